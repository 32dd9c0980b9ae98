"""Which trace set the run pages show: the URL's `run` query parameter (a trace_sets id), kept in the
session too so that switching pages in the sidebar -- which drops the query string -- keeps it.

    s = current_set()          # TraceSet or None
    select(s.id)               # from a picker: the URL follows
    no_set(reason)             # the empty state: what to do next, with links
    set_caption(s)             # one line naming the set, its plan and its status
"""

from __future__ import annotations

import streamlit as st

from profiler.collect import trace_sets
from profiler.collect.trace_sets import TraceSet
from ui.text import md

KEY = "run"  # the query parameter
_REMEMBERED = "_selected_run"
_AUTO = "_run_picked_for_you"  # the set opened because the link named none

PAGES = {
    "home": "pages/home.py",
    "timeline": "pages/timeline.py",
    "run_job": "pages/run_job.py",
    "upload": "pages/upload.py",
    "topology": "pages/topology.py",
    "memory": "pages/activation_memory.py",
    "scaling": "pages/tp_scaling.py",
}


def latest_completed() -> TraceSet | None:
    """The most recent completed run with traces (the demo on a fresh install), else None."""
    return next((s for s in trace_sets.list_sets() if s.status == "completed" and s.has_traces), None)


def current_id() -> str | None:
    """The URL's set, else the one this session last showed, else the most recent completed run (a
    link without ?run= must not open an empty page while runs exist)."""
    sid = st.query_params.get(KEY)
    if sid:
        st.session_state[_REMEMBERED] = sid
        return sid
    sid = st.session_state.get(_REMEMBERED)
    if not sid and (latest := latest_completed()) is not None:
        sid = st.session_state[_AUTO] = latest.id
        st.session_state[_REMEMBERED] = sid
    if sid:
        st.query_params[KEY] = sid
    return sid


def current_set() -> TraceSet | None:
    return trace_sets.find_set(current_id())


def select(set_id: str | None) -> None:
    st.session_state.pop(_AUTO, None)  # a set the user chose
    if set_id:
        st.query_params[KEY] = set_id
        st.session_state[_REMEMBERED] = set_id
    else:
        st.query_params.pop(KEY, None)
        st.session_state.pop(_REMEMBERED, None)


def no_set(reason: str | None = None) -> None:
    """The empty state of a run page: why nothing is shown, and where to go."""
    sid = current_id()
    if sid and reason is None:
        reason = f"There is no run or uploaded set called **{md(sid)}** here."  # plain text, no server paths
    st.info((reason + " " if reason else "") + "Pick a run on Home, start one in Run a job, or upload traces.")
    c1, c2, c3 = st.columns(3)
    c1.page_link(PAGES["home"], label="Home: pick a run", icon=":material/list:")
    c2.page_link(PAGES["run_job"], label="Run a job", icon=":material/play_arrow:")
    c3.page_link(PAGES["upload"], label="Upload traces", icon=":material/upload:")


def rank_count_text(world_size: int | None, traced: int) -> str:
    """'8 ranks', '1 of 8 ranks traced' (a set holding some ranks of a larger job), 'ranks unknown'."""
    if not world_size:
        return f"{traced:,} rank{'s' if traced != 1 else ''} traced" if traced else "ranks unknown"
    if traced and traced < world_size:
        return f"{traced:,} of {world_size:,} ranks traced"
    return f"{world_size:,} rank{'s' if world_size != 1 else ''}"


def set_caption(s: TraceSet) -> None:
    """One line naming the set, its plan, its ranks and status, and a link back to the picker."""
    ranks = rank_count_text(s.world_size, s.ranks_traced)
    kind = "uploaded set" if s.kind == "upload" else f"run · {s.status}"
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    picked = " · the most recent completed run (the link named no run)" if st.session_state.get(_AUTO) == s.id else ""
    c1.caption(f"**{md(s.name)}** ({kind}) · {md(s.plan_label)} · {ranks}{picked}")
    c2.page_link(PAGES["home"], label="Other runs", icon=":material/swap_horiz:", query_params={KEY: s.id})
