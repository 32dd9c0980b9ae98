"""`python -m profiler analyze`: the --json contract (keys, counts, units) and the text report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.cli.analyze import main
from tests.support import trace_samples as ts

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "world_size",
    "ranks",
    "steps",
    "collectives",
    "per_rank",
    "stragglers",
    "rank_step_heat",
    "skew",
    "tp_measured",
]


@pytest.fixture
def pair_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "set").mkdir()
    for rank, t in enumerate(ts.gpu_pair()):
        ts.write(tmp_path / "set" / f"rank{rank}_trace.json.gz", t)
    return tmp_path / "set"


def test_json_contract(pair_dir, capsys):
    assert main([str(pair_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == KEYS
    assert (out["world_size"], out["ranks"], out["steps"]) == (2, [0, 1], [1])
    assert out["collectives"] == [
        {"op": "all_reduce", "dim": "tp", "count": 2, "bytes": 8000, "time_us": 550.0}
    ]  # one kernel per rank: 300 + 250 us
    assert out["per_rank"] == [
        {"rank": 0, "compute_us": 300.0, "comm_us": 300.0, "exposed_comm_us": 200.0, "idle_us": 50.0},
        {"rank": 1, "compute_us": 300.0, "comm_us": 250.0, "exposed_comm_us": 200.0, "idle_us": 50.0},
    ]
    assert out["stragglers"] == [{"op": "all_reduce", "dim": "tp", "seq": 0, "late_rank": 1, "skew_us": 50.0}]


def test_plan_file_labels_dimensions(pair_dir, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan": {"dp": 2}}))  # a run.json-like wrapper works too
    assert main([str(pair_dir), "--plan", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["collectives"][0]["dim"] == "dp"


@pytest.mark.parametrize("tp, dim, launcher", [(1, "dp", ""), (2, "tp", ""), (2, "tp", "--nproc_per_node 8 ")])
def test_a_megatron_launch_script_labels_dimensions(pair_dir, tmp_path, capsys, tp, dim, launcher):
    # the world size, and with it DP, comes from the traces' 2 ranks, also where the launcher line says 8
    script = tmp_path / "pretrain_gpt.sh"
    script.write_text(
        f"torchrun {launcher}pretrain_gpt.py --tensor-model-parallel-size {tp} --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --vocab-size 512\n"
    )
    assert main([str(pair_dir), "--plan", str(script), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["collectives"][0]["dim"] == dim
    script.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 2\n")  # no model shape
    assert main([str(pair_dir), "--plan", str(script), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model's shape is unknown" in err[0]


@pytest.mark.parametrize(
    "plan_text, message", [("{", "not valid JSON"), ('{"tp": 4}', "world size 2"), ('{"tp": 0}', "cannot be read")]
)
def test_bad_plan_exits_2(pair_dir, tmp_path, capsys, plan_text, message):
    plan = tmp_path / "plan.json"
    plan.write_text(plan_text)
    assert main([str(pair_dir), "--plan", str(plan), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_negative_top_exits_2(pair_dir, capsys):
    assert main([str(pair_dir), "--json", "--top", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --top -1: expected a count of 0 or more"]


def test_text_report_and_rank_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    t = ts.gloo_cpu(rank=0, world=1)
    del t["distributedInfo"]
    path = ts.write(tmp_path / "worker.json", t)
    assert main([str(path)]) == 2
    assert "--rank worker.json=0" in capsys.readouterr().err
    assert main([str(path), "--rank", "worker.json=0"]) == 0
    text = capsys.readouterr().out
    assert "all_reduce" in text and "per rank" in text and "1 rank(s)" in text


def test_module_entry_point(pair_dir):
    out = subprocess.run(
        [sys.executable, "-m", "profiler", "analyze", str(pair_dir), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and list(json.loads(out.stdout)) == KEYS
