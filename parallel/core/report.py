"""One plan on one cluster, everything the plan model knows about it, as a JSON-ready dict.

`plan_report` is what `python -m parallel plan --json` prints and what the pages show; its keys are
a contract: valid, errors, warnings, world_size, activation_bytes_per_layer,
memory_per_gpu_bytes, ranks, groups, comm_per_step, bubble_fraction, step_time_s. Extra keys carry
the inputs and the breakdowns behind those numbers. Every key is snake_case with its unit in the name
(REPORT_KEYS; docs/json-output.md). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from parallel.core.comm import CommOptions, comm_per_step
from parallel.core.memory import (
    ActivationOptions,
    activation_bytes_per_layer,
    activation_components_bytes,
    memory_per_stage,
)
from parallel.core.perf import PerfOptions, bubble_fraction, step_time
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Model
from parallel.core.topology import DIMS, placed
from parallel.core.validate import check


@dataclass(frozen=True)
class Options:
    """Every modelling assumption in one place (all defaults are the cited papers')."""

    activations: ActivationOptions = field(default_factory=ActivationOptions)
    comm: CommOptions = field(default_factory=CommOptions)
    perf: PerfOptions = field(default_factory=PerfOptions)


# Every top-level key of `python -m parallel plan --json` (docs/json-output.md lists their units): plan_report's,
# then those the command adds (an --import's account; a --calibration's step and where it came from).
REPORT_KEYS = (
    "valid",
    "errors",
    "warnings",
    "world_size",
    "plan",
    "model",
    "cluster",
    "params",
    "activation_bytes_per_layer",
    "activation_components",
    "memory_per_gpu_bytes",
    "memory_per_stage_bytes",
    "ranks",
    "groups",
    "group_counts",
    "crossing_groups",
    "truncated",
    "comm_per_step",
    "bubble_fraction",
    "step_time_s",
    "step_time",
    "imported",
    "analytic_step_time",
    "calibration",
)

# Per-rank rows and groups a report lists; past this the lists hold the first LISTED of each (the
# counts stay whole: group_counts, crossing_groups), so a plan of any size is summarised in bounded
# time and memory. A view that needs a rank's place computes it from the topology.
LISTED = 4096


def _expert_dims(plan: Plan) -> tuple[str, ...]:
    """("ep",) when the plan has expert groups to list (the MoE layers' own layout), else ()."""
    return ("ep",) if plan.ep > 1 else ()


def groups_json(plan: Plan, cluster: Cluster, limit: int = LISTED) -> dict[str, list[dict]]:
    """Each dimension's first `limit` groups, each with its first `limit` ranks, nodes and NVLink
    domains, and its link (inter where it spans domains)."""
    topo = placed(plan, cluster)
    out = {}
    for dim in ("tp", "pp", "dp", "cp", *_expert_dims(plan)):
        rows = topo.group_ranks(dim)[:limit]
        nodes, domains = _distinct_per_row(rows // cluster.gpus_per_node), _distinct_per_row(topo.domain_of(rows))
        out[dim] = [
            {
                "ranks": r[:limit].tolist(),
                "nodes": n[:limit].tolist(),
                "domains": d[:limit].tolist(),
                "link": "inter" if len(d) > 1 else "intra",
            }
            for r, n, d in zip(rows, nodes, domains)
        ]
    return out


def _distinct_per_row(values: np.ndarray) -> list[np.ndarray]:
    """Each row's distinct values, ascending (all rows sorted at once)."""
    values = np.sort(values, axis=1)
    first = np.ones(values.shape, dtype=bool)
    first[:, 1:] = values[:, 1:] != values[:, :-1]
    return [v[f] for v, f in zip(values, first)]


def plan_report(plan: Plan, model: Model, cluster: Cluster, options: Options = Options()) -> dict:
    verdict = check(plan, model, cluster, options.activations)
    out = {
        "valid": verdict.valid,
        "errors": list(verdict.errors),
        "warnings": list(verdict.warnings),
        "world_size": plan.world_size,
        "plan": plan.to_dict(),
        "model": model.to_dict(),
        "cluster": cluster.to_dict(),
        # parameter counts (not bytes), the vocabulary padded for the plan's tp: Model.param_counts
        "params": model.param_counts(plan.tp),
    }
    if not verdict.computable:
        # Numbers from a shape that cannot exist would mislead; the errors say what to fix.
        out.update(
            {
                k: None
                for k in (
                    "activation_bytes_per_layer",
                    "memory_per_gpu_bytes",
                    "ranks",
                    "groups",
                    "comm_per_step",
                    "bubble_fraction",
                    "step_time_s",
                )
            }
        )
        return out
    stages = memory_per_stage(model, plan, options.activations)
    worst = max(stages, key=lambda r: r["total"])
    rows = comm_per_step(model, plan, cluster, options.comm)
    timing = step_time(model, plan, cluster, options.perf, options.comm, options.activations)
    topo = placed(plan, cluster)
    out.update(
        {
            "activation_bytes_per_layer": activation_bytes_per_layer(model, plan, options.activations),
            # one row per saved tensor (parallel.core.memory's names: "attention.qk", ... are values, not keys)
            "activation_components": [
                {"component": name, "bytes_per_layer": value}
                for name, value in activation_components_bytes(model, plan, options.activations).items()
            ],
            "memory_per_gpu_bytes": {k: worst[k] for k in ("params", "grads", "optimizer", "activations", "total")},
            "memory_per_stage_bytes": stages,
            "ranks": topo.rank_table(LISTED),
            "groups": groups_json(plan, cluster),
            "group_counts": {d: topo.group_count(d) for d in (*DIMS, *_expert_dims(plan))},
            "crossing_groups": {d: topo.crossing(d) for d in (*DIMS, *_expert_dims(plan))},
            "truncated": plan.world_size > LISTED,  # ranks and groups list the first LISTED only
            "comm_per_step": rows,
            "bubble_fraction": bubble_fraction(plan),
            "step_time_s": timing["step_time_s"],
            "step_time": timing,
        }
    )
    return out
