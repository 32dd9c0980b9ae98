"""A measured step split the way the plan model splits one (parallel.core.perf.step_time): compute by
kernel class, exposed communication per dimension, the pipeline bubble, idle, the optimizer.

    rows = compute_classes(traces)                        # rank, step, gemm_ns, attention_ns, optimizer_ns
    split = step_split(breakdown, comm_by_dim, rows, phases)    # StepSplit: per (rank, step) and averaged

Definitions (integer ns per rank and step, on breakdown's sets, so the parts add up to its window):
    optimizer    compute inside the optimizer's step (patterns.OPTIMIZER_RANGE: torch.optim's range, our
                 engine's phase; on a GPU the kernels launched inside it)
    gemm, attention   the rest of the compute that GEMM / attention kernels (device_fit.kernel_classes)
                 or, on a CPU rank, GEMM / attention operators (patterns.GEMM_CPU_OP, ATTENTION_CPU_OP) cover
    elementwise  the remaining compute
    exposed_<dim>   breakdown's exposed communication shared among the dimensions in proportion to each
                 one's own exposed time (comm_by_dim measures each against compute only, so dimensions
                 that overlap one another would count twice)
    bubble       the pipeline's idle (bubble.pipeline_phases: waits in ops across stages), taken out of
                 the exposed PP communication it was measured in
    memory       exposed memory copies;  idle   the window's remaining time (host gaps, launch latency)

Pure: numpy, pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from parallel.core.comm import DIMS  # the plan model's dimensions: tp, sp, cp, ep, pp, dp
from profiler.analyzers.breakdown import _WINDOW_FIELDS, _Rank
from profiler.analyzers.device_fit import kernel_classes
from profiler.analyzers.steps import step_windows
from profiler.traces import intervals as iv
from profiler.traces.loader import map_rank_tasks
from profiler.traces.model import Traces, rank_columns
from profiler.traces.patterns import ATTENTION_CPU_OP, GEMM_CPU_OP, KINDS, OPTIMIZER_RANGE
from profiler.traces.store import PartStore

CLASS_COLUMNS = ["rank", "step", "compute_ns", "gemm_ns", "attention_ns", "optimizer_ns"]
COMPUTE_PARTS = ("gemm", "attention", "elementwise", "optimizer")
COMPONENTS = (*COMPUTE_PARTS, *(f"exposed_{d}" for d in DIMS), "exposed_other", "bubble", "memory", "idle")
_K = {k: i for i, k in enumerate(KINDS)}
_NO_ROWS = {
    "kernel": np.zeros(0, bool),
    **{c: np.zeros(0, np.int64) for c in ("start_ns", "end_ns", "issue_ns", "step", "bytes")},
    "dim": np.zeros(0, object),
}


def _classes(names: np.ndarray, gpu: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct name: (gemm, attention, optimizer range) masks."""
    text = pd.Series(names, dtype=object).astype(str)
    opt = text.str.contains(OPTIMIZER_RANGE).to_numpy()
    if gpu:
        cls = kernel_classes(text)
        return cls == "gemm", cls == "attention", opt
    attention = text.str.contains(ATTENTION_CPU_OP).to_numpy()
    return text.str.contains(GEMM_CPU_OP).to_numpy() & ~attention, attention, opt


def _rank_classes(store: PartStore, rank: int, gpu: bool, windows: dict) -> list[tuple]:
    """One rank's CLASS_COLUMNS rows: a task (loader.map_rank_tasks)."""
    r = _Rank(store, rank, gpu, _NO_ROWS, windows)
    table = store.arrow(rank, "events")
    names = table.column("name").combine_chunks()
    codes = names.indices.to_numpy(zero_copy_only=False)
    gemm_n, attn_n, opt_n = _classes(np.asarray(names.dictionary.to_pylist(), dtype=object), gpu)
    gemm, attn, opt = gemm_n[codes], attn_n[codes], opt_n[codes]
    ranges = iv.union(r.ts[opt], r.end[opt])
    if gpu:  # kernels launched inside the optimizer's range
        corr = table.column("correlation").to_numpy()
        runtime = (r.kind == _K["runtime"]) & (corr >= 0)
        starts, ends = ranges
        at = np.searchsorted(starts, r.ts, side="right") - 1
        inside = runtime & (at >= 0) & (r.ts < ends[np.clip(at, 0, None)] if len(ends) else np.zeros(len(r.ts), bool))
        kernel = r.kind == _K["compute"]
        opt = kernel & np.isin(corr, corr[inside])
        ranges = iv.union(r.ts[opt], r.end[opt])
        gemm, attn = gemm & kernel, attn & kernel
    else:
        op = r.kind == _K["cpu_op"]
        gemm, attn = gemm & op, attn & op
    out = []
    for step, lo, hi in r.steps():
        compute = r.sets(step, lo, hi)[0]
        o = iv.intersect(compute, iv.clip(ranges, lo, hi))
        rest = iv.minus(compute, o)
        a = iv.intersect(rest, iv.clip(iv.union(r.ts[attn], r.end[attn]), lo, hi))
        g = iv.intersect(iv.minus(rest, a), iv.clip(iv.union(r.ts[gemm], r.end[gemm]), lo, hi))
        out.append((rank, step, iv.length(compute), iv.length(g), iv.length(a), iv.length(o)))
    return out


