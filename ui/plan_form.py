"""The sidebar plan form every plan page shares, kept in the URL so a copied link reopens the view.

    choice = plan_form()           # sidebar widgets + the plan's errors/warnings in the main area
    if choice.computable:
        my_page(choice)            # choice.params (plain strings: cache keys), .model, .cluster, .plan

    choice = plan_form(ask_model=run_views.model_question())   # a job whose model is unknown:
    choice.model_known             # False until the user picks one; then nothing depends on a stand-in

State: the widgets (keys `plan.<param>` in st.session_state) are the truth while the user edits;
each run re-asserts them so they survive page switches (widget state is per page otherwise) and
writes the full plan into `st.query_params` (parallel.review.urls' keys, all of them). A URL whose plan
differs from what this session last wrote — a shared link, or one edited by hand — is adopted into
the widgets; a bad value in it is shown with the plan model's message (never a traceback) and
its key takes the default.

A job whose model ParaScope does not know (an uploaded trace set, `?run=upload:NAME`) opens without a
`model` in the URL: the form then asks for the model first, at the top of the page, and shows no memory,
time or verdict until one is picked (the plan's layout, which needs no model, stays usable).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from parallel.core.plan import NO_OFFLOAD, PLAN_FIELDS, Plan, parse_value
from parallel.core.rank_grid import same_order
from parallel.core.specs import CLUSTERS, MODELS, Cluster, GiB, Model, SpecError
from parallel.core.topology import ORDERS
from parallel.core.validate import nearest_computable
from parallel.review.urls import (
    ASSUMPTION_KEYS,
    DEFAULT_PARAMS,
    KEYS,
    PLAN_KEYS,
    assumption_of,
    assumption_params,
    gpu_memory_gib,
    plan_from_params,
    plan_to_params,
    usable_params,
)
from ui import loaders
from ui.text import md

_PREFIX = "plan."
_WRITTEN = "_plan_params_written"  # the plan params this session last put in the URL
_SPEC = {spec.knob.url: spec for spec in PLAN_FIELDS}
_MAIN = ("dp", "tp", "pp", "cp", "sp", "mb", "gb")  # drawn in the form's first rows; the rest by section
_SECTIONS = {  # the schema's groups (Knob.group) as the form's expanders
    "plan": "Schedule, ZeRO, recompute, experts, rank order, kernels",
    "overlap": "Overlap (communication under compute)",
    "stages": "Uneven pipeline stages",
}
SETTINGS_SECTION = _SECTIONS["plan"]  # where the sidebar keeps recompute, offload and the attention kernel
_UNSET = "default"  # an optional field's "not set" choice in a selectbox
_ASK = "plan_ask_model"  # the main area's model picker, drawn while the job's model is unknown


@dataclass(frozen=True)
class PlanChoice:
    params: dict[str, str]
    model: Model
    cluster: Cluster
    plan: Plan
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    computable: bool  # False when the model cannot be split this way (or is unknown): nothing can be drawn
    model_known: bool = True  # False: the job's model is unknown and none is picked; `model` is a placeholder

    @property
    def label(self) -> str:
        c = self.cluster
        memory = f" of {c.gpu_memory_bytes / GiB:,.1f} GiB" if "gpumem" in self.params else ""
        model = self.model.name if self.model_known else "model unknown"
        return f"{model} on {c.name} {c.nodes}×{c.gpus_per_node} GPUs{memory} · {self.plan.label()}"


def saved_text(plan: Plan) -> str:
    """What the plan keeps for backward, in the words the pages' captions use: its recompute mode with
    the modules a selective one recomputes, the modules it offloads and its attention kernel, e.g.
    'recompute selective of core_attn+mlp, attn_norm+mlp_norm offloaded, fa2 attention'."""
    offload = f", {plan.offload_modules} offloaded" if plan.offload_modules != NO_OFFLOAD else ""
    return f"{recompute_text(plan)}{offload}, {plan.attention} attention"


def recompute_text(plan: Plan) -> str:
    """'recompute selective of core_attn+mlp', 'recompute full of 8 layers a stage', 'recompute none'."""
    modules = f" of {plan.recompute_modules}" if plan.recompute == "selective" else ""
    layers = f" of {plan.recompute_layers} layers a stage" if plan.recompute == "full" and plan.recompute_layers else ""
    return f"recompute {plan.recompute}{modules}{layers}"


def _widget_values(params: dict[str, str]) -> dict[str, object]:
    """Query-param strings (a whole plan, as plan_to_params writes it) -> the widgets' typed values."""
    _, _, plan = plan_from_params(params)
    out: dict[str, object] = {
        "model": params.get("model"),  # None: the job's model is unknown (see plan_form's ask_model)
        "cluster": params["cluster"],
        "nodes": int(params["nodes"]),
        "gpn": int(params["gpn"]),
        "nvl": int(params["nvl"]) if params.get("nvl") else None,  # None: the preset's domain (or one host)
        # the step model's assumptions, as Plan review's "Modelling assumptions" (absent: the model's own)
        "compute": "mfu" if params.get("mfu") else "device",
        "mfu": float(params.get("mfu") or 0.5),
        "dp_fixed": bool(params.get("dp_overlap")),
        "dp_overlap": float(params.get("dp_overlap") or 0.0),
    }
    for key, spec in _SPEC.items():
        value = getattr(plan, spec.name)
        out[key] = _UNSET if value is None and spec.kind in ("opt_bool",) else value
    return out


