"""Each collective matched across the ranks of its group: arrival skew, wait vs transfer, late rank.

    offsets = clock_offsets(traces)              # rank, host, offset_ns, instances, method
    inst = instances(traces, plan)               # one row per collective instance
    waits = per_rank_wait(traces, plan)          # one row per (instance, rank)

Matching key: the collectives table's `instance` -- group ranks (or pg name) + sequence number
(recorded, else the order of issue within the group). Only comparable rows take part: kernels on GPU
ranks, CPU collectives on CPU-only ranks (a GPU rank's CPU-side call without a kernel would compare
a launch with another rank's transfer).

Clocks: ranks on one host share a clock. Other hosts' clocks are aligned on collective *ends* -- a
collective completes on all ranks of its group at about the same moment -- as the median end
difference between clock domains, propagated breadth-first from the lowest rank's domain; p2p ops
are used only when nothing else links two domains. `align='auto'` treats ranks with unknown hosts as
separate domains, 'ranks' aligns every rank separately, 'none' keeps the recorded clocks. The offset
added to each rank's times is reported, never hidden.

Wait vs transfer (per rank): a collective cannot move data before its last rank arrives, so
wait = min(last start - own start, duration), transfer = duration - wait.

Pure: numpy, pandas.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pandas as pd

from profiler.analyzers.collectives import collectives
from profiler.analyzers.labels import P2P_OPS, PlanLike
from profiler.traces.model import Traces

INSTANCE_COLUMNS = [
    "instance",
    "op",
    "dim",
    "group",
    "group_size",
    "seq",
    "n_ranks",
    "bytes",
    "first_start_ns",
    "last_start_ns",
    "skew_ns",
    "late_rank",
    "early_rank",
    "end_ns",
    "max_dur_ns",
]


def _comparable(traces, table: pd.DataFrame) -> pd.DataFrame:
    gpu = {r for r in traces.rank_ids if traces.device_of(r) == "gpu"}
    keep = np.where(table["rank"].isin(gpu), table["source"] == "kernel", True)
    return table[keep]


def _per_rank(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (instance, rank): first start, last end of its rows (a call may launch several kernels)."""
    if table.empty:
        return pd.DataFrame(
            columns=["instance", "rank", "op", "dim", "group", "group_size", "seq", "bytes", "start_ns", "end_ns"]
        )
    return table.groupby(["instance", "rank"], as_index=False, observed=True).agg(
        op=("op", "first"),
        dim=("dim", "first"),
        group=("group", "first"),
        group_size=("group_size", "first"),
        seq=("seq", "first"),
        bytes=("bytes", "first"),
        start_ns=("start_ns", "min"),
        end_ns=("end_ns", "max"),
    )


def clock_offsets(traces: Traces, *, table: pd.DataFrame | None = None, align: str = "auto") -> pd.DataFrame:
    """Per rank: the ns added to its times to put it on the lowest rank's clock, and how it was found."""
    if align not in ("auto", "ranks", "none"):
        raise ValueError(f"align must be 'auto', 'ranks' or 'none', got {align!r}")
    hosts = traces.hosts()
    ranks = traces.rank_ids
    domain = {r: (hosts.get(r) if align == "auto" and hosts.get(r) else f"rank {r}") for r in ranks}
    out = pd.DataFrame(
        {"rank": ranks, "host": [hosts.get(r) for r in ranks], "offset_ns": 0, "instances": 0, "method": "none"}
    )
    domains = sorted(set(domain.values()), key=lambda d: min(r for r in ranks if domain[r] == d))
    if align == "none" or len(domains) < 2:
        out["method"] = "no alignment" if align == "none" else "one clock (same host)"
        return out
    per = _per_rank(_comparable(traces, table if table is not None else collectives(traces)))
    per = per.assign(domain=per["rank"].map(domain))
    diffs: dict[tuple, list] = defaultdict(list)
    p2p_diffs: dict[tuple, list] = defaultdict(list)
    for _, g in per.groupby("instance", sort=False):
        rel = g["end_ns"] - g["end_ns"].min()  # small ints: medians stay exact in float64
        ends = rel.groupby(g["domain"]).median()
        if len(ends) < 2:
            continue
        sink = p2p_diffs if g["op"].iloc[0] in P2P_OPS else diffs
        names = list(ends.index)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                sink[(a, b)].append(float(ends[b] - ends[a]))
                sink[(b, a)].append(float(ends[a] - ends[b]))
    offset = {domains[0]: (0, 0, "reference clock")}
    queue = deque([domains[0]])
    while queue:
        a = queue.popleft()
        for b in domains:
            if b in offset:
                continue
            samples = diffs.get((a, b)) or p2p_diffs.get((a, b))
            if samples:
                offset[b] = (offset[a][0] - int(round(np.median(samples))), len(samples), "collective ends")
                queue.append(b)
    for i, r in enumerate(ranks):
        off, n, method = offset.get(domain[r], (0, 0, "no collective shared with the reference; not aligned"))
        if domain[r] == domains[0] and r != ranks[0]:
            method = "same clock as the reference"
        out.loc[i, ["offset_ns", "instances", "method"]] = [off, n, method]
    return out.astype({"offset_ns": "int64", "instances": "int64"})


