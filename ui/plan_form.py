"""The sidebar plan form every plan page shares, kept in the URL so a copied link reopens the view.

    choice = plan_form()           # sidebar widgets + the plan's errors/warnings in the main area
    if choice.computable:
        my_page(choice)            # choice.params (plain strings: cache keys), .model, .cluster, .plan

State: the widgets (keys `plan.<param>` in st.session_state) are the truth while the user edits;
each run re-asserts them so they survive page switches (widget state is per page otherwise) and
writes the full plan into `st.query_params` (ui.plan_params' keys, all of them). A URL whose plan
differs from what this session last wrote — a shared link, or one edited by hand — is adopted into
the widgets; a bad value in it is shown with the plan model's message (never a traceback) and
its key takes the default.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from parallel.core.plan import CP_KINDS, RECOMPUTE, Plan
from parallel.core.specs import CLUSTERS, MODELS, Cluster, GiB, Model, SpecError
from parallel.core.topology import ORDERS
from parallel.core.topology_views import same_order
from parallel.core.validate import nearest_computable
from ui import loaders
from ui.plan_params import (
    DEFAULT_PARAMS,
    FORM_KEYS,
    KEYS,
    OPTIONAL_DEFAULTS,
    gpu_memory_gib,
    plan_from_params,
    plan_to_params,
    usable_params,
)
from ui.text import md

_PREFIX = "plan."
_WRITTEN = "_plan_params_written"  # the plan params this session last put in the URL
_INTS = ("nodes", "gpn", "dp", "tp", "pp", "cp", "mb", "gb", "vpp", "zero", "ep")


@dataclass(frozen=True)
class PlanChoice:
    params: dict[str, str]
    model: Model
    cluster: Cluster
    plan: Plan
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    computable: bool  # False when the model cannot be split this way: nothing can be drawn

    @property
    def label(self) -> str:
        c = self.cluster
        memory = f" of {c.gpu_memory_bytes / GiB:,.1f} GiB" if "gpumem" in self.params else ""
        return (
            f"{self.model.name} on {c.name} {c.nodes}×{c.gpus_per_node} GPUs{memory} · {self.plan.label()} · "
            f"global batch {self.plan.global_batch} · order {self.plan.order}"
        )


def _widget_values(params: dict[str, str]) -> dict[str, object]:
    """Query-param strings -> the widgets' typed values."""
    out: dict[str, object] = {k: int(params[k]) for k in _INTS}
    out.update(
        model=params["model"],
        cluster=params["cluster"],
        sp=params["sp"] in ("1", "true"),
        recompute=params["recompute"],
        order=params["order"],
        ck=params.get("ck", OPTIONAL_DEFAULTS["ck"]),
    )
    return out


def _set_widgets(params: dict[str, str]) -> None:
    for key, value in _widget_values(params).items():
        st.session_state[_PREFIX + key] = value


def _adopt_url() -> list[str]:
    """Put a newly opened or hand-edited URL's plan into the widgets (its usable keys; missing keys
    take their defaults); the messages of its bad values. Otherwise keep the widgets' values,
    re-asserted so that they survive a page switch (widget state is per page)."""
    ss = st.session_state
    url = {k: st.query_params[k] for k in FORM_KEYS if k in st.query_params}
    written = ss.get(_WRITTEN)
    if url and (written is None or any(written.get(k) != v for k, v in url.items())):
        good, errors = usable_params(url)
        model, cluster, plan = plan_from_params(good)
        params = plan_to_params(model.name, cluster.name, cluster.nodes, plan, cluster.gpus_per_node)
        if plan.order not in ORDERS:  # a valid order the form does not list: the listed one equal to it
            params["order"] = next((o for o in ORDERS if same_order(o, plan.order)), DEFAULT_PARAMS["order"])
        _set_widgets(params)
        return errors
    fallback = _widget_values(written or DEFAULT_PARAMS)
    for key, value in fallback.items():
        ss[_PREFIX + key] = ss[_PREFIX + key] if _PREFIX + key in ss else value
    return []


def _fit_nodes(nodes: int) -> None:
    st.session_state[_PREFIX + "nodes"] = nodes


def _reset() -> None:
    _set_widgets(DEFAULT_PARAMS)


