"""Gantt rectangles per rank with level of detail: at most `max_rects` per rank for any window.

    rects = timeline(traces, ranks=[0, 1], start_ns=t0, end_ns=t1, max_rects=500)

Lanes: 'compute' (GPU compute kernels; CPU-only ranks: outermost CPU operators), 'memory' (GPU
memcpy/memset) and 'comm' (rows of the collectives table, with op, dim, bytes and instance). Events
are clipped to the window. When a rank has more events than its budget, neighbours are merged across
the smallest gaps first, so the (budget - 1) largest idle gaps stay visible; a merged rectangle says
how many events it holds (`n_events`), how much of it is busy (`busy_ns`), and takes the name, op and
dim that cover the most time inside it. Unmerged comm rectangles keep their `instance` (to highlight
one collective across ranks). Collectives get a larger share of the budget than compute (LANE_WEIGHT).

Columns: rank, lane, start_ns, end_ns, name, op, dim, instance, bytes, n_events, busy_ns, merged.

Pure: numpy, pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import intervals as iv
from ..patterns import KINDS
from .collectives import collectives

COLUMNS = ["rank", "lane", "start_ns", "end_ns", "name", "op", "dim", "instance", "bytes", "n_events", "busy_ns",
           "merged"]
LANE_WEIGHT = {"comm": 4, "compute": 1, "memory": 1}  # collectives are what the chart is about
K = {k: i for i, k in enumerate(KINDS)}


@dataclass
class _Lane:
    start: np.ndarray
    end: np.ndarray
    label: np.ndarray  # index into labels
    labels: list  # (name, op, dim)
    instance: np.ndarray  # object: str
    nbytes: np.ndarray  # float, NaN when unknown

    def __len__(self):
        return len(self.start)

    def take(self, mask) -> "_Lane":
        return _Lane(self.start[mask], self.end[mask], self.label[mask], self.labels, self.instance[mask],
                     self.nbytes[mask])


def _outermost(ts, end, pid, tid) -> np.ndarray:
    """Mask of events not nested inside an earlier event of the same thread."""
    order = np.lexsort((-end, ts, tid, pid))
    s, e = ts[order], end[order]
    thread_start = np.ones(len(order), dtype=bool)
    thread_start[1:] = (pid[order][1:] != pid[order][:-1]) | (tid[order][1:] != tid[order][:-1])
    keep = np.zeros(len(order), dtype=bool)
    run_end = np.iinfo(np.int64).min
    for i in range(len(order)):  # a running max that restarts per thread
        if thread_start[i]:
            run_end = np.iinfo(np.int64).min
        keep[i] = s[i] >= run_end
        run_end = max(run_end, e[i])
    out = np.zeros(len(order), dtype=bool)
    out[order] = keep
    return out


def _plain(traces, lo, hi, mask) -> _Lane:
    a = traces.arrays
    idx = np.flatnonzero(mask)
    codes = traces.events["name"].cat.codes.to_numpy()[lo:hi][idx]
    uniq, inv = np.unique(codes, return_inverse=True)
    cats = traces.events["name"].cat.categories
    labels = [(str(cats[c]), "", "") for c in uniq]
    n = len(idx)
    return _Lane(a["ts"][lo:hi][idx], a["end"][lo:hi][idx], inv, labels, np.full(n, "", dtype=object),
                 np.full(n, np.nan))


def _lanes(traces, rows: pd.DataFrame, rank: int) -> dict[str, _Lane]:
    lo, hi = traces.rank_slices()[rank]
    a = traces.arrays
    kind = a["kind"][lo:hi]
    gpu = traces.device_of(rank) == "gpu"
    rows = rows[rows["source"] == "kernel"] if gpu else rows
    keys = list(zip(rows["name"].astype(str), rows["op"].astype(str), rows["dim"].astype(str)))
    labels = sorted(set(keys))
    where = {k: i for i, k in enumerate(labels)}
    comm = _Lane(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(), np.array([where[k] for k in keys], dtype=int),
                 labels, rows["instance"].to_numpy(dtype=object), rows["bytes"].to_numpy(dtype=float, na_value=np.nan))
    if gpu:
        compute = _plain(traces, lo, hi, kind == K["compute"])
        memory = _plain(traces, lo, hi, (kind == K["memcpy"]) | (kind == K["memset"]))
    else:
        ops = kind == K["cpu_op"]
        top = np.zeros(len(kind), dtype=bool)
        top[ops] = _outermost(a["ts"][lo:hi][ops], a["end"][lo:hi][ops], a["pid"][lo:hi][ops], a["tid"][lo:hi][ops])
        compute, memory = _plain(traces, lo, hi, top), _plain(traces, lo, hi, np.zeros(len(kind), dtype=bool))
    return {"compute": compute, "memory": memory, "comm": comm}


def _lod(lane: _Lane, budget: int) -> dict:
    """At most `budget` rectangles: merge across all but the (budget - 1) largest gaps."""
    order = np.argsort(lane.start, kind="stable")
    f = lane.take(order)
    s, e, n = f.start, f.end, len(f)
    if n <= budget:
        group = np.arange(n)
    else:
        gaps = s[1:] - np.maximum.accumulate(e)[:-1]  # gap after event i (negative: overlap)
        cut = np.zeros(n - 1, dtype=bool)
        if budget > 1:
            top = np.argpartition(-gaps, budget - 2)[: budget - 1]
            cut[top[gaps[top] > 0]] = True
        group = np.concatenate([[0], np.cumsum(cut)])
    first = np.flatnonzero(np.diff(group, prepend=-1))
    counts = np.bincount(group)
    us, ue = iv.union(s, e)  # groups never share a union segment: cuts are at gaps > 0
    busy = np.bincount(group[np.searchsorted(s, us, side="left")], weights=ue - us, minlength=len(first))
    # The label covering the most time in each group.
    width = len(f.labels) + 1
    key = group.astype(np.int64) * width + f.label
    ukey, inv = np.unique(key, return_inverse=True)
    total = np.bincount(inv, weights=(e - s).astype(float))
    best = np.lexsort((-total, ukey // width))
    _, pick = np.unique((ukey // width)[best], return_index=True)
    dominant = (ukey % width)[best][pick]
    single = counts == 1
    return {"start_ns": s[first], "end_ns": np.maximum.reduceat(e, first),
            "name": [f.labels[i][0] for i in dominant], "op": [f.labels[i][1] for i in dominant],
            "dim": [f.labels[i][2] for i in dominant],
            "instance": np.where(single, f.instance[first], ""),
            "bytes": np.where(single, f.nbytes[first], np.nan),
            "n_events": counts, "busy_ns": busy.astype(np.int64), "merged": ~single}


def _budgets(counts: dict[str, int], max_rects: int) -> dict[str, int]:
    """Rectangles per lane: all of them when they fit, else shares weighted by LANE_WEIGHT, each lane at
    least one; when there are more lanes than rectangles, the lightest lanes are left out."""
    if sum(counts.values()) <= max_rects:
        return dict(counts)
    lanes = sorted(counts, key=lambda k: -LANE_WEIGHT.get(k, 1))[:max_rects]
    weight = {k: LANE_WEIGHT.get(k, 1) * counts[k] for k in lanes}
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


def timeline(traces, plan=None, *, ranks=None, start_ns: int | None = None, end_ns: int | None = None,
             max_rects: int = 1000, table: pd.DataFrame | None = None,
             offsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rectangles per rank (see the module docstring). `offsets` (matching.clock_offsets) shifts each
    rank's clock first; the window is in the shifted time."""
    if max_rects < 1:
        raise ValueError(f"max_rects must be at least 1, got {max_rects}")
    table = table if table is not None else collectives(traces, plan)
    shift = dict(zip(offsets["rank"], offsets["offset_ns"])) if offsets is not None else {}
    by_rank = dict(tuple(table.groupby("rank", sort=False))) if len(table) else {}
    lo = start_ns if start_ns is not None else np.iinfo(np.int64).min
    hi = end_ns if end_ns is not None else np.iinfo(np.int64).max
    parts = []
    for rank in (ranks if ranks is not None else traces.rank_ids):
        rank = int(rank)
        if rank not in traces.rank_slices():
            continue
        off = int(shift.get(rank, 0))
        clipped = {}
        for name, lane in _lanes(traces, by_rank.get(rank, table.iloc[:0]), rank).items():
            lane = _Lane(lane.start + off, lane.end + off, lane.label, lane.labels, lane.instance, lane.nbytes)
            lane = lane.take((lane.end > lo) & (lane.start < hi))
            lane.start, lane.end = np.maximum(lane.start, lo), np.minimum(lane.end, hi)
            if len(lane):
                clipped[name] = lane
        for name, budget in _budgets({k: len(v) for k, v in clipped.items()}, max_rects).items():
            rect = _lod(clipped[name], budget)
            parts.append(pd.DataFrame({"rank": rank, "lane": name, **rect}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
    frame = pd.concat(parts, ignore_index=True)
    frame["bytes"] = pd.array(frame["bytes"].to_numpy(dtype=float), dtype="Float64").astype("Int64")
    return frame[COLUMNS].astype({"start_ns": "int64", "end_ns": "int64", "n_events": "int64", "busy_ns": "int64",
                                  "rank": "int64", "merged": "bool"})
