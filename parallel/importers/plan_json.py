"""ParaScope's own JSON -> model, plan, cluster: `python -m parallel plan --json` output, a review
export (its first plan unless one is named), `{"plan": .., "model": .., "cluster": ..}` with the model
and cluster as objects or preset names, or a bare plan object (the model then comes from the
caller). Keys the dataclasses do not have are listed, not fatal. Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import json

from parallel.core.plan import Plan
from parallel.core.report import REPORT_KEYS
from parallel.core.specs import Cluster, Link, Model, SpecError, cluster_preset, model_preset
from parallel.importers.base import Imported, failure


def _strip(cls, data: dict, where: str, unknown: list[str]) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in sorted(set(data) - names):
        unknown.append(f"{where}.{key}")
    return {k: v for k, v in data.items() if k in names}


def _cluster(value, unknown: list[str]) -> Cluster | None:
    if value is None:
        return None
    if isinstance(value, str):
        return cluster_preset(value)
    data = _strip(Cluster, value, "cluster", unknown)
    for link in ("intra", "inter"):
        if isinstance(data.get(link), dict):
            data[link] = Link(**_strip(Link, data[link], f"cluster.{link}", unknown))
    return Cluster(**data)


def import_plan_json(text: str, source: str = "pasted text", plan_name: str | None = None) -> Imported:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise failure(source, err.lineno, f"not valid JSON: {err.msg} (column {err.colno})", text) from None
    except RecursionError:
        raise failure(source, None, "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise failure(source, 1, f"expected a JSON object, got {type(data).__name__}", text)
    unknown: list[str] = []
    notes: list[str] = []
    name = None
    if isinstance(data.get("plans"), list):  # a review export
        plans = data["plans"]
        if not plans:
            raise failure(source, None, "the review holds no plans")
        names = [p.get("name") for p in plans]
        pick = names.index(plan_name) if plan_name in names else 0
        if plan_name and plan_name not in names:
            raise failure(
                source, None, f"no plan named {plan_name!r} in the review (plans: {', '.join(map(str, names))})"
            )
        if len(plans) > 1:
            notes.append(f"review with {len(plans)} plans ({', '.join(map(str, names))}): {names[pick]!r} imported")
        name = names[pick]
        data = {**data, "plan": plans[pick]["plan"]}
        if isinstance(plans[pick], dict) and plans[pick].get("model"):  # a plan of another model than the review's
            data["model"] = plans[pick]["model"]
    plan_data = (
        data.get("plan") if isinstance(data.get("plan"), dict) else data if "dp" in data or "tp" in data else None
    )
    if plan_data is None:
        raise failure(
            source,
            None,
            'no plan in this JSON: expected {"plan": {...}, "model": ..., "cluster": ...}, '
            "a plan object with dp/tp/pp/..., or a review export",
        )
    bare = plan_data is data
    plan_data = _strip(Plan, plan_data, "plan", unknown)
    if "global_batch" not in plan_data:
        raise failure(source, None, "the plan has no global_batch (sequences per optimizer step)")
    try:
        plan = Plan(**plan_data)
        model_value = None if bare else data.get("model")
        model = (
            model_preset(model_value)
            if isinstance(model_value, str)
            else Model(**_strip(Model, model_value, "model", unknown))
            if isinstance(model_value, dict)
            else None
        )
        cluster = None if bare else _cluster(data.get("cluster"), unknown)
    except (SpecError, TypeError) as err:
        raise failure(source, None, str(err)) from None
    if cluster is not None and isinstance(data.get("nodes"), int):
        cluster = cluster.with_nodes(data["nodes"])
    if model is None:
        notes.append("a bare plan: the model comes from --model")
    known = {
        "plan",
        "model",
        "cluster",
        "nodes",
        "plans",
        "name",
        "verdict",
        "notes",
        "kind",
        "version",
        "title",
        "author",
        "created",
        "id",
        "options",
        "selected",
    }
    report_keys = set(REPORT_KEYS)  # a `parallel plan --json` report read back: its own keys are not unknown
    if not bare:
        unknown += [k for k in data if k not in known | report_keys]
    nodes = cluster.nodes if cluster and cluster.gpus == plan.world_size else None
    return Imported(
        kind="plan-json",
        source=source if not name else f"{source} [{name}]",
        model=model,
        plan=plan,
        world_size=plan.world_size,
        nodes=nodes,
        gpus_per_node=cluster.gpus_per_node if cluster else None,
        cluster=cluster,
        world_from="dp×tp×pp×cp of the plan",
        recognised={k: v for k, v in plan.to_dict().items()},
        unknown=tuple(unknown),
        notes=tuple(notes),
        global_batch=plan.global_batch,
    )
