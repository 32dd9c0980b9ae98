"""The re-plan loop, small: a real 4-rank job of the tiny GPT under a poor plan (PP4, one microbatch a
stage: mostly bubble) profiled, calibrated from its own run, re-planned, and the recommended plan run
-- through `profiler run --plan` with the plan object `profiler replan --json` printed, and unprofiled
beside the start (bench.replan's loop). The bounds are loose: the other test worker loads the two
cores unevenly (bench.replan measures the figures)."""

from __future__ import annotations

import json

import pytest

from bench.replan import loop
from parallel.core.plan import Plan
from tests.conftest import run_module

pytestmark = pytest.mark.slow


def test_a_poor_plan_is_replanned_and_the_better_plan_runs(tmp_path):
    row = loop("gpt-pp4", "tiny", ["--pp", "4", "--global-batch", "4"], [], tmp_path, launches=1, seconds=1.0)
    assert row["start_label"].startswith("DP1 PP4") and row["recommended"] != row["start_label"]
    assert row["predicted_gain"] > row["error"]  # the bubble of 4 stages a microbatch is there to win
    assert row["recommended_step_s"] > 0 and row["start_step_s"] > 0
    assert row["measured_gain"] > -0.5, row  # never far slower, even on loaded cores
    # the same re-plan from the command line: its best plan object runs as `profiler run --plan`
    out = json.loads(run_module("profiler", "replan", str(tmp_path / "start-gpt-pp4"), "--json", "--top", "1"))
    best = out["plans"][0]["plan"]
    path = tmp_path / "best.json"
    path.write_text(json.dumps(best))
    run_module("profiler", "run", "--plan", str(path), "--model", "tiny", "--steps", "2", "--wait", "0", "--active", "1",
               "--out", str(tmp_path / "best"))  # fmt: skip
    ran = json.loads((tmp_path / "best" / "run.json").read_text())["plan"]
    assert Plan.from_dict(ran) == Plan.from_dict(best)
    report = json.loads(
        run_module("parallel", "plan", "--import", str(path), "--model", "tiny", "--cluster", "local-cpu", "--json")
    )
    assert Plan.from_dict(report["plan"]) == Plan.from_dict(best)
