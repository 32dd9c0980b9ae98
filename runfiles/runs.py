"""Run directories as the dashboard lists them: `python -m profiler run`'s output, read without torch.

    runs = list_runs()                    # every run under $PARASCOPE_RUNS (default ./runs), newest first
    info = read_run("runs/demo")          # RunInfo, or None when the folder is not a run at all
    info.status, info.progress, info.error_rank, info.error, info.traces

Tolerant by design: a run directory is read while its run is going, after it failed, or after its
supervisor died. A run.json being replaced is read again (rename is atomic, so a read sees a whole
file); one that never appeared yet gives status `starting`; a folder of traces without run.json
(copied by hand) gives `unknown`. run.json saying `running` while its supervisor (pid, same host)
is gone is reported `failed`, stale=True, with an error saying so -- a crashed or killed supervisor
cannot write its own end.

Pure: stdlib only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from runfiles.rundir import RUN_JSON, read_json, runs_root

STATUSES = ("starting", "running", "completed", "failed", "unknown")


@dataclass(frozen=True)
class RunInfo:
    path: Path
    name: str
    status: str  # one of STATUSES
    step: int | None = None
    steps: int | None = None
    plan: dict | None = None
    model: str | None = None  # the model's name
    cluster: str | None = None  # the cluster's name
    world_size: int | None = None
    nodes: int | None = None
    launcher: str | None = None
    started_at: str = ""
    finished_at: str = ""
    error: dict | None = None  # {rank, message, exitcode, log, log_tail}
    traces: int = 0  # complete trace files
    has_metrics: bool = False
    stale: bool = False  # run.json says running, but its supervisor is gone
    run: dict = field(default_factory=dict)  # run.json as read

    @property
    def progress(self) -> float | None:
        """0..1 for a progress bar; 1 when completed, None when unknown."""
        if self.status == "completed":
            return 1.0
        if self.steps:
            return max(0.0, min(1.0, (self.step or 0) / self.steps))
        return None

    @property
    def error_rank(self) -> int | None:
        rank = (self.error or {}).get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed")

    def log_path(self, rank: int) -> Path:
        return self.path / "logs" / f"rank{rank}.log"


def _name(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("name")
    return value if isinstance(value, str) else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _supervisor_gone(run: dict) -> bool:
    sup = run.get("supervisor") if isinstance(run.get("supervisor"), dict) else {}
    pid = sup.get("pid")
    if not isinstance(pid, int) or sup.get("hostname") != socket.gethostname():
        return False  # another host's supervisor: nothing to check from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _count_traces(path: Path) -> int:
    folder = path / "traces"
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")) and not p.name.startswith("."))


def read_run(path: str | Path) -> RunInfo | None:
    """The run in `path`, or None when it is not a run directory (no run.json, traces, logs or status)."""
    path = Path(path)
    if not path.is_dir():
        return None
    run = read_json(path / RUN_JSON)
    traces = _count_traces(path)
    if run is None:
        if traces:
            return RunInfo(
                path=path,
                name=path.name,
                status="unknown",
                traces=traces,
                has_metrics=(path / "metrics.json").is_file(),
            )
        if (path / "logs").is_dir() or (path / "status").is_dir():
            return RunInfo(path=path, name=path.name, status="starting")
        return None
    status = run.get("status") if run.get("status") in STATUSES else "unknown"
    error = run.get("error") if isinstance(run.get("error"), dict) else None
    stale = status == "running" and _supervisor_gone(run)
    if stale:
        status = "failed"
        error = {
            "rank": None,
            "message": f"the profiler process (pid {run['supervisor']['pid']}) ended without "
            "recording the run's end (killed, or its machine restarted)",
        }
    progress = run.get("progress") if isinstance(run.get("progress"), dict) else {}
    hosts = run.get("hosts") if isinstance(run.get("hosts"), dict) else {}
    nodes = _int(run.get("nodes")) or (len({h.get("node") for h in hosts.values() if isinstance(h, dict)}) or None)
    return RunInfo(
        path=path,
        name=path.name,
        status=status,
        step=_int(progress.get("step")),
        steps=_int(progress.get("steps")),
        plan=run.get("plan") if isinstance(run.get("plan"), dict) else None,
        model=_name(run.get("model")),
        cluster=_name(run.get("cluster")),
        world_size=_int(run.get("world_size")),
        nodes=nodes,
        launcher=run.get("launcher") if isinstance(run.get("launcher"), str) else None,
        started_at=str(run.get("started_at") or ""),
        finished_at=str(run.get("finished_at") or ""),
        error=error,
        traces=traces,
        has_metrics=(path / "metrics.json").is_file(),
        stale=stale,
        run=run,
    )


def list_runs(runs_dir: str | Path | None = None) -> list[RunInfo]:
    """Every run directory directly under `runs_dir` (default: $PARASCOPE_RUNS or ./runs), newest first."""
    folder = Path(runs_dir) if runs_dir is not None else runs_root()
    if not folder.is_dir():
        return []
    found = [
        info for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") if (info := read_run(p)) is not None
    ]
    return sorted(found, key=lambda i: (i.started_at or "", i.name), reverse=True)
