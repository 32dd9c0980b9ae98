"""Gantt rectangles per rank with level of detail: at most `max_rects` per rank for any window.

    rects = timeline(traces, ranks=[0, 1], start_ns=t0, end_ns=t1, max_rects=500)

Lanes: 'compute' (GPU compute kernels; CPU-only ranks: outermost CPU operators), 'memory' (GPU
memcpy/memset) and 'comm' (rows of the collectives table, with op, dim, bytes and instance). Events
are clipped to the window. When a rank has more events than its budget, neighbours are merged across
the smallest gaps first, so the (budget - 1) largest idle gaps stay visible; a merged rectangle says
how many events it holds (`n_events`), how much of it is busy (`busy_ns`: the union of its events),
and takes the name (and op) that covers the most time inside it. Merging never crosses a class --
compute, memory, or the collectives of one parallel dimension -- so a rectangle's busy time is all of
its class (a tp rectangle holds no SP time), and each class's busy time in a window is the same at
any level of detail. Unmerged comm rectangles keep their `instance` (to highlight one collective
across ranks). Collectives get a larger share of the budget than compute (LANE_WEIGHT).

Columns: rank, lane, start_ns, end_ns, name, op, dim, instance, bytes, n_events, busy_ns, merged.
Rows: ranks in the order asked, lanes in LANES order (the comm lane one dimension after another, by
name), then by start.

Speed: a rank's lanes are laid out on first use per (traces, table) -- one sorted array per column,
each lane a contiguous segment, with how far its events reach so far -- and the most recent ranks
are kept beside the Traces object (weakly: they go when the traces do; bounded in rows, so a
1,024-rank set is read rank by rank, never laid out at once). A window is then two binary searches
per lane and a few numpy passes over the events inside it.

Pure: numpy, pandas.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.analyzers.collectives import collectives
from profiler.analyzers.labels import PlanLike
from profiler.traces import intervals as iv
from profiler.traces.model import Traces
from profiler.traces.patterns import KINDS

COLUMNS = [
    "rank",
    "lane",
    "start_ns",
    "end_ns",
    "name",
    "op",
    "dim",
    "instance",
    "bytes",
    "n_events",
    "busy_ns",
    "merged",
]
LANES = ("compute", "memory", "comm")
LANE_WEIGHT = {"comm": 4, "compute": 1, "memory": 1}  # collectives are what the chart is about
K = {k: i for i, k in enumerate(KINDS)}
I64 = np.iinfo(np.int64)


@dataclass(frozen=True)
class _Index:
    """One rank's classes, one row per event: segment (rank, class) -> rows [a, b), each sorted by start.
    Classes: 0 compute, 1 memory, 2 + k the collectives of the k-th dimension (by name)."""

    segments: dict  # (rank, class number) -> (a, b)
    start: np.ndarray
    end: np.ndarray
    reach: np.ndarray  # running max of `end` within the segment: rows before the first reach > t end by t
    label: np.ndarray  # index into names / ops / dims
    ref: np.ndarray  # row of `instance` / `nbytes` (comm lane), -1 for events
    names: np.ndarray  # object
    ops: np.ndarray
    dims: np.ndarray
    instance: np.ndarray  # object, per comm row
    nbytes: np.ndarray  # float, NaN when unknown
    order: np.ndarray  # rank of each label by (name, op, dim): the tie-break between labels


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # traces -> (table, _Lanes)


def _outermost(thread, ts, end) -> np.ndarray:
    """Mask of events not nested inside an earlier event of the same thread (`thread`: a small int per
    event). Events come sorted by start within each thread (a rank's events are, by start), so
    a stable sort by thread is enough; equal starts are put longest first (it encloses the others)."""
    small = thread.astype(np.uint16) if len(thread) and thread.max() < 2**16 else thread  # radix sort
    order = np.argsort(small, kind="stable")
    s, t = ts[order], thread[order]
    same = t[1:] == t[:-1]
    if (same & (s[1:] < s[:-1])).any():  # not sorted by start after all
        order = np.lexsort((-end, ts, thread))
    else:
        tied = np.flatnonzero(np.r_[False, same & (s[1:] == s[:-1])])  # rows starting with the one before
        if len(tied):
            rows = np.union1d(tied, tied - 1)
            run = np.cumsum(np.r_[True, ~(same & (s[1:] == s[:-1]))])[rows]
            order[rows] = order[rows][np.lexsort((-end[order[rows]], run))]
    s, e, t = ts[order], end[order], thread[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = t[1:] != t[:-1]
    reach = iv.running_max(e, new)
    keep = new.copy()
    keep[1:] |= s[1:] >= reach[:-1]
    out = np.zeros(len(order), dtype=bool)
    out[order] = keep
    return out


def _event_rows(a: dict, gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rows of one rank's events, lane number) of its compute and memory lanes (`a`: rank_arrays)."""
    kind = a["kind"]
    if gpu:
        compute = kind == K["compute"]
        memory = (kind == K["memcpy"]) | (kind == K["memset"])
    else:
        compute, memory = np.zeros(len(kind), dtype=bool), np.zeros(len(kind), dtype=bool)
        ops = np.flatnonzero(kind == K["cpu_op"])
        if len(ops):  # CPU-only ranks: outermost operators per thread
            compute[ops[_outermost(a["thread"][ops], a["ts"][ops], a["end"][ops])]] = True
    rows = np.flatnonzero(compute | memory)
    return rows, np.where(compute[rows], 0, 1)


def _comm_labels(rows: pd.DataFrame) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
    """(label code per row, sorted distinct (name, op, dim))."""
    joined = (rows["name"].astype(str) + "\0" + rows["op"].astype(str) + "\0" + rows["dim"].astype(str)).to_numpy(
        dtype=object
    )
    codes, uniques = pd.factorize(joined, sort=True)  # '\0' sorts first: the order of the tuples
    return codes.astype(np.int64), [tuple(u.split("\0")) for u in uniques]


def _build(traces, rank: int, rows: pd.DataFrame) -> _Index:
    """The lanes of one rank: its compute/memory events and `rows`, its rows of the collectives table."""
    gpu = traces.device_of(rank) == "gpu"
    a = traces.rank_arrays(rank)
    ev_rows, ev_lane = _event_rows(a, gpu)
    cats = traces.rank_events(rank)["name"].cat
    codes = cats.codes.to_numpy()[ev_rows].astype(np.int64)
    n_cats = len(cats.categories)
    codes[codes < 0] = n_cats  # a missing name: the label after the categories
    if gpu and len(rows):
        rows = rows[(rows["source"] == "kernel").to_numpy(dtype=bool)]
    comm_label, comm_labels = _comm_labels(rows) if len(rows) else (np.empty(0, np.int64), [])
    dim_code = pd.factorize(rows["dim"].astype(str), sort=True)[0] if len(rows) else np.empty(0, np.int64)
    lane = np.concatenate([ev_lane, 2 + dim_code])  # the class: compute, memory, or one dimension's comm
    start = np.concatenate([a["ts"][ev_rows], rows["start_ns"].to_numpy(dtype=np.int64)])
    end = np.concatenate([a["end"][ev_rows], rows["end_ns"].to_numpy(dtype=np.int64)])
    label = np.concatenate([codes, comm_label + n_cats + 1])
    ref = np.concatenate([np.full(len(ev_rows), -1), np.arange(len(rows))])
    order = np.lexsort((start, lane))  # stable: equal starts keep event / table order
    lane, start, end, label, ref = (x[order] for x in (lane, start, end, label, ref))
    new = np.ones(len(order), dtype=bool)
    new[1:] = lane[1:] != lane[:-1]
    bounds = np.append(np.flatnonzero(new), len(order))
    segments = {(rank, int(lane[a])): (int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])}
    names = np.concatenate([cats.categories.to_numpy(dtype=object), [""], [x[0] for x in comm_labels]]).astype(object)
    blank = [""] * (n_cats + 1)
    ops = np.array(blank + [x[1] for x in comm_labels], dtype=object)
    dims = np.array(blank + [x[2] for x in comm_labels], dtype=object)
    keys = pd.MultiIndex.from_arrays([names.astype(str), ops.astype(str), dims.astype(str)])
    order = np.empty(len(names), dtype=np.int64)
    order[np.lexsort(tuple(reversed([keys.get_level_values(i).to_numpy() for i in range(3)])))] = np.arange(len(names))
    return _Index(
        segments,
        start,
        end,
        iv.running_max(end, new),
        label.astype(np.int64),
        ref.astype(np.int64),
        names,
        ops,
        dims,
        rows["instance"].to_numpy(dtype=object),
        rows["bytes"].to_numpy(dtype=float, na_value=np.nan),
        order,
    )


