"""The cache of loaded trace sets: one columnar store (profiler.traces.store) per input, keyed by
the content hash of the input files.

Layout: ``<cache dir>/<key>/meta.json`` (the small tables, the run.json, rank -> part, each part
file's size, and a batch part's row ranges per rank) beside the parts' Arrow IPC files. The loader writes the parts into a temporary
``.tmp-*`` folder of the cache dir; `publish` writes meta.json last and renames the folder into
place, so a reader never sees half an entry. Opening an entry checks every part file's size and
Arrow magic (12 bytes each); an unreadable or damaged entry is ignored (and rebuilt), never an error.

The cache dir is `$PARASCOPE_CACHE`, else ``~/.cache/parascope``.

Pure: pandas, pyarrow, orjson.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import orjson
import pandas as pd

from profiler.traces.model import Traces
from profiler.traces.store import PartStore, intact

SMALL_TABLES = ("ranks", "pg_config", "threads", "skipped", "step_windows", "shapes")


def default_dir() -> Path:
    env = os.environ.get("PARASCOPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "parascope"


def read(cache_dir: Path, key: str) -> Traces | None:
    entry = Path(cache_dir) / key
    if not (entry / "meta.json").is_file():
        return None
    try:
        meta = orjson.loads((entry / "meta.json").read_bytes())
        parts = {int(r): str(p) for r, p in meta["parts"].items()}
        sizes = {int(r): [int(x) for x in v] for r, v in meta["sizes"].items()}
        rows = {int(r): tuple(int(x) for x in v) for r, v in meta.get("rows", {}).items()}
        files = {(parts[r], tuple(pair)) for r, pair in sizes.items()}  # a batch part: checked once
        if set(sizes) != set(parts) or not all(
            intact(entry / f"{part}.{kind}.arrow", size)
            for part, pair in files
            for kind, size in zip(("events", "comm"), pair)
        ):
            return None
        small = {name: pd.DataFrame(meta["tables"][name]) for name in SMALL_TABLES}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    for name, frame in small.items():
        for col, dtype in meta["dtypes"][name].items():
            if col in frame:
                frame[col] = frame[col].astype(dtype)
    return Traces(
        store=PartStore(parts, folder=entry, rows=rows),
        part_sizes=sizes,
        source=meta["source"],
        run=meta["run"],
        key=key,
        from_cache=True,
        **small,
    )


DIGESTS = "digests.json"  # {stat key: sha256} of trace files hashed before (TraceSet.digest's memo)
MAX_DIGESTS = 200_000  # entries kept (~25 MB); the oldest are dropped beyond it
MAX_DIGESTS_BYTES = 64 << 20


def read_digests(cache_dir: Path) -> dict[str, str]:
    """The file-hash memo of the cache dir; empty when there is none or it cannot be used (never an
    error: without it every file is hashed again)."""
    path = Path(cache_dir) / DIGESTS
    try:
        if path.stat().st_size > MAX_DIGESTS_BYTES:
            return {}
        memo = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict):
        return {}
    return {k: v for k, v in memo.items() if isinstance(v, str) and len(v) == 64}


def write_digests(cache_dir: Path, memo: dict[str, str]) -> None:
    """Store the memo (temporary name, then rename: a reader sees the old one or the new one); the
    newest MAX_DIGESTS entries. Disk problems are swallowed, as for every cache write."""
    if len(memo) > MAX_DIGESTS:
        memo = dict(list(memo.items())[-MAX_DIGESTS:])
    path = Path(cache_dir) / DIGESTS
    tmp = path.with_name(f".{DIGESTS}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(orjson.dumps(memo))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _plain(col: pd.Series) -> list:
    """The column as JSON-able Python values, missing ones as None."""
    return [None if pd.isna(v) else v for v in col.astype(object).tolist()]


STALE_TMP_S = 3600  # a temporary folder untouched this long belongs to a writer that was killed


def remove_stale_temporaries(cache_dir: Path, *, older_than_s: float = STALE_TMP_S) -> int:
    """Remove `.tmp-*` folders left by killed writes (never renamed into place); returns how many."""
    removed, now = 0, time.time()
    for tmp in Path(cache_dir).glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > older_than_s:
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def publish(folder: Path, cache_dir: Path, traces: Traces) -> Path | None:
    """Write meta.json into the parts' `folder` and rename it to `<cache_dir>/<traces.key>`; returns the
    entry's path (another process's, when it stored the same key first), or None when it could not be
    written (the folder is then left to its Traces). Never raises for a disk problem."""
    if not traces.part_sizes:
        return None
    tables = {name: getattr(traces, name) for name in SMALL_TABLES}
    meta = {
        "source": traces.source,
        "run": traces.run,
        "parts": {str(r): p for r, p in traces.store.parts.items()},
        "sizes": {str(r): s for r, s in traces.part_sizes.items()},
        "rows": {str(r): list(v) for r, v in traces.store.rows.items()},
        "tables": {n: {c: _plain(t[c]) for c in t.columns} for n, t in tables.items()},
        "dtypes": {n: {c: str(t[c].dtype) for c in t.columns} for n, t in tables.items()},
    }
    target = Path(cache_dir) / traces.key
    try:
        tmp = folder / ".meta.json.tmp"
        tmp.write_bytes(orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS))
        os.replace(tmp, folder / "meta.json")
    except (OSError, TypeError):
        return None
    try:
        os.replace(folder, target)
    except OSError:  # another process stored the same key first: use theirs when it is whole
        if read(cache_dir, traces.key) is None:  # a damaged entry: replaced by this one
            shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(folder, target)
            except OSError:
                return None
        else:
            shutil.rmtree(folder, ignore_errors=True)
    traces.store.folder = target
    return target
