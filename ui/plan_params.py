"""A plan on a cluster <-> URL query parameters, so a copied dashboard URL reopens the same plan.

Keys (all values are strings, as in `st.query_params`):

    model     preset name (parallel.specs.MODELS)        cluster   preset name (parallel.specs.CLUSTERS)
    nodes     nodes of the cluster                       dp tp pp cp   parallel degrees
    sp        0 | 1 (Megatron sequence parallelism)      mb gb     micro batch, global batch (sequences)
    vpp       virtual pipeline stages per rank           zero      ZeRO stage 0-3
    recompute none | selective | full                    order     rank order, fastest first

A missing key takes DEFAULT_PARAMS' value, except `nodes`, which then fits the plan (just enough
nodes for dp*tp*pp*cp GPUs). Pure: stdlib and parallel/ only (no streamlit).
"""

from __future__ import annotations

from collections.abc import Mapping

from parallel.plan import Plan
from parallel.specs import Cluster, Model, SpecError, cluster_preset, model_preset

KEYS = ("model", "cluster", "nodes", "dp", "tp", "pp", "cp", "sp", "mb", "gb", "vpp", "zero", "recompute", "order")
_INT_FIELDS = {"dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "mb": "micro_batch", "gb": "global_batch",
               "vpp": "vpp", "zero": "zero"}

# The dashboard's opening plan: GPT-3 175B on 64 DGX H100 nodes, Megatron-style 8-way TP inside each
# node with SP, 8 pipeline stages, 8-way DP, batch 1536 (Narayanan et al. 2021, Table 1's 175B row).
DEFAULT_PARAMS: dict[str, str] = {
    "model": "gpt3-175b", "cluster": "dgx-h100", "nodes": "64", "dp": "8", "tp": "8", "pp": "8", "cp": "1",
    "sp": "1", "mb": "1", "gb": "1536", "vpp": "1", "zero": "0", "recompute": "none", "order": Plan().order,
}


def plan_to_params(model_name: str, cluster_name: str, nodes: int, plan: Plan) -> dict[str, str]:
    """The query parameters of a plan: every key of KEYS, as strings."""
    return {
        "model": model_name, "cluster": cluster_name, "nodes": str(int(nodes)),
        "dp": str(plan.dp), "tp": str(plan.tp), "pp": str(plan.pp), "cp": str(plan.cp),
        "sp": "1" if plan.sp else "0", "mb": str(plan.micro_batch), "gb": str(plan.global_batch),
        "vpp": str(plan.vpp), "zero": str(plan.zero), "recompute": plan.recompute, "order": plan.order,
    }


def _value(params: Mapping, key: str) -> str | None:
    value = params.get(key)
    if isinstance(value, (list, tuple)):  # parse_qs style {key: [values]}: the last one wins, as in st.query_params
        value = value[-1] if value else None
    return None if value is None else str(value).strip()


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"URL parameter {key}={text!r} must be an integer") from None


def plan_from_params(params: Mapping) -> tuple[Model, Cluster, Plan]:
    """The model, cluster (with its nodes) and plan a URL names; SpecError with a clear message if bad.

    Unknown keys are ignored (pages keep their own view state beside the plan)."""
    given = {k: v for k in KEYS if (v := _value(params, k)) not in (None, "")}
    values = {**DEFAULT_PARAMS, **given}
    model = model_preset(values["model"])
    cluster = cluster_preset(values["cluster"])
    sp = values["sp"].lower()
    if sp not in ("0", "1", "true", "false"):
        raise SpecError(f"URL parameter sp={values['sp']!r} must be 0 or 1")
    fields = {name: _int(key, values[key]) for key, name in _INT_FIELDS.items()}
    plan = Plan(**fields, sp=sp in ("1", "true"), recompute=values["recompute"], order=values["order"])
    if "nodes" in given:
        nodes = _int("nodes", given["nodes"])
        if nodes < 1:
            raise SpecError(f"URL parameter nodes={nodes} must be at least 1")
    else:
        nodes = max(1, -(-plan.world_size // cluster.gpus_per_node))
    cluster = cluster.with_nodes(nodes)
    return model, cluster, plan


def usable_params(params: Mapping) -> tuple[dict[str, str], list[str]]:
    """The plan keys of `params` that can be used on their own, and a message for each that cannot
    (so a link with one bad value still opens with the rest of its plan)."""
    good, errors = {}, []
    for key in KEYS:
        value = _value(params, key)
        if value in (None, ""):
            continue
        try:
            plan_from_params({key: value})
        except SpecError as err:
            errors.append(str(err))
        else:
            good[key] = value
    return good, errors
