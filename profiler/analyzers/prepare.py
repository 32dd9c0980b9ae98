"""A trace set prepared in a process of its own: parsed into the cache and every table a page reads
computed and kept there (TraceAnalysis keeps them per plan), with its progress as JSON lines.

A dashboard server must answer every user while one set is analysed: analysing in its own script
threads would hold its GIL for seconds at a time and grow its memory with the set. So the server
starts a Preparation, shows its progress, and once it is done opens the set from the cache, which
reads the kept tables and analyses nothing. A preparation past its time or memory budget is stopped
(its process group, the parse workers included), never the server.

    p = Preparation(source, plan, time_s=1800, memory_mb=4096, preview=64)
    p.state()       # State: status running/done/failed/cancelled, stage, done, total, message,
                    # preview (the first 64 ranks are ready: TraceSet.first_ranks(64))
    p.cancel()
    python -m profiler.analyzers.prepare '{"source": "runs/demo", "plan": null}'   # what the process runs

Pure, besides the process it starts: stdlib and psutil.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from profiler.analyzers.front import TraceAnalysis
from profiler.traces.errors import TraceError
from profiler.traces.loader import shared_workers
from profiler.traces.sources import resolve

# the tables a page reads, in the order they depend on each other
TABLES = ("collectives", "offsets", "per_rank_wait", "instances", "comm_by_dim")
STAGES = {
    "start": "Starting",
    "first": "Parsing the first ranks, to show them while the rest loads",
    "preview": "Parsing traces",
    "parse": "Parsing traces",
    "collectives": "Matching collectives across ranks",
    "offsets": "Aligning rank clocks",
    "per_rank_wait": "Measuring each rank's waits",
    "instances": "Finding stragglers",
    "comm_by_dim": "Breaking each step down",
}
DEFAULT_TIME_S = 1800.0
DEFAULT_MEMORY_MB = 4096.0
POLL_S = 0.25


def budget_from_env() -> tuple[float, float]:
    """(seconds, MB) a preparation may use: $PARASCOPE_PREPARE_TIME_S and $PARASCOPE_PREPARE_MEMORY_MB."""

    def number(name: str, default: float) -> float:
        try:
            value = float(os.environ.get(name, default))
        except ValueError:
            return default
        return value if value > 0 else default

    return number("PARASCOPE_PREPARE_TIME_S", DEFAULT_TIME_S), number("PARASCOPE_PREPARE_MEMORY_MB", DEFAULT_MEMORY_MB)


# -- the process --------------------------------------------------------------------------------------


def prepare(
    source: Any,
    plan: Any = None,
    *,
    report: Callable[[str, int, int, str], None] | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    preview: int = 0,
) -> None:
    """Parse `source` into the cache and keep every table of TABLES for `plan`; `report(stage, done,
    total, name)` after each file and each table. With `preview` > 0, the set's first `preview` ranks
    (TraceSet.first_ranks) are prepared first, on their own, and stage 'preview' reported: a page
    can draw them while the whole set loads. Raises TraceError as load_traces does."""
    report = report or (lambda *a: None)
    found = resolve(source)
    part = found.first_ranks(preview) if preview > 0 else None

    def parsed(done: int, total: int, name: str) -> None:
        report("parse", done, total, name)

    with shared_workers(workers if not scheduler else 1):
        if part is not None:
            report("first", 0, len(part.only), "")
            first = TraceAnalysis.load(part, plan, workers=workers, scheduler=scheduler)
            for table in TABLES:
                getattr(first, table)
            del first
            report("preview", len(part.only), len(part.only), "")
        report("parse", 0, found.count(), "")
        a = TraceAnalysis.load(found, plan, workers=workers, scheduler=scheduler, progress=parsed)
        for i, table in enumerate(TABLES):
            report(table, i, len(TABLES), STAGES[table])
            getattr(a, table)
        report("done", len(TABLES), len(TABLES), "")


def _main(argv: list[str]) -> int:
    """Prepare the set of the JSON spec argv[0] ({source, plan, workers, scheduler}); progress and the
    outcome as JSON lines on stdout. SIGTERM unwinds (the loader removes its half-written folder)."""

    def stop(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one would cut the cleanup short
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    spec = json.loads(argv[0])
    last = [0.0]

    def report(stage: str, done: int, total: int, name: str) -> None:
        now = time.monotonic()  # a few lines a second, however many files
        if stage == "parse" and 0 < done < total and now - last[0] < POLL_S:
            return
        last[0] = now
        print(json.dumps({"stage": stage, "done": done, "total": total, "name": name}), flush=True)

    try:
        prepare(
            spec["source"],
            spec.get("plan"),
            report=report,
            workers=int(spec.get("workers") or 1),
            scheduler=spec.get("scheduler"),
            preview=int(spec.get("preview") or 0),
        )
    except TraceError as err:
        print(json.dumps({"stage": "failed", "message": str(err), "trace_error": True}), flush=True)
        return 2
    except MemoryError:
        print(json.dumps({"stage": "failed", "message": "ran out of memory"}), flush=True)
        return 1
    return 0


# -- the server's handle --------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    status: str  # running, done, failed, cancelled
    stage: str = "start"
    done: int = 0
    total: int = 0
    name: str = ""
    message: str = ""  # why it failed
    trace_error: bool = False  # failed on the input (a TraceError's message), not on a budget
    elapsed_s: float = 0.0
    memory_mb: float = 0.0  # the process group's resident memory, latest sample
    preview: bool = False  # the first ranks are prepared (TraceSet.first_ranks of `preview` ranks)

    @property
    def fraction(self) -> float:
        """How far along, 0..1: parsing is the first half, the tables the second."""
        if self.status == "done":
            return 1.0
        part = self.done / self.total if self.total else 0.0
        if self.stage in ("start", "first", "preview", "parse"):
            return 0.5 * part
        return 0.5 + 0.5 * part

    @property
    def text(self) -> str:
        stage = STAGES.get(self.stage, self.stage)
        if self.stage == "parse" and self.total:
            return f"{stage}: {self.done:,} / {self.total:,} files"
        return stage + " …"


class Preparation:
    """`prepare` of one set in a child process (its own session, so its workers go with it), watched
    by two threads: one reads its progress lines, one enforces the time and memory budgets."""

    def __init__(
        self,
        source: Any,
        plan: Any = None,
        *,
        time_s: float = DEFAULT_TIME_S,
        memory_mb: float = DEFAULT_MEMORY_MB,
        workers: int = 1,
        scheduler: str | None = None,
        preview: int = 0,
    ):
        self.time_s, self.memory_mb = time_s, memory_mb
        self._lock = threading.Lock()
        self._state = State("running")
        self._stopping: State | None = None
        self._started = time.monotonic()
        self._log = tempfile.TemporaryFile()
        spec = {"source": str(source), "plan": plan, "workers": workers, "scheduler": scheduler, "preview": preview}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "profiler.analyzers.prepare", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[2],
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True, name="prepare-read").start()
        threading.Thread(target=self._watch, daemon=True, name="prepare-watch").start()

    def state(self) -> State:
        with self._lock:
            return replace(self._state, elapsed_s=time.monotonic() - self._started)

    def cancel(self, wait: bool = True) -> None:
        """Stop it; with `wait`, return once its processes are gone (else they go in the background)."""
        stop = State("cancelled", message="cancelled")
        if wait:
            self._stop(stop)
        else:
            threading.Thread(target=self._stop, args=(stop,), daemon=True, name="prepare-cancel").start()

    def wait(self, timeout: float | None = None) -> State:
        """Block until it ends (tests and scripts; a page polls state())."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.state().status == "running":
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return self.state()

    def _set(self, **changes) -> None:
        with self._lock:
            if self._state.status == "running":
                self._state = replace(self._state, **changes)

    def _stop(self, final: State) -> None:
        """Kill the process group, then report `final`: once a state is final, no process is left."""
        with self._lock:
            if self._state.status != "running" or self._stopping is not None:
                return
            self._stopping = final
        _kill_group(self._proc)
        with self._lock:
            self._state = replace(self._state, status=final.status, message=final.message)

    def _read(self) -> None:
        failure = None  # the process's own report of why it failed, final once it has exited
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("stage") == "failed":
                failure = msg
            elif msg.get("stage") == "done":
                continue  # done once the process has exited cleanly (its files are all in place)
            elif msg.get("stage") == "preview":
                self._set(preview=True)
            else:
                self._set(stage=msg["stage"], done=msg["done"], total=msg["total"], name=msg.get("name", ""))
        code = self._proc.wait()
        if self._stopping is not None:  # _stop reports it
            pass
        elif failure is not None:
            self._set(status="failed", message=failure.get("message", ""), trace_error=bool(failure.get("trace_error")))
        elif code == 0:
            self._set(status="done")
        else:
            self._set(status="failed", message=f"the analysis process stopped (exit {code}): {self._tail()}")
        self._log.close()

    def _tail(self) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - 2000))
            lines = self._log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return "no log"
        return lines[-1][:300] if lines else "no log"

    def _watch(self) -> None:
        try:
            root = psutil.Process(self._proc.pid)
        except psutil.Error:
            return
        while self.state().status == "running" and self._proc.poll() is None:
            elapsed = time.monotonic() - self._started
            mb = _tree_rss_mb(root)
            self._set(memory_mb=mb)
            if mb > self.memory_mb:
                self._stop(
                    State(
                        "failed",
                        message=f"the analysis needed more than its memory budget of {self.memory_mb:,.0f} MB "
                        f"({mb:,.0f} MB in use; PARASCOPE_PREPARE_MEMORY_MB)",
                    )
                )
            elif elapsed > self.time_s:
                self._stop(
                    State(
                        "failed",
                        message=f"the analysis took longer than its budget of {self.time_s:,.0f} s "
                        "(PARASCOPE_PREPARE_TIME_S)",
                    )
                )
            time.sleep(POLL_S)


def _tree_rss_mb(root) -> float:
    total = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the preparing process alone: it unwinds, stops its parse workers and removes its
    half-written folder (workers killed under it would fail its parse mid-cleanup). Then SIGKILL the
    whole group, whatever is left of it, at once or after `grace_s`."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    deadline = time.monotonic() + grace_s  # until the group's last member is gone (SIGKILL is not instant)
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
