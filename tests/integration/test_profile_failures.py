"""Failures of `python -m profiler run`: a rank that raises at step 2, one killed with
SIGKILL, a deliberate hang (ended by the process-group timeout), a job timeout, a cancel (SIGTERM
to the run's process group, as the dashboard sends it), and a raise under torchrun. Each must end
within 60 s with run.json saying `failed`, naming the rank and its last log lines, keeping the
traces already written, and leaving no process behind (found by a tag in their environment).

Faults come from the engine's hidden hook: PARASCOPE_FAIL_RANK / _STEP / _MODE=raise|kill|hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from profiler.collect.launchers import processes_with_env
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
PLAN = ["--dp=2", "--global-batch=4", "--steps=4", "--wait=1", "--warmup=1"]


def _tagged(tag: str) -> list[int]:
    """PIDs whose environment carries `tag` (the job's processes, wherever they were forked)."""
    return processes_with_env(tag)


def _env(tag: str, **extra) -> dict:
    return {**os.environ, "PARASCOPE_TEST_TAG": tag, **extra}


def _fault(mode: str, rank: int = 1, step: int = 2) -> dict:
    return {"PARASCOPE_FAIL_RANK": str(rank), "PARASCOPE_FAIL_STEP": str(step), "PARASCOPE_FAIL_MODE": mode}


def _profile(out: Path, flags: list[str], *, env: dict, timeout: float = 120):
    tag = env["PARASCOPE_TEST_TAG"]
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "run", *PLAN, *flags, f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    assert _tagged(tag) == [], "processes outlived the run"
    return r, elapsed, json.loads((out / "run.json").read_text())


@pytest.mark.parametrize(
    "mode,needle,exitcode",
    [
        ("raise", "RuntimeError: injected failure on rank 1 at step 2", 1),
        ("kill", "killed by signal 9 (SIGKILL)", -9),
    ],
)
def test_a_rank_that_raises_or_is_killed_fails_the_run(tmp_path, mode, needle, exitcode):
    tag = uuid.uuid4().hex
    r, elapsed, run = _profile(tmp_path / "run", ["--timeout=20"], env=_env(tag, **_fault(mode)))
    assert r.returncode == 1 and elapsed < 60, r.stderr[-2000:]
    assert run["status"] == "failed" and run["finished_at"]
    assert run["progress"] == {"step": 2, "steps": 4}  # steps 0 and 1 were done
    err = run["error"]
    assert err["rank"] == 1 and needle in err["message"] and err["exitcode"] == exitcode
    assert err["log"] == "logs/rank1.log"
    if mode == "raise":
        assert "Traceback" in err["log_tail"] and needle in err["log_tail"]
    assert f"rank 1 failed: {needle}" in r.stderr
    # rank 0 was recording step 2 when its peer failed: what it had collected was exported, whole
    assert any(t["rank"] == 0 for t in run["traces"])
    assert not list((tmp_path / "run" / ".partial").glob("*.json*"))


def test_a_hang_ends_by_the_process_group_timeout(tmp_path):
    tag = uuid.uuid4().hex
    r, elapsed, run = _profile(tmp_path / "run", ["--timeout=5"], env=_env(tag, **_fault("hang")))
    assert r.returncode == 1 and elapsed < 60
    err = run["error"]
    assert run["status"] == "failed" and err["rank"] == 0  # the rank whose collective timed out
    assert "Timed out" in err["message"] and "ranks stopped without an error of their own: 1" in err["message"]


def test_a_job_timeout_stops_everything(tmp_path):
    tag = uuid.uuid4().hex
    r, elapsed, run = _profile(tmp_path / "run", ["--timeout=60", "--job-timeout=12"], env=_env(tag, **_fault("hang")))
    assert r.returncode == 1 and elapsed < 40
    assert run["status"] == "failed" and run["error"]["rank"] is None
    assert "--job-timeout 12 s" in run["error"]["message"]


def test_cancel_by_sigterm_to_the_process_group(tmp_path):
    """As the dashboard cancels a job: SIGTERM to the group. Progress was visible while it ran."""
    tag, out = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "profiler", "run", *PLAN, "--steps=40", f"--out={out}"],
        cwd=ROOT,
        env=_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            try:
                run = json.loads((out / "run.json").read_text())  # atomic: always a whole file
            except FileNotFoundError:
                run = {}
            seen.append((run.get("status"), (run.get("progress") or {}).get("step")))
            if run.get("progress", {}).get("step", 0) >= 2:
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.3)
    assert _tagged(tag) == []
    assert ("running", 0) in seen  # a live progress bar had something to show, moving
    assert any(status == "running" and 0 < step < 40 for status, step in seen if step is not None)
    run = json.loads((out / "run.json").read_text())
    assert proc.returncode == 1 and run["status"] == "failed"
    assert "stopped by signal 15 (SIGTERM)" in run["error"]["message"]


def test_a_rank_that_raises_under_torchrun_fails_the_run(tmp_path):
    tag = uuid.uuid4().hex
    r, elapsed, run = _profile(
        tmp_path / "run", ["--timeout=20", "--launcher=torchrun"], env=_env(tag, **_fault("raise")), timeout=180
    )
    assert r.returncode == 1 and elapsed < 60, r.stderr[-2000:]
    err = run["error"]
    assert run["status"] == "failed" and run["launcher"] == "torchrun"
    assert err["rank"] == 1 and "injected failure on rank 1 at step 2" in err["message"]
    assert "Traceback" in err["log_tail"]
    assert (tmp_path / "run" / "logs" / "launcher-node0.log").is_file()
