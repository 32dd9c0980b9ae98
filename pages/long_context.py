"""Long context: how do I train 1M tokens? Activation memory and communication per layer from 4K to 1M
tokens for TP alone, TP + SP and TP + SP + CP by each exchange (all-gather, ring, Ulysses), the
smallest plan that fits at each length, and this project's measured runs on the curves."""

import streamlit as st

from parallel.core.long_context import CP_DEGREES, SP_VS_CP, coinciding
from parallel.core.specs import GiB
from profiler.collect import trace_sets
from ui import loaders, long_context_charts
from ui.plan_form import SETTINGS_SECTION, PlanChoice, plan_form, saved_text
from ui.routing import ensure_navigation
from ui.text import md


def _runs() -> tuple[tuple[str, int], ...]:
    """(metrics.json, mtime) of every run directory under the runs dir, profiled (`python -m profiler
    run`) or not (`python -m parallel train --out`): the cache key of their measured points."""
    out = []
    for f in trace_sets.runs_dir().glob("*/metrics.json"):
        try:
            out.append((str(f), f.stat().st_mtime_ns))
        except OSError:  # removed while listing
            continue
    return tuple(sorted(out))


def long_context_page(choice: PlanChoice) -> None:
    model, cluster, plan = choice.model, choice.cluster, choice.plan
    c1, _ = st.columns([3, 2])
    default_cp = plan.cp if plan.cp in CP_DEGREES else 8
    cp = c1.select_slider(
        "CP degree",
        options=list(CP_DEGREES),
        value=default_cp,
        key="lc_cp",
        bind="query-params",
        help="ranks the sequence is split over by context parallelism (any number of nodes)",
    )
    with st.spinner("Evaluating the plan model at 9 lengths …"):
        view = loaders.long_context_view(choice.params, cp, _runs())
    st.caption(
        f"{model.name} on {cluster.name}: TP {plan.tp} (the plan's), micro batch {plan.micro_batch}, "
        f"{saved_text(plan)} (the sidebar's {SETTINGS_SECTION}); CP {cp} over "
        f"{-(-plan.tp * cp // cluster.gpus_per_node)} node(s) of {cluster.gpus_per_node} GPUs. "
        "Lengths a plan cannot split are left out."
    )
    st.subheader("Activation memory per GPU")
    st.altair_chart(
        long_context_charts.memory_chart(view["memory"], view["measured"], cluster.gpu_memory_bytes / GiB),
        width="stretch",
    )
    st.caption(
        "Bytes saved for backward by one microbatch on one GPU (all layers, embedding and output), by "
        "parallel.core.memory; the dashed line is the GPU's memory (weights and optimizer states come on "
        "top). ◆: measured by the engine's saved-tensor hooks in a run of this project with the same model, "
        "TP, micro batch and recompute mode."
        if len(view["measured"])
        else "Bytes saved for backward by one microbatch on one GPU (all layers, embedding and output), by "
        "parallel.core.memory; the dashed line is the GPU's memory (weights and optimizer states come on top). "
        "No run of this project matches the plan (same model, TP, micro batch, recompute, pp 1): run one on "
        "Run a job (e.g. tiny-llama with --cp-kind ring) to see measured points here."
    )
    hidden = coinciding(view["memory"])
    if hidden:  # a legend entry with no line of its own reads as a missing curve
        st.caption(
            "Drawn on top of each other (the same bytes at every length): "
            + "; ".join(f"{md(later)} over {md(earlier)}" for later, earlier in hidden.items())
            + "."
        )
    st.markdown(SP_VS_CP)

    st.subheader("Communication per layer, by the link it crosses")
    st.altair_chart(long_context_charts.comm_chart(view["comm"]))
    st.caption(
        "TP/SP and CP collectives of one layer and microbatch (forward and backward) by the α-β model, on the "
        "link each group crosses: TP inside a node, CP over the node boundary once TP × CP exceeds a node. "
        "All-gather CP moves K/V of all s tokens per layer; ring passes one s/cp block cp−1 times forward "
        "and 2cp−1 times backward, overlapped with the attention of the block in hand (dashed: the "
        "attention compute at 50% MFU that hides it); Ulysses moves Q, K, V and the output by all-to-all."
    )

    st.subheader("The smallest plan that fits")
    fits = view["fits"]
    st.dataframe(
        fits.drop(columns="why").assign(memory_GiB=fits["memory_GiB"].round(1)),
        hide_index=True,
        column_config={
            "seq_len": st.column_config.NumberColumn("tokens", format="%d"),
            "plan": "plan (fewest GPUs, then fastest)",
            "gpus": "GPUs",
            "memory_GiB": "GiB on the most loaded GPU",
            "fits": "fits",
        },
    )
    st.caption(
        f"One model replica (DP 1): TP ≤ {cluster.gpus_per_node} with SP, CP of any exchange, PP with one "
        f"microbatch per stage, ZeRO-1 over the CP ranks, {saved_text(plan)}; weights, gradients, "
        f"optimizer states and activations within the GPU's memory less 10%."
    )
    for row in fits[~fits["fits"]].itertuples():
        st.warning(f"{row.seq_len:,} tokens: nothing fits — {md(row.why)}.")


ensure_navigation()
st.title("Long context")
lc_choice = plan_form()
if lc_choice.computable:
    long_context_page(lc_choice)
