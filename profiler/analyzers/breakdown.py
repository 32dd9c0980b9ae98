"""Per rank per step: compute, communication (total, overlapped with compute, exposed) and idle time.

    bd = breakdown(traces)         # rank, step, device, start_ns, end_ns, window_ns, compute_ns, comm_ns,
                                   # overlapped_comm_ns, exposed_comm_ns, memory_ns, exposed_memory_ns,
                                   # idle_ns, events
    by_dim = comm_by_dim(traces)   # rank, step, dim, count, bytes, comm_ns, exposed_comm_ns

Every number is a length of a union of event intervals, in integer ns, never NaN:
    comm        union of the collectives table's intervals (kernels on GPU ranks, CPU calls on CPU ranks)
    compute     GPU: union of compute kernels over all streams. CPU-only: per thread, the union of CPU
                operators minus that thread's collective calls (a thread blocked in a collective is not
                computing), then the union over threads
    overlapped  |comm ∩ compute|; exposed = comm - overlapped
    memory      GPU memcpy/memset union (0 on CPU-only ranks); exposed_memory = memory outside compute
                and comm, |memory - (compute ∪ comm)|
    idle        window - |compute ∪ comm ∪ memory|
So compute + exposed_comm + exposed_memory + idle = window exactly: the phases of a step add up to
it (memory copies overlap kernels on other streams, so memory_ns itself may not).

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

from profiler.analyzers.breakdown_cpu import cpu_breakdowns
from profiler.analyzers.collectives import collectives
from profiler.analyzers.labels import PlanLike
from profiler.analyzers.steps import step_of, step_windows
from profiler.traces import intervals as iv
from profiler.traces.loader import map_part_tasks
from profiler.traces.model import Traces, event_arrays, rank_columns
from profiler.traces.patterns import KINDS
from profiler.traces.store import PartStore

COLUMNS = [
    "rank",
    "step",
    "device",
    "start_ns",
    "end_ns",
    "window_ns",
    "compute_ns",
    "comm_ns",
    "overlapped_comm_ns",
    "exposed_comm_ns",
    "memory_ns",
    "exposed_memory_ns",
    "idle_ns",
    "events",
]
DIM_COLUMNS = ["rank", "step", "dim", "count", "bytes", "comm_ns", "exposed_comm_ns"]
K = {k: i for i, k in enumerate(KINDS)}
GPU_CODES = [K["compute"], K["comm"], K["memcpy"], K["memset"]]


def cpu_compute(a: dict, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """CPU-only compute of one rank's events a[..][lo:hi]: per thread, operators minus that thread's
    collective calls, then the union over threads. The threads are laid side by side on one time
    line (thread k shifted by k x the rank's span), so each set operation runs once for all of them."""
    kind = a["kind"][lo:hi]
    op = kind == K["cpu_op"]
    comm = (kind == K["cpu_comm"]) | (kind == K["ps_comm"])
    both = np.flatnonzero(op | comm)
    if not len(both):
        return iv.EMPTY
    ts, end, op = a["ts"][lo:hi][both], a["end"][lo:hi][both], op[both]
    thread = pd.factorize(a["thread"][lo:hi][both])[0]  # 0, 1, ... for this rank's threads
    base = int(ts.min())
    span = max(int(end.max()), int(ts.max())) - base + 1
    if (int(thread.max()) + 1) * span >= 2**62:  # too wide to lay side by side: one thread at a time
        return iv.merge(
            *(
                iv.minus(
                    iv.union(ts[(thread == k) & op], end[(thread == k) & op]),
                    iv.union(ts[(thread == k) & ~op], end[(thread == k) & ~op]),
                )
                for k in range(int(thread.max()) + 1)
            )
        )
    lift = thread.astype(np.int64) * span - base
    s, e = ts + lift, end + lift
    free_s, free_e = iv.minus(iv.union(s[op], e[op]), iv.union(s[~op], e[~op]))
    k = free_s // span
    return iv.union(free_s - k * span + base, free_e - k * span + base)


class _Rank:
    """One rank's arrays and collectives, and the sets of one step window."""

    def __init__(self, store, rank: int, gpu: bool, rows: dict, windows: dict):
        self.rank, self.gpu = rank, gpu
        a = event_arrays(store.arrow(rank, "events"))  # columns only: no pandas frame of every event
        lo, hi = 0, len(a["ts"])
        self.ts, self.end, self.kind = a["ts"][lo:hi], a["end"][lo:hi], a["kind"][lo:hi]
        keep = rows["kernel"] if self.gpu else slice(None)
        self.r_start, self.r_end = rows["start_ns"][keep], rows["end_ns"][keep]
        self.r_issue, self.r_step = rows["issue_ns"][keep], rows["step"][keep]
        self.r_dim, self.r_bytes = rows["dim"][keep], rows["bytes"][keep]
        order = np.argsort(windows["start_ns"], kind="stable")
        self.windows = {c: np.asarray(v, dtype=np.int64)[order] for c, v in windows.items()}
        if self.gpu:
            g = np.isin(self.kind, GPU_CODES)
            self.g_ts, self.g_end, self.g_kind = self.ts[g], self.end[g], self.kind[g]
            self.g_step = self._gpu_steps(a["correlation"][lo:hi], g)
        else:
            self.cpu_busy = cpu_compute(a, lo, hi)

    def _gpu_steps(self, corr, g) -> np.ndarray:
        w = self.windows
        if not len(w["step"]):
            return np.full(int(g.sum()), -1)
        rt = (self.kind == K["runtime"]) & (corr >= 0)
        order = np.argsort(corr[rt], kind="stable")
        rt_corr, rt_ts = corr[rt][order], self.ts[rt][order]
        want = corr[g]
        i = np.clip(np.searchsorted(rt_corr, want), 0, max(len(rt_corr) - 1, 0))
        linked = (len(rt_corr) > 0) & (want >= 0) & (rt_corr[i] == want) if len(rt_corr) else np.zeros(len(want), bool)
        when = np.where(linked, rt_ts[i] if len(rt_corr) else 0, self.ts[g])
        return step_of(when.astype(np.int64), w["start_ns"], w["end_ns"], w["step"])

    def steps(self):
        """(step, lo, hi) windows of this rank."""
        w = self.windows
        if self.gpu:
            out = []
            for step in w["step"].tolist() if len(w["step"]) else [-1]:
                m = self.g_step == step
                if m.any():
                    out.append((step, int(self.g_ts[m].min()), int(self.g_end[m].max())))
                else:
                    at = np.flatnonzero(w["step"] == step)
                    out.append(
                        (step, int(w["start_ns"][at[0]]), int(w["end_ns"][at[0]]))
                        if len(at)
                        else (step, int(self.ts.min()), int(self.end.max()))
                    )
            return out
        if len(w["step"]):
            return [(int(s), int(lo), int(hi)) for s, lo, hi in zip(w["step"], w["start_ns"], w["end_ns"])]
        return [(-1, int(self.ts.min()), int(self.end.max()))]

    def sets(self, step, lo, hi):
        """(compute, mask of collectives rows, comm set, memory, n events) of one window."""
        if self.gpu:
            m = self.g_step == step
            comp = m & (self.g_kind == K["compute"])
            mem = m & ((self.g_kind == K["memcpy"]) | (self.g_kind == K["memset"]))
            compute = iv.union(self.g_ts[comp], self.g_end[comp])
            memory = iv.union(self.g_ts[mem], self.g_end[mem])
            rows = (self.r_step == step) if step >= 0 else np.ones(len(self.r_step), dtype=bool)
            n = int(m.sum())
        else:
            compute, memory = iv.clip(self.cpu_busy, lo, hi), iv.EMPTY
            rows = (self.r_issue >= lo) & (self.r_issue < hi)
            n = int(((self.ts >= lo) & (self.ts < hi)).sum())
        comm = iv.clip(iv.union(self.r_start[rows], self.r_end[rows]), lo, hi)
        return compute, rows, comm, memory, n


def breakdown(traces: Traces, plan: PlanLike = None, *, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step); see the module docstring for each column's definition."""
    return breakdowns(traces, plan, table=table)[0]


def comm_by_dim(traces: Traces, plan: PlanLike = None, *, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step, dim) with collectives: count, bytes, comm_ns and exposed_comm_ns."""
    return breakdowns(traces, plan, table=table)[1]


def breakdowns(
    traces: Traces,
    plan: PlanLike = None,
    *,
    table: pd.DataFrame | None = None,
    workers: int = 1,
    scheduler: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(breakdown, comm_by_dim) in one pass over the ranks: each rank's events are read once, by that
    rank's task (`workers` processes or a Dask `scheduler`'s workers when the store is on disk)."""
    table = table if table is not None else collectives(traces, plan, workers=workers, scheduler=scheduler)
    windows = step_windows(traces)
    rows = pd.DataFrame(
        {
            "rank": table["rank"].to_numpy(),
            "kernel": (table["source"] == "kernel").to_numpy(dtype=bool),
            **{c: table[c].to_numpy(dtype=np.int64) for c in ("start_ns", "end_ns", "issue_ns", "step")},
            "dim": table["dim"].to_numpy(dtype=object).astype(str),
            "bytes": table["bytes"].fillna(0).to_numpy(dtype=np.int64),
        }
    )
    fields = tuple(c for c in rows.columns if c != "rank")
    by_rank, no_rows = rank_columns(rows, fields)
    w_by_rank, no_windows = rank_columns(windows, _WINDOW_FIELDS)
    out, dims = [], []
    tasks = map_part_tasks(
        traces,
        _ranks_breakdown,
        lambda r: (by_rank.get(r, no_rows), w_by_rank.get(r, no_windows)),
        workers=workers,
        scheduler=scheduler,
        preload=__name__,
    )
    for rows, dim_rows in tasks:
        out += rows
        dims += dim_rows
    bd = pd.DataFrame(out, columns=COLUMNS).astype({c: "int64" for c in COLUMNS if c != "device"})
    by_dim = pd.DataFrame(dims, columns=DIM_COLUMNS).astype(
        {
            "rank": "int64",
            "step": "int64",
            "count": "int64",
            "bytes": "int64",
            "comm_ns": "int64",
            "exposed_comm_ns": "int64",
        }
    )
    return bd, by_dim


_WINDOW_FIELDS = ("step", "start_ns", "end_ns")


def _ranks_breakdown(store: PartStore, rank_args: list[tuple]):
    """The breakdown and comm_by_dim rows of the ranks of one part (rank_args: (rank, gpu, rows,
    windows) each), in rank order: a task (loader.map_part_tasks). CPU-only ranks are computed
    together, as columns (breakdown_cpu), when there are several; GPU ranks rank by rank."""
    cpu = [x for x in rank_args if not x[1]]
    done: dict[int, tuple[list, list]] = {}
    if len(cpu) > 1:
        together = _cpu_together(store, cpu)
        if together is not None:
            bd, dims = together
            for row in bd:
                done.setdefault(row[0], ([], []))[0].append(row)
            for row in dims:
                done.setdefault(row[0], ([], []))[1].append(row)
            for x in cpu:
                done.setdefault(x[0], ([], []))
    out, dims = [], []
    for x in rank_args:
        rows, dim_rows = done[x[0]] if x[0] in done else _rank_breakdown(store, *x)
        out += rows
        dims += dim_rows
    return out, dims


def _cpu_together(store: PartStore, cpu: list[tuple]):
    """breakdown_cpu.cpu_breakdowns of these CPU-only ranks, read as one table; None when it declines."""
    ranks = [x[0] for x in cpu]
    events, _, starts = store.arrow_of(ranks)
    a = event_arrays(events)
    at = np.repeat(np.arange(len(ranks)), np.diff(np.r_[starts, len(events)]))

    def joined(pieces: list[dict], fields) -> dict:
        cols = {c: np.concatenate([np.asarray(p[c]) for p in pieces]) for c in fields}
        cols["at"] = np.repeat(np.arange(len(pieces)), [len(p[fields[0]]) for p in pieces])
        return cols

    rows = joined([x[2] for x in cpu], ("start_ns", "end_ns", "issue_ns", "dim", "bytes"))
    windows = joined([x[3] for x in cpu], _WINDOW_FIELDS)
    return cpu_breakdowns(a, at, ranks, rows, windows)


def _rank_breakdown(store: PartStore, rank: int, gpu: bool, rows: dict, windows: dict):
    """One rank's breakdown and comm_by_dim rows (tuples): a task (loader.map_rank_tasks) for a
    worker process or a Dask worker as well as here. `rows` and `windows`: the rank's collectives and
    step windows as columns (rank_columns)."""
    r = _Rank(store, rank, gpu, rows, windows)
    out, dims = [], []
    for step, lo, hi in r.steps():
        compute, sel, comm, memory, n = r.sets(step, lo, hi)
        overlapped = iv.overlap(comm, compute)
        working = iv.length(iv.merge(compute, comm))
        busy = iv.length(iv.merge(compute, comm, memory))
        window = max(hi - lo, busy)
        out.append(
            (
                r.rank,
                step,
                "gpu" if r.gpu else "cpu",
                lo,
                hi,
                window,
                iv.length(compute),
                iv.length(comm),
                overlapped,
                iv.length(comm) - overlapped,
                iv.length(memory),
                busy - working,
                window - busy,
                n,
            )
        )
        for dim in np.unique(r.r_dim[sel]):
            g = sel & (r.r_dim == dim)
            dim_comm = iv.clip(iv.union(r.r_start[g], r.r_end[g]), lo, hi)
            dims.append(
                (
                    r.rank,
                    step,
                    str(dim),
                    int(g.sum()),
                    int(r.r_bytes[g].sum()),
                    iv.length(dim_comm),
                    iv.length(iv.minus(dim_comm, compute)),
                )
            )
    return out, dims
