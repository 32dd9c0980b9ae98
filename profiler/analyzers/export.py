"""Exports: one merged Chrome/Perfetto trace with a process per rank, and the collectives table.

    export_perfetto(traces, "merged.json.gz")          # opens in ui.perfetto.dev / chrome://tracing
    export_collectives(table, "collectives.csv")       # or .parquet

In the merged trace each rank is a process ("rank 3", sorted by rank); its CPU threads and GPU
streams are threads ("cpu 1234 (pt_main_thread)", "gpu 0 stream 7"). Times are microseconds from the
earliest event of the set, after the optional per-rank clock offsets (matching.clock_offsets).
Collective events carry the collectives table's op, dim, bytes, group, seq and instance in args.
Written one rank at a time; gzip when the path ends in .gz.

Pure: numpy, pandas, orjson.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from pathlib import Path

import orjson
import pandas as pd

from profiler.traces.model import Traces
from profiler.traces.patterns import GPU_KINDS


def export_collectives(table: pd.DataFrame, path: str | Path) -> Path:
    """The collectives table as CSV or Parquet, by the path's suffix."""
    path = Path(path)
    if path.suffix == ".parquet":
        table.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        table.to_csv(path, index=False)
    else:
        raise ValueError(f"{path.name}: export the collectives table as .csv or .parquet")
    return path


def perfetto_events(
    traces: Traces, rank: int, *, t0_ns: int, offset_ns: int = 0, table: pd.DataFrame | None = None
) -> list[dict]:
    """The Chrome-trace events (dicts) of one rank, metadata first."""
    sub = traces.rank_events(rank)
    gpu = sub["kind"].isin(list(GPU_KINDS)).to_numpy()
    names = {(int(p), int(t)): n for r, p, t, n in traces.threads.itertuples(index=False) if r == rank}
    lanes = pd.DataFrame({"gpu": gpu, "pid": sub["pid"].to_numpy(), "tid": sub["tid"].to_numpy()}).drop_duplicates()
    lanes = lanes.sort_values(["gpu", "pid", "tid"], ignore_index=True)
    lane_id = {(bool(g), int(p), int(t)): i + 1 for i, (g, p, t) in enumerate(lanes.itertuples(index=False))}
    out = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    for (g, p, t), i in lane_id.items():
        label = f"gpu {p} stream {t}" if g else f"cpu {t}" + (f" ({names[(p, t)]})" if (p, t) in names else "")
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": i, "args": {"name": label}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": i, "args": {"sort_index": i}})
    comm = {}
    if table is not None:
        rows = table[table["rank"] == rank]
        cols = ["event", "cpu_event", "op", "dim", "bytes", "group", "seq", "instance"]
        for rec in rows[cols].itertuples(index=False):
            args = {
                "op": str(rec.op),
                "dim": str(rec.dim),
                "group": rec.group,
                "seq": int(rec.seq),
                "instance": rec.instance,
            }
            if not pd.isna(rec.bytes):
                args["bytes"] = int(rec.bytes)
            comm[int(rec.event)] = args
            if rec.cpu_event >= 0:
                comm.setdefault(int(rec.cpu_event), args)
    ts = (sub["ts_ns"].to_numpy() + offset_ns - t0_ns) / 1000.0
    dur = sub["dur_ns"].to_numpy() / 1000.0
    for row, name, cat, kind, p, t, g, start, length in zip(
        sub.index,
        sub["name"].astype(str),
        sub["cat"].astype(str),
        sub["kind"].astype(str),
        sub["pid"],
        sub["tid"],
        gpu,
        ts,
        dur,
    ):
        event = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "pid": rank,
            "tid": lane_id[(bool(g), int(p), int(t))],
            "ts": round(float(start), 3),
            "dur": round(float(length), 3),
        }
        args = comm.get(row)
        event["args"] = {"kind": kind, **args} if args else {"kind": kind}
        out.append(event)
    return out


def export_perfetto(
    traces: Traces,
    path: str | Path,
    *,
    ranks: Iterable[int] | None = None,
    offsets: pd.DataFrame | None = None,
    table: pd.DataFrame | None = None,
) -> Path:
    """Write the merged trace (see the module docstring); returns the path."""
    path = Path(path)
    shift = dict(zip(offsets["rank"], offsets["offset_ns"])) if offsets is not None else {}
    ranks = list(ranks) if ranks is not None else traces.rank_ids
    present = set(traces.rank_ids)
    starts = [
        int(traces.rank_events(r)["ts_ns"].iloc[0]) + int(shift.get(r, 0))  # sorted by start: the first is the min
        for r in ranks
        if r in present and len(traces.rank_events(r))
    ]
    t0 = min(starts) if starts else 0
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(b'{"displayTimeUnit":"ms","traceEvents":[')
        first = True
        for r in ranks:
            events = perfetto_events(traces, int(r), t0_ns=t0, offset_ns=int(shift.get(r, 0)), table=table)
            if not events:
                continue
            body = orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
            f.write((b"" if first else b",") + body)
            first = False
        f.write(b"]}")
    return path


__all__ = ["export_collectives", "export_perfetto", "perfetto_events"]