def per_rank_wait(
    traces: Traces,
    plan: PlanLike = None,
    *,
    table: pd.DataFrame | None = None,
    align: str = "auto",
    offsets: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (instance, rank): aligned start/end, wait_ns, transfer_ns, late (the last to arrive).
    `offsets`: clock_offsets already computed for the same table and align."""
    table = table if table is not None else collectives(traces, plan)
    offsets = offsets if offsets is not None else clock_offsets(traces, table=table, align=align)
    per = _per_rank(_comparable(traces, table))
    off = per["rank"].map(dict(zip(offsets["rank"], offsets["offset_ns"]))).fillna(0).astype("int64")
    per["offset_ns"] = off
    per["start_ns"] = per["start_ns"] + off
    per["end_ns"] = per["end_ns"] + off
    per["dur_ns"] = per["end_ns"] - per["start_ns"]
    last = per.groupby("instance")["start_ns"].transform("max")
    n = per.groupby("instance")["rank"].transform("size")
    per["n_ranks"] = n
    per["wait_ns"] = np.minimum((last - per["start_ns"]).to_numpy(), per["dur_ns"].to_numpy())
    per["transfer_ns"] = per["dur_ns"] - per["wait_ns"]
    per["late"] = (per["start_ns"] == last) & (n > 1)
    return per.sort_values(["start_ns", "rank"], ignore_index=True)


def instances(
    traces: Traces,
    plan: PlanLike = None,
    *,
    table: pd.DataFrame | None = None,
    align: str = "auto",
    per: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per collective instance: ranks seen, arrival skew (last start - first start), late rank.
    `per`: per_rank_wait already computed for the same table and align."""
    per = per if per is not None else per_rank_wait(traces, plan, table=table, align=align)
    if per.empty:
        return pd.DataFrame(columns=INSTANCE_COLUMNS)
    per = per.sort_values(["instance", "start_ns", "rank"])
    g = per.groupby("instance", sort=False)
    out = g.agg(
        op=("op", "first"),
        dim=("dim", "first"),
        group=("group", "first"),
        group_size=("group_size", "first"),
        seq=("seq", "first"),
        n_ranks=("rank", "size"),
        bytes=("bytes", "first"),
        first_start_ns=("start_ns", "min"),
        last_start_ns=("start_ns", "max"),
        early_rank=("rank", "first"),
        late_rank=("rank", "last"),
        end_ns=("end_ns", "max"),
        max_dur_ns=("dur_ns", "max"),
    ).reset_index()
    out["skew_ns"] = out["last_start_ns"] - out["first_start_ns"]
    single = out["n_ranks"] < 2
    out.loc[single, "late_rank"] = -1
    out.loc[single, "early_rank"] = -1
    return out[INSTANCE_COLUMNS].sort_values("first_start_ns", ignore_index=True)


def stragglers(
    traces: Traces,
    plan: PlanLike = None,
    *,
    table: pd.DataFrame | None = None,
    align: str = "auto",
    top: int | None = 20,
    inst: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The `top` (None: all) instances seen on two or more ranks with the largest arrival skew, the
    largest first (ties: the earliest first). `inst`: instances already computed."""
    inst = inst if inst is not None else instances(traces, plan, table=table, align=align)
    inst = inst[(inst["n_ranks"] >= 2) & (inst["skew_ns"] > 0)]
    ranked = inst.sort_values(["skew_ns", "first_start_ns"], ascending=[False, True])
    return (ranked if top is None else ranked.head(top)).reset_index(drop=True)
