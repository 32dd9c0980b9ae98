"""A run directory's layout, and the rules for claiming one (`python -m profiler run --out DIR`).

    DIR/run.json                      the run's state; one writer: the supervisor (`profiler run` of node 0)
    DIR/metrics.json                  written by global rank 0 when training ends (parallel.engine.metrics + profile)
    DIR/traces/rank{r}_trace.json.gz  one Kineto trace per rank, written by that rank
    DIR/logs/rank{r}.log              the rank's stdout and stderr
    DIR/logs/launcher-node{k}.log     torchrun's own output (launcher torchrun), per node
    DIR/status/rank{r}.json           the rank's own state (pid, host, step, error); one writer: that rank
    DIR/nodes/node{k}.json            multi-node runs: each node's supervisor records its part
    DIR/fr/rank{r}.json               the rank's Flight Recorder dump, when the job failed or hung
    DIR/.partial/                     files being written; renamed into place when complete

Every file is written whole and renamed into place (`os.replace`), so a reader sees the previous
version or the next, never half of one; a trace appears under traces/ only once it is complete.

Claiming (isolation): `new_run_dir` makes a fresh `<UTC time>-<label>` directory under the runs
root ($PARASCOPE_RUNS, default ./runs) with an exclusive mkdir, so two runs started at the same
moment get different directories. `claim(DIR)` accepts a missing or empty directory, and creates
run.json exclusively (O_EXCL), so two runs given the same DIR at once cannot both win. A non-empty
DIR is refused unless `force`; with `force`, only a directory that holds nothing but a previous
run's entries (the names above, plus params/) is accepted, and only those entries are removed --
never anything else -- and not while that run's supervisor is still alive on this host.

Pure: stdlib only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUNS_ENV = "PARASCOPE_RUNS"
RUN_JSON = "run.json"
METRICS_JSON = "metrics.json"
RUN_ENTRIES = frozenset({RUN_JSON, METRICS_JSON, "traces", "logs", "status", "nodes", "params", "fr", ".partial"})


class RunDirError(Exception):
    """A run directory that cannot be used, with the reason and what to do."""


def runs_root() -> Path:
    """Where runs go by default (and where the dashboard lists them): $PARASCOPE_RUNS or ./runs."""
    return Path(os.environ.get(RUNS_ENV) or "runs")


def now_iso(timespec: str = "milliseconds") -> str:
    """The current UTC time in ISO 8601, e.g. 2026-12-01T09:52:55.123+00:00."""
    return datetime.now(UTC).isoformat(timespec=timespec)


def slug(text: str) -> str:
    """'DP2 TP2+SP PP2' -> 'dp2-tp2-sp-pp2'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "run"


def trace_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "traces" / f"rank{rank}_trace.json.gz"


def log_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def status_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "status" / f"rank{rank}.json"


def node_path(run_dir: Path, node: int) -> Path:
    return Path(run_dir) / "nodes" / f"node{node}.json"


def flight_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "fr"


FLIGHT_TRIGGER = ".dump"  # created in fr/: every live rank dumps its Flight Recorder (parallel.engine.flight)


def request_flight_dumps(folder: Path, world_size: int, wait_s: float = 5.0) -> int:
    """Create the trigger in `folder` and wait up to `wait_s` for `world_size` dumps; returns how many."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    asked = time.time_ns()
    trigger = folder / FLIGHT_TRIGGER
    trigger.touch()
    os.utime(trigger, ns=(asked, asked))  # a new stamp even within the file system's time tick
    deadline = time.monotonic() + wait_s
    while True:
        n = sum(1 for p in folder.glob("rank*.json") if p.stat().st_mtime_ns >= asked)
        if n >= world_size or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def partial_dir(run_dir: Path) -> Path:
    return Path(run_dir) / ".partial"


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """`obj` as JSON at `path`, through a unique temporary file beside it and os.replace, so a reader
    sees the previous file or the next, never half of one (also with several writers at once)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def disk_full(path: str | Path, margin_bytes: int = 1 << 20) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) has under `margin_bytes` free."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free < margin_bytes
    except OSError:
        return False


def os_error_text(err: OSError, path: str | Path | None = None) -> str:
    """One line for an OSError: 'no space left on device (PATH)' for ENOSPC, else its strerror and path."""
    where = err.filename or path
    if err.errno == errno.ENOSPC:
        return f"no space left on device ({where})"
    return f"{err.strerror or err}" + (f" ({where})" if where else "")


# a run's own JSON files (run.json, metrics.json, status, a sweep, a job record): metrics.json is ~50 KB for
# 60 steps on 4 ranks and a few MB for long runs; a runs dir can be any folder a user points the app at
MAX_RUN_JSON_BYTES = 64 << 20


