"""Background jobs the dashboard starts: `python -m profiler run ... --out RUNS/NAME` in a process
group of its own, so it outlives the Streamlit session (and server) that started it. A small JSON
record on disk is the only state: any session, or a restarted server, finds, polls and cancels it.

    name = reserve(runs, "DP2 TP2 PP2")                  # '20251130-182301-dp2-tp2-pp2', unique
    job = start(profile_argv(["--dp", "2"], runs / name), name=name, runs_dir=runs)   # returns at once
    alive(job), refresh(job).returncode                 # a finished job knows its exit code
    cancel(job)                                         # SIGTERM to the group, SIGKILL after a grace period
    jobs(runs)                                          # every record, newest first
    tail(job.log_path, 40)                              # the launcher's own output

Files: RUNS/.jobs/NAME.json (argv, out, pid, pgid, start_ticks, started_at, cancelled, returncode,
finished_at) and RUNS/.jobs/NAME.log (stdout and stderr of the command; the job's per-rank logs are
in its run directory). A pid is trusted only together with its start time read from /proc, so a
recycled pid is never taken for the job, nor signalled.

Pure-ish: stdlib only (subprocess, os, signal, threading); no torch, no streamlit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runfiles.rundir import log_tail, now_iso, read_json, slug
from runfiles.rundir import write_json_atomic as _write

JOBS = ".jobs"
GRACE_S = 5.0  # between SIGTERM and SIGKILL on cancel


@dataclass(frozen=True)
class Job:
    name: str
    runs_dir: Path
    argv: tuple[str, ...] = ()
    out: str = ""
    pid: int = 0
    pgid: int = 0
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: tells a recycled pid apart
    started_at: str = ""
    cancelled: bool = False
    returncode: int | None = None  # set once the process is reaped
    finished_at: str = ""

    @property
    def record_path(self) -> Path:
        return self.runs_dir / JOBS / f"{self.name}.json"

    @property
    def log_path(self) -> Path:
        return self.runs_dir / JOBS / f"{self.name}.log"

    @property
    def run_dir(self) -> Path:
        return Path(self.out) if self.out else self.runs_dir / self.name


def profile_argv(flags: list[str], out: Path, *, python: str | None = None) -> list[str]:
    """The command that profiles a job into `out`: python -m profiler run FLAGS --out OUT."""
    return [python or sys.executable, "-m", "profiler", "run", *flags, "--out", str(out)]


def flags_of(values: dict) -> list[str]:
    """{'dp': 2, 'sp': True, 'micro_batch': 1, 'layers': None} -> ['--dp', '2', '--sp', '--micro-batch', '1']:
    True is a bare flag; False, None and '' are left out."""
    out: list[str] = []
    for key, value in values.items():
        if value is None or value is False or value == "":
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _record(job: Job) -> dict:
    data = dataclasses.asdict(job)
    data["runs_dir"] = str(job.runs_dir)
    data["argv"] = list(job.argv)
    return data


def reserve(runs_dir: Path, label: str) -> str:
    """A new job name '<UTC time>-<label>' no other job or run directory has; its record is created
    (O_EXCL) so two sessions reserving at once get different names."""
    jobs_dir = Path(runs_dir) / JOBS
    jobs_dir.mkdir(parents=True, exist_ok=True)
    base = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{slug(label)}"
    for i in range(1, 1000):
        name = base if i == 1 else f"{base}-{i}"
        if (Path(runs_dir) / name).exists():
            continue
        try:
            fd = os.open(jobs_dir / f"{name}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"name": name, "runs_dir": str(runs_dir), "started_at": now_iso("seconds")}, f)
        return name
    raise RuntimeError(f"no free job name for {base!r} in {runs_dir}")


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)": state is 3, starttime 22


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def start(argv: list[str], *, name: str, runs_dir: Path, cwd: str | Path | None = None, env: dict | None = None) -> Job:
    """Start `argv` in a new session (its own process group), output to the job's log; returns at
    once. A thread of this process reaps it and records its exit code."""
    runs_dir = Path(runs_dir)
    (runs_dir / JOBS).mkdir(parents=True, exist_ok=True)
    job = Job(
        name=name,
        runs_dir=runs_dir,
        argv=tuple(argv),
        out=str(_out_of(argv) or runs_dir / name),
        started_at=now_iso("seconds"),
    )
    with open(job.log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    job = dataclasses.replace(job, pid=proc.pid, pgid=proc.pid, start_ticks=_start_ticks(proc.pid))
    _write(job.record_path, _record(job))
    threading.Thread(target=_reap, args=(proc, job), daemon=True, name=f"reap-{name}").start()
    return job


def _out_of(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == "--out":
            return argv[i + 1]
    return None


def _reap(proc: subprocess.Popen, job: Job) -> None:
    code = proc.wait()
    current = load(job.runs_dir, job.name) or job
    _write(job.record_path, _record(dataclasses.replace(current, returncode=code, finished_at=now_iso("seconds"))))


def load(runs_dir: Path, name: str) -> Job | None:
    path = Path(runs_dir) / JOBS / f"{name}.json"
    data = read_json(path)
    if data is None:
        return None
    fields = {f.name for f in dataclasses.fields(Job)}
    data = {k: v for k, v in data.items() if k in fields}
    data["runs_dir"] = Path(runs_dir)
    data["argv"] = tuple(data.get("argv") or ())
    return Job(**data)


def jobs(runs_dir: Path) -> list[Job]:
    """Every job record under RUNS/.jobs, newest first."""
    folder = Path(runs_dir) / JOBS
    if not folder.is_dir():
        return []
    found = [load(runs_dir, p.stem) for p in folder.glob("*.json") if not p.name.startswith(".")]
    return sorted((j for j in found if j is not None), key=lambda j: j.started_at, reverse=True)


def refresh(job: Job) -> Job:
    return load(job.runs_dir, job.name) or job


def alive(job: Job) -> bool:
    """True while the job's process runs (not exited, not a zombie, not a recycled pid)."""
    if not job.pid or job.returncode is not None:
        return False
    if job.start_ticks is not None and _start_ticks(job.pid) != job.start_ticks:
        return False
    state = _proc_state(job.pid)
    if state is None:
        try:
            os.kill(job.pid, 0)  # no /proc: ask the kernel
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cancel(job: Job, *, grace_s: float = GRACE_S) -> Job:
    """SIGTERM to the job's whole process group, SIGKILL to whatever is left after `grace_s` (from a
    background thread, so this returns at once). Records `cancelled`; a finished job is left alone."""
    job = refresh(job)
    if not alive(job):
        return job
    job = dataclasses.replace(job, cancelled=True)
    _write(job.record_path, _record(job))
    try:
        os.killpg(job.pgid, signal.SIGTERM)
    except ProcessLookupError:
        return job

    def escalate():
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _group_alive(job.pgid):
                return
            time.sleep(0.1)
        try:
            os.killpg(job.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    threading.Thread(target=escalate, daemon=True, name=f"kill-{job.name}").start()
    return job


def tail(path: Path, lines: int = 40, *, max_bytes: int = 64 << 10) -> str:
    """The last `lines` lines of a text file ('' when it does not exist)."""
    return log_tail(path, lines, max_bytes)
