"""ParaScope: the dashboard's entry point. It only routes; each page lives in pages/.

Run: streamlit run app.py
"""

import streamlit as st

st.set_page_config(page_title="ParaScope", layout="wide")

home = st.Page("pages/home.py", title="Home", default=True)
st.navigation([home]).run()
