"""Measured data of a run on the plan pages, when the URL names one (`?run=`, from Home's links):

    adopt_run_plan()                   # ?run= and no plan: start from the set's plan (or its layout)
    plan_form(ask_model=model_question())  # the set's model unknown: the form asks for it first
    adoption_note()                    # under the form: what the adopted plan stands on
    topology_measured(choice, cells)   # Topology: the rank grid coloured by a measured per-rank value
    memory_measured(choice)            # Activation memory: metrics.json's measured bytes beside predicted
    tp_measured(choice)                # TP scaling: measured busbw points (traces' TP-group collectives,
                                       # commbench results) for busbw_chart's `measured`

Each draws nothing unless a set is named, and says why when it cannot draw (no traces yet, a plan
of another size, no metrics.json). Widgets -> cached loaders -> profiler.analyzers.aggregates and ui.run_tables -> chart builders.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from parallel.core.devices import cluster_for_device
from parallel.core.memory_sweeps import MetricsError, measured_vs_predicted, model_state_vs_predicted
from parallel.core.rank_grid import with_rank_values
from parallel.core.specs import CLUSTERS, MODELS, GiB
from profiler.analyzers import aggregates
from profiler.analyzers.aggregates import metrics_summary
from profiler.collect import trace_sets
from profiler.collect.trace_sets import TraceSet
from profiler.traces.errors import TraceError
from ui import memory_charts, run_loaders, topology_charts
from ui.plan_form import PlanChoice
from ui.run_tables import RANK_VALUES
from ui.selection import KEY, PAGES
from ui.text import bytes_text, md


def _named_set() -> TraceSet | None:
    """The set the URL names on a plan page (only the URL: a plan page without ?run= is pure planning)."""
    sid = st.query_params.get(KEY)
    return trace_sets.find_set(sid) if sid else None


def _forget() -> None:
    st.query_params.pop(KEY, None)


ADOPTED = "run_plan_adopted"  # session: (set id, the note to show) of the last set whose plan a page adopted
PLAN_KEYS = ("model", "dp", "tp", "pp")


def adopt_run_plan() -> None:
    """A plan page opened with ?run= and no plan in the URL starts from the set's plan; a set that came
    without one, from the layout its process groups show, else from a guess of its world size, and
    says which. A set whose model is no preset gets no model in the URL (no stand-in): the plan form
    asks for it (model_question). Once per set: afterwards the sidebar is the user's."""
    s = _named_set()
    if s is None or any(k in st.query_params for k in PLAN_KEYS):
        return
    done = st.session_state.get(ADOPTED)
    if done and done[0] == s.id:
        return
    device = guess = note = None
    if s.has_traces and (s.plan_obj is None or s.cluster not in CLUSTERS):
        try:
            if run_loaders.open_analysis(run_loaders.set_key(s)) is None:
                return
            device = run_loaders.device(run_loaders.set_key(s))
            guess = None if s.plan_obj else run_loaders.layout(run_loaders.set_key(s))
        except TraceError:
            return  # the measured section below says why the traces cannot be read
    params = _set_params(s, guess.plan if guess else None, device)
    if guess is not None:
        label = guess.plan.label()
        note = (
            f"{s.name} came without a plan: the layout {label} is inferred from {guess.evidence}."
            if guess.inferred
            else f"{s.name} came without a plan and {guess.evidence}: this is a guess, {label} over its "
            f"{guess.plan.world_size} ranks. Set the real layout in the sidebar."
        )
    if params and device and s.cluster not in CLUSTERS:
        note = f"{note} {_device_note(device, params)}" if note else _device_note(device, params)
    if params:
        st.query_params.update(params)
        st.session_state[ADOPTED] = (s.id, note)


def _set_params(s: TraceSet, plan=None, device: dict | None = None) -> dict[str, str] | None:
    """trace_sets.plan_params without a stand-in model: a set whose model is no preset opens with no
    `model` in the URL, and the plan form asks for it (model_question)."""
    params = trace_sets.plan_params(s, plan, device)
    if params and s.model not in MODELS:
        del params["model"]
    return params


def model_question() -> str | None:
    """Why the job's model must be asked for, while the URL names a set whose model ParaScope does not
    know and no model has been picked (none in the URL); None otherwise. For plan_form's ask_model."""
    if "model" in st.query_params:
        return None
    s = _named_set()
    if s is None or s.model in MODELS:
        return None
    named = f" (its plan calls it {s.model})" if s.model else ""
    hint = "; the job's launch script, uploaded with its traces, names it" if s.kind == "upload" else ""
    return f"{s.name} names no model ParaScope knows{named}{hint}."


