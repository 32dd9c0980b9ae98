"""ParaScope: the dashboard's entry point. It only routes; each page lives in pages/.

Run: streamlit run app.py
"""

import streamlit as st

from ui.routing import mark_routed

st.set_page_config(page_title="ParaScope", layout="wide")

run_pages = [
    st.Page("pages/home.py", title="Home", default=True),
    st.Page("pages/timeline.py", title="Collective timeline"),
    st.Page("pages/replan.py", title="Re-plan"),
    st.Page("pages/run_job.py", title="Run a job"),
    st.Page("pages/upload.py", title="Upload"),
    st.Page("pages/hang.py", title="Why did it hang"),
]
plan_pages = [
    st.Page("pages/topology.py", title="Topology"),
    st.Page("pages/activation_memory.py", title="Activation memory"),
    st.Page("pages/tp_scaling.py", title="TP scaling"),
    st.Page("pages/long_context.py", title="Long context"),
    st.Page("pages/plan_review.py", title="Plan review"),
]
mark_routed()
st.navigation({"Runs": run_pages, "Plan": plan_pages}).run()