class _Lanes:
    """The per-rank indexes of one (traces, table): built on first use, the most recent kept while
    they hold at most BUDGET_ROWS rows (a 1,024-rank set is never laid out all at once)."""

    BUDGET_ROWS = 4_000_000

    def __init__(self, traces, table: pd.DataFrame):
        self.traces, self.table = weakref.ref(traces), table  # weak: the cache is keyed by the traces
        ranks = table["rank"].to_numpy(dtype=np.int64) if len(table) else np.empty(0, np.int64)
        order = np.argsort(ranks, kind="stable")
        ids, first = np.unique(ranks[order], return_index=True)
        bounds = np.append(first, len(order))
        self.rows = {int(r): order[a:b] for r, a, b in zip(ids, bounds[:-1], bounds[1:])}
        self.recent: dict[int, _Index] = {}

    def rank(self, rank: int) -> _Index:
        hit = self.recent.pop(rank, None)
        if hit is None:
            rows = self.table.iloc[self.rows.get(rank, np.empty(0, np.int64))]
            hit = _build(self.traces(), rank, rows)
        self.recent[rank] = hit  # most recent last
        while len(self.recent) > 1 and sum(len(x.start) for x in self.recent.values()) > self.BUDGET_ROWS:
            del self.recent[next(iter(self.recent))]
        return hit