def load_json_object(path: str | Path, max_bytes: int = MAX_RUN_JSON_BYTES) -> dict:
    """The JSON object in the file at `path`, read bounded: OSError when it cannot be read, ValueError
    with a one-line reason when it is larger than `max_bytes`, not JSON, or not an object."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO or a device would block the read
        raise ValueError("not a regular file")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        size = f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes:,} bytes"
        raise ValueError(f"larger than {size}: not one of a run's JSON files")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to be one of a run's JSON files") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    return doc


def read_json(path: str | Path, max_bytes: int = MAX_RUN_JSON_BYTES) -> dict | None:
    """A JSON object (load_json_object), or None when missing, unreadable, too large or not an object:
    for files a writer may be replacing right now, which the next poll reads again."""
    try:
        return load_json_object(path, max_bytes)
    except (OSError, ValueError):
        return None


def read_statuses(run_dir: Path) -> dict[int, dict]:
    """Every rank's status file that can be read now, by rank."""
    out = {}
    folder = Path(run_dir) / "status"
    if folder.is_dir():
        for p in folder.glob("rank*.json"):
            data = read_json(p)
            if data is not None and p.stem[4:].isdigit():
                out[int(p.stem[4:])] = data
    return out


# Kineto prints these probe markers on every profiler start/stop (no setting turns them off); a tail
# shown to a user skips them so the lines that matter (an error, a traceback) are not pushed out.
KINETO_MARKERS = ("USDT:", "STAGE:")


def log_tail(path: Path, lines: int = 20, max_bytes: int = 64 << 10) -> str:
    """The last `lines` lines of a log, without Kineto's probe markers (reading at most `max_bytes`
    from its end); '' if none. The file itself keeps every line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip("\n")
    kept = [ln for ln in text.split("\n") if not ln.startswith(KINETO_MARKERS)]
    return "\n".join(kept[-lines:])


def new_run_dir(root: Path, label: str) -> Path:
    """A fresh, empty `root/<UTC time>-<label>` (exclusive mkdir: concurrent runs never share one)."""
    root = Path(root)
    try:
        if root.exists() and not root.is_dir():
            raise NotADirectoryError(0, "not a directory")
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"runs directory {root} (${RUNS_ENV} or ./runs): {err.strerror or err}") from None
    base = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{slug(label)}"
    for i in range(1, 10_000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RunDirError(f"no free run directory name for {base!r} in {root}")


def _alive_here(run: dict | None) -> bool:
    """Whether the supervisor a run.json names is still running on this host."""
    sup = (run or {}).get("supervisor") or {}
    pid = sup.get("pid")
    if run is None or run.get("status") != "running" or sup.get("hostname") != socket.gethostname():
        return False
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same_run_started(path: Path, entries: list[Path], run_id: str | None) -> bool:
    """Multi-node on a shared filesystem: other nodes of this very run (same run id) already wrote
    their files here, and no run.json exists yet."""
    if run_id is None or (path / RUN_JSON).exists() or any(p.name not in RUN_ENTRIES for p in entries):
        return False
    records = [read_json(p) for p in (path / "nodes").glob("node*.json")]
    return bool(records) and all(r is not None and r.get("run_id") == run_id for r in records)


def check_reusable(path: Path, *, force: bool, run_id: str | None = None) -> list[Path]:
    """The entries to remove before reusing `path` (none for a missing or empty directory), or
    RunDirError saying why it cannot be used."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path}: exists and is not a directory")
    entries = sorted(path.iterdir()) if path.is_dir() else []
    if not entries or _same_run_started(path, entries, run_id):
        return []
    if not force:
        raise RunDirError(
            f"--out {path}: the directory is not empty ({len(entries)} entries); choose a new "
            "directory, or pass --force to replace the previous run in it"
        )
    foreign = [p.name for p in entries if p.name not in RUN_ENTRIES and not p.name.startswith(f".{RUN_JSON}.")]
    if foreign:
        raise RunDirError(
            f"--out {path}: --force replaces only a previous run, and this directory also holds "
            f"{', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}; nothing was removed"
        )
    run = read_json(path / RUN_JSON)
    if _alive_here(run):
        raise RunDirError(
            f"--out {path}: its run is still going (supervisor pid {run['supervisor']['pid']}); nothing was removed"
        )
    return entries


def claim(path: Path, record: dict, *, force: bool, run_id: str | None = None) -> Path:
    """Make `path` this run's directory and write its first run.json (exclusively); returns it.
    `run_id` (multi-node node 0): files the other nodes of the same run wrote first are kept."""
    path = Path(path)
    for entry in check_reusable(path, force=force, run_id=run_id):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / RUN_JSON, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise RunDirError(f"--out {path}: another run claimed this directory at the same moment") from None
    except OSError as err:
        raise RunDirError(f"--out {path}: cannot be used ({err.strerror or err})") from None
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    return path


def claim_node(path: Path, record: dict, *, node: int, force: bool) -> Path:
    """Node k > 0 of a multi-node run: the directory may be shared with node 0 (a shared
    filesystem) or its own. It writes only its own files, so it refuses only when its node record
    is there from another run (a different run id) and not `force`."""
    path = Path(path)
    old = read_json(node_path(path, node))
    if old is not None and old.get("run_id") != record.get("run_id") and not force:
        raise RunDirError(
            f"--out {path}: holds node {node}'s record of another run ({old.get('run_id')!r}); "
            "choose a new directory, or pass --force to replace it"
        )
    write_json_atomic(node_path(path, node), record)
    return path
