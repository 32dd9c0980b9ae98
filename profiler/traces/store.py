"""The columnar store of a trace set: each rank's tables in their own Arrow IPC files, read one rank
(or one window of a rank) at a time, so no analysis needs the whole set in memory.

Layout of one entry (``<cache dir>/<key>/``)::

    meta.json                  small tables (ranks, pg_config, threads, skipped, step windows),
                               rank -> part, each part file's size; written last
    part-000000.events.arrow   one file's events, sorted by start: ts_ns, dur_ns, cat, name
                               (dictionary-encoded), kind, op (int8 codes into patterns.KINDS/OPS),
                               pid, tid, correlation, external_id
    part-000000.comm.arrow     its comm_args (event = row of the rank's events)

A part holds one file's tables, or -- for small files -- a batch of files' tables one after the other
(`rows`: rank -> its row ranges in the part's events and comm tables), so 10,000 tiny ranks are a few
dozen files to write, open and check, not 20,000.

Arrow IPC files rather than Parquet: they are read memory-mapped with no decoding (a rank's
columns cost what they hold, and only the pages a query touches are read), and a window query is
a binary search over the sorted ``ts_ns`` column of the ranks it shows -- exact row ranges, where
Parquet's row-group statistics would still decode whole groups. (DuckDB would add a query engine
for what two searchsorted calls do.) Each part is written under a temporary name and renamed; the
entry's folder is renamed into place after its meta.json, so a reader never trusts half an entry.

Analysis results of a cached set are kept beside its parts (``analysis-<plan hash>/*.arrow``, by
`save_frame`), so a warm `profiler analyze` reads them instead of recomputing.

Pure: numpy, pandas, pyarrow, orjson.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from profiler.traces.patterns import KINDS, OPS

ARROW_MAGIC = b"ARROW1"
EVENT_COLUMNS = ("ts_ns", "dur_ns", "cat", "name", "kind", "op", "pid", "tid", "correlation", "external_id")
_KIND_CATS = pd.CategoricalDtype(list(KINDS))
_OP_CATS = pd.CategoricalDtype(list(OPS))
_COMM_INTS = ("in_nelems", "out_nelems", "group_size", "seq", "src_rank", "dst_rank", "input_bytes")
_COMM_CATS = ("coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks")


def part_tables(
    columns: dict, names: np.ndarray, cats: np.ndarray, comm: list[dict], comm_fields: tuple[str, ...]
) -> tuple[pa.Table, pa.Table]:
    """(events, comm_args) Arrow tables of one parsed file: rows sorted by start (stable), comm rows
    renumbered to the sorted order."""
    events, table, _ = batch_tables([(columns, names, cats, comm)], comm_fields)
    return events, table


def batch_tables(
    files: list[tuple[dict, np.ndarray, np.ndarray, list[dict]]], comm_fields: tuple[str, ...]
) -> tuple[pa.Table, pa.Table, list[tuple[int, int, int, int]]]:
    """(events, comm_args) Arrow tables of several parsed files (columns, names, cats, comm args)
    laid end to end -- each file's rows sorted by start (stable), its comm rows renumbered to that
    order and counted from its own first row -- and each file's (events lo, hi, comm lo, hi) rows:
    one sort and one table for a batch of small files. Names and cats share one dictionary."""
    n = [len(f[0]["ts_ns"]) for f in files]
    first = np.r_[0, np.cumsum(n)].astype(np.int64)
    file_of = np.repeat(np.arange(len(files)), n)
    ts = np.concatenate([f[0]["ts_ns"] for f in files]) if files else np.empty(0, np.int64)
    order = np.lexsort((ts, file_of))  # by file, then by start; stable
    where = np.empty_like(order)
    where[order] = np.arange(len(order))
    arrays = {}
    for k in EVENT_COLUMNS:
        if k in ("name", "cat"):
            words = [f[1] if k == "name" else f[2] for f in files]
            offset = np.r_[0, np.cumsum([len(w) for w in words])].astype(np.int64)
            codes = np.concatenate([np.asarray(f[0][k], dtype=np.int64) + offset[i] for i, f in enumerate(files)])
            joined = np.concatenate([np.asarray(w, dtype=object) for w in words]) if words else np.empty(0, object)
            inverse, unique = pd.factorize(joined) if len(joined) else (np.empty(0, np.int64), np.empty(0, object))
            codes = np.asarray(inverse, dtype=np.int64)[codes[order]] if len(codes) else codes
            values = pa.array(np.asarray(unique, dtype=object), type=pa.string())
            arrays[k] = pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), values)
            continue
        col = np.concatenate([f[0][k] for f in files])[order]
        if k in ("kind", "op"):
            arrays[k] = pa.array(col.astype(np.int8), type=pa.int8())
        else:
            arrays[k] = pa.array(col)
    events = pa.table(arrays)
    comm = [(i, r) for i, f in enumerate(files) for r in f[3]]
    rows = np.asarray([first[i] + r["event"] for i, r in comm], dtype=np.int64)
    at = np.asarray([i for i, _ in comm], dtype=np.int64)
    data = {"event": where[rows] - first[at] if len(rows) else rows}
    for c in comm_fields:
        values = [r[c] for _, r in comm]
        data[c] = pa.array(values, type=pa.int64() if c in _COMM_INTS else pa.string())
    table = pa.table(data)
    if len(rows):  # by file, then by the event's sorted row
        table = table.take(pa.array(np.lexsort((data["event"], at))))
    m = np.bincount(at, minlength=len(files)) if len(files) else np.zeros(0, np.int64)
    comm_first = np.r_[0, np.cumsum(m)].astype(np.int64)
    spans = [(int(first[i]), int(first[i + 1]), int(comm_first[i]), int(comm_first[i + 1])) for i in range(len(files))]
    return events, table, spans


def write_table(table: pa.Table, path: Path) -> int:
    """Write `table` as an uncompressed Arrow IPC file at `path` (temporary name, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)
    return path.stat().st_size