def compute_classes(traces: Traces, *, workers: int = 1, scheduler: str | None = None) -> pd.DataFrame:
    """One row per (rank, step): CLASS_COLUMNS, on the same compute and steps as breakdown's."""
    w_by_rank, no_windows = rank_columns(step_windows(traces), _WINDOW_FIELDS)
    rows: list[tuple] = []
    for part in map_rank_tasks(
        traces,
        _rank_classes,
        lambda r: (w_by_rank.get(r, no_windows),),
        workers=workers,
        scheduler=scheduler,
        preload=__name__,
    ):
        rows += part
    return pd.DataFrame(rows, columns=CLASS_COLUMNS).astype("int64")


@dataclass(frozen=True)
class StepSplit:
    rows: pd.DataFrame  # rank, step, window_ns and one <component>_ns column per COMPONENTS
    components: pd.DataFrame  # component, seconds (mean over ranks and traced steps), share

    @property
    def step_s(self) -> float:
        return float(self.components["seconds"].sum())

    def to_dict(self) -> dict:
        return {
            "step_s": round(self.step_s, 6),
            "components": {r.component: round(float(r.seconds), 6) for r in self.components.itertuples()},
            "ranks": int(self.rows["rank"].nunique()) if len(self.rows) else 0,
            "steps": int(self.rows["step"].nunique()) if len(self.rows) else 0,
        }


def step_split(
    breakdown: pd.DataFrame, comm_by_dim: pd.DataFrame, classes: pd.DataFrame, phases: pd.DataFrame | None = None
) -> StepSplit:
    """The split of every (rank, step) and its mean (module docstring). `phases`: bubble.pipeline_phases'
    table (None or empty without a pipeline)."""
    bd = breakdown[["rank", "step", "window_ns", "compute_ns", "exposed_comm_ns", "exposed_memory_ns", "idle_ns"]]
    rows = bd.merge(classes.drop(columns="compute_ns"), on=["rank", "step"], how="left").fillna(0)
    rows["optimizer"] = rows["optimizer_ns"]
    rows["gemm"], rows["attention"] = rows["gemm_ns"], rows["attention_ns"]
    rows["elementwise"] = (rows["compute_ns"] - rows["gemm"] - rows["attention"] - rows["optimizer"]).clip(lower=0)
    dims = comm_by_dim.pivot_table(index=["rank", "step"], columns="dim", values="exposed_comm_ns", aggfunc="sum")
    dims = dims.reindex(pd.MultiIndex.from_frame(rows[["rank", "step"]])).fillna(0)
    known = [d for d in DIMS if d in dims.columns]
    dims["other"] = dims[[c for c in dims.columns if c not in DIMS]].sum(axis=1)
    own = dims[[*known, "other"]].to_numpy(dtype=float)
    total = own.sum(axis=1, keepdims=True)
    share = np.divide(own, total, out=np.zeros_like(own), where=total > 0)
    exposed = share * rows["exposed_comm_ns"].to_numpy(dtype=float)[:, None]
    for i, d in enumerate([*known, "other"]):
        rows[f"exposed_{d}"] = exposed[:, i]
    for d in DIMS:
        if f"exposed_{d}" not in rows:
            rows[f"exposed_{d}"] = 0.0
    rows["bubble"] = 0.0
    if phases is not None and len(phases):
        idle = phases.groupby(["rank", "step"])["pipeline_idle_ns"].sum()
        idle = idle.reindex(pd.MultiIndex.from_frame(rows[["rank", "step"]])).fillna(0).to_numpy(dtype=float)
        rows["bubble"] = np.minimum(idle, rows["exposed_pp"].to_numpy(dtype=float))
        rows["exposed_pp"] = rows["exposed_pp"] - rows["bubble"]
    rows["memory"], rows["idle"] = rows["exposed_memory_ns"], rows["idle_ns"]
    out = rows[["rank", "step", "window_ns"]].copy()
    for c in COMPONENTS:
        out[f"{c}_ns"] = rows[c].astype("float64")
    mean = [float(out[f"{c}_ns"].mean()) / 1e9 if len(out) else 0.0 for c in COMPONENTS]
    whole = sum(mean)
    comps = pd.DataFrame(
        {"component": list(COMPONENTS), "seconds": mean, "share": [m / whole if whole else 0.0 for m in mean]}
    )
    return StepSplit(out, comps)