def _set_widgets(params: dict[str, str]) -> None:
    for key, value in _widget_values(params).items():
        st.session_state[_PREFIX + key] = value


def _adopt_url(model_unknown: bool) -> list[str]:
    """Put a newly opened or hand-edited URL's plan into the widgets (its usable keys; missing keys
    take their defaults, but no model when `model_unknown`); the messages of its bad values. Otherwise
    keep the widgets' values, re-asserted so that they survive a page switch (widget state is per page)."""
    ss = st.session_state
    url = {k: st.query_params[k] for k in (*KEYS, *ASSUMPTION_KEYS) if k in st.query_params}
    written = ss.get(_WRITTEN)
    if url and (written is None or any(written.get(k) != v for k, v in url.items()) or set(url) - set(written)):
        good, errors = usable_params(url)
        try:
            model, cluster, plan = plan_from_params(good)
        except SpecError as err:  # each value is good alone, together they are not (e.g. rcl without full)
            errors.append(str(err))
            model, cluster, plan = plan_from_params({k: v for k, v in good.items() if k not in PLAN_KEYS})
        params = plan_to_params(
            model.name, cluster.name, cluster.nodes, plan, cluster.gpus_per_node, nvlink_domain=cluster.nvlink_domain
        )
        if plan.order not in ORDERS:  # a valid order the form does not list: the listed one equal to it
            params["order"] = next((o for o in ORDERS if same_order(o, plan.order)), DEFAULT_PARAMS["order"])
        for key in ASSUMPTION_KEYS:
            if key in url:
                try:
                    assumption_of(key, url[key])
                    params[key] = url[key]
                except SpecError as err:
                    errors.append(str(err))
        _set_widgets(params)
        if model_unknown and "model" not in url:
            ss[_PREFIX + "model"] = None
        return errors
    fallback = _widget_values(written or DEFAULT_PARAMS)
    for key, value in fallback.items():
        ss[_PREFIX + key] = ss[_PREFIX + key] if _PREFIX + key in ss else value
    if ss[_PREFIX + "model"] is None and not model_unknown:  # left a job's page for plain planning
        ss[_PREFIX + "model"] = DEFAULT_PARAMS["model"]
    return []


def _fit_nodes(nodes: int) -> None:
    st.session_state[_PREFIX + "nodes"] = nodes


def _preset_hosts() -> None:
    """A picked cluster brings its own hosts and NVLink domain (4 GPUs a host, 72 a domain on an NVL72)."""
    ss = st.session_state
    ss[_PREFIX + "gpn"] = CLUSTERS[ss[_PREFIX + "cluster"]].gpus_per_node
    ss[_PREFIX + "nvl"] = None


def _reset() -> None:
    _set_widgets(DEFAULT_PARAMS)


def _field_widget(where, key: str) -> None:
    """One plan field's widget, from its declaration: a toggle for a flag, a selectbox for choices (and
    an optional flag: default / on / off), a number input for an integer (empty: unset)."""
    spec, k = _SPEC[key], _PREFIX + key
    knob = spec.knob
    if spec.kind == "bool":
        where.toggle(knob.column, key=k, help=knob.help)
    elif spec.kind == "opt_bool":
        where.selectbox(
            knob.column,
            [_UNSET, True, False],
            key=k,
            help=knob.help,
            format_func=lambda v: "the model's" if v == _UNSET else "on" if v else "off",
        )
    elif spec.kind == "choice":
        where.selectbox(knob.column, list(knob.choices), key=k, help=knob.help)
    elif spec.name == "order":  # the rank order: the listed ones
        where.selectbox(knob.column, list(ORDERS), key=k, help=knob.help, format_func=lambda o: f"{o} — {ORDERS[o]}")
    elif spec.kind == "text":  # module lists (recompute, offload): the plan checks the names
        where.text_input(knob.column, key=k, help=knob.help)
    elif spec.kind == "opt_float":
        where.number_input(knob.column, min_value=0.0, step=0.05, key=k, help=knob.help, placeholder="default")
    else:
        optional = spec.kind == "opt_int"
        where.number_input(
            knob.column,
            min_value=knob.lo if knob.lo is not None else 0,
            max_value=knob.hi or 1 << 24,
            step=1,
            key=k,
            help=knob.help + (" (empty: the default)" if optional else ""),
            placeholder="default" if optional else None,
        )