def _device_note(device: dict, params: dict[str, str]) -> str:
    """What the traces say of the job's GPU and which cluster the plan pages use for it."""
    memory = device["memory_bytes"]
    said = f"{device['name']}{f', {memory / GiB:,.1f} GiB' if memory else ''}"
    others = f" (and {', '.join(device['others'])} on other ranks)" if device["others"] else ""
    if cluster_for_device(device["name"]) == params["cluster"]:
        return f"Its traces' deviceProperties name the GPU: {said}{others}, so the plan pages use {params['cluster']}."
    gpumem = ", with the job's memory per GPU" if "gpumem" in params else ""
    return (
        f"Its traces' deviceProperties name the GPU: {said}{others}. ParaScope has no cluster of it: the plan "
        f"pages use {params['cluster']}'s links and FLOP/s{gpumem}."
    )


def adoption_note() -> None:
    """What the plan in the sidebar stands on, under the plan form, when it came from the URL's set: a
    layout inferred or guessed from its traces, the GPU they name."""
    s = _named_set()
    done = st.session_state.get(ADOPTED)
    if s is not None and done and done[0] == s.id and done[1]:
        st.info(md(done[1]))


def _header(s: TraceSet, what: str) -> None:
    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    c1.subheader(f"Measured: {what} on {s.name}")
    c2.button(
        "Hide", key=f"hide_measured_{what}", on_click=_forget, help="plan without the run (drops ?run= from the URL)"
    )


def _same_size(s: TraceSet, choice: PlanChoice) -> bool:
    if s.world_size and s.world_size != choice.plan.world_size:
        st.info(
            f"{s.name} ran on {s.world_size} ranks ({s.plan_label}) but the plan in the sidebar has "
            f"{choice.plan.world_size}; open the run's own plan to compare rank by rank."
        )
        params = _set_params(s)
        if params:
            st.page_link(
                PAGES["topology"],
                label=f"Open {s.name}'s plan",
                icon=":material/grid_view:",
                query_params={**params, KEY: s.id},
            )
        return False
    return True


def _steady_step_ms(s: TraceSet) -> float | None:
    """The run's steady step (the median of its steps after the first, metrics.json), in ms."""
    if not s.has_metrics:
        return None
    metrics = run_loaders.metrics(str(s.path), (s.path / "metrics.json").stat().st_mtime_ns) or {}
    head = metrics_summary(metrics)
    return head["step_time_s"] * 1e3 if head["step_time_s"] is not None else None


def topology_measured(choice: PlanChoice, cells: pd.DataFrame) -> None:
    s = _named_set()
    if s is None:
        return
    _header(s, "per-rank values")
    if not s.has_traces:
        st.info(f"{md(s.name)} has no traces yet ({md(s.status)}); they appear when the run finishes.")
        return
    if not _same_size(s, choice):
        return
    try:
        if run_loaders.open_analysis(run_loaders.set_key(s)) is None:  # a first load, cancelled
            return
        values = run_loaders.rank_values(run_loaders.set_key(s))
    except TraceError as err:
        st.error(f"The traces of {md(s.name)} cannot be analysed: {md(err)}")
        return
    column = st.segmented_control(
        "Colour GPUs by",
        list(RANK_VALUES),
        default="exposed_comm_ms",
        required=True,
        key="topo_measure",
        bind="query-params",
        format_func=lambda c: RANK_VALUES[c][0],
    )
    _, title, fmt = RANK_VALUES[column]
    traced = float(values["step_ms"].mean()) if "step_ms" in values and len(values) else None
    steady = _steady_step_ms(s)
    step_note = (
        f" The traced steps took {traced:,.1f} ms on average (profiler attached)"
        + (f"; the run reports a steady step of {steady:,.1f} ms (median after its first)." if steady else ".")
        + " Per-step values are parts of the traced step."
        if traced
        else ""
    )
    st.caption(
        f"The same grid as above, each GPU coloured by its rank's {title} in {s.name} (per step: the mean over "
        "the traced steps; busbw: the median over its collectives); grey: no value. A rank that waits on a "
        "slow peer shows high exposed communication; the slow peer itself is often the last to arrive." + step_note
    )
    st.altair_chart(
        topology_charts.rank_values_chart(with_rank_values(cells, values[column], column), column, title=title, fmt=fmt)
    )


