"""Gantt rectangles per rank with level of detail: at most `max_rects` per rank for any window.

    rects = timeline(traces, ranks=[0, 1], start_ns=t0, end_ns=t1, max_rects=500)

Lanes: 'compute' (GPU compute kernels; CPU-only ranks: outermost CPU operators), 'memory' (GPU
memcpy/memset) and 'comm' (rows of the collectives table, with op, dim, bytes and instance). Events
are clipped to the window. When a rank has more events than its budget, neighbours are merged across
the smallest gaps first, so the (budget - 1) largest idle gaps stay visible; a merged rectangle says
how many events it holds (`n_events`), how much of it is busy (`busy_ns`), and takes the name, op and
dim that cover the most time inside it. Unmerged comm rectangles keep their `instance` (to highlight
one collective across ranks).

Columns: rank, lane, start_ns, end_ns, name, op, dim, instance, bytes, n_events, busy_ns, merged.

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import intervals as iv
from .collectives import collectives

COLUMNS = ["rank", "lane", "start_ns", "end_ns", "name", "op", "dim", "instance", "bytes", "n_events", "busy_ns",
           "merged"]


def _outermost(frame: pd.DataFrame) -> pd.DataFrame:
    """Events not nested inside an earlier event of the same thread."""
    keep = []
    for _, g in frame.groupby(["pid", "tid"], sort=False):
        g = g.sort_values("ts_ns")
        end = (g["ts_ns"] + g["dur_ns"]).to_numpy()
        run_end = np.maximum.accumulate(end)
        top = np.ones(len(g), dtype=bool)
        top[1:] = g["ts_ns"].to_numpy()[1:] >= run_end[:-1]
        keep.append(g[top])
    return pd.concat(keep) if keep else frame.iloc[:0]


def _lanes(traces, table: pd.DataFrame, rank: int) -> dict[str, pd.DataFrame]:
    sub = traces.events[traces.events["rank"] == rank]
    gpu = traces.device_of(rank) == "gpu"
    rows = table[table["rank"] == rank]
    rows = rows[rows["source"] == "kernel"] if gpu else rows
    comm = pd.DataFrame({"start_ns": rows["start_ns"], "end_ns": rows["end_ns"], "name": rows["name"].astype(str),
                         "op": rows["op"].astype(str), "dim": rows["dim"].astype(str),
                         "instance": rows["instance"], "bytes": rows["bytes"]})
    if gpu:
        comp = sub[sub["kind"] == "compute"]
        mem = sub[sub["kind"].isin(["memcpy", "memset"])]
    else:
        comp = _outermost(sub[sub["kind"] == "cpu_op"])
        mem = sub.iloc[:0]

    def plain(f):
        return pd.DataFrame({"start_ns": f["ts_ns"], "end_ns": f["ts_ns"] + f["dur_ns"], "name": f["name"].astype(str),
                             "op": "", "dim": "", "instance": "", "bytes": pd.array([pd.NA] * len(f), dtype="Int64")})

    return {"compute": plain(comp), "memory": plain(mem), "comm": comm}


def _lod(f: pd.DataFrame, budget: int) -> pd.DataFrame:
    """At most `budget` rectangles: merge across all but the (budget - 1) largest gaps."""
    f = f.sort_values("start_ns", ignore_index=True)
    s, e = f["start_ns"].to_numpy(), f["end_ns"].to_numpy()
    n = len(f)
    if n <= budget:
        busy = e - s
        return f.assign(n_events=1, busy_ns=busy, merged=False)
    run_end = np.maximum.accumulate(e)
    gaps = s[1:] - run_end[:-1]  # gap after event i (negative: overlap)
    cut = np.zeros(n - 1, dtype=bool)
    k = budget - 1
    if k > 0:
        top = np.argpartition(-gaps, k - 1)[:k]
        cut[top[gaps[top] > 0]] = True
    group = np.concatenate([[0], np.cumsum(cut)])
    first = np.flatnonzero(np.concatenate([[True], cut]))
    dur = e - s
    # Busy time: union length inside each group (groups never share a union segment: cuts are gaps > 0).
    us, ue = iv.union(s, e)
    seg_group = group[np.searchsorted(s, us, side="left")]
    busy = np.bincount(seg_group, weights=(ue - us), minlength=len(first)).astype(np.int64)
    top_name = (f.assign(g=group, d=dur).groupby(["g", "name", "op", "dim"], sort=False)["d"].sum()
                .reset_index().sort_values("d", ascending=False).drop_duplicates("g").set_index("g").sort_index())
    counts = np.bincount(group)
    single = counts == 1
    out = pd.DataFrame({
        "start_ns": s[first], "end_ns": np.maximum.reduceat(e, first),
        "name": top_name["name"].to_numpy(), "op": top_name["op"].to_numpy(), "dim": top_name["dim"].to_numpy(),
        "instance": np.where(single, f["instance"].to_numpy()[first], ""),
        "bytes": pd.array(np.where(single, f["bytes"].to_numpy(dtype=object, na_value=None)[first], None),
                          dtype="Int64"),
        "n_events": counts, "busy_ns": busy, "merged": ~single})
    return out


LANE_WEIGHT = {"comm": 4, "compute": 1, "memory": 1}  # collectives are what the chart is about


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
    out = []
    for rank in (ranks if ranks is not None else traces.rank_ids):
        lanes = _lanes(traces, table, int(rank))
        clipped = {}
        for lane, f in lanes.items():
            off = int(shift.get(rank, 0))
            f = f.assign(start_ns=f["start_ns"] + off, end_ns=f["end_ns"] + off)
            lo = start_ns if start_ns is not None else np.iinfo(np.int64).min
            hi = end_ns if end_ns is not None else np.iinfo(np.int64).max
            f = f[(f["end_ns"] > lo) & (f["start_ns"] < hi)]
            f = f.assign(start_ns=f["start_ns"].clip(lower=lo), end_ns=f["end_ns"].clip(upper=hi))
            if len(f):
                clipped[lane] = f
        for lane, budget in _budgets({k: len(f) for k, f in clipped.items()}, max_rects).items():
            out.append(_lod(clipped[lane], budget).assign(rank=int(rank), lane=lane))
    if not out:
        return pd.DataFrame({c: [] for c in COLUMNS})
    frame = pd.concat(out, ignore_index=True)
    frame["bytes"] = frame["bytes"].astype("Int64")
    return frame[COLUMNS].astype({"start_ns": "int64", "end_ns": "int64", "n_events": "int64", "busy_ns": "int64"})
