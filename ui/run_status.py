"""A run's state on any page: a badge, a live progress bar while it runs (polled from its run.json in a
fragment, so only the bar reruns), and a failure's rank, message and log.

    badge(s)             # ':green-badge[completed]' for markdown
    live_progress(s.id)  # while starting/running; reruns the whole page once the run ends
    failure(s)           # failing rank, message, the tail of that rank's log (or the launcher's)
"""

from __future__ import annotations

import streamlit as st

from profiler.collect import jobs, trace_sets
from profiler.collect.trace_sets import TraceSet
from ui.text import md

POLL_S = 2.0
ACTIVE = ("starting", "running")
_COLOURS = {
    "starting": "gray",
    "running": "blue",
    "completed": "green",
    "failed": "red",
    "cancelled": "orange",
    "uploaded": "violet",
}


def badge(s: TraceSet) -> str:
    return f":{_COLOURS.get(s.status, 'gray')}-badge[{s.status}]"


def progress_text(s: TraceSet) -> str:
    if s.status == "starting":
        return "starting: launching the ranks …"
    if s.steps:
        return f"step {s.step or 0} of {s.steps}"
    return s.status


@st.fragment(run_every=POLL_S)
def live_progress(set_id: str) -> None:
    """A progress bar that follows the run's run.json; when the run is no longer active, the whole
    page reruns (so it shows the finished run)."""
    s = trace_sets.find_set(set_id)
    if s is None or s.status not in ACTIVE:
        st.rerun(scope="app")
    st.progress(s.progress or 0.0, text=f"{s.name}: {progress_text(s)}")


def log_of(s: TraceSet, lines: int = 40) -> tuple[str, str]:
    """(title, text): the failing rank's log when there is one, else the job's launcher log."""
    if s.error_rank is not None:
        text = jobs.tail(s.rank_log(s.error_rank), lines)
        if text:
            return f"last lines of logs/rank{s.error_rank}.log", text
    if s.job is not None:
        return "last lines of the job's output", jobs.tail(s.job.log_path, lines)
    return "", ""


def failure(s: TraceSet) -> None:
    """The failing rank, its message and its log."""
    where = f"on rank {s.error_rank}" if s.error_rank is not None else ""
    if s.status == "cancelled":  # say what is there: ranks write their traces when they finish
        kept = (
            f"The {s.trace_files} trace file{'s' if s.trace_files != 1 else ''} written before it stopped "
            "are kept and shown below."
            if s.has_traces
            else "It stopped before any rank wrote its trace (a rank writes one when its profiled steps "
            "end), so there is nothing to show."
        )
        st.warning(f"**{md(s.name)}** was cancelled. {kept}")
    else:
        st.error(f"**{md(s.name)}** failed {where}: {md(s.error or 'no message recorded')}")
    title, text = log_of(s)
    if text:
        with st.expander(title, expanded=s.status == "failed"):
            st.code(text, language=None)
