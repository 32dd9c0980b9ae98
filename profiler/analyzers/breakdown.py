"""Per rank per step: compute, communication (total, overlapped with compute, exposed) and idle time.

    bd = breakdown(traces)         # rank, step, device, start_ns, end_ns, window_ns, compute_ns, comm_ns,
                                   # overlapped_comm_ns, exposed_comm_ns, memory_ns, idle_ns, events
    by_dim = comm_by_dim(traces)   # rank, step, dim, count, bytes, comm_ns, exposed_comm_ns

Every number is a length of a union of event intervals, in integer ns, never NaN:
    comm        union of the collectives table's intervals (kernels on GPU ranks, CPU calls on CPU ranks)
    compute     GPU: union of compute kernels over all streams. CPU-only: per thread, the union of CPU
                operators minus that thread's collective calls (a thread blocked in a collective is not
                computing), then the union over threads
    overlapped  |comm ∩ compute|; exposed = comm - overlapped
    memory      GPU memcpy/memset union (0 on CPU-only ranks)
    idle        window - |compute ∪ comm ∪ memory|

Steps: GPU events belong to the ProfilerStep their launch (cuda_runtime via correlation) falls in,
else the one their own start falls in; the window is then their first start to last end. CPU-only
ranks use the ProfilerStep range itself. A rank without ProfilerStep gets one row, step -1, spanning
all its events. `comm_by_dim` splits comm per parallel dimension; its exposed part is measured against
all compute, so per-dim values can each be exposed while overlapping each other.

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import intervals as iv
from .collectives import collectives
from .steps import assign_steps, step_windows

COLUMNS = ["rank", "step", "device", "start_ns", "end_ns", "window_ns", "compute_ns", "comm_ns",
           "overlapped_comm_ns", "exposed_comm_ns", "memory_ns", "idle_ns", "events"]
DIM_COLUMNS = ["rank", "step", "dim", "count", "bytes", "comm_ns", "exposed_comm_ns"]


def _comm_rows(traces, table: pd.DataFrame, rank: int) -> pd.DataFrame:
    rows = table[table["rank"] == rank]
    return rows[rows["source"] == "kernel"] if traces.device_of(rank) == "gpu" else rows


def _gpu_steps(traces, sub: pd.DataFrame, windows: pd.DataFrame) -> np.ndarray:
    """Step of each GPU event of one rank: by its launch time when linked, else its own start."""
    runtime = sub[(sub["kind"] == "runtime") & (sub["correlation"] >= 0)]
    launch = pd.Series(runtime["ts_ns"].to_numpy(), index=runtime["correlation"].to_numpy())
    launch = launch[~launch.index.duplicated()]
    when = sub["correlation"].map(launch).fillna(sub["ts_ns"]).to_numpy(dtype=np.int64)
    return assign_steps(sub["rank"].to_numpy(), when, windows)


def cpu_compute(sub: pd.DataFrame):
    """CPU-only compute of one rank: per thread, operators minus that thread's collective calls."""
    sets = []
    for _, g in sub[sub["kind"].isin(["cpu_op", "cpu_comm", "ps_comm"])].groupby(["pid", "tid"], sort=False):
        ops = g[g["kind"] == "cpu_op"]
        comm = g[g["kind"] != "cpu_op"]
        busy = iv.union(ops["ts_ns"], ops["ts_ns"] + ops["dur_ns"])
        blocked = iv.union(comm["ts_ns"], comm["ts_ns"] + comm["dur_ns"])
        sets.append(iv.minus(busy, blocked))
    return iv.merge(*sets)


def _rank_windows(traces, sub, windows, rank):
    """[(step, lo, hi, gpu_event_mask or None)] for one rank."""
    gpu = traces.device_of(rank) == "gpu"
    w = windows[windows["rank"] == rank]
    is_gpu = sub["kind"].isin(["compute", "comm", "memcpy", "memset"]).to_numpy()
    if gpu:
        steps = _gpu_steps(traces, sub[is_gpu], w) if len(w) else np.full(int(is_gpu.sum()), -1)
        out = []
        ends = (sub["ts_ns"] + sub["dur_ns"]).to_numpy()[is_gpu]
        starts = sub["ts_ns"].to_numpy()[is_gpu]
        for step in (w["step"].tolist() if len(w) else [-1]):
            mask = steps == step
            lo, hi = (int(starts[mask].min()), int(ends[mask].max())) if mask.any() else _cpu_window(w, step, sub)
            out.append((step, lo, hi, mask))
        return out
    if len(w):
        return [(int(s), int(lo), int(hi), None) for s, lo, hi in zip(w["step"], w["start_ns"], w["end_ns"])]
    return [(-1, int(sub["ts_ns"].min()), int((sub["ts_ns"] + sub["dur_ns"]).max()), None)]


