"""Fit parallel.core.calibrated's step-time model to measured runs: `python -m profiler calibrate`.

    cal = fit([Measured(analysis, metrics, plan, model, path), ...], cores=os.cpu_count())

From each profiled run:
    tracing overhead   per kind of time, against the run's own unprofiled steady steps (metrics.json:
                       the steps before the profiler's warm-up and after its teardown, the first
                       excluded; the median): work by f_work = traced work / unprofiled work, link
                       samples by f_comm = traced transfers / unprofiled transfers. The engine times
                       its communication calls in every step (comm_time_s_per_rank), which splits an
                       unprofiled step into work and blocked time; the blocked time's waits for late
                       peers are those peers' work (the traced waits / f_work), the rest is transfer.
                       Tracing slows work (a record per op) but not transfers -- on a VM whose idle
                       cores halt it shortened them. A run without those timers (another framework's
                       traces) divides both by the step's factor; one without unprofiled steps
                       (profiler run --wait 1 or 2, nothing after the traced steps) keeps 1 and its
                       source says so.
    level              unprofiled launches of a run's plan and model (`parallel train` runs, given
                       with --unprofiled): the median of their steady steps and the run's own is the
                       step the fit gives it, both factors scaled to match (_leveled). One launch runs
                       20-25% fast or slow throughout now and then, and a calibration run's level sets
                       every constant fitted from it.
    work samples       per rank and step: GEMM time (leaf GEMM ops on CPU, GEMM kernels on GPU) for k,
                       the seconds per FLOP; the work inside the engine's forward/backward phases (less
                       the collectives inside them) for a (per layer), a_tp, a_sp, a_cp, a_head by non-
                       negative least squares against the plan's regressors (calibrated.features) of the
                       rank's stage -- extras no run tells apart fitted as one and split by the blocking
                       calls per layer each dimension adds (call_weights). Outside those phases: the
                       optimizer's range (ps.phase optim) for w0, once per step; the rest per
                       microbatch for a_mb (on the calibration runs it grew with the microbatches: 0.9
                       ms at 1, 1.7-2.1 at 2, 2.1-4.4 at 4); without the engine's ranges all of it is w0.
    link samples       per (op, group size, bytes), the mean cost of the trace's ops -- a p2p op's
                       transfer after both sides arrived (its whole time when it ended before its peer
                       came: an eager send's issue), a collective's transfer plus its wait less the
                       rank's typical wait there (op_cost_ns: jitter in lock-step is paid every call, a
                       wait the schedule puts on the same rank each step -- a pipeline's drain before
                       the gradients' all-reduce -- is the bubble's) -- against (1, hops, bus bytes):
                       per-call c, alpha, beta (non-negative least squares), and per
                       collective a scale (op_scale: its cost over the shared terms'), alternated
                       until they settle; the median op keeps scale 1. c is fitted only when one op
                       was measured at two hop counts (group sizes); else alpha per ring step carries
                       the latency, as the ring model's (Thakur et al. 2005). Ring CP's sends and
                       receives (dim cp) are the halves of exchanges, an op of their own ("exchange").
    contention         a run with more ranks than cores: its work samples are divided by the stretch
                       the engine measured in its unprofiled steps -- work's wall time over its CPU time
                       (cpu_time_s_per_rank less comm_cpu_time_s_per_rank): how long the rank waited
                       for a core -- and its link samples by the contention the model gives it (first
                       guess: ranks/cores). Measured, work stretches far less than communication when
                       ranks wait on each other: TP+SP x CP on 4 ranks 1.05-1.19 while the model's
                       contention was ~1.9; work-bound dp4 1.9-2.0. (Dividing by a stretch per operator
                       -- its wall time against a run whose ranks had a core each -- predicted worse:
                       25.9% and 30.3% mean error against 17.0% and 18.3%, bench/predict.py.)
                       gamma (the busy share of communication) is measured: the CPU seconds inside its
                       communication calls (comm_cpu_time_s_per_rank) over the communication seconds
                       the model gives it uncontended; eta (the share of the cores the ranks keep busy)
                       is then fitted so the model gives that run its unprofiled step, alternating a few
                       rounds. Without CPU clocks eta stays 1, gamma is what gives the step and the work
                       too is divided by the model's contention; without such a run gamma stays 0.5 and
                       eta 1. Measured here, ranks that outnumber the cores keep 72-87% of them busy
                       whatever the plan (pp4 on 2 cores 79-80%, dp2 x pp2 87%, tp4 72-74%, TP+SP x CP
                       73-82%): a rank woken by a peer can find its core taken while the other idles.
                       gamma alone, fitted to the step, had folded that idleness into communication and
                       under-predicted pipelines on shared cores by 10-25% (their loss is not in their
                       communication).

Pure: numpy, pandas.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.calibrated import (
    Calibration,
    CalibrationError,
    collective_s,
    comm_calls,
    features,
    predict,
    stage_layers,
)
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Link, Model
from profiler.analyzers.labels import P2P_OPS
from profiler.analyzers.replay import phases
from profiler.traces import intervals as iv
from profiler.traces.model import link_tier, node_of_ranks


def nnls(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares for a few columns: the best least-squares fit over every subset of
    columns whose solution is non-negative (exact; 2^columns small solves)."""
    n = A.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b**2))
    for mask in range(1, 2**n):
        cols = [j for j in range(n) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
        if (x < 0).any():
            continue
        res = float(np.sum((A[:, cols] @ x - b) ** 2))
        if res < best_res - 1e-18:
            best = np.zeros(n)
            best[cols] = x
            best_res = res
    return best, best_res


@dataclass
class Measured:
    analysis: Any  # profiler.TraceAnalysis of the run's traces
    metrics: dict  # its metrics.json
    plan: Plan
    model: Model
    path: str = ""
    cluster: Cluster | None = None  # its nodes, when it ran on more than one (groups across them: inter)
    # steady steps (median after the first) of unprofiled launches of the same plan and model: with the
    # run's own unprofiled step, their median is the level the fit gives the run (_leveled)
    launches_s: tuple[float, ...] = ()


def _unprofiled(times: list, traced_steps: list[int]) -> list[float]:
    """The steady steps without the profiler attached: neither the first, nor traced, nor the
    profiler's warm-up (the step before the first traced one), nor its teardown and export (the step
    after the last); those after the traced ones count too, so a drift over the run is bracketed."""
    first = min(traced_steps) if traced_steps else len(times)
    last = max(traced_steps) if traced_steps else len(times)
    return [t for i, t in enumerate(times) if (0 < i < first - 1 or i > last + 1) and isinstance(t, (int, float))]


def rank_series(metrics: dict, key: str, rank: int) -> list:
    """metrics.json's per-rank list `key` of `rank` ({rank: [float]}, rank keys strings), [] when the
    field is missing or not of that shape (an older or edited file: the fit then uses one factor)."""
    field = metrics.get(key)
    series = field.get(str(rank)) if isinstance(field, dict) else None
    return series if isinstance(series, list) else []


def unprofiled_step_s(metrics: dict, traced_steps: list[int]) -> float | None:
    """Median of the run's unprofiled steady steps (_unprofiled), the slowest rank's each."""
    keep = _unprofiled(metrics.get("step_time_s") or [], traced_steps)
    return float(np.median(keep)) if keep else None


def measured_step(metrics: dict, traced_steps: list[int]) -> tuple[float, bool] | None:
    """(seconds, unprofiled) of a run's measured step, as the model predicts it: its unprofiled steps'
    median when a profiled run has them (unprofiled True), else the median after the first step
    (unprofiled only when nothing was traced); None without two step times."""
    times = [float(t) for t in metrics.get("step_time_s") or [] if isinstance(t, (int, float))]
    if len(times) < 2:
        return None
    plain = unprofiled_step_s(metrics, traced_steps) if traced_steps else None
    if plain is not None:
        return plain, True
    return float(np.median(times[1:])), not traced_steps


@dataclass(frozen=True)
class Overhead:
    """What tracing did to one run, traced over unprofiled per kind of time: `work` divides the work
    samples, `comm` the link samples (1: nothing removed)."""

    work: float
    comm: float
    plain_step_s: float | None  # the unprofiled steady step (median), None without one
    traced_step_s: float  # the traced steps' mean
    split: bool  # the unprofiled steps timed their communication: a factor per kind, else one for both
    # work's wall time over its CPU time in the unprofiled steps: > 1 where ranks shared cores and
    # waited for one; None without CPU clocks (metrics.json cpu_time_s_per_rank)
    stretch: float | None = None
    # a rank's CPU seconds inside its communication calls per unprofiled step (the ranks' mean of their
    # medians); None without CPU clocks
    comm_cpu_s: float | None = None
    level: float = 1.0  # the run's own unprofiled step over the median of its launches' (_leveled)
    launches: int = 0  # unprofiled launches of its plan that set that level


def _leveled(o: Overhead, launches_s: tuple[float, ...]) -> Overhead:
    """The overhead with the run's level set by its unprofiled launches: the median of their steady
    steps and the run's own unprofiled one. A launch can run 20-25% fast or slow throughout (pp2 here:
    26.5 ms in one of six back-to-back launches, 33.5-38.2 in the others) and one calibration run's
    level sets every constant fitted from it; the factors grow by level = own / median, so the samples
    shrink by it. Without an unprofiled step of its own, the run's traced step over the launches'
    median is its one factor (as for a run without communication timers)."""
    steps = [float(x) for x in launches_s if x and x > 0]
    if not steps:
        return o
    if not o.plain_step_s:
        plain = float(np.median(steps))
        f = o.traced_step_s / plain if o.traced_step_s else 1.0
        return dataclasses.replace(o, work=f, comm=f, plain_step_s=plain, split=False, launches=len(steps))
    level_s = float(np.median([o.plain_step_s, *steps]))
    level = o.plain_step_s / level_s
    return dataclasses.replace(
        o,
        work=o.work * level,
        comm=o.comm * level,
        plain_step_s=level_s,
        comm_cpu_s=None if o.comm_cpu_s is None else o.comm_cpu_s / level,
        level=level,
        launches=len(steps),
    )


def _overhead(run: Measured) -> Overhead:
    """The run's tracing overhead against its own unprofiled steps. The engine times its communication
    calls in every step (metrics.json comm_time_s_per_rank), so each kind gets its own factor: tracing
    slows a host's work (a record per op) but not its transfers -- on a VM whose idle cores halt it
    even shortened them (tp2: 1.24 ms a traced all-reduce, 1.70 ms an unprofiled one). The blocked
    time is transfers (what the link samples count, op_cost_ns) and waits for late peers, which are
    made of those peers' work: the unprofiled waits are the traced ones over the work factor, the
    rest of the unprofiled blocked time is transfer. Without those timers (another framework's run)
    one factor, the step's, for both. Means over the traced steps, not medians: the samples are
    means over them, so a slow traced step (a loaded machine) raises both alike and divides out."""
    ph = phases(run.analysis.graph)
    traced_steps = run.analysis.traces.steps
    plain = unprofiled_step_s(run.metrics, traced_steps)
    traced = float(ph.groupby("step")["window_ns"].mean().mean()) / 1e9 if len(ph) else 0.0
    if not plain or not traced:
        return Overhead(1.0, 1.0, plain, traced, False)
    per = run.analysis.per_rank_wait
    cost = pd.Series(op_cost_ns(per).to_numpy(), index=per["rank"].to_numpy()).groupby(level=0).sum()
    cost = cost / ph["step"].nunique()  # per traced step
    traced_rank = ph.groupby("rank")[["window_ns", "work_ns"]].mean()
    f = traced / plain
    work_t, work_p, xfer_t, wait_t, blocked_p, work_cpu, comm_cpu = [], [], [], [], [], [], []

    def unprofiled(key: str, rank: int) -> list[float]:
        return _unprofiled(rank_series(run.metrics, key, rank), traced_steps)

    for rank, row in traced_rank.iterrows():
        t, c = unprofiled("step_time_s_per_rank", rank), unprofiled("comm_time_s_per_rank", rank)
        if not t or len(c) != len(t):
            continue
        blocked_t = (row["window_ns"] - row["work_ns"]) / 1e9
        x = min(float(cost.get(rank, 0.0)) / 1e9, blocked_t)
        work_t.append(row["work_ns"] / 1e9)
        work_p.append(float(np.median(np.subtract(t, c))))
        xfer_t.append(x)
        wait_t.append(blocked_t - x)
        blocked_p.append(float(np.median(c)))
        u, uc = unprofiled("cpu_time_s_per_rank", rank), unprofiled("comm_cpu_time_s_per_rank", rank)
        if len(u) == len(t) == len(uc):
            work_cpu.append(float(np.median(np.subtract(u, uc))))
            comm_cpu.append(float(np.median(uc)))
    if not work_t or np.mean(work_p) <= 0:
        return Overhead(f, f, plain, traced, False)
    f_work = float(np.mean(work_t) / np.mean(work_p))
    xfer_p = np.mean(blocked_p) - np.mean(wait_t) / f_work
    f_comm = float(np.mean(xfer_t) / xfer_p) if xfer_p > 0 and np.mean(xfer_t) > 0 else 1.0
    stretch = comm_cpu_s = None
    if len(work_cpu) == len(work_p) and np.mean(work_cpu) > 0:
        stretch = max(1.0, float(np.mean(work_p) / np.mean(work_cpu)))
        comm_cpu_s = float(np.mean(comm_cpu))
    return Overhead(f_work, f_comm, plain, traced, True, stretch, comm_cpu_s)


GEMM_CPU_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})  # leaves: not matmul/linear
GEMM_KERNEL = r"gemm|cutlass|xmma|cublas|sm\d+_"
PHASE = r"^ps\.phase kind=(?:fwd|bwd)\b"
OPTIM = r"^ps\.phase kind=optim\b"