def _widgets() -> dict[str, str]:
    sb, k = st.sidebar, _PREFIX
    sb.header("Plan")
    sb.selectbox(
        "Model",
        list(MODELS),
        key=k + "model",
        format_func=lambda n: f"{n} ({MODELS[n].layers} layers, h {MODELS[n].hidden})",
    )
    c0, c1, c2 = sb.columns([4, 2, 2])
    c0.selectbox("Cluster", list(CLUSTERS), key=k + "cluster")
    c1.number_input("Nodes", min_value=1, max_value=65536, step=1, key=k + "nodes")
    c2.number_input(
        "Per node",  # "GPUs/node" wrapped to "GPUs/nod e" in the narrow column
        min_value=1,
        max_value=1024,
        step=1,
        key=k + "gpn",
        help="GPUs (CPU: ranks) per node; the presets have 8",
    )
    c1, c2 = sb.columns(2)
    for i, (dim, title) in enumerate((("dp", "DP"), ("tp", "TP"), ("pp", "PP"), ("cp", "CP"))):
        (c1 if i % 2 == 0 else c2).number_input(
            title,
            min_value=1,
            max_value=65536,
            step=1,
            key=k + dim,
            help={"dp": "data parallel", "tp": "tensor parallel", "pp": "pipeline parallel", "cp": "context parallel"}[
                dim
            ],
        )
    sb.toggle(
        "Sequence parallelism (SP)",
        key=k + "sp",
        help="Megatron SP (Korthikanti et al. 2022): LayerNorm/dropout on s/tp tokens; needs TP > 1",
    )
    c1, c2 = sb.columns(2)
    c1.number_input("Micro batch", min_value=1, max_value=65536, step=1, key=k + "mb")
    c2.number_input(
        "Global batch", min_value=1, max_value=10**7, step=1, key=k + "gb", help="sequences per optimizer step"
    )
    with sb.expander("Schedule, ZeRO, recompute, CP exchange, EP, rank order"):
        st.number_input("Virtual stages per rank (vpp)", min_value=1, max_value=128, step=1, key=k + "vpp")
        st.selectbox(
            "ZeRO stage",
            [0, 1, 2, 3],
            key=k + "zero",
            format_func=lambda z: ["0 (none)", "1 (optimizer)", "2 (+ gradients)", "3 (+ weights)"][z],
        )
        st.selectbox("Activation recompute", list(RECOMPUTE), key=k + "recompute")
        st.selectbox(
            "CP exchange",
            list(CP_KINDS),
            key=k + "ck",
            help="how context parallelism shares the sequence: all-gathered K/V (Llama 3), ring attention "
            "(K/V blocks passed round the CP ring), or Ulysses all-to-all to head shards (cp·tp must divide the heads)",
        )
        st.number_input(
            "Expert parallel (EP)",
            min_value=1,
            max_value=65536,
            step=1,
            key=k + "ep",
            help="MoE models: each MoE layer's experts split over EP ranks taken from DP × CP (adds no GPUs)",
        )
        st.selectbox(
            "Rank order (fastest first)", list(ORDERS), key=k + "order", format_func=lambda o: f"{o} — {ORDERS[o]}"
        )
    ss = st.session_state
    values = {key: ss[k + key] for key in KEYS}
    out = {key: str(int(values[key])) for key in _INTS}
    out.update(
        model=values["model"],
        cluster=values["cluster"],
        sp="1" if values["sp"] else "0",
        recompute=values["recompute"],
        order=values["order"],
    )
    params = {key: out[key] for key in KEYS}
    if ss[k + "ck"] != OPTIONAL_DEFAULTS["ck"]:  # optional key: links of all-gather plans stay as they were
        params["ck"] = ss[k + "ck"]
    return params


