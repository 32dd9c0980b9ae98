"""bench.published (the step model against published GPU runs) and bench.gpu_kernels' offline
comparison: the translation of a run into a plan, what is refused and why, and -- where the
shared published runs are at hand -- the goal the model is held to."""

import json
from pathlib import Path

import pytest

from bench import gpu_kernels, published
from parallel.core import compute
from parallel.core.devices import DEVICES

RUNS = Path(__file__).resolve().parents[3] / "shared" / "published_runs.json"


def run(**over):
    base = {
        "source": {"repo_file": "NVIDIA/NeMo docs/source/performance/performance_summary.md", "row": "x"},
        "hardware": {"gpu": "H100 80GB SXM (DGX-H100)", "gpus_per_node": 8},
        "model": {
            "name": "LLAMA3-8B",
            "arch": "Llama",
            "layers": 32,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "ffn_hidden": 14336,
            "vocab": 128256,
            "seq_len": 8192,
        },
        "parallel": {
            "num_gpus": 8,
            "tp": 1,
            "pp": 1,
            "vp": 1,
            "cp": 1,
            "ep": 1,
            "micro_batch": 1,
            "global_batch": 128,
            "precision": "FP8",
            "recompute": None,
            "optimizer_sharding": None,
            "overlap_flags": None,
            "sequence_parallel": None,
            "other": None,
        },
        "result": {"tokens_per_s_per_gpu": 14000, "iteration_time_s": None, "tflops_per_gpu": None, "other": None},
        "notes": "",
    }
    for key, value in over.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) else value
    return base


def test_a_run_becomes_its_frameworks_plan_and_a_step_time():
    case = published.translate(0, run())
    p = case.plan
    assert (p.dp, p.tp, p.zero, p.fp8, p.grad_reduce_overlap, p.param_gather_overlap) == (8, 1, 1, "gemm", True, True)
    assert case.measured_step_s == pytest.approx(128 * 8192 / (14000 * 8))
    row = published.predict(case)
    assert row["error"] == pytest.approx(case.measured_step_s / row["predicted_step_s"] - 1)
    assert any("Megatron-core performance recipe" in a for a in row["assumptions"])


@pytest.mark.parametrize(
    "over,reason",
    [
        ({"parallel": {"tp": None}}, "parallel degrees not given"),
        ({"hardware": {"gpu": "H100 SXM 96GB HBM2e, 500W power limit"}}, "power-capped"),
        ({"result": {"tokens_per_s_per_gpu": None}}, "not convertible"),
        ({"notes": "Early ramp-up (GBS=16)"}, "not a steady-state"),
        ({"model": {"name": "Mystery", "ffn_hidden": None}}, "no known config"),
    ],
)
def test_incomplete_runs_are_left_out_with_the_reason(over, reason):
    with pytest.raises(published.Skip, match=reason):
        published.translate(0, run(**over))


@pytest.mark.skipif(not RUNS.is_file(), reason="../shared/published_runs.json not present")
def test_the_model_meets_its_goal_on_the_published_runs(capsys):
    assert published.main(["--runs", str(RUNS), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    overall = out["summary"]["overall"]
    assert overall["runs"] >= 40
    assert overall["mean_abs_error"] <= 0.10 and overall["worst_abs_error"] <= 0.20


def test_gpu_kernels_compares_offline_against_the_model():
    dev = DEVICES["h200-sxm"]
    shapes = [(8192, 8192, 8192), (4096, 14336, 4096)]
    data = {
        "device": "synthetic",
        "sms": 132,
        "torch": "-",
        "gemm_grid": [
            {"m": m, "n": n, "k": k, "seconds": float(compute.gemm_seconds(dev, m, n, k))} for m, n, k in shapes
        ],
        "gemm_layers": [],
        "fp8_grid": [{"m": 8192, "n": 8192, "k": 8192, "seconds": 1e-6}],  # implausibly fast: ratio far from 1
    }
    lines = gpu_kernels.compare(data, dev)
    grid = next(x for x in lines if x.startswith("gemm_grid"))
    assert "median 1.00" in grid and "2 points" in grid
    assert "shorter than 30 us left out" in next(x for x in lines if x.startswith("fp8_grid"))


def test_rank_finds_the_runs_plan_and_a_top_plan_no_slower_than_it():
    short = run(model={"seq_len": 2048})  # at 8192 tokens this plan does not fit without recompute
    case = published.translate(0, short)
    r = published.rank_of(case)
    assert r["rank"] is not None and 1 <= r["rank"] <= r["of"]
    assert r["top_step_s"] <= published.predict(case)["predicted_step_s"] * 1.0001
    assert r["gain"] == pytest.approx(case.measured_step_s / r["top_step_s"] - 1)
    lines = published.rank_lines([short], None)
    assert lines[1].split()[0] == "0" and "faster than measured" in lines[-1]
