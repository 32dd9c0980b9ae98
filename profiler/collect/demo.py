"""Real data on a fresh install: a small profile run made by the project's own profiler.

    path = ensure_demo_run(runs_dir)     # returns at once; poll runfiles.runs.read_run(path) for progress

The first call starts `python -m profiler run` (DEMO_FLAGS: an 8-rank DP2×TP2×PP2+SP job of the
`tiny` model, 4 steps, the last two recorded; ~10 s on 2 cores) in the background, in a session
of its own so that it outlives the caller (a Streamlit script run), with its output in
RUNS/.demo.log. Later calls return the same directory without starting anything while that run is
going or once it completed; a demo run that failed (or whose process died) is started again,
replacing only its own files (`--force`). A lock file (RUNS/.demo.lock, flock) makes concurrent
callers -- two browser tabs on first start -- start one run between them.

Pure: stdlib only (the run itself imports torch in its own processes).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from runfiles.rundir import runs_root
from runfiles.runs import read_run

DEMO_NAME = "demo"
DEMO_FLAGS = (
    "--dp",
    "2",
    "--tp",
    "2",
    "--pp",
    "2",
    "--sp",
    "--steps",
    "4",
    "--global-batch",
    "8",
    "--wait",
    "1",
    "--warmup",
    "1",
)
ROOT = (
    Path(__file__).resolve().parents[2]
)  # the project (profiler/collect/ is two below it), so `-m profiler` imports from any cwd


def demo_command(path: Path, *, flags=DEMO_FLAGS, force: bool = False) -> list[str]:
    """The command that makes the demo run in `path` (for callers that start jobs their own way)."""
    return [sys.executable, "-m", "profiler", "run", *flags, "--out", str(path), *(["--force"] if force else [])]


def ensure_demo_run(runs_dir=None, *, name: str = DEMO_NAME, flags=DEMO_FLAGS) -> Path:
    """The demo run's directory under `runs_dir`, started in the background if it is neither
    running nor completed. Returns immediately."""
    runs = Path(runs_dir) if runs_dir is not None else runs_root()
    runs.mkdir(parents=True, exist_ok=True)
    path = (runs / name).resolve()
    with open(runs / ".demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = read_run(path)
        if info is not None and info.status in ("completed", "running", "starting"):
            return path
        if _starting(runs / ".demo.pid"):
            return path  # started by an earlier call, not yet claimed its directory
        log = runs / ".demo.log"
        offset = log.stat().st_size if log.exists() else 0
        proc = _start(demo_command(path, flags=flags, force=path.exists()), log=log)
        (runs / ".demo.pid").write_text(str(proc.pid))
        _wait_for_claim(path, proc, log, offset)
    return path


class DemoStartError(RuntimeError):
    """The demo run's process ended before it claimed its directory; the message holds its log's tail."""


def _starting(pid_file: Path) -> bool:
    """Whether the demo process an earlier call started is still alive (and so still starting)."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:  # a recycled pid is not ours: ours runs `-m profiler run`
        return b"profiler" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _start(argv: list[str], *, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    threading.Thread(target=proc.wait, daemon=True, name="demo-run-reaper").start()  # no zombie left behind
    return proc


def _wait_for_claim(path: Path, proc: subprocess.Popen, log: Path, offset: int, timeout_s: float = 5.0) -> None:
    """Hold the lock until the new run has written its run.json (a fraction of a second: the plan is
    checked and the directory claimed before torch is imported), so the next caller sees it running;
    DemoStartError with the log's tail when the process ends first (it cannot even start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_run(path)
        if info is not None and info.status in ("running", "failed", "completed"):
            return
        code = proc.poll()
        if code is not None and read_run(path) is None:
            raise DemoStartError(f"the demo run exited with code {code} before it started:\n{_log_tail(log, offset)}")
        time.sleep(0.05)


def _log_tail(log: Path, offset: int, lines: int = 20) -> str:
    """The last lines this start wrote to the log (from `offset`), at most 16 KiB of them."""
    try:
        with open(log, "rb") as f:
            f.seek(max(offset, f.seek(0, 2) - (16 << 10)))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(the log is empty)"
