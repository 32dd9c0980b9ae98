"""parallel.review.refit: a review's plans carried to another model or cluster."""

import pytest

from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS
from parallel.review.document import NamedPlan
from parallel.review.refit import refit_plan, refit_review

H100 = CLUSTERS["dgx-h100"]


@pytest.mark.parametrize(
    "plan, gpus, want",
    [
        (Plan(dp=8, tp=8, pp=8, global_batch=1536), 64, Plan(dp=1, tp=8, pp=8, global_batch=1536)),
        (Plan(dp=8, tp=8, pp=8, global_batch=1536), 1024, Plan(dp=16, tp=8, pp=8, global_batch=1536)),
        # 1536 sequences split over dp 48 x micro batch 2: the global batch stays
        (
            Plan(dp=8, tp=4, pp=2, micro_batch=2, global_batch=1536),
            384,
            Plan(dp=48, tp=4, pp=2, micro_batch=2, global_batch=1536),
        ),
        (Plan(dp=2, tp=8, global_batch=10), 48, Plan(dp=6, tp=8, global_batch=12)),  # nearest multiple of dp x mb
        (Plan(dp=8, tp=8, pp=8, global_batch=1536), 32, Plan(dp=8, tp=8, pp=8, global_batch=1536)),  # cannot: kept
    ],
)
def test_refit_moves_dp_and_keeps_the_batch_where_it_divides(plan, gpus, want):
    assert refit_plan(plan, gpus) == want


def test_refit_review_says_what_changed_and_why_a_plan_does_not_fit():
    plans = (NamedPlan("A", Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)), NamedPlan("B", Plan(tp=7)))
    a, b = refit_review(plans, MODELS["llama3-70b"], H100.with_nodes(8))
    assert a.change == "DP 8 → 1 for 64 GPUs" and a.valid and a.named.plan.world_size == 64
    assert not b.valid and any("tp 7" in e for e in b.errors) and b.nearest  # one-field changes that fit
    assert all(p.tp != 7 for p in b.nearest)
