"""TP scaling: predicted per-layer time split into compute and TP communication for TP = 1 … 32,
speedup and efficiency, SP off and on, with the NVLink/InfiniBand boundary marked; below, TP sweeps
measured on the two-node lab beside the prediction for the lab's own links."""

from pathlib import Path

import streamlit as st

from profiler.collect import trace_sets
from profiler.lab import sweep_views as sweep_data
from ui import loaders, run_views, scaling_charts
from ui.plan_form import PlanChoice, plan_form, recompute_text
from ui.routing import ensure_navigation
from ui.text import md
from ui.theme import link_names


def _gbps(bytes_per_s: float) -> str:
    """450 GB/s, 0.1 GB/s: a shaped lab link is well under 1 GB/s, which ',.0f' showed as 0."""
    gb = bytes_per_s / 1e9
    return f"{gb:,.0f} GB/s" if gb >= 10 else f"{gb:.2g} GB/s"


def _compute_text(params: dict[str, str]) -> str:
    mfu = params.get("mfu")
    return (
        f"every operator at {float(mfu):.0%} MFU" if mfu else "each operator timed from its shape on the cluster's GPU"
    )


def tp_scaling_page(choice: PlanChoice) -> None:
    model, cluster, plan = choice.model, choice.cluster, choice.plan
    view = loaders.scaling_view(choice.params)  # compute: the sidebar's Modelling assumptions
    gpn = cluster.gpus_per_node
    st.caption(
        f"{model.name}: one layer, micro batch {plan.micro_batch} × {model.seq_len} tokens, "
        f"{recompute_text(plan)}, on {cluster.name} ({gpn} GPUs per node: {cluster.intra.name} "
        f"{_gbps(cluster.intra.bandwidth_bytes_per_s)} inside, {cluster.inter.name} "
        f"{_gbps(cluster.inter.bandwidth_bytes_per_s)} across, per GPU per direction). "
        f"TP > {gpn} leaves the node. Compute: {_compute_text(choice.params)} (the sidebar's Modelling assumptions)."
    )
    if view["notes"]:  # one box, not one per TP degree: a small model can leave out half the sweep
        st.info("\n".join(f"- {note}" for note in view["notes"]))

    cols = st.columns(3)
    for col, row in zip(cols, view["highlights"]):
        col.metric(
            row["label"],
            f"{row['comm_fraction']:.0%} communication",
            delta=f"efficiency {row['efficiency']:.0%}",
            delta_color="off",
            delta_arrow="off",
            help=row["help"],
        )

    st.subheader("Per-layer time: compute vs TP communication")
    st.caption(
        "TP without SP all-reduces twice forward and twice backward; TP + SP moves the same bytes as "
        "all-gathers and reduce-scatters, so its exposed time matches, and Megatron's backward re-gather "
        "overlaps compute (light tick beside the bar, not part of it). With TP comm overlap, SP's collectives "
        "inside a node hide under the GEMMs they feed (light tick); across nodes they stay exposed. SP's gain is memory "
        "(see Activation memory). Compute shrinks slower than 1/TP: each rank's GEMMs get thinner."
    )
    names = link_names(cluster)
    st.altair_chart(scaling_charts.layer_time_chart(view["frame"], gpn, names=names))
    st.subheader("Speedup and efficiency")
    st.altair_chart(scaling_charts.speedup_chart(view["frame"], gpn, names=names))
    st.subheader("Bus bandwidth of the TP collective")
    st.caption(
        "Bus bandwidth by the nccl-tests convention (algbw × 2(n−1)/n), ring model: it approaches the "
        "link's bandwidth for large messages, and latency pulls it down as the group grows. Black diamonds: "
        "measured points (a run's or an uploaded set's TP-group collectives, commbench results)."
    )
    measured = run_views.tp_measured(choice)  # a run's TP-group collectives, commbench results
    st.altair_chart(scaling_charts.busbw_chart(view["frame"], gpn, measured, names=names))
    st.dataframe(view["table"], hide_index=True)


LAB_LINE = (
    "**The lab**: two network namespaces on this machine joined by a veth link shaped with tc, so ranks on "
    "one node talk over loopback and ranks on different nodes over a deliberately slower link — the "
    "NVLink/InfiniBand cliff in miniature. Reproduce: `sudo python -m profiler lab up --like dgx-h100 && "
    "sudo python -m profiler tpsweep --lab`."
)


@st.cache_data(show_spinner=False, max_entries=16)
def _sweep_view(path: str, mtime_ns: int) -> dict:
    return sweep_data.sweep_view(sweep_data.load_sweep(Path(path)))


def lab_sweep_section() -> None:
    st.subheader("Measured on the two-node lab")
    st.caption(LAB_LINE)
    sweeps = sweep_data.find_sweeps(trace_sets.runs_dir())
    if not sweeps:
        st.info(
            f"No TP sweep under {trace_sets.runs_dir()} yet. As root: `python -m profiler lab up --like dgx-h100`, "
            "then `python -m profiler tpsweep --lab` (about 4 minutes on 2 cores) writes one there."
        )
        return
    names = [s["name"] for s in sweeps]
    name = st.selectbox(
        "Sweep",
        names,
        key="tps_sweep",
        format_func=lambda n: next(f"{n} ({s['status']}, {s['points']} runs)" for s in sweeps if s["name"] == n),
    )
    chosen = next(s for s in sweeps if s["name"] == name)
    try:
        view = _sweep_view(chosen["path"], chosen["mtime_ns"])
    except sweep_data.SweepError as err:
        st.error(md(err))
        return
    for note in view["notes"]:
        st.warning(md(note))
    st.caption(
        view["caption"] + " Diamonds: measured (TP comm with its p25–p75 bar), labelled with the error "
        "vs the prediction; blue squares: the model calibrated on two of the sweep's own runs (TP comm and "
        "step time; the table has its errors, its TP comm against what an untraced step pays a layer: each "
        "call's mean cost, jitter included); shaded: TP groups that span both lab nodes."
    )
    st.altair_chart(scaling_charts.sweep_chart(view["chart"], view["gpus_per_node"]))
    st.dataframe(view["table"], hide_index=True)


ensure_navigation()
st.title("TP scaling")
run_views.adopt_run_plan()  # ?run= without a plan: start from the set's (or its traces') layout
scaling_choice = plan_form(ask_model=run_views.model_question())
run_views.adoption_note()  # the layout or GPU the plan took from the set, if it did
if scaling_choice.computable:
    tp_scaling_page(scaling_choice)
lab_sweep_section()