def _cpu_window(w, step, sub):
    row = w[w["step"] == step]
    if len(row):
        return int(row["start_ns"].iloc[0]), int(row["end_ns"].iloc[0])
    return int(sub["ts_ns"].min()), int((sub["ts_ns"] + sub["dur_ns"]).max())


def _sets(traces, table, rank):
    """Per rank: a function (step, lo, hi, mask) -> (compute, comm rows, comm set, memory, n events)."""
    sub = traces.events[traces.events["rank"] == rank]
    gpu = traces.device_of(rank) == "gpu"
    rows = _comm_rows(traces, table, rank)
    gsub = sub[sub["kind"].isin(["compute", "comm", "memcpy", "memset"])]
    cpu_busy = None if gpu else cpu_compute(sub)

    def at(step, lo, hi, mask):
        if gpu:
            g = gsub[mask]
            comp = g[g["kind"] == "compute"]
            mem = g[g["kind"].isin(["memcpy", "memset"])]
            compute = iv.union(comp["ts_ns"], comp["ts_ns"] + comp["dur_ns"])
            memory = iv.union(mem["ts_ns"], mem["ts_ns"] + mem["dur_ns"])
            in_step = rows[rows["step"] == step] if step >= 0 else rows
            n = len(g)
        else:
            compute = iv.clip(cpu_busy, lo, hi)
            memory = iv.EMPTY
            in_step = rows[(rows["issue_ns"] >= lo) & (rows["issue_ns"] < hi)]
            n = int(((sub["ts_ns"] >= lo) & (sub["ts_ns"] < hi)).sum())
        comm = iv.clip(iv.union(in_step["start_ns"], in_step["end_ns"]), lo, hi)
        return compute, in_step, comm, memory, n

    return sub, at


def breakdown(traces, plan=None, *, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step); see the module docstring for each column's definition."""
    table = table if table is not None else collectives(traces, plan)
    windows = step_windows(traces)
    out = []
    for rank in traces.rank_ids:
        sub, at = _sets(traces, table, rank)
        for step, lo, hi, mask in _rank_windows(traces, sub, windows, rank):
            compute, _, comm, memory, n = at(step, lo, hi, mask)
            overlapped = iv.overlap(comm, compute)
            busy = iv.length(iv.merge(compute, comm, memory))
            window = max(hi - lo, busy)
            out.append((rank, step, traces.device_of(rank), lo, hi, window, iv.length(compute), iv.length(comm),
                        overlapped, iv.length(comm) - overlapped, iv.length(memory), window - busy, n))
    return pd.DataFrame(out, columns=COLUMNS).astype({c: "int64" for c in COLUMNS if c != "device"})


def comm_by_dim(traces, plan=None, *, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step, dim) with collectives: count, bytes, comm_ns and exposed_comm_ns."""
    table = table if table is not None else collectives(traces, plan)
    windows = step_windows(traces)
    out = []
    for rank in traces.rank_ids:
        sub, at = _sets(traces, table, rank)
        for step, lo, hi, mask in _rank_windows(traces, sub, windows, rank):
            compute, rows, _, _, _ = at(step, lo, hi, mask)
            for dim, g in rows.groupby("dim", observed=True, sort=True):
                comm = iv.clip(iv.union(g["start_ns"], g["end_ns"]), lo, hi)
                out.append((rank, step, str(dim), len(g), int(g["bytes"].fillna(0).sum()), iv.length(comm),
                            iv.length(iv.minus(comm, compute))))
    return pd.DataFrame(out, columns=DIM_COLUMNS).astype(
        {"rank": "int64", "step": "int64", "count": "int64", "bytes": "int64", "comm_ns": "int64",
         "exposed_comm_ns": "int64"})