def intact(path: Path, size: int) -> bool:
    """The file has the size it was written with and Arrow's magic at both ends (cheap: 12 bytes)."""
    try:
        if path.stat().st_size != size or size < 12:
            return False
        with open(path, "rb") as f:
            head = f.read(6)
            f.seek(-6, os.SEEK_END)
            return head == ARROW_MAGIC and f.read(6) == ARROW_MAGIC
    except OSError:
        return False


def _read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


_OPEN: OrderedDict[tuple, pa.Table] = OrderedDict()  # per process: the last parts read (memory-mapped)
_OPEN_KEPT = 8


def _read_shared(path: Path) -> pa.Table:
    """`_read(path)`, kept per process for the next rank of the same batch part: a part of 200 ranks
    is opened once, not 200 times. Keyed by the file's identity, so a rewritten file is read again."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    table = _OPEN.get(key)
    if table is None:
        table = _OPEN[key] = _read(path)
        while len(_OPEN) > _OPEN_KEPT:
            _OPEN.popitem(last=False)
    else:
        _OPEN.move_to_end(key)
    return table


def events_frame(table: pa.Table) -> pd.DataFrame:
    """The pandas events of one part (RangeIndex = row in the part): name and cat as categoricals,
    kind and op as categoricals over patterns.KINDS / OPS."""
    frame = table.to_pandas()
    frame["kind"] = pd.Categorical.from_codes(frame["kind"].to_numpy().astype(np.int16), dtype=_KIND_CATS)
    frame["op"] = pd.Categorical.from_codes(frame["op"].to_numpy().astype(np.int16), dtype=_OP_CATS)
    return frame


def comm_frame(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()
    for c in _COMM_INTS:
        frame[c] = pd.array(frame[c], dtype="Int64") if len(frame) else pd.array([], dtype="Int64")
    for c in _COMM_CATS:
        frame[c] = pd.Categorical(frame[c])
    return frame


class PartStore:
    """rank -> its events and comm_args: Arrow IPC files in `folder` (read memory-mapped, a few ranks
    kept decoded, bounded by events), or Arrow tables held in memory when no folder could be written.
    `rows`: rank -> (events lo, hi, comm lo, hi) for a rank sharing its part with others (a batch of
    small files); a rank not in it owns its whole part."""

    def __init__(
        self,
        parts: dict[int, str],
        *,
        folder: Path | None = None,
        tables: dict[str, tuple[pa.Table, pa.Table]] | None = None,
        budget_events: int = 4_000_000,
        rows: dict[int, tuple[int, int, int, int]] | None = None,
    ):
        self.parts = dict(parts)
        self.rows = {int(r): tuple(int(x) for x in v) for r, v in (rows or {}).items()}
        self.folder = Path(folder) if folder is not None else None
        self.tables = tables or {}
        self.budget_events = budget_events
        self._recent: OrderedDict[tuple[str, int], tuple[pd.DataFrame, int]] = OrderedDict()

    @property
    def on_disk(self) -> bool:
        """Parts are files another process can open (not tables held by this one)."""
        return self.folder is not None and not self.tables

    def only(self, rank: int) -> "PartStore":
        """This store narrowed to one rank's part, as a task for another process is sent it: a folder
        and a file name when the parts are on disk (the task opens its own partition); the store
        itself when they are tables held here."""
        if not self.on_disk:
            return self
        return self.narrowed([rank])

    def narrowed(self, ranks: list[int]) -> "PartStore":
        """This store narrowed to `ranks` (only: one rank; a task of a batch part's ranks: several)."""
        if not self.on_disk:
            return self
        return PartStore(
            {r: self.parts[r] for r in ranks},
            folder=self.folder,
            budget_events=self.budget_events,
            rows={r: self.rows[r] for r in ranks if r in self.rows},
        )

    def _table(self, rank: int, which: int) -> pa.Table:
        part = self.parts[rank]
        if part in self.tables:
            table = self.tables[part][which]
        else:
            assert self.folder is not None
            table = _read_shared(self.folder / f"{part}.{('events', 'comm')[which]}.arrow")
        span = self.rows.get(rank)
        if span is None:
            return table
        lo, hi = span[2 * which], span[2 * which + 1]
        return table.slice(lo, hi - lo)

    def _cached(self, key: tuple[str, int], make) -> pd.DataFrame:
        hit = self._recent.get(key)
        if hit is not None:
            self._recent.move_to_end(key)
            return hit[0]
        frame = make()
        self._recent[key] = (frame, len(frame))
        while len(self._recent) > 1 and sum(n for _, n in self._recent.values()) > self.budget_events:
            self._recent.popitem(last=False)
        return frame

    def _frame(self, rank: int, table: pa.Table) -> pd.DataFrame:
        frame = events_frame(table)
        if rank in self.rows:  # a batch part's dictionaries hold its other ranks' names too
            for c in ("name", "cat"):
                frame[c] = frame[c].cat.remove_unused_categories()
        return frame

    def events(self, rank: int) -> pd.DataFrame:
        return self._cached(("events", rank), lambda: self._frame(rank, self._table(rank, 0)))

    def comm_args(self, rank: int) -> pd.DataFrame:
        return self._cached(("comm", rank), lambda: comm_frame(self._table(rank, 1)))

    def arrow(self, rank: int, which: str) -> pa.Table:
        """The rank's `which` ('events' or 'comm') Arrow table as stored: memory-mapped from its file,
        nothing decoded (for analyses that want plain columns, not a pandas frame)."""
        return self._table(rank, ("events", "comm").index(which))

    def arrow_of(self, ranks: list[int]) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """The events and comm Arrow tables of `ranks` laid end to end (comm with an `at` column: the
        index of its rank in `ranks`; its `event` stays the row in the rank's own events) and where
        each rank's events begin: the ranks of a batch part read as one table, nothing decoded."""
        events = [self._table(r, 0) for r in ranks]
        comms = [self._table(r, 1) for r in ranks]
        starts = np.zeros(len(ranks), dtype=np.int64)
        if len(ranks) > 1:
            starts[1:] = np.cumsum([len(e) for e in events[:-1]])
        comms = [c.append_column("at", pa.array(np.full(len(c), k, dtype=np.int64))) for k, c in enumerate(comms)]
        return pa.concat_tables(events), pa.concat_tables(comms), starts

    def window(self, rank: int, start_ns: int, end_ns: int) -> pd.DataFrame:
        """The rank's events starting in [start_ns, end_ns): only those rows are read (binary search on
        the sorted start column; the file is memory-mapped, so the other pages are never touched)."""
        table = self._table(rank, 0)
        ts = table.column("ts_ns").to_numpy()
        lo, hi = np.searchsorted(ts, [start_ns, end_ns], side="left")
        frame = self._frame(rank, table.slice(int(lo), int(hi - lo)))
        frame.index = pd.RangeIndex(int(lo), int(hi))
        return frame

    def forget(self) -> None:
        self._recent.clear()


def save_frame(frame: pd.DataFrame, path: Path) -> None:
    """Keep a derived table (an analysis result) beside the store: Arrow IPC with pandas' dtypes and
    `attrs` in the schema metadata; written under a temporary name and renamed. Disk problems are
    swallowed: a result cache must never fail an analysis."""
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        attrs = orjson.dumps(frame.attrs, option=orjson.OPT_NON_STR_KEYS)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"parascope.attrs": attrs})
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(table, path)
    except (OSError, TypeError, ValueError, pa.ArrowException):
        return


def load_frame(path: Path) -> pd.DataFrame | None:
    """A table kept by save_frame, or None when there is none (or it cannot be read)."""
    if not path.is_file():
        return None
    try:
        table = _read(path)
        frame = table.to_pandas()
        frame.attrs.update(orjson.loads((table.schema.metadata or {}).get(b"parascope.attrs", b"{}")))
    except (OSError, ValueError, TypeError, pa.ArrowException):
        return None
    return frame
