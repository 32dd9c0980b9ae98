"""Home: the run picker. Local runs and uploaded trace sets with their plan and status (live progress
for running ones, the failing rank for failed ones); the chosen one lives in the URL (`?run=`), with
links into the pages that read it. A fresh install starts a small real demo run."""

import streamlit as st

from parallel.core.specs import CLUSTERS, MODELS
from profiler.analyzers.aggregates import metrics_summary
from profiler.collect import jobs, runs_calibration, trace_sets
from profiler.collect.demo import DemoStartError
from profiler.collect.trace_sets import TraceSet
from runfiles.rundir import flight_dir
from ui import calibration_views, demo, run_loaders, run_status, selection
from ui.routing import ensure_navigation
from ui.text import md

PICK = "home_pick"


def _on_pick() -> None:
    selection.select(st.session_state.get(PICK))


def _start_demo() -> None:
    selection.select(demo.start_demo(trace_sets.runs_dir()))


def _table(was_active: bool) -> None:
    sets = trace_sets.list_sets()
    st.dataframe(
        trace_sets.table_rows(sets),
        hide_index=True,
        key="home_table",
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
            "ranks": st.column_config.NumberColumn("ranks", format="%d"),
        },
    )
    if was_active and not any(s.status in run_status.ACTIVE for s in sets):
        st.rerun(scope="app")  # a run just ended: refresh the whole page


def sets_table(sets: list[TraceSet]) -> None:
    """Every set, newest first; polled every few seconds (alone, as a fragment) while a run is active."""
    active = any(s.status in run_status.ACTIVE for s in sets)
    st.fragment(_table, run_every=run_status.POLL_S if active else None)(active)


def _links(s: TraceSet) -> None:
    run = {selection.KEY: s.id}
    plan = trace_sets.plan_params(s)
    # a set that names a preset model and cluster opens its plan; otherwise the page adopts it from the
    # traces (their GPU, their layout) and says what stands in for what the set does not name
    known = plan if s.model in MODELS and s.cluster in CLUSTERS else None
    no_plan = "this set has no plan: attach one when uploading, for dimension labels and the plan pages"
    c = st.columns(4)
    c[0].page_link(
        selection.PAGES["timeline"],
        label="Collective timeline",
        icon=":material/view_timeline:",
        query_params=run,
        disabled=not s.has_traces,
        help="per-rank Gantt, skew, stragglers, breakdown",
    )
    c[1].page_link(
        selection.PAGES["topology"],
        label="Topology, measured",
        icon=":material/grid_view:",
        query_params={**(known or {}), **run},
        disabled=not s.has_traces,
        help="the rank grid coloured by exposed comm, busbw, ... per rank"
        + ("; this set has no plan: the page starts from the layout its process groups show" if plan is None else ""),
    )
    c[2].page_link(
        selection.PAGES["memory"],
        label="Activation memory",
        icon=":material/memory:",
        query_params={**(known or {}), **run},
        disabled=plan is None and not s.has_traces,
        help=(
            no_plan
            if not s.has_traces
            else "this set has no plan: the page starts from the layout its process groups show"
        )
        if plan is None
        else "measured (metrics.json) beside predicted",
    )
    c[3].page_link(
        selection.PAGES["scaling"],
        label="TP scaling",
        icon=":material/trending_up:",
        query_params={**(known or {}), **run},
        disabled=not s.has_traces,
        help="its TP-group collectives' busbw (by group size and link) over the prediction",
    )