def _widgets() -> dict[str, str]:
    sb, k = st.sidebar, _PREFIX
    sb.header("Plan")
    sb.selectbox(
        "Model",
        list(MODELS),
        key=k + "model",
        format_func=_model_text,
        placeholder="unknown: pick the job's model",
    )
    c0, c1, c2 = sb.columns([4, 2, 2])
    c0.selectbox("Cluster", list(CLUSTERS), key=k + "cluster", on_change=_preset_hosts)
    c1.number_input("Nodes", min_value=1, max_value=65536, step=1, key=k + "nodes")
    c2.number_input(
        "Per node",  # "GPUs/node" wrapped to "GPUs/nod e" in the narrow column
        min_value=1,
        max_value=1024,
        step=1,
        key=k + "gpn",
        help="GPUs (CPU ranks) per node; picking a cluster sets its own (8 on a DGX, 4 on an NVL72 rack)",
    )
    sb.number_input(
        "NVLink domain (GPUs)",
        value=None,  # clearable: empty is the cluster's own
        min_value=1,
        max_value=1 << 20,
        step=1,
        key=k + "nvl",
        placeholder=f"{own} GPUs" if (own := CLUSTERS[st.session_state[k + "cluster"]].nvlink_domain) else "one node",
        help="GPUs sharing one NVLink fabric, whole hosts (a multiple of the GPUs per node); "
        "empty: the cluster's own (72 on an NVL72 rack, else one host)",
    )
    c1, c2 = sb.columns(2)
    for i, key in enumerate(("dp", "tp", "pp", "cp")):
        _field_widget(c1 if i % 2 == 0 else c2, key)
    _field_widget(sb, "sp")
    c1, c2 = sb.columns(2)
    _field_widget(c1, "mb")
    _field_widget(c2, "gb")
    for group, title in _SECTIONS.items():
        with sb.expander(title):
            for key, spec in _SPEC.items():
                if key not in _MAIN and spec.knob.group == group:
                    _field_widget(st, key)
    _assumption_widgets(sb)
    ss = st.session_state
    values = {}
    for key, spec in _SPEC.items():
        value = ss[k + key]
        values[key] = None if value == _UNSET or (value is None and spec.kind == "opt_int") else value
    model = ss[k + "model"]  # None: the job's model is unknown
    gpn, domain = int(ss[k + "gpn"]), None if ss[k + "nvl"] is None else int(ss[k + "nvl"])
    try:  # the hosts and the NVLink domain as the Cluster takes them (a domain is whole hosts)
        plan_from_params({"cluster": ss[k + "cluster"], "gpn": str(gpn), "nvl": str(domain or "")})
    except SpecError as err:
        st.sidebar.error(f"{md(err)}. Using {ss[k + 'cluster']}'s own hosts and NVLink domain.")
        gpn, domain = CLUSTERS[ss[k + "cluster"]].gpus_per_node, None
    try:
        plan = Plan(**{_SPEC[key].name: parse_value(_SPEC[key], v) for key, v in values.items()})
    except SpecError as err:  # each widget offers legal values only; some combinations are not
        st.sidebar.error(md(err))
        plan = plan_from_params(DEFAULT_PARAMS)[2]
    params = plan_to_params(
        model or DEFAULT_PARAMS["model"],
        ss[k + "cluster"],
        int(ss[k + "nodes"]),
        plan,
        gpn,
        nvlink_domain=domain,
    )
    if model is None:  # no stand-in's name in the URL: a copied link still asks for the model
        del params["model"]
    mfu = float(ss[k + "mfu"]) if ss[k + "compute"] == "mfu" else None
    return {**params, **assumption_params(mfu, float(ss[k + "dp_overlap"]) if ss[k + "dp_fixed"] else None)}


