"""ZeRO-2/3's gradient reduce-scatters and parameter all-gathers appear in `profiler analyze` under dim dp,
one per layer unit and microbatch, and move the bytes parallel.core.comm predicts.

Real profiled runs of the tiny GPT (gloo, `python -m profiler run`). Units (parallel.engine.zero):
its 4 layers, the token embedding, and the rest (position embedding, final LayerNorm): 6 per rank.
ZeRO-2 reduce-scatters each unit once per microbatch and all-gathers the updated shards once per
step; ZeRO-3 all-gathers each unit before its forward and again before its backward.
"""

import json

import pytest

from parallel.core import comm
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS
from tests.conftest import run_module as run

ACTIVE, UNITS = 1, 6


@pytest.mark.slow
@pytest.mark.parametrize(
    "plan",
    [Plan(dp=2, zero=2, global_batch=4), Plan(dp=2, tp=2, sp=True, zero=3, global_batch=4)],
    ids=lambda p: f"zero{p.zero}",
)
def test_zero_collectives_are_per_unit_under_dp(plan, tmp_path):
    out = tmp_path / "run"
    args = [f"--dp={plan.dp}", f"--tp={plan.tp}", f"--zero={plan.zero}", f"--global-batch={plan.global_batch}"]
    args += ["--sp"] if plan.sp else []
    run("profiler", "run", *args, f"--steps={2 + ACTIVE}", f"--active={ACTIVE}", "--out", str(out))
    rows = [c for c in json.loads(run("profiler", "analyze", str(out), "--json"))["collectives"] if c["dim"] == "dp"]
    per_rank = ACTIVE * plan.world_size
    m = plan.microbatches
    counts = {op: sum(c["count"] for c in rows if c["op"] == op) / per_rank for op in ("reduce_scatter", "all_gather")}
    assert counts["reduce_scatter"] == UNITS * m
    assert counts["all_gather"] == (UNITS * 2 * m if plan.zero == 3 else UNITS)
    # the only all-reduce left is the loss (4 bytes per rank), no gradient bucket
    assert all(c["bytes"] <= 4 * c["count"] for c in rows if c["op"] == "all_reduce")
    cluster = CLUSTERS["local-cpu"].sized_for(plan.world_size)
    predicted = comm.bytes_per_step(comm.comm_per_step(MODELS["tiny"], plan, cluster), "dp")
    measured = sum(c["bytes"] for c in rows if c["op"] != "all_reduce") / per_rank
    assert measured == pytest.approx(predicted, rel=0.02), (measured, predicted)
