"""Re-plan: an opened trace set's job as identified from its traces, its measured step beside the
plan model's, and the plans that would run it faster, with their gain, why, and their launch files."""

import streamlit as st

from profiler.traces.errors import TraceError
from ui import replan_jobs, replan_views, run_loaders, selection
from ui.routing import ensure_navigation
from ui.text import md


def replan_page(s) -> None:
    key = run_loaders.set_key(s)
    try:
        a = run_loaders.open_analysis(key)
    except TraceError as err:
        st.error(f"These traces cannot be analysed: {md(err)}")
        return
    if a is None:
        return
    world = a.traces.world_size
    gpus = st.number_input(
        "Re-plan on GPUs", min_value=1, max_value=1 << 20, value=world, step=1, key="rp_gpus", bind="query-params"
    )
    r = replan_jobs.open_replan(key, a.front, None if gpus == world else int(gpus))
    if r is None:
        return
    replan_views.job_section(r)
    replan_views.gap_section(r)
    replan_views.plans_section(r, s.name)


ensure_navigation()
st.title("Re-plan")
replan_set = selection.current_set()
if replan_set is None:
    selection.no_set()
else:
    selection.set_caption(replan_set)
    if replan_set.has_traces:
        replan_page(replan_set)
    else:
        st.info("No traces yet: a run writes one trace per rank when it finishes; this page fills in then.")