def _assumption_widgets(sb) -> None:
    """The step model's assumptions, as Plan review's: its links carry them (`mfu`, `dp_overlap`)."""
    k = _PREFIX
    with sb.expander("Modelling assumptions"):
        compute = st.radio(
            "Compute",
            ["device", "mfu"],
            key=k + "compute",
            format_func={"device": "per operator, on the device", "mfu": "one MFU for everything"}.get,
            help="per operator: each GEMM, the attention core and the element-wise traffic timed from its shape "
            "on the cluster's GPU (parallel.core.compute); one MFU: every FLOP at this fraction of the GPU's peak",
        )
        st.slider("MFU", 0.1, 1.0, step=0.05, key=k + "mfu", disabled=compute != "mfu")
        fixed = st.toggle(
            "Fixed DP overlap", key=k + "dp_fixed", help="off: the plan's own grad-reduce / param-gather overlap"
        )
        st.slider(
            "DP overlap",
            0.0,
            1.0,
            step=0.05,
            key=k + "dp_overlap",
            disabled=not fixed,
            help="fraction of gradient reduction hidden behind backward",
        )


def _model_text(name: str) -> str:
    return f"{name} ({MODELS[name].layers} layers, h {MODELS[name].hidden})"


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


def plan_form(activations: dict | None = None, *, ask_model: str | None = None) -> PlanChoice:
    """Sidebar form + URL sync; shows the plan's memory per GPU and step time (as Plan review and `python
    -m parallel plan` give them) and its errors and warnings at the top of the page. `activations`:
    loaders.verdict's act_bytes, when the page draws its numbers with another bytes per activation than
    the model's (its memory check then uses the same). `ask_model`: why the job's model is unknown
    (ui.run_views.model_question); until a model is picked the form asks for it first and shows no
    number, error or warning that would come from a stand-in (choice.model_known is False)."""
    url_errors = _adopt_url(ask_model is not None)
    params = _widgets()
    known = "model" in params
    url_errors += _gpu_memory(params)
    if any(st.query_params.get(k) != v for k, v in params.items()):
        st.query_params.update(params)
    for key in (*KEYS, *ASSUMPTION_KEYS):  # a field back at its default leaves the link
        if key not in params and key in st.query_params:
            del st.query_params[key]
    st.session_state[_WRITTEN] = params
    try:
        model, cluster, plan = plan_from_params(params)  # the widgets only offer legal values
    except SpecError as err:  # ... but a traceback must never reach the user
        st.error(f"This plan cannot be built: {md(err)}. Showing the default plan.")
        params = dict(DEFAULT_PARAMS)
        model, cluster, plan = plan_from_params(params)
    if known:
        verdict = loaders.verdict(params, **(activations or {}))
    else:  # a stand-in's memory check or split errors would read as the job's
        verdict = {"errors": [], "warnings": [], "computable": False}
    choice = PlanChoice(
        params,
        model,
        cluster,
        plan,
        tuple(verdict["errors"]),
        tuple(verdict["warnings"]),
        verdict["computable"],
        model_known=known,
    )
    st.sidebar.button("Reset to the default plan", on_click=_reset, width="stretch", key="plan_reset")
    st.sidebar.caption("The URL holds this plan: copy it to share the view.")
    if not known:
        _ask_for_model(ask_model or "The job's model is unknown.")
    st.caption(choice.label)
    if choice.computable:
        _plan_numbers(params)
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
    if known and not choice.computable:
        _offer_fixes(model, cluster, plan)
    return choice


def _pick_model() -> None:
    st.session_state[_PREFIX + "model"] = st.session_state[_ASK]


def _ask_for_model(why: str) -> None:
    """The page's first words while the job's model is unknown, and the picker that ends it."""
    st.warning(
        f"**Which model did this job train?** {md(why)} Memory per GPU, step time and what fits depend on the "
        "model, so this page shows none of them until you pick it, below or in the sidebar (the closest preset "
        "if it is none of them)."
    )
    st.selectbox(
        "The job's model",
        list(MODELS),
        index=None,
        key=_ASK,
        on_change=_pick_model,
        format_func=_model_text,
        placeholder="Pick the job's model",
    )


def _plan_numbers(params: dict[str, str]) -> None:
    """The plan's headline numbers, the same on every plan page and in Plan review."""
    n = loaders.plan_numbers(params)
    if n["memory_per_gpu_bytes"] is None:
        return
    c1, c2, c3 = st.columns(3)
    c1.metric("Memory per GPU", f"{n['memory_per_gpu_bytes'] / GiB:,.1f} GiB", help="the most loaded pipeline stage")
    c2.metric("Step time", f"{n['step_time_s']:,.3f} s", help="parallel.core.perf's step model, as Plan review's")
    c3.metric("MFU", f"{n['mfu']:.1%}" if n["mfu"] is not None else "—")


_FORM_KEY_OF = {spec.name: spec.knob.url for spec in PLAN_FIELDS}  # Plan field -> form key


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