def _gpu_memory(params: dict[str, str]) -> list[str]:
    """Keep the URL's `gpumem` (an uploaded job's GPU memory, from its traces) in `params` while the
    cluster stays the one it came with; picking another cluster drops it. The message if it is bad."""
    text = st.query_params.get("gpumem")
    if not text:
        return []
    if st.query_params.get("cluster", params["cluster"]) != params["cluster"]:
        del st.query_params["gpumem"]
        return []
    try:
        gib = gpu_memory_gib(text)
    except SpecError as err:
        del st.query_params["gpumem"]
        return [str(err)]
    params["gpumem"] = text
    st.sidebar.caption(
        f"GPU memory: {gib:,.1f} GiB per GPU, the job's own (from its traces), not {params['cluster']}'s; "
        "pick a cluster to use a preset's."
    )
    return []


def plan_form(activations: dict | None = None) -> PlanChoice:
    """Sidebar form + URL sync; shows the plan's errors and warnings at the top of the page.
    `activations`: loaders.verdict's flash / dropout / act_bytes, when the page draws its numbers
    with other activation assumptions than the defaults (its memory check then uses the same)."""
    url_errors = _adopt_url()
    params = _widgets()
    url_errors += _gpu_memory(params)
    if any(st.query_params.get(k) != v for k, v in params.items()):
        st.query_params.update(params)
    if "ck" not in params and "ck" in st.query_params:
        del st.query_params["ck"]
    st.session_state[_WRITTEN] = params
    try:
        model, cluster, plan = plan_from_params(params)  # the widgets only offer legal values
    except SpecError as err:  # ... but a traceback must never reach the user
        st.error(f"This plan cannot be built: {md(err)}. Showing the default plan.")
        params = dict(DEFAULT_PARAMS)
        model, cluster, plan = plan_from_params(params)
    verdict = loaders.verdict(params, **(activations or {}))
    choice = PlanChoice(
        params, model, cluster, plan, tuple(verdict["errors"]), tuple(verdict["warnings"]), verdict["computable"]
    )
    st.sidebar.button("Reset to the default plan", on_click=_reset, width="stretch", key="plan_reset")
    st.sidebar.caption("The URL holds this plan: copy it to share the view.")
    st.caption(choice.label)
    for message in url_errors:
        st.error(f"The link has a value that cannot be used: {md(message)}. Using the default for it.")
    for message in choice.errors:
        st.error(md(message))
    if plan.world_size != cluster.gpus:
        need = -(-plan.world_size // cluster.gpus_per_node)
        if need * cluster.gpus_per_node == plan.world_size:
            st.button(
                f"Use {need} nodes ({need}×{cluster.gpus_per_node} = {plan.world_size} GPUs)",
                on_click=_fit_nodes,
                args=(need,),
                key="plan_fit_nodes",
            )
    for message in choice.warnings:
        st.warning(md(message))
    if not choice.computable:
        _offer_fixes(model, cluster, plan)
    return choice


_FORM_KEY_OF = {"micro_batch": "mb", "global_batch": "gb", "cp_kind": "ck"}  # Plan field -> form key


def _apply_fix(key: str, value, nodes: int) -> None:
    st.session_state[_PREFIX + key] = value
    st.session_state[_PREFIX + "nodes"] = nodes


def _offer_fixes(model: Model, cluster: Cluster, plan: Plan) -> None:
    """The model cannot be split this way: the nearest plans that can, one click each (the nodes follow
    when the GPU count changes)."""
    fixes = nearest_computable(plan, model)
    st.info(
        "The model cannot be split this way, so there is nothing to draw: "
        + (
            "pick a nearby plan below, or change the plan in the sidebar."
            if fixes
            else "change the plan in the sidebar."
        )
    )
    if not fixes:
        return
    cols = st.columns(len(fixes))
    for col, (name, value, fixed) in zip(cols, fixes):
        key = _FORM_KEY_OF.get(name, name)
        nodes = max(cluster.nodes, -(-fixed.world_size // cluster.gpus_per_node))
        if fixed.world_size != plan.world_size:
            nodes = -(-fixed.world_size // cluster.gpus_per_node)
        shown = {"sp": "SP on" if value else "SP off"}.get(name, f"{key.upper()} {value}")
        more = f" on {nodes} nodes" if fixed.world_size != plan.world_size else ""
        col.button(
            f"Use {shown}{more}",
            key=f"plan_fix_{name}_{value}",
            on_click=_apply_fix,
            args=(key, value, nodes),
            help=f"{fixed.label()}: {fixed.world_size:,} GPUs",
        )
