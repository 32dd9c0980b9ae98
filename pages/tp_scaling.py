"""TP scaling: predicted per-layer time split into compute and TP communication for TP = 1 … 32,
speedup and efficiency, SP off and on, with the NVLink/InfiniBand boundary marked."""

import streamlit as st

from ui import loaders, run_views, scaling_charts
from ui.plan_form import PlanChoice, plan_form
from ui.routing import ensure_navigation


def tp_scaling_page(choice: PlanChoice) -> None:
    model, cluster, plan = choice.model, choice.cluster, choice.plan
    mfu = st.slider("MFU of the GEMMs", min_value=0.1, max_value=0.9, value=0.5, step=0.05, key="tps_mfu",
                    bind="query-params", help="fraction of the GPU's peak FLOP/s the layer's compute reaches")
    view = loaders.scaling_view(choice.params, mfu)
    gpn = cluster.gpus_per_node
    st.caption(f"{model.name}: one layer, micro batch {plan.micro_batch} × {model.seq_len} tokens, recompute "
               f"{plan.recompute}, on {cluster.name} ({gpn} GPUs per node: {cluster.intra.name} "
               f"{cluster.intra.bandwidth_bytes_per_s / 1e9:,.0f} GB/s inside, {cluster.inter.name} "
               f"{cluster.inter.bandwidth_bytes_per_s / 1e9:,.0f} GB/s across, per GPU per direction). "
               f"TP > {gpn} leaves the node.")
    for note in view["notes"]:
        st.info(note)

    cols = st.columns(3)
    for col, row in zip(cols, view["highlights"]):
        col.metric(row["label"], f"{row['comm_fraction']:.0%} communication",
                   delta=f"efficiency {row['efficiency']:.0%}", delta_color="off", delta_arrow="off",
                   help=row["help"])

    st.subheader("Per-layer time: compute vs TP communication")
    st.caption("TP without SP all-reduces twice forward and twice backward; TP + SP moves the same bytes as "
               "all-gathers and reduce-scatters, so its exposed time matches, and Megatron's backward re-gather "
               "overlaps compute (light segment). SP's gain is memory (see Activation memory).")
    st.altair_chart(scaling_charts.layer_time_chart(view["frame"], gpn))
    st.subheader("Speedup and efficiency")
    st.altair_chart(scaling_charts.speedup_chart(view["frame"], gpn))
    st.subheader("Bus bandwidth of the TP collective")
    st.caption("Bus bandwidth by the nccl-tests convention (algbw × 2(n−1)/n), ring model: it approaches the "
               "link's bandwidth for large messages, and latency pulls it down as the group grows. Black diamonds: "
               "measured points (a run's or an uploaded set's TP-group collectives, commbench results).")
    measured = run_views.tp_measured(choice)  # a run's TP-group collectives, commbench results
    st.altair_chart(scaling_charts.busbw_chart(view["frame"], gpn, measured))
    st.dataframe(view["table"], hide_index=True)


ensure_navigation()
st.title("TP scaling")
scaling_choice = plan_form()
if scaling_choice.computable:
    tp_scaling_page(scaling_choice)
