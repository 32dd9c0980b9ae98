"""Isolation and bad input of `python -m profiler run`: run directories are claimed
exclusively, --out never clobbers anything but a previous run (and only with --force), a bad plan
or schedule exits 2 before any process starts (without importing torch), and two runs started at
the same moment write to two directories.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from profiler.collect.spec import parse_run
from runfiles import rundir
from tests.conftest import ROOT


def _cli(args, *, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "profiler", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--dp=3", "--tp=3"], "error:"),  # the plan model's own message (heads/tp, world size ...)
        (["--wait=0", "--warmup=0"], "--wait + --warmup must be at least 1"),
        (["--steps=3", "--wait=1", "--warmup=1", "--active=2"], "wait 1 + warmup 1 + active 2 = 4 > --steps 3"),
        (["--dp=2", "--nnodes=2"], "--nnodes > 1 needs --launcher torchrun"),
        (
            ["--dp=4", "--launcher=torchrun", "--nnodes=2", "--nproc-per-node=3", "--rdzv-endpoint=h:1"],
            "--nnodes 2 × --nproc-per-node 3 = 6 ranks, but dp×tp×pp×cp = 4",
        ),
    ],
)
def test_bad_flags_are_errors_before_anything_runs(flags, message):
    spec, errors, _ = parse_run(flags)
    assert any(message in e for e in errors) or (message == "error:" and errors), errors


def test_an_invalid_plan_exits_2_without_importing_torch_or_creating_the_directory(tmp_path):
    code = (
        "import sys; from profiler.cli import run; rc = run.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "--tp=3", f"--out={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "invalid plan:" in r.stderr and "error:" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "out,env,needle",
    [
        ("file", {}, "exists and is not a directory"),
        ("file/run", {}, "cannot be created ("),
        (None, {"PARASCOPE_RUNS": "file"}, "runs directory"),  # the default --out under an unusable runs root
    ],
)
def test_an_out_that_cannot_be_used_exits_2_without_a_traceback(tmp_path, out, env, needle):
    (tmp_path / "file").write_text("keep me")
    env = {k: str(tmp_path / v) for k, v in env.items()}
    r = _cli(["--dp=2", "--global-batch=2", "--steps=3"] + ([f"--out={tmp_path / out}"] if out else []), env=env)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


def test_a_non_empty_out_is_refused_without_force_and_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    r = _cli(["--dp=2", f"--out={tmp_path}"])
    assert r.returncode == 2 and "not empty" in r.stderr and "--force" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    r = _cli(["--dp=2", f"--out={tmp_path}", "--force"])  # --force replaces a run, never other files
    assert r.returncode == 2 and "mine.txt" in r.stderr and "nothing was removed" in r.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def _old_run(path: Path, **run) -> None:
    (path / "traces").mkdir(parents=True)
    (path / "traces" / "rank0_trace.json.gz").write_bytes(b"old")
    (path / "logs").mkdir()
    (path / "run.json").write_text(json.dumps({"status": "completed", **run}))


def test_force_replaces_only_a_previous_runs_entries(tmp_path):
    _old_run(tmp_path)
    with pytest.raises(rundir.RunDirError, match="not empty"):
        rundir.claim(tmp_path, {"status": "running"}, force=False)
    rundir.claim(tmp_path, {"status": "running", "new": True}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert json.loads((tmp_path / "run.json").read_text())["new"] is True


def test_force_refuses_while_that_run_is_still_going(tmp_path):
    _old_run(tmp_path, status="running", supervisor={"pid": os.getppid(), "hostname": socket.gethostname()})
    with pytest.raises(rundir.RunDirError, match="still going"):
        rundir.claim(tmp_path, {"status": "running"}, force=True)
    assert (tmp_path / "traces" / "rank0_trace.json.gz").read_bytes() == b"old"


def test_claims_are_exclusive(tmp_path):
    """Many claimants of one empty directory at once: exactly one wins, the others get RunDirError."""
    results, barrier = [], threading.Barrier(8)

    def claim(i):
        barrier.wait()
        try:
            rundir.claim(tmp_path / "run", {"who": i}, force=False)
            results.append(("won", i))
        except rundir.RunDirError:
            results.append(("lost", i))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for what, i in results if what == "won"]
    assert len(winners) == 1
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"who": winners[0]}


def test_new_run_dirs_are_unique_under_concurrency(tmp_path):
    made, barrier = [], threading.Barrier(8)

    def make():
        barrier.wait()
        made.append(rundir.new_run_dir(tmp_path, "DP2 TP2+SP"))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() and p.name.split("-", 2)[2].startswith("dp2-tp2-sp") for p in made)


def test_atomic_json_never_leaves_a_temporary_file(tmp_path):
    rundir.write_json_atomic(tmp_path / "run.json", {"a": 1})
    rundir.write_json_atomic(tmp_path / "run.json", {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert rundir.read_json(tmp_path / "run.json") == {"a": 2}


@pytest.mark.slow
def test_two_runs_started_together_get_their_own_directories(tmp_path):
    """No --out: each run claims a fresh directory under $PARASCOPE_RUNS; both complete."""
    env = {**os.environ, rundir.RUNS_ENV: str(tmp_path)}
    flags = ["--dp=2", "--global-batch=2", "--steps=2", "--wait=1", "--warmup=0", "--active=1"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "profiler", "run", *flags],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(dirs) == 2
    for d in dirs:
        run = json.loads((d / "run.json").read_text())
        assert run["status"] == "completed"
        assert sorted(p.name for p in (d / "traces").iterdir()) == ["rank0_trace.json.gz", "rank1_trace.json.gz"]
        assert f"run directory: {d}" in "".join(o[0] for o in outs)


def test_log_tail_skips_kinetos_probe_markers_but_the_file_keeps_them(tmp_path):
    log = tmp_path / "rank0.log"
    body = ["step 1", "Traceback (most recent call last):", "RuntimeError: boom"]
    markers = [
        f"USDT:2026-11-30 23:00:25 591:591 SyncActivityProfilerHandler.cpp:52] profiler_{w}" for w in ("start", "stop")
    ]
    log.write_text("\n".join(body[:1] + markers + body[1:] + markers) + "\n")
    assert rundir.log_tail(log, 2) == "Traceback (most recent call last):\nRuntimeError: boom"
    assert rundir.log_tail(log, 10) == "\n".join(body)
    assert log.read_text().count("USDT:") == 4
