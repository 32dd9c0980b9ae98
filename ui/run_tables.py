"""Tables behind the run pages: the analyzers' frames shaped for the Collective timeline's charts and
tables (their headers, parts and labels).

    span = step_span(bd, offsets, step)                 # (start_ns, end_ns) of a step on the aligned clock
    gantt = gantt_frame(rects, table, t0_ns=span[0])   # timeline rectangles, ms from the step's start
    parts = breakdown_parts(bd, step)                  # compute / overlapped / exposed / memory / idle per rank
    rank_values(bd, table)                             # per rank: exposed comm, busbw, ... (Topology's colours)

Every frame is long-form, one row per mark; times are float ms, sizes bytes. The aggregates the CLI
shares (skew, heat, TP cost, counts) are profiler.analyzers.aggregates. Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analyzers.aggregates import ALL, step_rows

PARTS = ("compute", "comm overlapped with compute", "comm exposed", "memory copies", "idle")


RANK_VALUES = {  # column -> (button label, legend title, number format)
    "exposed_comm_ms": ("exposed communication", "exposed comm, ms/step", ",.1f"),
    "step_ms": ("traced step", "traced step, ms", ",.1f"),
    "comm_ms": ("communication", "comm, ms/step", ",.1f"),
    "compute_ms": ("compute", "compute, ms/step", ",.1f"),
    "idle_ms": ("idle", "idle, ms/step", ",.1f"),
    "busbw_gbps": ("busbw", "median busbw, GB/s", ",.3g"),
    "late_count": ("last to arrive", "times last to arrive", ",d"),
}


def steps_of(bd: pd.DataFrame) -> list[int]:
    """The steps a breakdown has, ascending (-1: a set without ProfilerStep annotations)."""
    return sorted(int(s) for s in bd["step"].unique()) if len(bd) else []


def _shift(bd: pd.DataFrame, offsets: pd.DataFrame | None) -> pd.DataFrame:
    off = (
        bd["rank"].map(dict(zip(offsets["rank"], offsets["offset_ns"]))).fillna(0).astype("int64")
        if offsets is not None and len(offsets)
        else 0
    )
    return bd.assign(start_ns=bd["start_ns"] + off, end_ns=bd["end_ns"] + off)


def step_span(bd: pd.DataFrame, offsets: pd.DataFrame | None, step: int) -> tuple[int, int]:
    """First start and last end of `step` over all ranks (all steps for ALL), on the aligned clock."""
    rows = _shift(bd, offsets)
    if step != ALL:
        rows = rows[rows["step"] == step]
    if rows.empty:
        raise ValueError(f"step {step} is not in this trace set")
    return int(rows["start_ns"].min()), int(rows["end_ns"].max())


def _group_of(instance: pd.Series) -> pd.Series:
    """The group of each instance key ('0,1#3' -> '0,1', 'pg:5#3' -> 'pg:5'); 'unknown' where the
    trace did not say (the key is then the op's: 'all_to_all#3')."""
    group = instance.astype(str).str.rsplit("#", n=1).str[0]
    return group.where(group.str.fullmatch(r"[\d,]+|pg:.*"), "unknown")


OVERVIEW_COLUMNS = ["rank", "start_ms", "end_ms", "category", "label", "n_events", "busy_pct", "busy_ms"]


def gantt_frame(rects: pd.DataFrame, table: pd.DataFrame, *, t0_ns: int) -> pd.DataFrame:
    """profiler.analyzers.timeline rectangles for a chart: rank, lane, start_ms, end_ms (float32 ms from
    t0), category (compute | memory | the collective's dim), label (kernel or op name), dim, bytes, group,
    busbw_gbps (from the collectives table; unmerged collectives only), n_events, busy_pct (rounded, for
    the eye), busy_ms (exact: a class's busy time in a window is its sum, at any zoom), instance
    (unique for merged rectangles, so selecting one never selects another). Narrow dtypes and Arrow
    dictionaries: this is what the browser receives."""
    if rects.empty:
        return pd.DataFrame(
            columns=[
                "rank",
                "lane",
                "start_ms",
                "end_ms",
                "category",
                "label",
                "dim",
                "bytes",
                "group",
                "busbw_gbps",
                "n_events",
                "busy_pct",
                "busy_ms",
                "instance",
            ]
        )
    comm = (rects["lane"] == "comm").to_numpy()
    busbw = table.groupby(["rank", "instance"], observed=True)["busbw_gbps"].median() if len(table) else None
    keys = pd.MultiIndex.from_arrays([rects["rank"], rects["instance"]])
    bw = busbw.reindex(keys).to_numpy(dtype=float) if busbw is not None else np.full(len(rects), np.nan)
    merged = rects["merged"].to_numpy()
    instance = rects["instance"].astype(str)
    instance = instance.where(~merged, "merged " + rects["rank"].astype(str) + ":" + rects["start_ns"].astype(str))
    dims = rects["dim"].astype(str).replace({"": "unknown"})
    out = pd.DataFrame(
        {
            "rank": rects["rank"].astype("int32"),
            "lane": pd.Categorical(rects["lane"], categories=["compute", "memory", "comm"]),
            "start_ms": ((rects["start_ns"] - t0_ns) / 1e6).astype("float32"),
            "end_ms": ((rects["end_ns"] - t0_ns) / 1e6).astype("float32"),
            "category": np.where(comm, dims, rects["lane"]),
            "label": np.where(comm, rects["op"].astype(str), rects["name"].astype(str).str.slice(0, 80)),
            "dim": np.where(comm, dims, ""),
            "bytes": rects["bytes"].to_numpy(dtype="float64", na_value=np.nan).astype("float32"),
            "group": np.where(comm & ~merged, _group_of(rects["instance"]), ""),
            "busbw_gbps": np.where(comm, bw, np.nan).astype("float32"),
            "n_events": rects["n_events"].clip(upper=np.iinfo(np.int16).max).astype("int16"),
            "busy_pct": (100 * rects["busy_ns"] / (rects["end_ns"] - rects["start_ns"]).clip(lower=1))
            .round()
            .astype("uint8"),
            "busy_ms": (rects["busy_ns"] / 1e6).astype("float32"),
            "instance": np.where(comm, instance, ""),
        }
    )
    for col in ("category", "label", "dim", "group", "instance"):
        out[col] = out[col].astype("category")  # Arrow dictionaries: each string sent once
    return out


def breakdown_table(bd: pd.DataFrame, step: int) -> pd.DataFrame:
    """Per rank (summed over the chosen steps): window, compute, comm, overlapped, exposed, idle in ms
    and the exposed share of the window."""
    rows = step_rows(bd, step)
    cols = ["window_ns", "compute_ns", "comm_ns", "overlapped_comm_ns", "exposed_comm_ns", "memory_ns", "idle_ns"]
    g = rows.groupby("rank")[cols].sum()
    out = pd.DataFrame(
        {c.removesuffix("_ns").replace("_comm", " comm").replace("_", " ") + " ms": g[c] / 1e6 for c in cols}
    )
    out = out.round(3)
    out["exposed share"] = g["exposed_comm_ns"] / g["window_ns"].clip(lower=1)
    return out.reset_index()


def breakdown_parts(bd: pd.DataFrame, step: int) -> pd.DataFrame:
    """Long form for a stacked bar per rank whose parts sum to the step's window: rank, part, order, ms.
    compute = compute not overlapped by comm; memory copies = time only memcpy/memset were busy
    (exposed_memory_ns)."""
    g = (
        step_rows(bd, step)
        .groupby("rank")[
            ["window_ns", "compute_ns", "overlapped_comm_ns", "exposed_comm_ns", "exposed_memory_ns", "idle_ns"]
        ]
        .sum()
    )
    values = {
        PARTS[0]: g["compute_ns"] - g["overlapped_comm_ns"],
        PARTS[1]: g["overlapped_comm_ns"],
        PARTS[2]: g["exposed_comm_ns"],
        PARTS[3]: g["exposed_memory_ns"],
        PARTS[4]: g["idle_ns"],
    }
    long = pd.concat(
        [
            pd.DataFrame({"rank": g.index.astype("int32"), "part": part, "order": i, "ms": v.to_numpy() / 1e6})
            for i, (part, v) in enumerate(values.items())
        ],
        ignore_index=True,
    )
    long["part"] = pd.Categorical(long["part"], categories=list(PARTS))
    return long


def straggler_table(strag: pd.DataFrame, steps: pd.Series, step: int) -> pd.DataFrame:
    """The worst instances (largest arrival skew): op, dim, group, seq, skew ms, late rank, early rank, bytes."""
    rows = strag if step == ALL else strag[strag["instance"].map(steps) == step]
    return pd.DataFrame(
        {
            "instance": rows["instance"].astype(str),
            "op": rows["op"].astype(str),
            "dim": rows["dim"].astype(str),
            "group": rows["group"].astype(str),
            "seq": rows["seq"],
            "skew ms": (rows["skew_ns"] / 1e6).round(3),
            "late rank": rows["late_rank"],
            "early rank": rows["early_rank"],
            "bytes": rows["bytes"],
        }
    ).reset_index(drop=True)


def straggler_labels(worst: pd.DataFrame) -> dict[str, str]:
    """instance -> a one-line description, for a picker of the worst stragglers."""
    return {
        str(i): f"{d} {o} · group {g or 'unknown'} · #{q} · skew {k:,.2f} ms · late rank {r}"
        for i, d, o, g, q, k, r in zip(
            worst["instance"],
            worst["dim"],
            worst["op"],
            worst["group"],
            worst["seq"],
            worst["skew ms"],
            worst["late rank"],
        )
    }


def step_summary(breakdown: pd.DataFrame, skew: pd.DataFrame, counts: dict) -> dict:
    """Headline numbers of a step: collectives (collective_counts: each once across ranks), mean exposed
    share, worst arrival skew (ms)."""
    return {
        "collectives": counts["collectives"],
        "exposed_share": float(breakdown["exposed share"].mean()) if len(breakdown) else None,
        "worst_skew_ms": float(skew["max_skew_ms"].max()) if len(skew) else None,
    }


def dim_table(by_dim: pd.DataFrame, step: int, table: pd.DataFrame) -> pd.DataFrame:
    """Per parallel dimension: collectives (each once across ranks, as collective_counts), calls on all
    ranks, bytes, comm and exposed ms (summed over ranks)."""
    rows = step_rows(by_dim, step)
    g = rows.groupby("dim", observed=True)[["count", "bytes", "comm_ns", "exposed_comm_ns"]].sum()
    calls = step_rows(table, step)
    once = calls.drop_duplicates("instance").groupby(calls["dim"].astype(str).rename("dim")).size()
    return (
        pd.DataFrame(
            {
                "collectives": once.reindex(g.index.astype(str)).fillna(0).astype("int64").to_numpy(),
                "calls (all ranks)": g["count"],
                "bytes": g["bytes"],
                "comm ms (all ranks)": g["comm_ns"] / 1e6,
                "exposed ms (all ranks)": g["exposed_comm_ns"] / 1e6,
            },
            index=g.index,
        )
        .round(3)
        .reset_index()
    )


def rank_values(bd: pd.DataFrame, table: pd.DataFrame, inst: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank: exposed_comm_ms, step_ms (its traced steps' window), comm_ms, compute_ms, idle_ms
    (mean per step, so each is a part of step_ms), busbw_gbps (median over its collectives with a known
    size), late_count (instances it arrived last at)."""
    g = bd.groupby("rank")
    out = pd.DataFrame(
        {
            "exposed_comm_ms": g["exposed_comm_ns"].mean() / 1e6,
            "step_ms": g["window_ns"].mean() / 1e6,
            "comm_ms": g["comm_ns"].mean() / 1e6,
            "compute_ms": g["compute_ns"].mean() / 1e6,
            "idle_ms": g["idle_ns"].mean() / 1e6,
        }
    )
    if len(table):
        out["busbw_gbps"] = table.dropna(subset=["busbw_gbps"]).groupby("rank")["busbw_gbps"].median()
    else:
        out["busbw_gbps"] = np.nan
    late = inst.loc[inst["late_rank"] >= 0, "late_rank"].value_counts() if inst is not None and len(inst) else None
    out["late_count"] = late.reindex(out.index).fillna(0) if late is not None else 0
    out.index = out.index.astype("int64")
    return out


HEAT_VALUES = {  # column -> (label, legend title)
    "step_ms": ("Step time", "step ms"),
    "exposed_ms": ("Exposed communication", "exposed comm ms"),
    "late_ms": ("Arrival lateness", "late ms"),
}


def slowest_ranks(heat: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """The ranks that made others wait most (summed lateness over steps), then by step time."""
    g = heat.groupby("rank", as_index=False).agg(
        late_ms=("late_ms", "sum"), step_ms=("step_ms", "mean"), exposed_ms=("exposed_ms", "mean")
    )
    g = g.sort_values(["late_ms", "step_ms"], ascending=False, ignore_index=True).head(top)
    return g.rename(
        columns={"late_ms": "late ms (sum)", "step_ms": "mean step ms", "exposed_ms": "mean exposed ms"}
    ).round(3)
