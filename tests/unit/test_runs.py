"""runfiles.runs (the pages' run-directory reader, pure) and profiler.collect.demo (the first-start demo run).

The reader must take whatever a run directory looks like at any moment of its life -- just claimed,
running, failed, abandoned by a killed supervisor, or a bare folder of traces -- and never raise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler.cli import run as run_cli
from profiler.cli import tpsweep
from profiler.collect import demo
from profiler.collect.demo import ensure_demo_run
from runfiles.runs import list_runs, read_run
from tests.conftest import ROOT


def _write(path: Path, run: dict | None = None, traces: int = 0) -> Path:
    path.mkdir(parents=True)
    if run is not None:
        (path / "run.json").write_text(json.dumps(run))
    if traces:
        (path / "traces").mkdir()
        for r in range(traces):
            (path / "traces" / f"rank{r}_trace.json.gz").write_bytes(b"x")
    return path


def _running(**extra) -> dict:
    return {
        "status": "running",
        "progress": {"step": 1, "steps": 4},
        "plan": {"dp": 2},
        "world_size": 2,
        "model": {"name": "tiny"},
        "cluster": {"name": "local-cpu"},
        "started_at": "2030-01-01T00:00:00",
        "supervisor": {"pid": os.getpid(), "hostname": socket.gethostname()},
        **extra,
    }


def test_a_running_run(tmp_path):
    info = read_run(_write(tmp_path / "a", _running()))
    assert (info.status, info.step, info.steps, info.progress) == ("running", 1, 4, 0.25)
    assert (info.model, info.cluster, info.world_size, info.stale) == ("tiny", "local-cpu", 2, False)


def test_a_failed_run_names_its_rank(tmp_path):
    run = _running(status="failed", error={"rank": 3, "message": "RuntimeError: boom", "log_tail": "..."})
    info = read_run(_write(tmp_path / "a", run))
    assert info.status == "failed" and info.error_rank == 3 and info.error["message"] == "RuntimeError: boom"
    assert info.finished and info.log_path(3) == tmp_path / "a" / "logs" / "rank3.log"


def test_a_run_whose_supervisor_died_is_failed_and_stale(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = _running(supervisor={"pid": dead.pid, "hostname": socket.gethostname()})
    info = read_run(_write(tmp_path / "a", run))
    assert info.status == "failed" and info.stale and f"pid {dead.pid}" in info.error["message"]


@pytest.mark.parametrize(
    "content,status",
    [
        (None, None),  # an empty folder is not a run
        ("{", "starting"),  # run.json caught half-written by some other writer: read as not there yet
        ("[1, 2]", "starting"),
        (json.dumps({"status": "weird"}), "unknown"),
    ],
)
def test_odd_run_json(tmp_path, content, status):
    path = tmp_path / "a"
    path.mkdir()
    if content is not None:
        (path / "run.json").write_text(content)
        (path / "logs").mkdir()
    info = read_run(path)
    assert (info.status if info else None) == status


def test_traces_without_run_json_and_listing(tmp_path):
    _write(tmp_path / "copied", None, traces=3)
    _write(tmp_path / "old", _running(status="completed", started_at="2020-01-01T00:00:00"))
    _write(tmp_path / "new", _running(started_at="2031-01-01T00:00:00"))
    (tmp_path / ".jobs").mkdir()  # hidden folders are not runs
    (tmp_path / "file.txt").write_text("")
    runs = list_runs(tmp_path)
    assert [r.name for r in runs] == ["new", "old", "copied"]
    assert runs[2].status == "unknown" and runs[2].traces == 3 and runs[1].progress == 1.0
    assert list_runs(tmp_path / "missing") == []


def test_the_reader_and_the_supervisors_import_no_torch():
    """What the pages import, and the processes that only watch ranks (run, commbench), stay pure."""
    modules = (
        "runfiles.runs, profiler.collect.demo, runfiles.rundir, profiler.cli.run, profiler.collect.supervisor, "
        "profiler.collect.launchers, profiler.cli.commbench, profiler.commbench.fit"
    )
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.slow
def test_the_demo_run_starts_in_the_background_and_completes(tmp_path):
    flags = ("--dp", "2", "--global-batch", "2", "--steps", "3", "--wait", "1", "--warmup", "1")
    t0 = time.monotonic()
    path = ensure_demo_run(tmp_path, flags=flags)
    assert time.monotonic() - t0 < 5  # returns at once, the run going on in the background
    assert path == (tmp_path / "demo").resolve() and read_run(path).status == "running"
    assert ensure_demo_run(tmp_path, flags=flags) == path  # a second caller starts nothing
    deadline = time.monotonic() + 120
    while (info := read_run(path)).status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert info.status == "completed", (tmp_path / ".demo.log").read_text()[-2000:]
    assert info.traces == 2 and info.has_metrics
    mtime = (path / "run.json").stat().st_mtime
    assert ensure_demo_run(tmp_path, flags=flags) == path and (path / "run.json").stat().st_mtime == mtime


def test_the_demo_and_tp_sweep_start_jobs_from_the_project_root():
    for root in (demo.ROOT, tpsweep.ROOT):  # the cwd and PYTHONPATH of `python -m profiler ...`
        assert (root / "profiler" / "__main__.py").is_file() and (root / "parallel").is_dir()


def test_a_run_with_more_ranks_than_the_machine_hosts_is_refused_before_any_starts(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--model", "tiny", "--dp", "4096", "--seq-len", "8", "--global-batch", "4096", "--out", str(out)]
    assert run_cli.main(argv) == 2
    assert "4,096 rank processes on this machine, more than it can host" in capsys.readouterr().err
    assert not out.exists()  # nothing claimed, nothing started
    assert run_cli.main(["--model", "tiny", "--dp", "4", "--max-local-ranks", "2", "--out", str(out)]) == 2
    assert "4 rank processes on this machine, more than it can host (2:" in capsys.readouterr().err