def _index(traces, table: pd.DataFrame) -> _Lanes:
    """The lanes of (traces, table), kept while both are the ones asked for."""
    hit = _CACHE.get(traces)
    if hit is not None and hit[0]() is table:
        return hit[1]
    lanes = _Lanes(traces, table)
    _CACHE[traces] = (weakref.ref(table), lanes)
    return lanes


def _lane(cls: int) -> str:
    return LANES[min(cls, len(LANES) - 1)]  # classes 2, 3, ... are the comm lane's dimensions


def _weight(cls: int) -> int:
    return LANE_WEIGHT.get(_lane(cls), 1)


def _budgets(counts: dict[int, int], max_rects: int) -> dict[int, int]:
    """Rectangles per class: all of them when they fit, else shares weighted by their lane's
    LANE_WEIGHT, each class at least one; when there are more classes than rectangles, the lightest
    classes are left out."""
    if sum(counts.values()) <= max_rects:
        return dict(counts)
    lanes = sorted(counts, key=lambda k: -_weight(k))[:max_rects]
    weight = {k: _weight(k) * counts[k] for k in lanes}
    total = sum(weight.values())
    out = {k: max(1, min(counts[k], max_rects * weight[k] // total)) for k in lanes}
    while sum(out.values()) > max_rects:  # the floors of 1 can overshoot by a few
        k = max((k for k in out if out[k] > 1), key=out.get)
        out[k] -= 1
    spare = max_rects - sum(out.values())
    for k in lanes:  # leftovers to the weightiest lanes first
        add = min(spare, counts[k] - out[k])
        out[k] += add
        spare -= add
    return out


def _clamp(x: int) -> int:
    return min(max(x, I64.min), I64.max)


def timeline(
    traces: Traces,
    plan: PlanLike = None,
    *,
    ranks: Iterable[int] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    max_rects: int = 1000,
    table: pd.DataFrame | None = None,
    offsets: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Rectangles per rank (see the module docstring). `offsets` (matching.clock_offsets) shifts each
    rank's clock first; the window is in the shifted time."""
    if max_rects < 1:
        raise ValueError(f"max_rects must be at least 1, got {max_rects}")
    table = table if table is not None else collectives(traces, plan)
    lanes = _index(traces, table)
    shift = dict(zip(offsets["rank"].tolist(), offsets["offset_ns"].tolist())) if offsets is not None else {}
    lo = start_ns if start_ns is not None else I64.min
    hi = end_ns if end_ns is not None else I64.max
    present = set(traces.rank_ids)
    frames = []
    for rank in ranks if ranks is not None else traces.rank_ids:
        rank = int(rank)
        if rank in present:
            frame = _rank_rects(lanes.rank(rank), rank, lo, hi, int(shift.get(rank, 0)), max_rects)
            if frame is not None:
                frames.append(frame)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _rank_rects(x: _Index, rank: int, lo: int, hi: int, off: int, max_rects: int) -> pd.DataFrame | None:
    """One rank's rectangles in [lo, hi) (shifted time; `off`: its clock's shift), or None."""
    # Pieces: the part of one (rank, lane) segment inside the window, in the rank's own clock.
    p_rank, p_lane, p_a, p_b, p_lo, p_hi, p_off = ([] for _ in range(7))
    r_lo, r_hi = _clamp(lo - off), _clamp(hi - off)
    for (_, lane), (a, b) in sorted(x.segments.items()):
        i = a + int(np.searchsorted(x.reach[a:b], r_lo, side="right"))  # the first that reaches past lo
        j = a + int(np.searchsorted(x.start[a:b], r_hi, side="left"))  # the first that starts at hi
        if j > i:
            for lst, v in zip((p_rank, p_lane, p_a, p_b, p_lo, p_hi, p_off), (rank, lane, i, j, r_lo, r_hi, off)):
                lst.append(v)
    p_rank, p_lane, p_a, p_b, p_lo, p_hi, p_off = (
        np.array(v, dtype=np.int64) for v in (p_rank, p_lane, p_a, p_b, p_lo, p_hi, p_off)
    )
    rows, piece = iv.index_runs(p_a, p_b)
    inside = x.end[rows] > p_lo[piece]  # a nested event may end before lo although its segment reached past
    rows, piece = rows[inside], piece[inside]
    counts = np.bincount(piece, minlength=len(p_a))
    budget = np.zeros(len(p_a), dtype=np.int64)
    mine = np.flatnonzero(counts > 0)  # the lanes share max_rects
    got = _budgets({int(p_lane[k]): int(counts[k]) for k in mine}, max_rects)
    for k in mine:
        budget[k] = got.get(int(p_lane[k]), 0)
    kept = budget[piece] > 0
    rows, piece = rows[kept], piece[kept]
    if not len(rows):
        return None
    return _lod(x, rows, piece, budget, p_lo, p_hi, p_off, p_rank, p_lane)


def _lod(x: _Index, rows, piece, budget, p_lo, p_hi, p_off, p_rank, p_lane) -> pd.DataFrame:
    """Clip the rows to their piece's window and merge each piece down to its budget: across all but the
    (budget - 1) largest gaps."""
    s = np.maximum(x.start[rows], p_lo[piece])
    e = np.minimum(x.end[rows], p_hi[piece])
    n = len(rows)
    new_piece = np.ones(n, dtype=bool)
    new_piece[1:] = piece[1:] != piece[:-1]
    reach = iv.running_max(e, new_piece)
    gaps = np.empty(n, dtype=np.int64)  # gaps[k]: idle time before row k (negative: overlap)
    gaps[0] = 0
    gaps[1:] = s[1:] - reach[:-1]
    cut = new_piece.copy()
    bounds = np.append(np.flatnonzero(new_piece), n)
    for a, b in zip(bounds[:-1], bounds[1:]):
        k = budget[piece[a]]
        if b - a <= k:
            cut[a:b] = True
        elif k > 1:
            g = gaps[a + 1 : b]
            top = np.argpartition(-g, k - 2)[: k - 1]
            cut[a + 1 + top[g[top] > 0]] = True
    group = np.cumsum(cut) - 1
    first = np.flatnonzero(cut)
    counts = np.diff(np.append(first, n))
    single = counts == 1
    # Busy time: the union of each group's events. Groups are cut at gaps > 0, so a union run never
    # spans two groups; a run starts where a row starts past all before it in its piece.
    run = new_piece.copy()
    run[1:] |= s[1:] > reach[:-1]
    run_at = np.flatnonzero(run)
    run_len = np.maximum.reduceat(np.maximum(e, s), run_at) - s[run_at]
    busy = np.bincount(group[run_at], weights=run_len, minlength=len(first)).astype(np.int64)
    # The label covering the most time in each merged group (ties: the first by name, op and dim, so the
    # pick does not depend on the order names were met in the files).
    dominant = x.label[rows[first]]
    multi = ~single[group]
    if multi.any():
        width = len(x.names)
        key = group[multi] * width + x.label[rows[multi]]
        ukey, inv = np.unique(key, return_inverse=True)
        total = np.bincount(inv, weights=(e[multi] - s[multi]).astype(float))
        best = np.lexsort((x.order[ukey % width], -total, ukey // width))
        g, pick = np.unique((ukey // width)[best], return_index=True)
        dominant[g] = (ukey % width)[best][pick]
    ref = np.where(single, x.ref[rows[first]], -1)
    has = ref >= 0
    instance = np.full(len(first), "", dtype=object)
    instance[has] = x.instance[ref[has]]
    nbytes = np.full(len(first), np.nan)
    nbytes[has] = x.nbytes[ref[has]]
    pf = piece[first]
    off = p_off[pf]
    frame = pd.DataFrame(
        {
            "rank": p_rank[pf],
            "lane": np.array(LANES, dtype=object)[np.minimum(p_lane[pf], len(LANES) - 1)],
            "start_ns": s[first] + off,
            "end_ns": np.maximum.reduceat(e, first) + off,
            "name": x.names[dominant],
            "op": x.ops[dominant],
            "dim": x.dims[dominant],
            "instance": instance,
            "bytes": pd.array(nbytes, dtype="Float64").astype("Int64"),
            "n_events": counts.astype(np.int64),
            "busy_ns": busy,
            "merged": ~single,
        }
    )
    return frame[COLUMNS]
