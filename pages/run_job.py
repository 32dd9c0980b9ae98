"""Run a job: profile a parallel training job on this machine. `python -m profiler run` starts in the
background (its own process group, not tied to this browser tab); its progress and log follow here,
it can be cancelled, and the finished run appears on Home. Several jobs may run at once."""

import streamlit as st

from profiler.collect import jobs, trace_sets
from ui import run_status, selection
from ui.job_form import check, job_form
from ui.routing import ensure_navigation
from ui.text import md

SHOWN = 8  # most recent jobs listed


def _job_card(job: jobs.Job) -> None:
    s = trace_sets.find_set(job.name)
    with st.container(border=True):
        c1, c2 = st.columns([5, 1], vertical_alignment="center")
        status = s.status if s else "failed"
        c1.markdown(f"**{job.name}** " + (run_status.badge(s) if s else ":red-badge[failed]"))
        if s is not None and status in run_status.ACTIVE:
            st.progress(s.progress or 0.0, text=run_status.progress_text(s))
            if jobs.alive(job):
                c2.button("Cancel", key=f"cancel_{job.name}", on_click=jobs.cancel, args=(job,), icon=":material/stop:")
            log = jobs.tail(s.rank_log(0), 8) or jobs.tail(job.log_path, 8)
            if log:
                st.code(log, language=None)
        elif s is not None and status == "completed":
            c2.page_link(
                selection.PAGES["home"], label="Open", icon=":material/open_in_new:", query_params={selection.KEY: s.id}
            )
        elif s is not None:
            run_status.failure(s)
        else:
            st.error("The job left no run directory; its output:")
            st.code(jobs.tail(job.log_path, 20) or "(empty)", language=None)
        st.caption("`" + " ".join(job.argv[1:]) + "`")


def _active(shown: list[jobs.Job]) -> bool:
    return any((s := trace_sets.find_set(j.name)) is not None and s.status in run_status.ACTIVE for j in shown)


def _jobs_list(was_active: bool) -> None:
    shown = jobs.jobs(trace_sets.runs_dir())[:SHOWN]
    if not shown:
        st.caption("No jobs started from the dashboard yet.")
    for job in shown:
        _job_card(job)
    if was_active and not _active(shown):
        st.rerun(scope="app")  # the last active job ended: stop polling


def run_job_page() -> None:
    submitted = job_form()
    if submitted is not None:
        flags, label = submitted
        errors, warnings = check(flags)
        for message in errors:
            st.error(md(message))
        for message in warnings:
            st.warning(md(message))
        if not errors:
            runs = trace_sets.runs_dir()
            name = jobs.reserve(runs, label)
            jobs.start(jobs.profile_argv(flags, runs / name), name=name, runs_dir=runs)
            selection.select(name)
            st.success(f"Started **{md(name)}**: it runs in the background, so you may leave this page.")
    st.subheader("Jobs")
    active = _active(jobs.jobs(trace_sets.runs_dir())[:SHOWN])
    st.fragment(_jobs_list, run_every=run_status.POLL_S if active else None)(active)


ensure_navigation()
st.title("Run a job")
st.caption(
    "Profiles every rank with torch.profiler into a run directory under "
    f"`{trace_sets.runs_dir()}` (set PARASCOPE_RUNS to change it)."
)
run_job_page()
