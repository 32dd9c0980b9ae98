"""The columnar store of a trace set: each rank's tables in their own Arrow IPC files, read one rank
(or one window of a rank) at a time, so no analysis needs the whole set in memory.

Layout of one entry (``<cache dir>/<key>/``)::

    meta.json                  small tables (ranks, pg_config, threads, skipped, step windows),
                               rank -> part, each part file's size; written last
    part-000000.events.arrow   one file's events, sorted by start: ts_ns, dur_ns, cat, name
                               (dictionary-encoded), kind, op (int8 codes into patterns.KINDS/OPS),
                               pid, tid, correlation, external_id
    part-000000.comm.arrow     its comm_args (event = row in the part)

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
    order = np.argsort(columns["ts_ns"], kind="stable")
    where = np.empty_like(order)
    where[order] = np.arange(len(order))
    arrays = {}
    for k in EVENT_COLUMNS:
        col = columns[k][order]
        if k in ("name", "cat"):
            values = pa.array(names if k == "name" else cats, type=pa.string())
            arrays[k] = pa.DictionaryArray.from_arrays(pa.array(col, type=pa.int32()), values)
        elif k in ("kind", "op"):
            arrays[k] = pa.array(col.astype(np.int8), type=pa.int8())
        else:
            arrays[k] = pa.array(col)
    events = pa.table(arrays)
    rows = np.asarray([r["event"] for r in comm], dtype=np.int64)
    data = {"event": where[rows] if len(rows) else rows}
    for c in comm_fields:
        values = [r[c] for r in comm]
        data[c] = pa.array(values, type=pa.int64() if c in _COMM_INTS else pa.string())
    table = pa.table(data)
    if len(rows):
        table = table.take(pa.array(np.argsort(data["event"], kind="stable")))
    return events, table


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
    kept decoded, bounded by events), or Arrow tables held in memory when no folder could be written."""

    def __init__(
        self,
        parts: dict[int, str],
        *,
        folder: Path | None = None,
        tables: dict[str, tuple[pa.Table, pa.Table]] | None = None,
        budget_events: int = 4_000_000,
    ):
        self.parts = dict(parts)
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
        return PartStore({rank: self.parts[rank]}, folder=self.folder, budget_events=self.budget_events)

    def _table(self, rank: int, which: int) -> pa.Table:
        part = self.parts[rank]
        if part in self.tables:
            return self.tables[part][which]
        assert self.folder is not None
        return _read(self.folder / f"{part}.{('events', 'comm')[which]}.arrow")

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

    def events(self, rank: int) -> pd.DataFrame:
        return self._cached(("events", rank), lambda: events_frame(self._table(rank, 0)))

    def comm_args(self, rank: int) -> pd.DataFrame:
        return self._cached(("comm", rank), lambda: comm_frame(self._table(rank, 1)))

    def arrow(self, rank: int, which: str) -> pa.Table:
        """The rank's `which` ('events' or 'comm') Arrow table as stored: memory-mapped from its file,
        nothing decoded (for analyses that want plain columns, not a pandas frame)."""
        return self._table(rank, ("events", "comm").index(which))

    def window(self, rank: int, start_ns: int, end_ns: int) -> pd.DataFrame:
        """The rank's events starting in [start_ns, end_ns): only those rows are read (binary search on
        the sorted start column; the file is memory-mapped, so the other pages are never touched)."""
        table = self._table(rank, 0)
        ts = table.column("ts_ns").to_numpy()
        lo, hi = np.searchsorted(ts, [start_ns, end_ns], side="left")
        frame = events_frame(table.slice(int(lo), int(hi - lo)))
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