def _leaves(ev: pd.DataFrame, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which CPU operators contain no other on their thread (aten::linear holds aten::addmm: the leaf
    is the one that did the work)."""
    op = (ev["kind"] == "cpu_op").to_numpy()
    leaf = np.zeros(len(ev), dtype=bool)
    idx = np.flatnonzero(op)
    if not len(idx):
        return leaf
    tid = ev["tid"].to_numpy()[idx]
    order = np.lexsort((-(end[idx] - ts[idx]), ts[idx], tid))  # by thread, start, the outer one first
    i = idx[order]
    nxt_same = np.r_[tid[order][1:] == tid[order][:-1], False]
    nxt_ts = np.r_[ts[i][1:], np.iinfo(np.int64).max]
    leaf[i] = ~nxt_same | (nxt_ts >= end[i])
    return leaf


def _rank_split(
    run: Measured, rank: int, comm: pd.DataFrame, windows: pd.DataFrame
) -> tuple[float, float, float, float, float]:
    """(GEMM seconds, element-wise seconds, element-wise operators, forward/backward work seconds,
    optimizer seconds) of one rank per traced step, on its own clock: GEMMs are leaf ops (CPU) or GEMM
    kernels (GPU); element-wise work the other leaf ops or compute kernels inside forward/backward, less
    the collectives; forward/backward work is the engine's ps.phase fwd/bwd ranges less the collectives
    inside them; the optimizer its optim range."""
    ev = run.analysis.traces.rank_events(rank)
    names = ev["name"].astype(str)
    ts, end = ev["ts_ns"].to_numpy(), (ev["ts_ns"] + ev["dur_ns"]).to_numpy()
    if run.analysis.traces.device_of(rank) == "gpu":
        kernel = (ev["kind"] == "compute").to_numpy()
        gemm = kernel & names.str.contains(GEMM_KERNEL, case=False, regex=True).to_numpy()
        elementwise = kernel & ~gemm
    else:
        gemm = names.isin(GEMM_CPU_OPS).to_numpy()
        elementwise = _leaves(ev, ts, end) & ~gemm
    n_steps = max(len(windows), 1)
    lo, hi = (
        (int(windows["start_ns"].min()), int(windows["end_ns"].max()))
        if len(windows)
        else (int(ts.min()), int(end.max()))
    )
    inside = (ts >= lo) & (ts < hi)
    gemm_s = iv.length(iv.union(ts[gemm & inside], end[gemm & inside])) / 1e9 / n_steps
    comm_iv = iv.union(
        comm["start_ns"].to_numpy() - comm["offset_ns"].to_numpy(),
        comm["end_ns"].to_numpy() - comm["offset_ns"].to_numpy(),
    )

    def ranges_of(pattern: str):
        sel = names.str.contains(pattern, regex=True).to_numpy() & inside
        return iv.union(ts[sel], end[sel])

    def work_in(pattern: str) -> float:
        """Seconds per step inside the ranges named `pattern`, less the collectives inside them."""
        ranges = ranges_of(pattern)
        return (iv.length(ranges) - iv.overlap(ranges, comm_iv)) / 1e9 / n_steps

    phase = ranges_of(PHASE)
    ew = elementwise & inside
    if len(phase[0]):  # the engine's forward/backward ranges; else (another framework's) all the steps'
        starts = np.searchsorted(phase[0], ts[ew], side="right") - 1
        ew[np.flatnonzero(ew)] = (starts >= 0) & (ts[ew] < phase[1][np.maximum(starts, 0)])
    ew_iv = iv.minus(iv.union(ts[ew], end[ew]), comm_iv)
    return gemm_s, iv.length(ew_iv) / 1e9 / n_steps, ew.sum() / n_steps, work_in(PHASE), work_in(OPTIM)


TIME_KEYS = ("gemm_s", "elementwise_s", "pipeline_work_s", "work_s", "optim_s")  # a work sample's seconds


def _scaled(samples: list[dict], scale: float) -> list[dict]:
    """The work samples with their seconds divided by `scale` (the run's work overhead x its stretch)."""
    return [{**x, **{k: x[k] / scale for k in TIME_KEYS}} for x in samples]


def _work_samples(run: Measured) -> list[dict]:
    """Per rank: stage, its regressors and its measured work per traced step (seconds, as traced:
    fit divides them by the run's overhead and contention each round, _scaled)."""
    f = features(run.model, run.plan)
    weights = call_weights(run.model, run.plan)
    m = max(run.plan.microbatches, 1)
    g = run.analysis.graph
    work = phases(g).groupby("rank")["work_ns"].mean() / 1e9
    per = run.analysis.per_rank_wait
    bd = run.analysis.breakdown
    out = []
    for rank, w in work.items():
        rank = int(rank)
        s = min(int(g.stage.get(rank, 0)), run.plan.pp - 1)
        gemm_s, ew_s, ew_ops, fb_s, optim_s = _rank_split(run, rank, per[per["rank"] == rank], bd[bd["rank"] == rank])
        fb_s = fb_s if fb_s > 0 else float(w)  # no ps.phase ranges (another framework's traces): all of it
        out.append(
            {
                "rank": rank,
                "stage": s,
                "layers_mb": m * f["layers"][s],
                "tp_layers_mb": m * f["layers"][s] * (run.plan.tp > 1),
                "sp_layers_mb": m * f["layers"][s] * bool(run.plan.sp),
                "cp_layers_mb": m * f["layers"][s] * (run.plan.cp > 1),
                "call_weights": weights,
                "head_mb": m * f["head"][s],
                "flops": m * (f["layer_flops"][s] + f["head_flops"][s]),
                "elementwise_bytes": m * f["elementwise_bytes"][s],
                "elementwise_ops": ew_ops,
                "gemm_s": gemm_s,
                "elementwise_s": ew_s,
                "pipeline_work_s": fb_s,
                "work_s": float(w),
                "optim_s": optim_s,
                "microbatches": m,
            }
        )
    return out


def op_cost_ns(per: pd.DataFrame) -> pd.Series:
    """What each per_rank_wait row costs its rank as link time: a p2p op its transfer after both sides
    arrived, or, when it ended before its peer came (an eager send: the issue), its whole time -- the
    host's, not a wait; a collective its transfer plus the part of its wait that is jitter: the wait
    less the rank's typical (median) wait at that collective (same op, group and size). A wait that
    repeats on the same rank is the schedule's -- a pipeline's drain before the gradients' all-reduce,
    an uneven stage -- which the model has as the bubble and the slowest stage; jitter in lock-step
    (TP's all-reduces: now one rank late, now the other) is paid every call and stays in."""
    op = per["op"].astype(str)
    last = per.groupby("instance")["start_ns"].transform("max")
    paid_transfer = op.isin(P2P_OPS) & (per["end_ns"] >= last)
    p2p = per["transfer_ns"].where(paid_transfer, per["dur_ns"])
    typical = per.groupby([op, per["group"].astype(str), per["bytes"], per["rank"]], observed=True, dropna=False)[
        "wait_ns"
    ].transform("median")
    collective = per["transfer_ns"] + (per["wait_ns"] - typical).clip(lower=0)
    return p2p.where(op.isin(P2P_OPS), collective)


def _link_rows(run: Measured) -> pd.DataFrame:
    """Mean cost per (op, group size, bytes, tier) of the run's ops seen on two or more ranks (seconds,
    as traced: fit divides them by the run's overhead and contention each round)."""
    per = run.analysis.per_rank_wait
    per = per[per["n_ranks"] >= 2]
    if per.empty:
        return pd.DataFrame(columns=["op", "n", "bytes", "tier", "transfer_s", "count"])
    nodes = node_of_ranks(run.analysis.traces.run, run.analysis.traces.hosts())
    tiers = {g: link_tier(g, nodes) for g in per["group"].astype(str).unique()}
    per = per.assign(tier=per["group"].astype(str).map(tiers).replace({"unknown": "intra"}))
    per = per.assign(cost_ns=op_cost_ns(per))
    # ring CP's sends and receives are halves of exchanges (every rank sends and receives at once), not a
    # pipeline's one-way p2p: an op of their own (calibrated.exchange_s), costed as p2p ops are
    shift = per["op"].astype(str).isin(P2P_OPS) & (per["dim"].astype(str) == "cp")
    per = per.assign(op=per["op"].astype(str).where(~shift, "exchange"))
    # dropna=False: an op without its group or message size stays a row, so the fit can say what is missing
    g = per.groupby(["op", "group_size", "bytes", "tier"], observed=True, dropna=False)
    out = g["cost_ns"].mean().rename("transfer_ns").reset_index()  # the step pays the mean, tail included
    out["count"] = g.size().to_numpy()
    out["transfer_s"] = out["transfer_ns"] / 1e9
    return out.rename(columns={"group_size": "n"})[["op", "n", "bytes", "tier", "transfer_s", "count"]]


def _fit_links(
    frames: list[pd.DataFrame], tier: str = "intra", op_scale: dict | None = None
) -> tuple[float, float, float, dict] | None:
    """(call, alpha, beta, op_scale) of one link tier by non-negative least squares over its (op, n,
    bytes) groups, then each collective's scale: its measured cost over the fit's, count-weighted
    (a backend's own algorithm: gloo's reduce-scatter is an all-reduce), alternating until both settle,
    the count-weighted median op at scale 1 -- so one odd op does not bend the others. `op_scale` given
    (the inter tier: the intra fit's) is kept. None for the inter tier when no run crossed nodes."""
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(rows):
        rows = rows[rows["tier"] == tier]
    if tier != "intra" and rows.empty:
        return None
    known = rows.dropna(subset=["bytes", "n"]) if len(rows) else rows
    if len(rows) and known.empty:  # collectives seen, none with both sizes
        named = (("n", "group size ('Group size', 'Process Group Ranks')"), ("bytes", "message size ('In msg nelems')"))
        lacking = [what for col, what in named if rows[col].isna().all()] or [what for _, what in named]
        raise CalibrationError(
            f"the collectives seen on two or more ranks carry no {' or '.join(lacking)} in their trace events, "
            "as older PyTorch profilers wrote them: nothing to fit links on"
        )
    rows = known
    if rows.empty:
        raise CalibrationError(
            "no collective in the calibration runs was seen on two or more ranks: nothing to fit links on"
        )
    units = [
        Calibration(0, 0, 0, 0, alpha_s=0.0, beta_s_per_byte=0.0, call_s=1.0),
        Calibration(0, 0, 0, 0, alpha_s=1.0, beta_s_per_byte=0.0),
        Calibration(0, 0, 0, 0, alpha_s=0.0, beta_s_per_byte=1.0),
    ]
    op = rows["op"].astype(str).replace({"send": "send_recv", "recv": "send_recv"}).to_numpy()
    A = np.array(
        [[collective_s(o, int(n), float(b), u) for u in units] for o, n, b in zip(op, rows["n"], rows["bytes"])]
    )
    y = rows["transfer_s"].to_numpy(dtype=float)
    count = rows["count"].to_numpy(dtype=float)
    w = np.sqrt(count)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    fixed = op_scale is not None
    op_scale = dict(op_scale or {})
    ops = sorted(set(op))
    weight = {o: count[op == o].sum() for o in ops}
    # a per-call cost apart from alpha x hops shows only where one op was measured at two hop counts
    # (group sizes): with op_scale free, two ops' hops tell nothing. Else alpha per ring step carries
    # the latency (Thakur et al.) and larger groups pay it per step (tp4 on 2 cores: a 4-rank
    # all-reduce 6.9 ms, a 2-rank one 2.2 ms -- the ring's 6 steps to 2)
    cols = [0, 1, 2] if any(len(set(A[op == o, 1])) > 1 for o in ops) else [1, 2]
    for _ in range(1 if fixed else 100):  # alternating least squares: shared terms, then each op's scale
        s_row = np.array([op_scale.get(o, 1.0) for o in op])
        coef = np.zeros(3)
        coef[cols], _ = nnls((A * w[:, None] / scale)[:, cols], y / s_row * w)
        coef = coef / scale
        if fixed:
            break
        model = A @ coef
        new = {}
        for o in ops:
            m, yo, c = model[op == o], y[op == o], count[op == o]
            if (c * m * m).sum() > 0:
                new[o] = float((c * yo * m).sum() / (c * m * m).sum())
        # scale and shared terms trade off: the count-weighted median op keeps scale 1 (the shared
        # fit is the typical op's, the odd ones carry their factor)
        order = sorted(new, key=new.get)
        acc, half, mid = 0.0, sum(weight[o] for o in order) / 2, 1.0
        for o in order:
            acc += weight[o]
            if acc >= half:
                mid = new[o]
                break
        new = {o: v / mid for o, v in new.items()} if mid > 0 else new
        done = new.keys() == op_scale.keys() and all(abs(new[o] - op_scale[o]) <= 1e-9 * new[o] for o in new)
        op_scale = new
        if done:
            break
    call, alpha, beta = coef
    return float(call), float(alpha), float(beta), op_scale


EXTRA_COLUMNS = ("tp_layers_mb", "sp_layers_mb", "cp_layers_mb")  # a_tp, a_sp, a_cp's regressors


@dataclass(frozen=True)
class Work:
    a: float  # per layer and microbatch
    k: float  # per FLOP
    a_head: float
    w0: float  # per step: the optimizer
    a_tp: float
    a_sp: float
    a_cp: float
    a_mb: float  # per microbatch outside forward/backward
    e: float = 0.0  # per byte of element-wise work


def _fit_work(samples: list[dict]) -> Work:
    """k from the GEMMs' time per FLOP; a, a_head, a_tp, a_sp, a_cp by non-negative least squares on the
    forward/backward work less k x FLOPs; w0 the optimizer's mean work per step and a_mb the rest of the
    work outside forward/backward per microbatch (without the engine's optim ranges, all of it is w0).
    A column no run varies (no tp > 1 run: a_tp) gets 0. Extras that no run tells
    apart (TP, SP and CP on together in the only run that has any: the same column) are fitted as one
    and split by the blocking calls per layer each dimension adds (`call_weights`): their extra work
    is the host's glue around those calls (copies, reshapes, the autograd function)."""
    flops = sum(x["flops"] for x in samples)
    k = sum(x["gemm_s"] for x in samples) / flops if flops else 0.0
    X = np.array([[x[c] for c in ("layers_mb", "head_mb", *EXTRA_COLUMNS)] for x in samples], dtype=float)
    # extras with one pattern over the samples (the same runs have them) form a group: one column
    groups: dict[tuple, list[int]] = {}
    for j in range(2, X.shape[1]):
        if X[:, j].any():
            groups.setdefault(tuple(X[:, j] > 0), []).append(j)
    cols = [0, 1] + [g[0] for g in groups.values()]
    e = _fit_elementwise(samples)
    y = np.array([max(0.0, x["pipeline_work_s"] - k * x["flops"] - e * x["elementwise_bytes"]) for x in samples])
    scale = X[:, cols].max(axis=0)
    scale[scale == 0] = 1.0
    fitted, _ = nnls(X[:, cols] / scale, y)
    coef = np.zeros(X.shape[1])
    coef[cols] = fitted / scale
    for members in groups.values():
        lump = coef[members[0]]
        weights = np.array(
            [np.mean([x["call_weights"][j - 2] for x in samples if x[EXTRA_COLUMNS[j - 2]]]) for j in members]
        )
        share = weights / weights.sum() if weights.sum() > 0 else np.full(len(members), 1 / len(members))
        coef[members] = lump * share
    a, a_head, a_tp, a_sp, a_cp = coef
    outside = [max(0.0, x["work_s"] - x["pipeline_work_s"]) for x in samples]
    if all(x["optim_s"] > 0 for x in samples):  # the engine's optim range: the rest is per microbatch
        w0 = float(np.mean([x["optim_s"] for x in samples]))
        a_mb = float(np.mean([max(0.0, o - x["optim_s"]) / x["microbatches"] for o, x in zip(outside, samples)]))
    else:  # another framework's traces: all of it once per step
        w0, a_mb = float(np.mean(outside)), 0.0
    return Work(float(a), float(k), float(a_head), w0, float(a_tp), float(a_sp), float(a_cp), a_mb, e)


def _fit_elementwise(samples: list[dict]) -> float:
    """e: seconds per byte of element-wise work, by non-negative least squares of the non-GEMM leaf
    operators' time on their count (each one's dispatch: a's terms carry it) and the bytes the layers
    write (B_layer). Both columns are needed: on a small model the operators' time is their count's;
    0 when no two samples tell the columns apart (their ratio the same: one plan's ranks)."""
    rows = [x for x in samples if x["elementwise_ops"] > 0 and x["elementwise_bytes"] > 0]
    ratios = {round(float(np.log(x["elementwise_bytes"] / x["elementwise_ops"])), 3) for x in rows}
    if len(ratios) < 2:
        return 0.0
    X = np.array([[x["elementwise_ops"], x["elementwise_bytes"]] for x in rows], dtype=float)
    y = np.array([x["elementwise_s"] for x in rows], dtype=float)
    scale = X.max(axis=0)
    coef, _ = nnls(X / scale, y)
    return float(coef[1] / scale[1])


def call_weights(model: Model, plan: Plan) -> tuple[float, float, float]:
    """Blocking calls per layer and microbatch that TP, SP and CP each add to the plan: TP its own
    (the all-reduces it would make without SP), SP what it makes beyond those, CP its exchange's (a
    ring's send-and-receive two)."""

    def per_layer(p: Plan, dims: set[str]) -> float:
        rows = [r for r in comm_calls(model, p, overlaps=False) if r["scope"] == "layer" and r["dim"] in dims]
        layers = sum(stage_layers(model, p)) / p.pp * max(p.microbatches, 1)
        return sum(r["calls"] * (2 if r["exchange"] else 1) for r in rows) / layers if layers else 0.0

    tp = per_layer(dataclasses.replace(plan, sp=False), {"tp"}) if plan.tp > 1 else 0.0
    sp = max(per_layer(plan, {"tp", "sp"}) - tp, 0.0) if plan.sp else 0.0
    return tp, sp, per_layer(plan, {"cp"})


def _gamma_for(r: Measured, cal: Calibration, step_s: float) -> float:
    """The busy share of communication that makes the model give this shared-core run its step."""
    lo, hi = 0.0, 1.0

    def step(g: float) -> float:
        return predict(r.model, r.plan, _with(cal, gamma=g), cluster=r.cluster)["step_time_s"]

    if step(hi) < step_s:
        return hi
    for _ in range(40):  # the step grows with gamma: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < step_s else (lo, mid)
    return (lo + hi) / 2


def _comm_busy_share(r: Measured, o: Overhead, cal: Calibration) -> float | None:
    """gamma measured: the run's CPU seconds inside its communication calls (the engine's clock, per
    rank and unprofiled step) over the communication seconds the model gives a rank of it uncontended
    (its slowest stage's); None without CPU clocks."""
    if o.comm_cpu_s is None:
        return None
    p = predict(r.model, r.plan, cal, cluster=r.cluster)
    comm = sum(v for k, v in p.items() if k.startswith("exposed_")) / p["contention_factor"]
    return min(1.0, o.comm_cpu_s / comm) if comm > 0 else None


EFFICIENCY_FLOOR = 0.25  # the fewest of the cores the ranks are taken to keep busy


def _efficiency_for(r: Measured, cal: Calibration, step_s: float) -> float:
    """The share of the cores the ranks keep busy (eta) that makes the model give this shared-core
    run its step: 1 when the model is as slow or slower with every core busy."""

    def step(e: float) -> float:
        return predict(r.model, r.plan, _with(cal, core_efficiency=e), cluster=r.cluster)["step_time_s"]

    lo, hi = EFFICIENCY_FLOOR, 1.0
    if step(hi) >= step_s:
        return hi
    if step(lo) <= step_s:
        return lo
    for _ in range(40):  # the step falls as eta grows: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) > step_s else (lo, mid)
    return (lo + hi) / 2


def _with(cal: Calibration, **changes) -> Calibration:
    return Calibration(**{**cal.to_dict(), **changes, "assumptions": cal.assumptions})


def _inter_from_commbench(links: dict[str, Link], call: float, alpha: float, beta: float) -> tuple:
    """(call, alpha, beta) of the inter-node link from a commbench of both links: the traces' intra
    terms -- what the job pays on a link beyond its wire: gloo's host work, lock-step jitter, shared
    cores, which commbench's idle back-to-back calls do not -- plus the inter link's extra latency per
    hop and seconds per bus byte over the intra link's, as commbench measured both (all of the inter
    link's when it fitted no intra bandwidth: loopback on busy cores can time flat). On the lab the
    tiny model's DP all-reduce took the same time across the shaped link as inside a node (27.6 vs
    27.9 ms a step), where the traced intra terms scaled by commbench's ratio put 29 ms on it."""
    inter, intra = links["inter"], links.get("intra")
    hop = inter.latency_s - (intra.latency_s if intra else 0.0)
    per_byte = 1.0 / inter.bandwidth_bytes_per_s - (1.0 / intra.bandwidth_bytes_per_s if intra else 0.0)
    return call, alpha + max(0.0, hop), beta + max(0.0, per_byte)


def traced_device(runs: list[Measured]) -> str:
    """'gpu' when every run's traces have GPU ranks (kernels), 'cpu' when none has: the device a fit
    of these runs is for (GPU: a device per rank, no sharing of cores). CalibrationError when they mix:
    one calibration describes one kind of machine."""
    on: dict[str, list[str]] = {"gpu": [], "cpu": []}
    for r in runs:
        gpu = any(r.analysis.traces.device_of(k) == "gpu" for k in r.analysis.traces.rank_ids)
        on["gpu" if gpu else "cpu"].append(r.path or r.plan.label())
    if on["gpu"] and on["cpu"]:
        raise CalibrationError(
            f"these runs mix GPU ranks ({', '.join(on['gpu'])}) and CPU ranks ({', '.join(on['cpu'])}): "
            "one calibration describes one kind of machine; fit each apart"
        )
    return "gpu" if on["gpu"] else "cpu"


def fit(
    runs: list[Measured],
    *,
    cores: int,
    device: str = "cpu",
    rounds: int = 5,
    commbench: dict[str, Link] | None = None,
) -> Calibration:
    """The calibration these runs imply (see the module docstring). `commbench` (its fitted links:
    `profiler calibrate --links`) give the inter-node terms when no run's groups crossed nodes
    (_inter_from_commbench); a run that crossed them wins (its collectives ran in the job)."""
    if not runs:
        raise CalibrationError("give at least one profiled run to calibrate from")
    over = [_leveled(_overhead(r), r.launches_s) for r in runs]
    shared = device == "cpu" and cores > 0
    sharing = [shared and r.plan.world_size > cores for r in runs]
    deflate = [r.plan.world_size / cores if s else 1.0 for r, s in zip(runs, sharing)]  # first guess: time-slicing
    gamma, efficiency, cal = 0.5, 1.0, None
    raw_work = [_work_samples(r) for r in runs]  # the traces are read once; each round rescales
    raw_links = [_link_rows(r) for r in runs]
    for _ in range(rounds):
        # a shared run's work by its measured stretch (wall over CPU time) where the engine timed it,
        # else by the contention the model gives it; its transfers by the model's contention
        samples = [
            x
            for raw, o, d in zip(raw_work, over, deflate)
            for x in _scaled(raw, o.work * (o.stretch if o.stretch and d > 1 else d))
        ]
        w = _fit_work(samples)
        links = [
            rows.assign(transfer_s=rows["transfer_s"] / (o.comm * d)) for rows, o, d in zip(raw_links, over, deflate)
        ]
        call, alpha, beta, op_scale = _fit_links(links)
        inter = _fit_links(links, "inter", op_scale)
        inter_source = "traces" if inter else None
        if inter is None and commbench and "inter" in commbench:
            inter, inter_source = _inter_from_commbench(commbench, call, alpha, beta), "commbench"
        inter = inter or (None, None, None, None)
        cal = Calibration(
            w.a,
            w.k,
            w.a_head,
            w.w0,
            alpha,
            beta,
            tp_layer_s=w.a_tp,
            sp_layer_s=w.a_sp,
            cp_layer_s=w.a_cp,
            microbatch_fixed_s=w.a_mb,
            elementwise_byte_s=w.e,
            call_s=call,
            inter_call_s=inter[0],
            inter_alpha_s=inter[1],
            inter_beta_s_per_byte=inter[2],
            inter_source=inter_source,
            op_scale=op_scale,
            gamma=gamma,
            core_efficiency=efficiency,
            cores=cores if shared else 0,
            device=device,
            overlaps=device != "cpu",
        )
        # the step each shared run must be given: its unprofiled one, else (overhead kept in) its traced one
        fitted = [
            (r, o, o.plain_step_s or o.traced_step_s)
            for r, o, s in zip(runs, over, sharing)
            if s and (o.plain_step_s or o.traced_step_s)
        ]
        if not fitted:
            break
        # gamma measured by the CPU clocks where the engine kept them, then eta so the model gives each
        # shared run its step; without clocks gamma is what gives the step (and every core is busy)
        measured = [g for g in (_comm_busy_share(r, o, cal) for r, o, _ in fitted) if g is not None]
        if measured:
            gamma = float(np.mean(measured))
            cal = _with(cal, gamma=gamma)
            efficiency = float(np.mean([_efficiency_for(r, cal, plain) for r, _, plain in fitted]))
        else:
            gamma = float(np.mean([_gamma_for(r, cal, plain) for r, _, plain in fitted]))
        cal = _with(cal, gamma=gamma, core_efficiency=efficiency)
        # a shared run's samples are then divided by the contention the model now gives it
        deflate = [
            predict(r.model, r.plan, cal, cluster=r.cluster)["contention_factor"] if s else 1.0
            for r, s in zip(runs, sharing)
        ]
    assert cal is not None
    sources = []
    for r, o in zip(runs, over):
        pred = predict(r.model, r.plan, cal, cluster=r.cluster)["step_time_s"]
        plain = o.plain_step_s
        sources.append(
            {
                "path": r.path,
                "plan": r.plan.label(),
                "ranks": r.plan.world_size,
                "traced_step_s": round(o.traced_step_s, 6),
                "unprofiled_step_s": None if plain is None else round(plain, 6),
                "overhead_factor": round(o.traced_step_s / plain, 4) if plain else 1.0,
                "work_overhead_factor": round(o.work, 4),
                "comm_overhead_factor": round(o.comm, 4),
                "overhead_split": o.split,
                "work_stretch": None if o.stretch is None else round(o.stretch, 4),
                "comm_cpu_s": None if o.comm_cpu_s is None else round(o.comm_cpu_s, 6),
                "overhead_removed": plain is not None,
                "unprofiled_launches": o.launches,
                "level_factor": round(o.level, 4),
                "fitted_step_s": round(pred, 6),
            }
        )
    return Calibration(**{**cal.to_dict(), "sources": sources, "assumptions": cal.assumptions})
