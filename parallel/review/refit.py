"""A review's plans carried over to another model or cluster: each plan re-fitted to the new GPU count
where its data-parallel degree can absorb the change, and the plans that still do not fit named with
why and the nearest plans that do (parallel.core.validate.nearest_computable).

Pure: stdlib and parallel/ only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Model
from parallel.core.validate import check, nearest_computable
from parallel.review.document import NamedPlan


@dataclass(frozen=True)
class Refit:
    """One plan after a switch: the plan it became, what changed (a sentence, '' for nothing), whether it
    now fits, the errors that stop it, and the nearest plans that would (one-field changes)."""

    named: NamedPlan
    change: str
    valid: bool
    errors: tuple[str, ...]
    nearest: tuple[Plan, ...]


def refit_plan(plan: Plan, gpus: int) -> Plan:
    """`plan` on `gpus` GPUs: dp = gpus / (tp x pp x cp) where that divides, the global batch kept when dp x
    micro batch still divides it, else the nearest multiple of dp x micro batch (the same microbatches per
    pipeline, at least one). The plan unchanged when tp x pp x cp does not divide `gpus`."""
    replica = plan.tp * plan.pp * plan.cp
    if gpus % replica or gpus // replica == plan.dp:
        return plan
    dp = gpus // replica
    per_step = dp * plan.micro_batch
    gb = (
        plan.global_batch
        if plan.global_batch % per_step == 0
        else max(1, round(plan.global_batch / per_step)) * per_step
    )
    return dataclasses.replace(plan, dp=dp, global_batch=gb)


def refit_review(plans: tuple[NamedPlan, ...], model: Model, cluster: Cluster) -> list[Refit]:
    """Every plan of a review carried to `model` on `cluster` (refit_plan), with its verdict there."""
    out = []
    for named in plans:
        trains = named.model_or(model)
        plan = refit_plan(named.plan, cluster.gpus)
        change = ""
        if plan != named.plan:
            change = f"DP {named.plan.dp} → {plan.dp} for {cluster.gpus:,} GPUs" + (
                f", global batch {named.plan.global_batch} → {plan.global_batch}"
                if plan.global_batch != named.plan.global_batch
                else ""
            )
        verdict = check(plan, trains, cluster)
        nearest = tuple(p for _, _, p in nearest_computable(plan, trains)) if not verdict.computable else ()
        out.append(Refit(dataclasses.replace(named, plan=plan), change, verdict.valid, tuple(verdict.errors), nearest))
    return out
