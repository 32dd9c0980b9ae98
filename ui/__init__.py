"""The dashboard's UI layer: shared Streamlit plumbing (plan form, cached loaders), Altair chart
builders (`*_charts.py`, each returning an `alt.Chart`) and pure data preparation (`*_data.py`:
pandas only, no streamlit). Importing the package imports nothing."""