def memory_measured(choice: PlanChoice) -> None:
    s = _named_set()
    if s is None:
        return
    _header(s, "activation memory")
    if not s.has_metrics:
        st.info(
            f"{s.name} has no metrics.json"
            + (" yet" if s.status in ("starting", "running") else "")
            + ": runs of `python -m profiler run` (and `python -m parallel train`) write one with the measured "
            "activation bytes per rank."
        )
        return
    metrics = run_loaders.metrics(str(s.path), (s.path / "metrics.json").stat().st_mtime_ns) or {}
    try:
        frame = measured_vs_predicted(metrics)
    except MetricsError as err:
        st.warning(f"{md(s.name)}'s metrics.json cannot be compared: {md(err)}")
        return
    plan = metrics.get("plan") or {}
    st.caption(
        f"Bytes saved for backward by one microbatch on each rank, measured by the engine's saved-tensor hooks "
        f"in {s.name} ({s.plan_label}, model {s.model or '?'}), beside parallel.core.memory's prediction for the "
        f"same shapes; below, the error in %. Recompute {plan.get('recompute', '?')}."
    )
    st.altair_chart(memory_charts.measured_vs_predicted_chart(frame))
    _model_state_measured(s, metrics)


def _model_state_measured(s, metrics: dict) -> None:
    """The run's parameter, gradient and optimizer bytes per rank beside the plan model's."""
    st.markdown("**Model state**")
    try:
        frame = model_state_vs_predicted(metrics)
    except MetricsError as err:
        st.info(f"{md(s.name)}: {md(err)}")
        return
    zero = (metrics.get("plan") or {}).get("zero", 0)
    worst = frame["error_pct"].abs().max()
    transient = metrics.get("model_state_transient_bytes") or {}
    peaks = [
        (max(float(v.get(k, 0)) for v in transient.values() if isinstance(v, dict)), label)
        for k, label in (("gathered_params", "all-gathered layers"), ("unsharded_grads", "full-size gradients"))
        if any(isinstance(v, dict) and v.get(k) for v in transient.values())
    ]
    extra = (
        " Held for moments inside a step, not counted above: "
        + ", ".join(f"{label} up to {bytes_text(n)}" for n, label in peaks)
        + " (the most on any rank)."
        if peaks
        else ""
    )
    st.caption(
        f"Parameters, gradients and optimizer states each rank holds (ZeRO-{zero}; counted from the tensors' "
        f"storages after the first step's gradient reduction), beside parallel.core.memory.model_state_bytes for "
        f"the engine's dtypes; largest error {worst:.2f} %.{extra}"
    )
    st.altair_chart(memory_charts.model_state_chart(frame))


def _json(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return None


def tp_measured(choice: PlanChoice) -> pd.DataFrame | None:
    """Measured busbw points for the TP-scaling charts: the named set's TP-group collectives, and the
    commbench results uploaded here or found beside the runs (RUNS/commbench*.json, the set's
    commbench.json)."""
    parts = []
    s = _named_set()
    title = (
        f"Measured: {md(s.name)}'s TP-group collectives, commbench results"
        if s is not None
        else "Measured points: a run's TP-group collectives, commbench results"
    )
    with st.expander(title, expanded=s is not None):
        if s is not None and s.has_traces:
            try:
                ours = (
                    run_loaders.tp_measured(run_loaders.set_key(s))
                    if run_loaders.open_analysis(run_loaders.set_key(s)) is not None
                    else None
                )
            except TraceError as err:
                st.error(f"The traces of {md(s.name)} cannot be analysed: {md(err)}")
                ours = None
            if ours is not None and len(ours):
                st.caption(
                    f"{md(s.name)}: median busbw of its TP/SP-group collectives by group size and link (diamonds)."
                )
                st.dataframe(
                    ours,
                    hide_index=True,
                    column_config={
                        "busbw_bytes_per_s": None,
                        # wide enough for its header ("busbw G…" was cut in the default width)
                        "busbw_gbps": st.column_config.NumberColumn("busbw GB/s", format="%.4g", width="medium"),
                    },
                )
                parts.append(ours.assign(source=s.name))
            elif ours is not None:
                st.caption(f"{md(s.name)} has no TP/SP-group collectives with a known size.")
        elif s is None:
            st.caption("Open a run from Home (its TP scaling link) to overlay its TP-group collectives.")
        files = ([s.path / "commbench.json"] if s is not None else []) + sorted(
            trace_sets.runs_dir().glob("commbench*.json")
        )
        found = {
            f.name if f.parent == trace_sets.runs_dir() else f"{s.name}/{f.name}": _json(f.read_bytes())
            for f in files
            if f.is_file()
        }
        up = st.file_uploader(
            "commbench JSON (python -m profiler commbench --out FILE)", type=["json"], key="tps_commbench"
        )
        if up is not None:
            found[up.name] = _json(up.getvalue())
        for name, data in found.items():
            bench = aggregates.commbench_points(data) if isinstance(data, dict) else None
            if bench is None or bench.empty:
                st.warning(f"{md(name)}: no all_reduce rows with a group size and busbw (is it commbench's JSON?)")
                continue
            st.caption(f"{md(name)}: commbench all_reduce busbw at its largest message, by group size and link.")
            parts.append(bench.assign(source=name))
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else None
