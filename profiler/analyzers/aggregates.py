"""Per-step aggregates of the analyzers' tables, for the CLI's JSON and the pages alike: which step an
instance belongs to, arrival skew per (dim, op), collectives counted once across ranks, the rank x step
heat, TP-group collectives by size and link, a run's metrics and its GPU.

    steps = instance_steps(table)                   # instance -> its step
    skew_table(inst, steps, step)                   # per (dim, op): instances, median/p95/max skew ms, ...
    collective_counts(table, step)                  # {collectives, world, unknown}, each once across ranks
    rank_step_heat(bd, per_rank_wait, steps)        # every rank x step: step_ms, exposed_ms, late_ms
    tp_measured(table, nodes)                       # TP-group busbw by group size, SP and link

Long-form frames, snake_case columns with units (docs/json-output.md). Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from parallel.core.memory_sweeps import MetricsError, measured_vs_predicted, model_state_vs_predicted
from profiler.traces.model import link_tier

ALL = -2  # the "all steps" choice of a step selector


TP_DIMS = ("tp", "sp")


def step_rows(bd: pd.DataFrame, step: int) -> pd.DataFrame:
    return bd if step == ALL else bd[bd["step"] == step]


def instance_steps(table: pd.DataFrame) -> pd.Series:
    return table.groupby("instance", observed=True)["step"].first() if len(table) else pd.Series(dtype="int64")


SKEW_COLUMNS = [
    "dim",
    "op",
    "instances",
    "median_skew_ms",
    "p95_skew_ms",
    "max_skew_ms",
    "most_often_late_rank",
    "times_late",
]


def skew_table(inst: pd.DataFrame, steps: pd.Series, step: int) -> pd.DataFrame:
    """Arrival skew per (dim, op) over the instances seen on 2+ ranks (SKEW_COLUMNS): instances, median,
    p95 and max skew in ms, the rank most often last to arrive and how many times it was."""
    rows = inst[inst["n_ranks"] >= 2]
    if step != ALL:
        rows = rows[rows["instance"].map(steps) == step]
    if rows.empty:
        return pd.DataFrame(columns=SKEW_COLUMNS)
    rows = rows.assign(skew_ms=rows["skew_ns"] / 1e6)
    g = rows.groupby(["dim", "op"], observed=True)
    late = g["late_rank"].agg(lambda s: s.value_counts().idxmax())
    times = g["late_rank"].agg(lambda s: int(s.value_counts().max()))
    out = pd.DataFrame(
        {
            "instances": g.size(),
            "median_skew_ms": g["skew_ms"].median(),
            "p95_skew_ms": g["skew_ms"].quantile(0.95),
            "max_skew_ms": g["skew_ms"].max(),
            "most_often_late_rank": late,
            "times_late": times,
        }
    )
    return out.round(3).reset_index().sort_values("max_skew_ms", ascending=False, ignore_index=True)


def collective_counts(table: pd.DataFrame, step: int) -> dict:
    """The collectives of `step` (ALL: every step), each counted once across the ranks that took part
    (an instance: the same call on every rank of its group), not calls x ranks: collectives, and of
    them `world` (spanning every rank, no dimension known) and `unknown` (no evidence at all)."""
    rows = step_rows(table, step)
    if not len(rows):
        return {"collectives": 0, "world": 0, "unknown": 0}
    first = rows.drop_duplicates("instance")
    source = first["dim_source"].astype(str)
    return {
        "collectives": len(first),
        "world": int((source == "group_size").sum()),
        "unknown": int((source == "unknown").sum()),
    }


def _link(group: str, node_of: dict[int, object]) -> str:
    """'intra' or 'inter' (the plan model's words; the page names them for its cluster), or 'unknown link'."""
    tier = link_tier(group, node_of)
    return "unknown link" if tier == "unknown" else tier


def tp_measured(table: pd.DataFrame, node_of: dict[int, object]) -> pd.DataFrame:
    """TP/SP-group collectives of a trace set as the TP-scaling overlay: one row per (group size, sp, link,
    op) with tp, sp, link, op, n (collectives), bytes (median), busbw_bytes_per_s (median)."""
    rows = table[table["dim"].astype(str).isin(TP_DIMS) & table["busbw_gbps"].notna() & (table["group_size"] > 1)]
    if rows.empty:
        return pd.DataFrame(columns=["tp", "sp", "link", "op", "n", "bytes", "busbw_bytes_per_s"])
    links = {g: _link(g, node_of) for g in rows["group"].astype(str).unique()}
    rows = rows.assign(
        link=rows["group"].astype(str).map(links),
        sp=rows["dim"].astype(str) == "sp",
        op=rows["op"].astype(str),
        tp=rows["group_size"].astype("int64"),
    )
    g = rows.groupby(["tp", "sp", "link", "op"])
    out = pd.DataFrame({"n": g.size(), "bytes": g["bytes"].median(), "busbw_gbps": g["busbw_gbps"].median()})
    out["busbw_bytes_per_s"] = out["busbw_gbps"] * 1e9
    return out.reset_index()


def metrics_summary(metrics: dict | None) -> dict:
    """Headline numbers of a run's metrics.json: steady step time (median after the first step), first
    and last loss, the largest activation-memory and model-state errors vs the prediction (%). Missing
    ones are None."""
    out = {"step_time_s": None, "loss_first": None, "loss_last": None, "act_error_pct": None, "state_error_pct": None}
    if not metrics:
        return out
    times = [float(t) for t in metrics.get("step_time_s") or [] if isinstance(t, (int, float))]
    if times:
        out["step_time_s"] = float(np.median(times[1:] if len(times) > 1 else times))
    loss = [float(x) for x in metrics.get("loss") or [] if isinstance(x, (int, float))]
    if loss:
        out["loss_first"], out["loss_last"] = loss[0], loss[-1]
    for key, frame in (("act_error_pct", measured_vs_predicted), ("state_error_pct", model_state_vs_predicted)):
        try:
            err = frame(metrics)["error_pct"].dropna()
            out[key] = float(err.abs().max()) if len(err) else None
        except MetricsError:
            pass
    return out


def commbench_points(data: dict) -> pd.DataFrame:
    """busbw points of a `python -m profiler commbench` result for the TP-scaling overlay: of its `results`
    (op, group_size, link, bytes, busbw_gbps, ...), the all_reduce rows, the largest message of each
    (group size, link): tp, link, busbw_bytes_per_s, sp (False), source."""
    listed = data.get("results") or data.get("rows") or []  # one row per (op, group size, link, bytes)
    rows = pd.DataFrame([r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else [])
    if rows.empty:
        return pd.DataFrame(columns=["tp", "link", "busbw_bytes_per_s"])
    size = next((c for c in ("group_size", "nranks", "n", "ranks", "world_size") if c in rows), None)
    if "busbw_bytes_per_s" not in rows and "busbw_gbps" in rows:
        rows["busbw_bytes_per_s"] = rows["busbw_gbps"] * 1e9
    if size is None or "busbw_bytes_per_s" not in rows:
        return pd.DataFrame(columns=["tp", "link", "busbw_bytes_per_s"])
    if "op" in rows:
        rows = rows[rows["op"] == "all_reduce"]
    rows = rows.assign(tp=rows[size].astype(int), link=rows["link"] if "link" in rows else "intra")
    by = rows.sort_values("bytes" if "bytes" in rows else size).groupby(["tp", "link"]).tail(1)
    return by[["tp", "link", "busbw_bytes_per_s"]].assign(sp=False, source="commbench")


def rank_step_heat(bd: pd.DataFrame, per_rank: pd.DataFrame, steps: pd.Series) -> pd.DataFrame:
    """One row per (rank, step) of every rank: step_ms (the step's window), exposed_ms (exposed
    communication) and late_ms (how long the rank's collectives started after the first rank of their
    group -- the time it made the others wait), so 1,000+ ranks fit one picture."""
    heat = pd.DataFrame(
        {
            "rank": bd["rank"].to_numpy(),
            "step": bd["step"].to_numpy(),
            "step_ms": bd["window_ns"].to_numpy() / 1e6,
            "exposed_ms": bd["exposed_comm_ns"].to_numpy() / 1e6,
        }
    )
    if len(per_rank):
        first = per_rank.groupby("instance", observed=True)["start_ns"].transform("min")
        late = pd.DataFrame(
            {
                "rank": per_rank["rank"].to_numpy(),
                "step": per_rank["instance"].map(steps).fillna(-1).astype("int64").to_numpy(),
                "late_ms": (per_rank["start_ns"] - first).to_numpy() / 1e6,
            }
        )
        late = late.groupby(["rank", "step"], as_index=False)["late_ms"].sum()
        heat = heat.merge(late, on=["rank", "step"], how="left")
    else:
        heat["late_ms"] = 0.0
    heat["late_ms"] = heat["late_ms"].fillna(0.0)
    return heat.round(3)


def job_device(ranks: pd.DataFrame) -> dict | None:
    """The GPU a set's ranks ran on, from their traces' deviceProperties: {"name", "memory_bytes"
    (None when the traces do not say), "ranks" (how many report it), "others" (other names seen)};
    None when no rank ran kernels on a named GPU."""
    if "device_name" not in ranks:
        return None
    named = ranks[ranks["device_name"].notna()]
    if named.empty:
        return None
    counts = named["device_name"].value_counts()
    name = str(counts.index[0])
    memory = named.loc[named["device_name"] == name, "device_memory"] if "device_memory" in named else pd.Series()
    memory = pd.to_numeric(memory, errors="coerce").dropna()
    return {
        "name": name,
        "memory_bytes": int(memory.mode().iloc[0]) if len(memory) else None,
        "ranks": int(counts.iloc[0]),
        "others": [str(n) for n in counts.index[1:]],
    }
