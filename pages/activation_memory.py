"""Activation memory: parallel.core.memory's components without and with sequence parallelism, per layer
and per GPU, by recompute mode, against sequence length and against TP; model states by stage."""

import streamlit as st

from parallel.core.memory_sweeps import SCOPES, SP_LABEL
from parallel.core.plan import NO_OFFLOAD
from parallel.core.specs import GiB
from ui import loaders, memory_charts, run_views
from ui.memory_charts import capacity_drawn
from ui.plan_form import SETTINGS_SECTION, PlanChoice, plan_form, saved_text
from ui.routing import ensure_navigation
from ui.text import bytes_text

ACT_BYTES = (0, 2, 4)  # the Activation bytes choices: 0 = the model's dtype


def _act_label(b: int) -> str:
    """A choice's label, which is also what the URL holds for it (Streamlit binds a selectbox by label)."""
    return "model dtype" if b == 0 else f"{b} B"


def activation_memory_page(choice: PlanChoice) -> None:
    model, plan = choice.model, choice.plan
    c1, c4 = st.columns([3, 2])
    url = {"bind": "query-params"}  # the view's choices live in the URL beside the plan
    scope = c1.segmented_control(
        "Scope",
        list(SCOPES),
        default="layer",
        required=True,
        key="mem_scope",
        format_func=SCOPES.get,
        **url,
        help="per layer: one layer, one microbatch. per GPU: the first pipeline stage's "
        "layers times the microbatches it holds in flight, plus the embedding terms",
    )
    act_bytes = c4.selectbox(
        "Activation bytes",
        list(ACT_BYTES),
        key="mem_act",
        **url,
        format_func=_act_label,
        help=f"bytes per saved activation; the model's dtype is {model.dtype_bytes} B",
    )
    view = loaders.memory_view(choice.params, act_bytes, scope)

    cols = st.columns(3)
    off = view["per_layer"][SP_LABEL[False]]
    cols[0].metric("Per layer, one microbatch, without SP", bytes_text(off), help=saved_text(plan))
    if SP_LABEL[True] in view["per_layer"]:
        on = view["per_layer"][SP_LABEL[True]]
        change = (on - off) / off if off else 0.0
        # no arrow for no change: a "▼ 0%" reads as a saving that is not there
        cols[1].metric(
            "… with SP", bytes_text(on), delta=f"{change:+.0%}" if round(change, 2) else None, delta_color="inverse"
        )
    else:
        cols[1].metric("… with SP", "needs TP > 1", help="SP shards LayerNorm/dropout across the TP group; set TP ≥ 2")
    cols[2].metric("GPU memory", f"{choice.cluster.gpu_memory_bytes / GiB:,.0f} GiB", help=choice.cluster.name)

    unit_note = "per layer for one microbatch" if scope == "layer" else "on the first pipeline stage's GPU"
    st.subheader("By recompute mode")
    st.caption(
        f"Activations saved for backward {unit_note}, stacked by component (hover a segment); "
        "Korthikanti et al. 2022, Table 2. Selective recompute drops what its modules save (the plan's: "
        f"{plan.recompute_modules}; core_attn: the s×s attention tensors); full recompute keeps only each "
        "layer's input."
        + (
            f" Offloaded ({plan.offload_modules}): on the GPU for one layer, in host memory for the rest."
            if scope == "gpu" and plan.offload_modules != NO_OFFLOAD
            else ""
        )
    )
    st.altair_chart(memory_charts.recompute_chart(view["recompute"], scope=scope))

    st.subheader("Per GPU, by pipeline stage")
    st.caption(
        f"Parameters, gradients, optimizer states (ZeRO-{plan.zero}) and activations "
        f"({saved_text(plan)}, {plan.schedule}, vpp {plan.vpp}) on one GPU of each stage; "
        + (
            "the dashed line is the GPU's memory."
            if capacity_drawn(view["stages"])
            else f"all far below the GPU's {choice.cluster.gpu_memory_bytes / GiB:,.0f} GiB (not drawn)."
        )
    )
    st.altair_chart(memory_charts.stage_chart(view["stages"]))

    st.subheader("Against sequence length")
    st.caption(
        f"The plan's micro batch, TP and {saved_text(plan)}; the model's own length "
        f"({model.seq_len}) is marked ▼. The s×s attention tensors grow quadratically; flash attention "
        f"removes them (the plan's attention kernel and dropout: the sidebar's {SETTINGS_SECTION}). Lengths "
        "the plan cannot split are left out."
    )
    st.altair_chart(memory_charts.sweep_chart(view["seq_len"], axis="seq_len", scope=scope))

    st.subheader("Against TP")
    st.caption(
        f"TP = {_tp_values(view['tp'])} for this model (the plan's TP = {plan.tp} marked ▼; degrees the model "
        "cannot be split by are left out); without SP the "
        "LayerNorm/dropout/residual group stays whole on every rank, with SP it shrinks with TP."
    )
    st.altair_chart(memory_charts.sweep_chart(view["tp"], axis="tp", scope=scope))
    run_views.memory_measured(choice)  # only when the URL names a run (?run=)


def _tp_values(sweep) -> str:
    """The TP degrees the sweep actually drew: '1, 2, 4' (not the 1 … 32 it tried)."""
    values = sorted({int(x) for x in sweep["x"]}) if len(sweep) else []
    return ", ".join(map(str, values)) or "none"


def _toggled() -> dict:
    """The page's bytes per activation as it stands before it is drawn (its session state, or on a first
    visit the URL it is bound to, by label: '4 B'), so the plan form's memory check uses the same assumption
    as every number below it."""
    if "mem_act" in st.session_state:
        return {"act_bytes": st.session_state["mem_act"]}
    by_label = {_act_label(b): b for b in ACT_BYTES}
    return {"act_bytes": by_label.get(st.query_params.get("mem_act"), 0)}  # an unknown label: the widget drops it


ensure_navigation()
st.title("Activation memory")
run_views.adopt_run_plan()  # ?run= without a plan: start from the set's (or its traces') layout
memory_choice = plan_form(_toggled(), ask_model=run_views.model_question())
run_views.adoption_note()  # the layout or GPU the plan took from the set, if it did
if memory_choice.computable:
    activation_memory_page(memory_choice)
