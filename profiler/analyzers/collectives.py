"""The collectives table: one row per collective instance per rank, every field traceable to events.

    from profiler.analyzers import collectives
    table = collectives(traces, plan)          # plan: Plan, dict or None (run.json's when known)

How rows are made, per rank:
- CPU-side comm events (``ps.comm`` annotations, c10d::*, record_param_comms, nccl:*, gloo:*,
  symm_mem::*) nest on their thread; the outermost one is the *root* of a collective call and the
  nested ones lend it metadata (our annotation, ``Collective name``, message sizes, group).
- GPU ranks: one row per communication kernel (source 'kernel'), tied to its CPU root through the
  launch: kernel.correlation -> cuda_runtime event -> the root holding it on that thread (else the
  kernel's External id -> a CPU comm event). The kernel's own args win, then the root's. Roots that
  launched no kernel (a sampled trace, a gloo group) become rows with source 'cpu'.
- CPU-only ranks: one row per root (source 'cpu'). gloo runs a collective on a worker thread
  (``gloo:all_reduce`` on pt_gloo_runloop) that is not nested in the caller's root; each such
  worker event is paired with the earliest unpaired compatible root that started before it (a root
  whose span holds it first), extending the row's end and never counted twice.

Columns: rank, source, op, dim, dim_source, name, start_ns, end_ns, dur_ns, issue_ns, bytes,
bytes_source, group ('0,1,2,3'), group_size, group_desc, pg_name, seq, seq_source, instance,
algbw_gbps, busbw_gbps (nccl-tests: bytes / dur, x bus factor), stream, step, event (row of
the rank's events: traces.rank_events(rank)), cpu_event (the root's row there, -1 if none).

Across ranks, after the per-rank parts: a group size the trace did not record is the number of ranks
in the row's instance when the set holds every rank of the job (its busbw then follows), and a
collective with no other evidence whose group is the whole world is labelled 'world' (dim_source
'group_size'): spanning every rank says which ranks, not which parallel dimension -- a DDP
gradient all-reduce and a DLRM embedding all-to-all look the same.

Pure: numpy, pandas.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from parallel.core.comm import bus_factor
from profiler.analyzers.labels import P2P_OPS, DimLabeler, PlanLike, plan_of
from profiler.analyzers.steps import step_windows
from profiler.traces.loader import map_part_tasks
from profiler.traces.model import COMM_ARG_FIELDS, Traces, rank_columns
from profiler.traces.patterns import KINDS, OPS, RECORD_PARAM_COMMS, dtype_bytes, normalize_op
from profiler.traces.store import PartStore
from runfiles.annotations import parse_comm

META_FIELDS = COMM_ARG_FIELDS
INPUT_IS_SIZE = frozenset({"all_reduce", "broadcast", "reduce", "all_to_all", "send"})
COLUMNS = [
    "rank",
    "source",
    "op",
    "dim",
    "dim_source",
    "name",
    "start_ns",
    "end_ns",
    "dur_ns",
    "issue_ns",
    "bytes",
    "bytes_source",
    "group",
    "group_size",
    "group_desc",
    "pg_name",
    "seq",
    "seq_source",
    "instance",
    "algbw_gbps",
    "busbw_gbps",
    "stream",
    "step",
    "event",
    "cpu_event",
]


@dataclass(eq=False)  # identity: list.remove must not compare every field of every pending root
class _Root:
    row: int
    tid: tuple
    start: int
    end: int
    name: str
    members: list = field(default_factory=list)  # event rows, root first
    worker: bool = False  # only gloo:* events: the work of a call made elsewhere
    paired: int = -1  # worker row merged into this root
    kernels: int = 0


def collectives(
    traces: Traces, plan: PlanLike = None, *, workers: int = 1, scheduler: str | None = None
) -> pd.DataFrame:
    """The collectives table (see the module docstring); empty with the same columns if none. Each
    rank's part of the table is made from that rank's events alone (rows, steps, labels, seq), so with
    `workers` > 1 (or a Dask `scheduler`, whose workers see the store's folder) and a store on disk,
    that many processes (Dask tasks) make them, each reading its ranks' partitions itself: the same
    rows, in the same order, and only columns travel back."""
    plan = plan_of(plan, traces)
    sw, pg = step_windows(traces), traces.pg_config
    windows, empty_w = rank_columns(sw, _WINDOW_FIELDS)
    pg_of, empty_pg = rank_columns(pg, _PG_FIELDS)
    parts, not_collectives = [], Counter()
    tasks = map_part_tasks(
        traces,
        _ranks_table,
        lambda r: (pg_of.get(r, empty_pg), windows.get(r, empty_w)),
        plan,
        workers=workers,
        scheduler=scheduler,
        preload=__name__,
    )
    for part, skipped in tasks:
        if part:
            parts.append(part)
        not_collectives.update(skipped)
    if not parts:
        table = pd.DataFrame({c: pd.Series(dtype=_DTYPES.get(c, "object")) for c in COLUMNS})
    else:  # one frame of all ranks' columns: a frame per rank and a concat of them cost ~5x more
        table = pd.DataFrame({c: _joined([p[c] for p in parts]) for c in COLUMNS})
        ranks = table["rank"].to_numpy()
        if len(ranks) > 1 and (np.diff(ranks) < 0).any():  # parts of interleaved ranks: rank order
            table = table.iloc[np.argsort(ranks, kind="stable")].reset_index(drop=True)
        table = table.astype(_DTYPES)
        _sizes_from_instances(table, traces)
        _label_world(table, traces, plan)
    table.attrs["not_collectives"] = dict(not_collectives)  # CPU comm events that are no collective
    return table


def _complete(traces: Traces) -> bool:
    """Every rank of the job is in the set (so an instance's ranks are its whole group)."""
    return traces.world_size > 1 and set(traces.rank_ids) == set(range(traces.world_size))


def _sizes_from_instances(table: pd.DataFrame, traces: Traces) -> None:
    """Group sizes the trace did not record, from the instances: in a set holding every rank of the
    job, the ranks that took part in one collective instance are its group. Fills group_size and
    busbw for those rows (p2p rows excepted: their size is the pair)."""
    missing = (table["group_size"].isna() | (table["group_size"] < 1)).to_numpy() & ~table["op"].isin(
        P2P_OPS
    ).to_numpy()
    if not missing.any() or not _complete(traces):
        return
    ranks = table.groupby("instance", observed=True)["rank"].nunique()
    size = table.loc[missing, "instance"].map(ranks).to_numpy(dtype=float)
    ok = size > 1
    rows = np.flatnonzero(missing)[ok]
    if not len(rows):
        return
    table.loc[table.index[rows], "group_size"] = size[ok].astype(np.int64)
    keys = list(zip(table["op"].iloc[rows].tolist(), size[ok].astype(int).tolist()))
    factors = np.array([bus_factor(*k) for k in keys], dtype=float)
    table.loc[table.index[rows], "busbw_gbps"] = table["algbw_gbps"].iloc[rows].to_numpy() * factors


def _label_world(table: pd.DataFrame, traces: Traces, plan) -> None:
    """Collectives still 'unknown' whose group is every rank of the job: the plan's dimension when it
    has one spanning the world (dp 8 alone, tp 2 alone: dim_source 'plan'), else 'world' (dim_source
    'group_size': the evidence is the group's size, not a dimension)."""
    world = traces.world_size
    if world < 2:
        return
    hit = (table["dim"] == "unknown") & (table["group_size"] == world) & ~table["op"].isin(P2P_OPS)
    spanning = [d for d in ("dp", "tp", "pp", "cp") if plan is not None and getattr(plan, d) == world]
    label = (spanning[0], "plan") if len(spanning) == 1 else ("world", "group_size")
    if hit.any():
        for col, value in zip(("dim", "dim_source"), label):
            if isinstance(table[col].dtype, pd.CategoricalDtype) and value not in table[col].cat.categories:
                table[col] = table[col].cat.add_categories([value])
            table.loc[hit, col] = value


_KINDS = ("ps_comm", "cpu_comm", "runtime", "comm")  # the events a row is made of


_KIND_NAMES = np.array(KINDS, dtype=object)
_OP_NAMES = np.array([*OPS, None], dtype=object)  # code -1 (no op) -> None


def _event_columns(table: pa.Table, starts: np.ndarray) -> dict[str, np.ndarray]:
    """The events of _KINDS of several ranks' tables laid end to end (`starts`: where each rank's rows
    begin) as plain columns (row: the event's row in the joined table; at: the index of its rank; kind,
    op and name as Python strings): only those rows, no pandas frame -- the collectives need a few % of
    a rank's events, and per-rank frames cost more than the rows."""
    rows = np.flatnonzero(np.isin(table.column("kind").to_numpy(), [KINDS.index(k) for k in _KINDS]))
    sub = table.take(pa.array(rows))
    cols = {c: sub.column(c).to_numpy() for c in ("ts_ns", "dur_ns", "pid", "tid", "correlation", "external_id")}
    cols["row"] = rows
    cols["at"] = np.searchsorted(starts, rows, side="right") - 1
    cols["kind"] = _KIND_NAMES[sub.column("kind").to_numpy()]
    cols["op"] = _OP_NAMES[sub.column("op").to_numpy()]
    name = sub.column("name")
    name = name.unify_dictionaries().combine_chunks() if isinstance(name, pa.ChunkedArray) else name
    if isinstance(name, pa.ChunkedArray):  # no chunk at all: no row is a comm event
        cols["name"] = np.array([], dtype=object)
        return cols
    words = name.dictionary.to_numpy(zero_copy_only=False).astype(object)
    cols["name"] = words[name.indices.to_numpy()] if len(words) else np.array([], dtype=object)
    return cols


def _comm_meta(table: pa.Table, starts: np.ndarray) -> dict[int, dict]:
    """joined event row -> its comm args (None where not recorded), from the ranks' Arrow comm tables
    laid end to end (`starts`: where each rank's rows begin in the joined events)."""
    fields = list(META_FIELDS)
    values = [table.column(c).to_pylist() for c in fields]
    events = table.column("event").to_numpy() + starts[table.column("at").to_numpy()]
    return {e: dict(zip(fields, vals)) for e, *vals in zip(events.tolist(), *values)}


# Per process (the caller's or a worker's): ps.comm name -> label (every rank of a group has the same
# names), and the last plan's labeler (building one walks every group of the plan).
_LABELS: dict = {}
_LABELERS: dict = {}


_WINDOW_FIELDS = ("start_ns", "end_ns", "step")
_PG_FIELDS = ("rank", "pg_name", "ranks", "pg_desc", "pg_size")


def _ranks_table(store: PartStore, rank_args: list[tuple], plan):
    """The finished part of the table of several ranks, each rank's rows from its own events alone
    (their columns, ranks in the order given; {} when none has a collective) and their CPU comm events
    that are no collective: a task (loader.map_part_tasks) that runs in a worker process or on a Dask
    worker as well as here. `rank_args`: (rank, gpu, pg, windows) per rank -- its pg_config rows and
    step windows as columns (rank_columns). The ranks' events are read as one table, so a part of
    hundreds of small ranks costs a few array operations, not a few hundred."""
    skipped: Counter = Counter()
    ranks = [a[0] for a in rank_args]
    events, comm, starts = store.arrow_of(ranks)
    cols = _event_columns(events, starts)
    rows = _rank_rows(cols, ranks, [a[1] for a in rank_args], starts, _comm_meta(comm, starts), _LABELS, skipped)
    if not rows:
        return {}, dict(skipped)
    rows.sort(key=lambda r: r["rank"])  # rank by rank (stable: each rank's rows in their own order)
    key = repr(plan)
    if key not in _LABELERS:
        _LABELERS.clear()
        _LABELERS[key] = DimLabeler(plan)
    out = {c: [r[c] for r in rows] for c in _ROW_FIELDS}
    out["step"] = _steps(
        np.asarray(out["rank"], dtype=np.int64), np.asarray(out["issue_ns"], dtype=np.int64), rank_args
    )
    pg = {f: np.concatenate([np.asarray(a[2][f], dtype=object) for a in rank_args]) for f in _PG_FIELDS}
    out.update(_label(rows, pg, _LABELERS[key]))
    # int columns as arrays here, in the worker: the caller joins 1,000s of ranks' pieces with one
    # concatenate instead of converting lists of Python ints (~30 ms a column at 1,024 ranks)
    ints = {c: np.asarray(out[c], dtype=np.int64) for c in COLUMNS if _DTYPES.get(c) == "int64"}
    return {c: ints[c] if c in ints else out[c] for c in COLUMNS}, dict(skipped)


def _steps(rank: np.ndarray, issue: np.ndarray, rank_args: list[tuple]) -> np.ndarray:
    """The step of each row (rank, issue time): its rank's window holding the time, -1 if none
    (steps.step_of for many ranks at once). Windows and rows are sorted together by (rank, time),
    a window before a row at the same time; a row's window is the last window before it, when it is
    of the row's rank and still open at the time."""
    w_rank = np.concatenate([np.full(len(a[3]["step"]), a[0], dtype=np.int64) for a in rank_args])
    w = {c: np.concatenate([np.asarray(a[3][c], dtype=np.int64) for a in rank_args]) for c in _WINDOW_FIELDS}
    out = np.full(len(issue), -1, dtype=np.int64)
    if not len(w_rank) or not len(issue):
        return out
    order = np.lexsort((w["start_ns"], w_rank))
    w_rank, starts, ends, steps = w_rank[order], w["start_ns"][order], w["end_ns"][order], w["step"][order]
    n = len(w_rank)
    kind = np.r_[np.zeros(n, np.int8), np.ones(len(issue), np.int8)]
    both = np.lexsort((kind, np.r_[starts, issue], np.r_[w_rank, rank]))
    last = np.maximum.accumulate(np.where(both < n, both, -1))  # the latest window at each position
    i = np.empty(len(issue), dtype=np.int64)
    i[both[both >= n] - n] = last[both >= n]
    ok = i >= 0
    ok[ok] = (w_rank[i[ok]] == rank[ok]) & (issue[ok] < ends[i[ok]])
    out[ok] = steps[i[ok]]
    return out


def _joined(pieces: list) -> Any:
    """One column from the ranks' pieces: lists joined as a list, arrays (numpy, pandas) concatenated."""
    if all(isinstance(p, list) for p in pieces):
        return [v for p in pieces for v in p]
    if all(isinstance(p, np.ndarray) for p in pieces):
        return np.concatenate(pieces)
    if all(isinstance(p, pd.arrays.IntegerArray) for p in pieces):  # values and NA mask joined, not per value
        values = np.concatenate([p.to_numpy(dtype=np.int64, na_value=0) for p in pieces])
        return pd.arrays.IntegerArray(values, np.concatenate([p.isna() for p in pieces]))
    return pd.concat([pd.Series(p) for p in pieces], ignore_index=True)


# The row fields taken as they are; _label makes the rest.
_ROW_FIELDS = (
    "rank",
    "source",
    "op",
    "name",
    "start_ns",
    "end_ns",
    "dur_ns",
    "issue_ns",
    "stream",
    "event",
    "cpu_event",
    "pg_name",
)


_DTYPES = {
    "rank": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "dur_ns": "int64",
    "issue_ns": "int64",
    "bytes": "Int64",
    "group_size": "Int64",
    "seq": "int64",
    "algbw_gbps": "float64",
    "busbw_gbps": "float64",
    "stream": "int64",
    "step": "int64",
    "event": "int64",
    "cpu_event": "int64",
    "source": "category",
    "op": "category",
    "dim": "category",
    "dim_source": "category",
    "bytes_source": "category",
    "seq_source": "category",
    "name": "str",
    "group": "str",
    "group_desc": "str",
    "pg_name": "str",
    "instance": "str",
}


def _roots(cpu: dict[str, np.ndarray]) -> dict[int, _Root]:
    """Outermost CPU comm event of each nest, per thread of each rank, with its members (`cpu`:
    _event_columns; a root's `tid` is (rank index, pid, tid))."""
    roots: dict[int, _Root] = {}
    at, pid, tid = cpu["at"], cpu["pid"], cpu["tid"]
    ts = cpu["ts_ns"]
    end = ts + cpu["dur_ns"]
    order = np.lexsort((-end, ts, tid, pid, at))  # per thread, by start, the enclosing event first
    names = cpu["name"][order].tolist()
    rows, at, pid, tid = cpu["row"][order].tolist(), at[order].tolist(), pid[order].tolist(), tid[order].tolist()
    ts, end = ts[order].tolist(), end[order].tolist()  # plain ints: the loop below is per event
    stack: list[tuple[int, int]] = []  # (end, root row) of open events on the current thread
    thread = None
    for row, k, p, t, start, stop, name in zip(rows, at, pid, tid, ts, end, names):
        if (k, p, t) != thread:
            thread, stack = (k, p, t), []
        while stack and start >= stack[-1][0]:
            stack.pop()
        if stack:
            root = roots[stack[0][1]]
            root.members.append(row)
            root.worker &= name.startswith("gloo:")
        else:
            roots[row] = _Root(row, (k, p, t), start, stop, name, [row], name.startswith("gloo:"))
        # A child never outlives its parent: gloo records an async op (gloo:send, gloo:recv) on the
        # caller's thread with the duration of the whole transfer, past the call that issued it;
        # clipped, it cannot swallow the next call (e.g. the recv a pipeline waits on) into this nest.
        stack.append((min(stop, stack[-1][0]) if stack else stop, row if not stack else stack[0][1]))
    return roots


def _value(x):
    """None for missing (None, NaN, NA), else a plain Python value."""
    if x is None or type(x) in (int, str):  # the common case, from Arrow's to_pylist
        return x
    if not isinstance(x, str) and pd.isna(x):
        return None
    return x.item() if hasattr(x, "item") else x


def _merge_meta(meta: dict, rows) -> dict:
    """First recorded value of each metadata field over `rows`, in order."""
    out = dict.fromkeys(META_FIELDS)
    for row in rows:
        rec = meta.get(row)
        if rec is None:
            continue
        for f in META_FIELDS:
            if out[f] is None:
                out[f] = _value(rec[f])
    return out


def _root_op(info: dict, rows, labels: dict) -> tuple[str, object]:
    """(op, annotation label) of a root's members: our annotation first, then c10d/nccl/gloo names."""
    label, op = None, "other"
    for row in rows:
        kind, member_op, name = info[row]
        if kind == "ps_comm" and label is None:
            if name not in labels:
                labels[name] = parse_comm(name)
            label = labels[name]
        if op == "other" and isinstance(member_op, str) and member_op != "other":
            op = member_op
    return (label.op if label else op), label


def _pair_workers(roots: dict[int, _Root]) -> None:
    """Pair each gloo worker event (by start) with the earliest unpaired compatible caller on another
    thread that started before it: one whose span holds it first, else the earliest of any.

    Pending callers are kept per op, in start order, split into `live` (their span may still hold a
    later worker) and `stale` (ended before the current worker started: workers come by start, so
    they never hold one again) -- each caller is moved once, so a rank of millions of events with
    thousands of never-paired callers stays linear, not quadratic."""
    workers = sorted((r for r in roots.values() if r.worker), key=lambda r: r.start)
    callers = sorted((r for r in roots.values() if not r.worker and not r.kernels), key=lambda r: r.start)
    live: dict[str, dict[int, _Root]] = {}  # caller op -> {id: caller}, in start order
    stale: dict[str, list] = {}  # caller op -> heap of (start, order, caller); paired ones dropped lazily
    i = 0
    for w in workers:
        while i < len(callers) and callers[i].start <= w.start:
            live.setdefault(callers[i].op, {})[i] = callers[i]
            i += 1
        ops = sorted(op for op in live.keys() | stale.keys() if _compatible(w.op, op))
        chosen, bucket, rank = None, None, None  # rank: (start, order) -- ties go to the first caller
        for op in ops:  # the earliest caller holding w, over the compatible ops
            pending = live.get(op, {})
            for key, c in list(pending.items()):
                if c.end < w.start:  # can never hold this or a later worker
                    del pending[key]
                    heapq.heappush(stale.setdefault(op, []), (c.start, key, c))
                    continue
                if c.tid != w.tid:
                    if chosen is None or (c.start, key) < rank:
                        chosen, bucket, rank = c, (pending, key), (c.start, key)
                    break
        if chosen is None:  # none holds it: the earliest compatible caller of all
            for op in ops:
                heap = stale.get(op, [])
                while heap and heap[0][2].paired >= 0:
                    heapq.heappop(heap)
                # the heap's top, or (rare: it is on w's own thread) a scan of the whole heap
                for start, key, c in heap if heap and heap[0][2].tid == w.tid else heap[:1]:
                    if c.paired < 0 and c.tid != w.tid and (chosen is None or (start, key) < rank):
                        chosen, bucket, rank = c, None, (start, key)
        if chosen is None:
            continue
        chosen.paired, w.paired = w.row, chosen.row
        if bucket is not None:
            del bucket[0][bucket[1]]


def _compatible(worker_op: str, caller_op: str) -> bool:
    # gloo runs reduce_scatter as an all_reduce (the annotation says which it was)
    return (
        "other" in (worker_op, caller_op)
        or worker_op == caller_op
        or (worker_op == "all_reduce" and caller_op == "reduce_scatter")
    )


def _select(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


def _rank_rows(
    sub: dict[str, np.ndarray],
    ranks: list[int],
    gpus: list[bool],
    starts: np.ndarray,
    meta: dict,
    labels: dict,
    not_collectives: Counter,
) -> list[dict]:
    """The rows of several ranks, each from its own events; `sub`: their events of _KINDS as columns
    (_event_columns: `row` in the joined table, `at` the index of its rank in `ranks`), `gpus` whether
    each rank is a GPU rank, `starts` where each rank's rows begin. Keys of threads, launches and
    External ids carry the rank's index, so one pass serves every rank; gloo workers pair per rank."""
    kind = sub["kind"]
    is_cpu = (kind == "ps_comm") | (kind == "cpu_comm")
    cpu = _select(sub, is_cpu)
    roots = _roots(cpu)
    info = dict(zip(cpu["row"].tolist(), zip(cpu["kind"].tolist(), cpu["op"].tolist(), cpu["name"].tolist())))
    per_thread: dict[tuple, list[_Root]] = {}
    for r in roots.values():
        r.op, r.label = _root_op(info, r.members, labels)
        per_thread.setdefault(r.tid, []).append(r)
    thread_roots = {}
    for tid, rs in per_thread.items():
        rs.sort(key=lambda r: r.start)
        thread_roots[tid] = (np.array([r.start for r in rs], dtype=np.int64), rs)
    by_ext = {
        (k, x): row for row, k, x in zip(cpu["row"].tolist(), cpu["at"].tolist(), cpu["external_id"].tolist()) if x >= 0
    }
    member_root = {m: r for r in roots.values() for m in r.members}
    first = starts.tolist()
    out = []
    gpu_at = np.asarray(gpus, dtype=bool)
    if gpu_at.any():
        on_gpu = gpu_at[sub["at"]] if len(sub["at"]) else np.zeros(0, dtype=bool)
        runtime = _select(sub, on_gpu & (kind == "runtime") & (sub["correlation"] >= 0))
        launch = dict(
            zip(
                zip(runtime["at"].tolist(), runtime["correlation"].tolist()),
                zip(runtime["pid"].tolist(), runtime["tid"].tolist(), runtime["ts_ns"].tolist()),
            )
        )
        kernels = _select(sub, on_gpu & (kind == "comm"))
        for row, k, corr, ext, ts, dur, tid, name, kop in zip(
            *(
                kernels[c].tolist()
                for c in ("row", "at", "correlation", "external_id", "ts_ns", "dur_ns", "tid", "name", "op")
            )
        ):
            root, issue = None, int(ts)
            if corr >= 0 and (k, corr) in launch:
                lpid, ltid, lts = launch[(k, corr)]
                issue = int(lts)
                starts_of, rs = thread_roots.get((k, lpid, ltid), (None, None))
                if starts_of is not None:
                    i = int(np.searchsorted(starts_of, lts, side="right")) - 1
                    if i >= 0 and lts <= rs[i].end:
                        root = rs[i]
            if root is None and ext >= 0 and (k, ext) in by_ext:
                root = member_root.get(by_ext[(k, ext)])
            if root is not None:
                root.kernels += 1
                if corr < 0 or (k, corr) not in launch:
                    issue = root.start
            md = _merge_meta(meta, [row] + (root.members if root else []))
            op = _pick_op(root, md, kop)
            out.append(_row(ranks[k], first[k], row, "kernel", name, ts, ts + dur, issue, tid, root, md, op))
    per_rank: dict[int, dict[int, _Root]] = {}
    for row, r in roots.items():
        per_rank.setdefault(r.tid[0], {})[row] = r
    for rank_roots in per_rank.values():
        _pair_workers(rank_roots)
    for r in roots.values():
        if r.kernels or (r.worker and r.paired >= 0):
            continue
        if _is_wait_marker(r, info, meta):
            not_collectives["record_param_comms of a work.wait(), not a collective"] += 1
            continue
        members = r.members + ([r.paired] if r.paired >= 0 else [])
        paired = roots.get(r.paired)
        end = max(r.end, paired.end) if paired else r.end
        md = _merge_meta(meta, members + (paired.members if paired else []))
        k = r.tid[0]
        out.append(
            _row(ranks[k], first[k], r.row, "cpu", r.name, r.start, end, r.start, -1, r, md, _pick_op(r, md, None))
        )
    return out


def _is_wait_marker(root: _Root, info: dict, meta: dict) -> bool:
    """A lone record_param_comms that torch logs for work.wait(): Collective name 'wait', or (older
    traces) no name at all and no c10d/nccl/gloo op around it."""
    if any(info[m][2] != RECORD_PARAM_COMMS for m in root.members):
        return False
    names = {(meta.get(m) or {}).get("coll_name") for m in root.members}
    names = {n for n in names if isinstance(n, str)}
    return not names or names == {"wait"}


def _pick_op(root: _Root | None, md: dict, kernel_op) -> str:
    if root is not None and root.label is not None:
        return root.label.op
    if md["coll_name"]:
        op = normalize_op(md["coll_name"])
        if op != "other":
            return op
    if root is not None and root.op != "other":
        return root.op
    return kernel_op if isinstance(kernel_op, str) else "other"


def _row(rank, first, row, source, name, start, end, issue, stream, root: _Root | None, md: dict, op: str) -> dict:
    """A row of `rank`, whose events begin at row `first` of the joined table (event, cpu_event: rows
    of the rank's own events; unit: the call, unique in the joined table)."""
    label = root.label if root is not None else None
    return {
        "rank": rank,
        "source": source,
        "op": op,
        "name": name,
        "start_ns": start,
        "end_ns": end,
        "dur_ns": end - start,
        "issue_ns": issue,
        "stream": stream,
        "event": int(row) - first,
        "cpu_event": root.row - first if root is not None else -1,
        "unit": root.row if root is not None else -1 - row,
        "label": label,
        **md,
    }


def _label(rows: list[dict], pg_config: dict, labeler: DimLabeler) -> dict[str, list | np.ndarray]:
    """The columns group, bytes, dim, seq, instance and bandwidths of one rank's `rows` (plain Python
    values: a column with a missing value would turn its ints into floats, a p2p group '0.0,1.0')."""
    pg = {
        (int(r), str(n)): (ranks, desc, size)
        for r, n, ranks, desc, size in zip(
            pg_config["rank"],
            pg_config["pg_name"],
            pg_config["ranks"],
            pg_config["pg_desc"],
            pg_config["pg_size"],
        )
    }
    cols: dict[str, list] = {
        c: []
        for c in (
            "group",
            "group_size",
            "group_desc",
            "bytes",
            "bytes_source",
            "dim",
            "dim_source",
            "seq",
            "seq_source",
        )
    }
    parsed: dict[str, tuple] = {}  # group -> its ranks; (dim, group, op, desc) -> label: a few distinct ones
    dims: dict[tuple, tuple[str, str]] = {}
    for rec in rows:
        label = rec["label"]
        conf = pg.get((rec["rank"], str(rec["pg_name"])), (None,) * 3) if rec["pg_name"] else (None,) * 3
        conf = tuple(_value(c) for c in conf)
        p2p = rec["op"] in P2P_OPS and rec["src_rank"] is not None and rec["dst_rank"] is not None
        if label is not None:
            group = ",".join(str(r) for r in label.ranks)
        elif p2p:  # the two peers, sender first (as our annotation writes them)
            group = f"{rec['src_rank']},{rec['dst_rank']}"
        else:
            group = rec["pg_ranks"] or conf[0]
        if group and group not in parsed:
            parsed[group] = tuple(int(x) for x in group.split(","))
        ranks = parsed[group] if group else None
        size = len(ranks) if ranks else (rec["group_size"] or conf[2])
        desc = rec["pg_desc"] or conf[1]
        nbytes, source = _bytes(rec, label)
        key = (label.dim if label else None, ranks, rec["op"], desc)
        if key not in dims:
            dims[key] = labeler.label(ann_dim=key[0], ranks=ranks, op=rec["op"], desc=desc)
        dim, dim_source = dims[key]
        # A trace's p2p Seq counts all p2p ops of the process group on one rank, not per pair of peers:
        # the pair's order of issue matches sender and receiver instead.
        seq = label.seq if label else (None if p2p else rec["seq"])
        for key, value in (
            ("group", group or ""),
            ("group_size", size),
            ("group_desc", desc or ""),
            ("bytes", nbytes),
            ("bytes_source", source),
            ("dim", dim),
            ("dim_source", dim_source),
            ("seq", -1 if seq is None else int(seq)),
            ("seq_source", "none" if seq is None else ("annotation" if label else "trace")),
        ):
            cols[key].append(value)
    cols["group_size"] = pd.array(cols["group_size"], dtype="Int64")
    cols["bytes"] = pd.array(cols["bytes"], dtype="Int64")
    _ordinal_seq(cols, rows)
    nbytes = cols["bytes"].to_numpy(dtype=float, na_value=np.nan)
    dur = np.array([r["dur_ns"] for r in rows], dtype=float)
    algbw = np.where(dur > 0, nbytes / np.where(dur > 0, dur, 1), np.nan)  # bytes/ns = GB/s
    keys = list(zip((r["op"] for r in rows), (None if n is pd.NA else int(n) for n in cols["group_size"])))
    factors = {k: bus_factor(*k) for k in set(keys)}
    cols["algbw_gbps"] = algbw
    cols["busbw_gbps"] = algbw * np.array([factors[k] for k in keys], dtype=float)
    return cols


def _bytes(rec: dict, label) -> tuple[int | None, str]:
    if label is not None:
        return label.bytes, "annotation"
    size = dtype_bytes(rec["dtype"])
    counts = [n for n in (rec["in_nelems"], rec["out_nelems"]) if n is not None]
    if size and counts:
        return max(counts) * size, "msg_nelems"
    if rec["input_bytes"] is not None and rec["op"] in INPUT_IS_SIZE:
        return int(rec["input_bytes"]), "input_dims"
    return None, "unknown"


def _ordinal_seq(cols: dict, rows: list[dict]) -> None:
    """Where no seq was recorded: the order of issue within the rank's group (its pg name; else the
    op), counting each call once (a call's rows share its `unit`); then `instance`: the same call on
    every rank of its group is group (or pg name, or op) # seq: '0,1#3', 'pg:5#3', 'all_to_all#3' (a
    call whose group the trace does not say: the op's calls in order). In place on `cols` (rows of
    one or more ranks, each rank counted on its own)."""
    keys = [g if g != "" else (f"pg:{r['pg_name']}" if r["pg_name"] else r["op"]) for g, r in zip(cols["group"], rows)]
    seq, source = cols["seq"], cols["seq_source"]
    keys = [(r["rank"], k) for r, k in zip(rows, keys)]  # counted per rank
    calls: dict[tuple, int] = {}  # (key, unit) -> the call's first issue, in order of first appearance
    for i in (i for i, s in enumerate(seq) if s < 0):
        call = (keys[i], rows[i]["unit"])
        issue = rows[i]["issue_ns"]
        if call not in calls or issue < calls[call]:
            calls[call] = issue
    per_key: dict[str, list] = {}
    for n, ((key, unit), issue) in enumerate(calls.items()):
        per_key.setdefault(key, []).append((issue, n, unit))  # ties: the first to appear first
    ordinal = {(key, unit): o for key, calls_of in per_key.items() for o, (_, _, unit) in enumerate(sorted(calls_of))}
    for i, s in enumerate(seq):
        if s < 0:
            seq[i] = ordinal[(keys[i], rows[i]["unit"])]
            source[i] = "order"
    cols["instance"] = [f"{k}#{s}" for (_, k), s in zip(keys, seq)]
