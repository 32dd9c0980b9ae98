"""Each CP exchange's collectives appear in `profiler analyze` under dim cp with the right op, and the
bytes a rank moves per step equal parallel.core.comm's prediction.

Real profiled runs of tiny-llama (gloo, `python -m profiler run`): all-gather -> all_gather +
reduce_scatter, ring -> send/recv, Ulysses -> all_to_all; the bytes come from the trace's own labels.
"""

import json

import pytest

from parallel.core import comm
from parallel.core.engine_plan import engine_plan
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS
from tests.conftest import run_module as run

ACTIVE, GLOBAL_BATCH = 1, 2
OPS = {"allgather": {"all_gather", "reduce_scatter"}, "ring": {"send", "recv"}, "ulysses": {"all_to_all"}}
MOVED = {"all_gather", "reduce_scatter", "all_to_all", "send"}  # a recv is the other end of a send


@pytest.mark.slow
@pytest.mark.parametrize(
    "plan",
    [
        Plan(cp=2, cp_kind="allgather", global_batch=GLOBAL_BATCH),
        Plan(cp=2, tp=2, sp=True, cp_kind="ring", global_batch=GLOBAL_BATCH),
        Plan(cp=4, cp_kind="ulysses", global_batch=GLOBAL_BATCH),
    ],
    ids=lambda p: p.cp_kind,
)
def test_cp_collectives_are_labelled_and_sized_as_the_model_says(plan, tmp_path):
    out = tmp_path / "run"
    args = ["--model=tiny-llama", f"--cp={plan.cp}", f"--tp={plan.tp}", f"--cp-kind={plan.cp_kind}"]
    args += [f"--global-batch={plan.global_batch}"] + (["--sp"] if plan.sp else [])
    run("profiler", "run", *args, f"--steps={2 + ACTIVE}", f"--active={ACTIVE}", "--out", str(out))
    rows = [c for c in json.loads(run("profiler", "analyze", str(out), "--json"))["collectives"] if c["dim"] == "cp"]
    assert {c["op"] for c in rows} == OPS[plan.cp_kind]
    cluster = CLUSTERS["local-cpu"].sized_for(plan.world_size)
    ran = engine_plan(plan, dropout=0.0)  # the engine's materialised attention keeps the gathered K/V
    predicted = comm.bytes_per_step(comm.comm_per_step(MODELS["tiny-llama"], ran, cluster), "cp")
    measured = sum(c["bytes"] for c in rows if c["op"] in MOVED) / ACTIVE / plan.world_size
    assert measured == pytest.approx(predicted, rel=0.05), (rows, predicted)
