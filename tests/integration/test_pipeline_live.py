"""The microbatches a pipeline stage holds at its peak, as the engine runs its schedule, equal the plan
model's inflight_chunks (all of a stage's chunks) and embedding_chunks (the first stage's chunk 0,
which alone holds the embedding-dropout masks): the interleaved schedule's peak, measured."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parallel.core.memory import embedding_chunks, inflight_chunks
from parallel.core.plan import Plan

ROOT = Path(__file__).resolve().parents[2]

CASES = {  # name: (pp, vpp, global batch, schedule, layers)
    "1f1b-pp2-m4": (2, 1, 4, "1f1b", 4),
    "gpipe-pp2-m4": (2, 1, 4, "gpipe", 4),
    "interleaved-pp2-v2-m2 (all warm-up)": (2, 2, 2, "1f1b", 4),
    "interleaved-pp2-v2-m8": (2, 2, 8, "1f1b", 4),
    "interleaved-pp4-v2-m16": (4, 2, 16, "1f1b", 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_live_microbatches_equal_the_plan_model(name, tmp_path):
    pp, vpp, gb, schedule, layers = CASES[name]
    cmd = [sys.executable, "-m", "parallel", "train", "--steps", "1", "--out", str(tmp_path)]
    cmd += [f"--pp={pp}", f"--vpp={vpp}", f"--global-batch={gb}", f"--schedule={schedule}", f"--layers={layers}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    plan = Plan(pp=pp, vpp=vpp, global_batch=gb, schedule=schedule)
    for rank, live in metrics["live_microbatches"].items():
        stage = metrics["coords"][rank]["pp"]
        assert live["peak"] == live["predicted_peak"] == inflight_chunks(plan, stage), (rank, live)
        assert len(live["per_chunk"]) == vpp
        if stage == 0:
            assert live["per_chunk"][0] == live["predicted_first_chunk"] == embedding_chunks(plan), (rank, live)
        else:
            assert live["predicted_first_chunk"] is None
    if vpp > 1 and gb > 2 * pp:  # the masks of 2p microbatches, not of all v·p + p - 1 chunks in flight
        assert embedding_chunks(plan) == 2 * pp < inflight_chunks(plan, 0) == vpp * pp + pp - 1