def _details(s: TraceSet) -> None:
    st.subheader(md(s.name))
    facts = [run_status.badge(s), s.plan_label, selection.rank_count_text(s.world_size, s.ranks_traced)]
    facts += [
        f"{k} {v}"
        for k, v in (
            ("model", s.model),
            ("cluster", s.cluster),
            ("nodes", s.nodes),
            ("backend", s.run.get("backend")),
            ("torch", s.run.get("torch_version")),
        )
        if v
    ]
    st.markdown(" · ".join(str(f) for f in facts))
    if s.when:
        st.caption(f"{s.when} · {md(s.path)}")
    if s.status in run_status.ACTIVE:
        run_status.live_progress(s.id)
        if s.job is not None and jobs.alive(s.job):
            st.button("Cancel this run", key="home_cancel", on_click=jobs.cancel, args=(s.job,), icon=":material/stop:")
    if s.status in ("failed", "cancelled"):
        run_status.failure(s)
        if s.kind == "run" and any(flight_dir(s.path).glob("rank*.json")):
            st.page_link(
                "pages/hang.py",
                label="Why did it hang: its Flight Recorder dumps",
                icon=":material/troubleshoot:",
                query_params={selection.KEY: s.id},
            )
    if s.has_metrics:
        run_metrics = run_loaders.run_metrics(s)
        head = metrics_summary(run_metrics)
        m = st.columns(4)
        if head["step_time_s"] is not None:
            m[0].metric("Steady step time", f"{head['step_time_s']:.3f} s", help="median after the first step")
        if head["loss_last"] is not None:
            m[1].metric(
                "Loss",
                f"{head['loss_last']:.4f}",
                delta=f"{head['loss_last'] - head['loss_first']:+.4f}"
                if abs(head["loss_last"] - head["loss_first"]) >= 5e-5
                else None,
                delta_color="inverse",
                help="last step, and its change since the first",
            )
        if head["act_error_pct"] is not None:
            m[2].metric(
                "Activation memory vs model",
                f"{head['act_error_pct']:.1f} % off",
                help="largest per-rank error of parallel.core.memory's prediction against the measured bytes",
            )
        if head["state_error_pct"] is not None:
            m[3].metric(
                "Model state vs model",
                f"{head['state_error_pct']:.1f} % off",
                help="largest per-rank error of the predicted parameter, gradient and optimizer bytes "
                "against the tensors the run held",
            )
        calibration_views.run_prediction(s, run_metrics)
    _links(s)


def home_page() -> None:
    sets = trace_sets.list_sets()
    if not sets:  # a fresh install: profile the demo job, so the dashboard shows real data at once
        st.info(
            "No runs or uploaded traces yet, so ParaScope is profiling a small real job to start with: a tiny "
            "GPT trained DP2 × TP2 + SP × PP2 on 8 CPU processes (gloo), every rank traced (well under a minute)."
        )
        try:
            _start_demo()
        except OSError as err:
            st.error(
                f"The demo run cannot start in the runs folder: {md(err)}. Set PARASCOPE_RUNS to a writable "
                "folder, or upload traces."
            )
            st.page_link(selection.PAGES["upload"], label="Upload traces", icon=":material/upload:")
            return
        except DemoStartError as err:
            head, _, log = str(err).partition("\n")
            st.error(f"The demo job failed to start: {md(head)}. Its log ends:")
            st.code(log, language=None)
            st.button("Try again", key="demo_retry")
            st.page_link(selection.PAGES["upload"], label="Or upload traces", icon=":material/upload:")
            return
        st.rerun()
    ids = [s.id for s in sets]
    current = selection.current_id()
    if current not in ids:
        asked = st.query_params.get(selection.KEY)
        current = next((s.id for s in sets if s.status == "completed"), ids[0])
        selection.select(current)
        if asked:  # a link to a set that is not here: said, not silently replaced
            st.warning(
                f"There is no run or uploaded set called **{md(asked)}** here; showing "
                f"**{md(next(s.name for s in sets if s.id == current))}** instead."
            )
    if st.session_state.get(PICK) != current:
        st.session_state[PICK] = current  # the URL wins: a copied link, or one from another page
    labels = {s.id: s.label for s in sets}
    st.selectbox(
        "Run or uploaded trace set",
        ids,
        key=PICK,
        on_change=_on_pick,
        format_func=labels.get,
        help="newest first; the choice is kept in the URL (?run=…), so a copied link reopens it",
    )
    _details(next(s for s in sets if s.id == current))
    st.subheader("All runs and uploads")
    sets_table(sets)
    calibration_views.calibrate_form(runs_calibration.calibration_candidates(sets))


ensure_navigation()
st.title("ParaScope")
st.caption("Plan, profile and review DP × TP × PP × CP parallel training jobs: pick a run or an uploaded trace set.")
home_page()
