"""Home page: what ParaScope is and where to start."""

import streamlit as st

st.title("ParaScope")
st.write("Plan, profile and review DP × TP × PP × CP parallel training jobs.")
