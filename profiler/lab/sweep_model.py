"""The TP sweep's numbers: what one lab run measured, and what the plan model predicts for it.

    measured = measure_run(run_dir, model, plan)        # from the run's traces and metrics (profiler.analyzers)
    frame = compare(sweep)                               # one row per (tp, sp): measured, predicted, error %
    pred = prediction(sweep)                             # parallel.core.scaling.tp_scaling on the lab's cluster

Measured, per run (every rank of its profiled steps):
    tp_comm_s            TP/SP communication of one layer for one microbatch: for each op the layer
                         issues, the median time of one call of the layer's size (b·s·h elements)
                         × the calls per layer (parallel.core.comm's count). The time of a call is its
                         *transfer*: from the last rank's arrival to its end (the analyzers' per_rank_wait),
                         what the α-β model describes; p25/p75 give tp_comm_lo_s/hi_s
    tp_comm_with_wait_s  the same with each rank's whole call, waiting for late peers included
    tp_comm_paid_s       the same as a step pays it, what the calibrated model predicts: each call's
                         mean cost as the calibration's link samples count it (transfer plus the
                         jitter of lock-step ranks: calibrate.op_cost_ns), the slow tail included, over
                         the run's tracing overhead on transfers (an untraced step's); None without
                         untraced steps to measure that overhead on
    busbw_bytes_per_s    median bus bandwidth of those calls (nccl-tests: bytes / transfer × factor)
    step_time_s          median step time after the first (metrics.json)
    tp_comm_step_s       all TP/SP collectives of a step on one rank (median over ranks)

On the lab nothing overlaps (gloo runs each collective synchronously), so both sides count every TP
collective of a layer, Megatron's backward SP re-gather included (the plan model's "overlapped" row).

Predicted, with a Cluster made of the lab: `intra`/`inter` from the sweep's commbench fit,
`gpus_per_node` ranks per lab node, and a compute rate measured on this CPU (the smallest TP run
inside one node: FLOPs / (step time - its TP comm)), shared: W ranks on C cores compute at
min(1, C / W) of it. TP comm and busbw come from parallel.core.scaling.tp_scaling; step time is compute
(parallel.core.perf's hardware FLOPs) plus all TP comm.

Pure: pandas, numpy, parallel/ and profiler's analyzers (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from parallel.core.calibrated import CalibrationError, collective_s, predict
from parallel.core.comm import bus_factor, comm_per_step, crosses_nodes
from parallel.core.perf import flops_per_step
from parallel.core.plan import Plan
from parallel.core.scaling import tp_scaling
from parallel.core.specs import CLUSTERS, Cluster, Link, Model
from profiler.analyzers.calibrate import Measured, _overhead, fit, measured_step, op_cost_ns
from profiler.analyzers.front import TraceAnalysis
from profiler.traces.errors import TraceError
from runfiles.metrics import load_metrics

TP_DIMS = ("tp", "sp")
COMPARE_COLUMNS = (
    "tp",
    "sp",
    "link",
    "nodes",
    "status",
    "measured_tp_comm_s",
    "measured_tp_comm_lo_s",
    "measured_tp_comm_hi_s",
    "predicted_tp_comm_s",
    "tp_comm_error_pct",
    "measured_busbw_bytes_per_s",
    "predicted_busbw_bytes_per_s",
    "busbw_error_pct",
    "measured_step_s",
    "predicted_step_s",
    "step_error_pct",
)


def sweep_plan(tp: int, sp: bool, micro_batch: int = 1) -> Plan:
    return Plan(tp=tp, sp=sp, micro_batch=micro_batch, global_batch=micro_batch)


def layer_calls(model: Model, plan: Plan) -> dict[str, float]:
    """{op: TP/SP calls per layer per microbatch}, overlapped ones included (parallel.core.comm's count)."""
    rows = comm_per_step(
        model,
        plan,
        Cluster(
            name="count",
            nodes=1,
            gpus_per_node=max(plan.tp, 1),
            gpu_memory_bytes=1,
            peak_flops=1.0,
            intra=Link(1.0, 0.0),
            inter=Link(1.0, 0.0),
        ),
    )
    calls: dict[str, float] = {}
    for r in rows:
        if r["dim"] in TP_DIMS and r["scope"] == "layer":  # the layers' own, not the embedding's or the loss's
            calls[r["collective"]] = calls.get(r["collective"], 0) + r["calls"] / (
                model.layers * max(plan.microbatches, 1)
            )
    return calls


def layer_bytes(model: Model, plan: Plan) -> int:
    """Bytes of one TP collective of a layer: b·s·h activations (the gathered buffer under SP)."""
    return plan.micro_batch * model.seq_len * model.hidden * model.dtype_bytes


def _steady(times) -> float | None:
    times = [float(t) for t in times or [] if isinstance(t, (int, float))]
    if not times:
        return None
    return float(np.median(times[1:] if len(times) > 1 else times))


def _none(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def measure_run(run_dir: Path, model: Model, plan: Plan) -> dict:
    """A completed run's measured numbers (the module docstring's keys) and `calls`, per op:
    {calls_per_step (per rank), bytes, transfer_s, with_wait_s, busbw_bytes_per_s}."""
    run_dir = Path(run_dir)
    metrics = load_metrics(run_dir)
    # the model predicts an unprofiled step: the run's untraced steps when it has them (tpsweep
    # --unprofiled-steps), else its steady steps, the traced ones among them
    step = measured_step(metrics, (metrics.get("profile") or {}).get("profiled_steps") or [])
    out = {
        "step_time_s": step[0] if step else _steady(metrics.get("step_time_s")),
        "step_unprofiled": bool(step and step[1]),
        "tp_comm_s": 0.0,
        "tp_comm_lo_s": 0.0,
        "tp_comm_hi_s": 0.0,
        "tp_comm_with_wait_s": 0.0,
        "tp_comm_paid_s": None,
        "busbw_bytes_per_s": None,
        "tp_comm_step_s": 0.0,
        "calls": {},
    }
    if plan.tp == 1:
        return out
    analysis = TraceAnalysis.load(run_dir, plan.to_dict())
    table, per = analysis.collectives, analysis.per_rank_wait
    steps = table[["instance", "rank", "step"]].drop_duplicates(["instance", "rank"])
    per = per.merge(steps, on=["instance", "rank"], how="left")
    per = per.assign(cost_ns=op_cost_ns(per).to_numpy())
    overhead = _overhead(Measured(analysis=analysis, metrics=metrics, plan=plan, model=model, path=str(run_dir)))
    paid_s = 0.0  # what a step pays a layer; known only where untraced steps timed the transfers (split)
    tp = per[per["dim"].astype(str).isin(TP_DIMS)]
    nsteps = max(tp["step"].nunique(), 1)
    if len(tp):
        out["tp_comm_step_s"] = float(
            tp.groupby(["rank", "step"])["dur_ns"].sum().groupby("rank").median().median() / 1e9
        )
    size = layer_bytes(model, plan)
    layer = tp[tp["bytes"] == size]
    for op, n in layer_calls(model, plan).items():
        rows = layer[layer["op"].astype(str) == op]
        if rows.empty:
            continue
        tr = rows["transfer_ns"].to_numpy(float) / 1e9
        busbw = size / np.maximum(tr, 1e-9) * bus_factor(op, plan.tp)
        q25, q50, q75 = np.percentile(tr, [25, 50, 75])
        with_wait = float(np.median(rows["dur_ns"].to_numpy(float)) / 1e9)
        cost = float(rows["cost_ns"].mean()) / 1e9 / overhead.comm
        out["calls"][op] = {
            "calls_per_layer": n,
            "calls_per_step": len(rows) / rows["rank"].nunique() / nsteps,
            "bytes": size,
            "transfer_s": float(q50),
            "with_wait_s": with_wait,
            "paid_s": cost if overhead.split else None,
            "busbw_bytes_per_s": float(np.median(busbw)),
        }
        out["tp_comm_s"] += n * q50
        out["tp_comm_lo_s"] += n * q25
        out["tp_comm_hi_s"] += n * q75
        out["tp_comm_with_wait_s"] += n * with_wait
        paid_s += n * cost
    out["tp_comm_paid_s"] = paid_s if overhead.split else None
    if len(layer):
        tr = layer["transfer_ns"].to_numpy(float) / 1e9
        factor = np.array([bus_factor(str(op), plan.tp) for op in layer["op"]])
        out["busbw_bytes_per_s"] = float(np.median(size / np.maximum(tr, 1e-9) * factor))
    return out


def _points(sweep: dict) -> list[dict]:
    return [p for p in sweep.get("points") or [] if isinstance(p, dict)]


def sweep_model(sweep: dict) -> Model:
    return Model.from_dict(sweep["model"])


def compute_rate(sweep: dict) -> tuple[float | None, dict]:
    """(FLOP/s of one core, provenance): from the smallest-TP completed run inside one node, its hardware
    FLOPs per rank over (step time - its TP comm), scaled by the share of a core each rank had."""
    model, cores = sweep_model(sweep), sweep.get("machine", {}).get("cpus") or 1
    done = [
        p
        for p in _points(sweep)
        if p.get("status") == "completed" and p.get("nodes") == 1 and (p.get("measured") or {}).get("step_time_s")
    ]
    if not done:
        return None, {"note": "no completed run inside one node to measure the compute rate with"}
    p = min(done, key=lambda q: (q["tp"], q["sp"]))
    m, plan = p["measured"], sweep_plan(p["tp"], p["sp"], sweep.get("micro_batch", 1))
    compute_s = max(m["step_time_s"] - (m.get("tp_comm_step_s") or 0.0), 1e-9)
    share = min(1.0, cores / plan.world_size)
    rate = flops_per_step(model, plan)["hardware_flops"] / plan.world_size / (compute_s * share)
    return rate, {
        "tp": p["tp"],
        "sp": p["sp"],
        "step_time_s": m["step_time_s"],
        "compute_s": compute_s,
        "cores": cores,
        "flops_per_s": rate,
    }


def lab_cluster(sweep: dict, flops_per_s: float | None = None) -> Cluster:
    """The lab as the plan model's Cluster: 2 nodes of `gpus_per_node` ranks, links from commbench's fit
    (the shaped link's setting where commbench fitted none), one core's FLOP/s as each rank's peak."""
    links = (sweep.get("commbench") or {}).get("links") or {}
    lab = sweep.get("lab") or {}

    def link(name: str, fallback: Link) -> Link:
        v = links.get(name) or {}
        if v.get("bandwidth_bytes_per_s"):
            return Link(
                float(v["bandwidth_bytes_per_s"]), float(v.get("latency_s") or 0.0), f"lab {name} (commbench fit)"
            )
        return fallback

    inter_default = Link(
        float(lab.get("bandwidth_bytes_per_s") or 125e6), float(lab.get("latency_s") or 0.0), "lab veth (as shaped)"
    )
    intra = link("intra", CLUSTERS["local-cpu"].intra)
    return Cluster(
        name=f"lab {lab.get('prefix', '')}".strip(),
        nodes=2,
        gpus_per_node=int(sweep["gpus_per_node"]),
        gpu_memory_bytes=CLUSTERS["local-cpu"].gpu_memory_bytes,
        peak_flops=flops_per_s or CLUSTERS["local-cpu"].peak_flops,
        intra=intra,
        inter=link("inter", inter_default),
        device="cpu",
    )


def prediction(sweep: dict) -> pd.DataFrame:
    """parallel.core.scaling.tp_scaling for the sweep's model on the lab's cluster, at the sweep's TP degrees
    (each rank a core of its own; compute on shared cores is in compare's step time)."""
    rate, _ = compute_rate(sweep)
    tps = tuple(sorted({int(p["tp"]) for p in _points(sweep)} | {1}))
    plan = Plan(micro_batch=sweep.get("micro_batch", 1), global_batch=sweep.get("micro_batch", 1))
    return tp_scaling(sweep_model(sweep), lab_cluster(sweep, rate), tps=tps, plan=plan)


def _err(measured, predicted) -> float:
    if measured is None or predicted is None or not predicted or not math.isfinite(predicted):
        return float("nan")
    return (measured - predicted) / predicted * 100


def predict_point(sweep: dict, tp: int, sp: bool, pred: pd.DataFrame | None = None) -> dict:
    """{link, tp_comm_s, busbw_bytes_per_s, compute_s, step_time_s} predicted for one (tp, sp) of the sweep."""
    model, cores = sweep_model(sweep), sweep.get("machine", {}).get("cpus") or 1
    rate, _ = compute_rate(sweep)
    pred = prediction(sweep) if pred is None else pred
    row = pred[(pred["tp"] == tp) & (pred["sp"] == sp)]
    if row.empty or not bool(row["valid"].iloc[0]):
        return {"link": None, "tp_comm_s": None, "busbw_bytes_per_s": None, "compute_s": None, "step_time_s": None}
    r = row.iloc[0]
    plan = sweep_plan(tp, sp, sweep.get("micro_batch", 1))
    comm_s = float(r["tp_comm_s"] + r["overlapped_s"]) if tp > 1 else 0.0
    compute = None
    if rate:
        compute = (
            flops_per_step(model, plan)["hardware_flops"] / plan.world_size / (rate * min(1.0, cores / plan.world_size))
        )
    step = compute + comm_s * model.layers * max(plan.microbatches, 1) if compute is not None else None
    return {
        "link": r["link"],
        "tp_comm_s": comm_s,
        "busbw_bytes_per_s": _none(float(r["busbw_bytes_per_s"])),
        "compute_s": compute,
        "step_time_s": step,
    }


def compare(sweep: dict) -> pd.DataFrame:
    """One row per point of the sweep (COMPARE_COLUMNS): measured beside predicted, error in % of the
    prediction (positive: slower / more bandwidth than predicted)."""
    rows = []
    pred = prediction(sweep) if _points(sweep) else None
    for p in _points(sweep):
        m = p.get("measured") or {}
        q = predict_point(sweep, int(p["tp"]), bool(p["sp"]), pred)
        rows.append(
            {
                "tp": int(p["tp"]),
                "sp": bool(p["sp"]),
                "link": p.get("link") or q["link"],
                "nodes": p.get("nodes"),
                "status": p.get("status"),
                "measured_tp_comm_s": m.get("tp_comm_s"),
                "measured_tp_comm_lo_s": m.get("tp_comm_lo_s"),
                "measured_tp_comm_hi_s": m.get("tp_comm_hi_s"),
                "predicted_tp_comm_s": q["tp_comm_s"],
                "tp_comm_error_pct": _err(m.get("tp_comm_s"), q["tp_comm_s"]),
                "measured_busbw_bytes_per_s": m.get("busbw_bytes_per_s"),
                "predicted_busbw_bytes_per_s": q["busbw_bytes_per_s"],
                "busbw_error_pct": _err(m.get("busbw_bytes_per_s"), q["busbw_bytes_per_s"]),
                "measured_step_s": m.get("step_time_s"),
                "predicted_step_s": q["step_time_s"],
                "step_error_pct": _err(m.get("step_time_s"), q["step_time_s"]),
            }
        )
    df = pd.DataFrame(rows, columns=list(COMPARE_COLUMNS))
    num = [c for c in COMPARE_COLUMNS if c not in ("tp", "sp", "link", "nodes", "status")]
    df[num] = df[num].astype(float)
    return df.sort_values(["sp", "tp"], ignore_index=True)


def with_predictions(sweep: dict) -> dict:
    """The sweep with each point's `predicted` and `error_pct`, and the compute rate used (for the JSON)."""
    sweep = dict(sweep)  # a shallow copy; points are rebuilt below
    frame = compare(sweep) if _points(sweep) else None
    rate, how = compute_rate(sweep)
    sweep["compute"] = how
    cluster = lab_cluster(sweep, rate)
    sweep["cluster"] = cluster.to_dict()
    points = []
    for p in _points(sweep):
        row = frame[(frame["tp"] == p["tp"]) & (frame["sp"] == p["sp"])].iloc[0]
        points.append(
            {
                **p,
                "predicted": {
                    k: _none(float(row[f"predicted_{k}"])) for k in ("tp_comm_s", "busbw_bytes_per_s", "step_s")
                },
                "error_pct": {k: _none(float(row[f"{k}_error_pct"])) for k in ("tp_comm", "busbw", "step")},
            }
        )
    sweep["points"] = points
    return sweep


def calibrate_sweep(sweep: dict, out: Path) -> dict | None:
    """The step-time model calibrated on two of the sweep's own runs: the smallest TP > 1 inside
    one node and the largest TP across the link (its groups give the inter-node terms), then every point's
    calibrated step and TP communication per layer beside the measured ones (TP comm as the step pays
    it, measure_run's tp_comm_paid_s: `measured_tp_comm_kind` paid, or transfer for an older sweep). None when the sweep
    lacks such a pair. The runs have untraced steps on each side of the profiled ones (tpsweep
    --unprofiled-steps), so the fit removes the tracing overhead against them and measures how long the
    lab's shared ranks waited for a core (the engine's CPU clocks), and the measured step is those
    untraced steps: both sides are of an unprofiled step. Without them (--unprofiled-steps 0) the
    overhead stays in on both sides."""
    model = sweep_model(sweep)
    done = [p for p in _points(sweep) if p.get("status") == "completed" and p.get("run_dir")]
    # the intra-node link's terms need TP collectives inside a node: TP 1 has none
    inside = [p for p in done if p.get("nodes") == 1 and int(p["tp"]) > 1]
    across = [p for p in done if (p.get("nodes") or 1) > 1]
    if not inside or not across:
        return None
    pick = [min(inside, key=lambda q: (q["tp"], q["sp"])), max(across, key=lambda q: (q["tp"], q["sp"]))]
    gpn = int(sweep["gpus_per_node"])

    def cluster(p: dict):
        plan = sweep_plan(int(p["tp"]), bool(p["sp"]), sweep.get("micro_batch", 1))
        nodes = max(1, -(-plan.world_size // gpn))
        return plan, dataclasses.replace(CLUSTERS["local-cpu"], nodes=nodes, gpus_per_node=min(gpn, plan.world_size))

    runs = []
    try:
        for p in pick:
            plan, c = cluster(p)
            folder = Path(out) / p["run_dir"]
            runs.append(
                Measured(
                    analysis=TraceAnalysis.load(folder, plan.to_dict()),
                    metrics=load_metrics(folder),
                    plan=plan,
                    model=model,
                    path=str(p["run_dir"]),
                    cluster=c,
                )
            )
        cal = fit(runs, cores=int(sweep.get("machine", {}).get("cpus") or 1))
    except (TraceError, CalibrationError, OSError) as err:
        return {"error": str(err)}
    points = []
    for p in done:
        plan, c = cluster(p)
        # the lab runs gpn ranks per node, each node's ranks on this machine's shared cores
        out = predict(model, plan, cal, cluster=c, ranks_here=plan.world_size)
        pred = out["step_time_s"]
        measured = (p.get("measured") or {}).get("step_time_s")
        # one layer's TP/SP communication as measure_run counts it (each op's calls of the layer's
        # size, the re-gather included), under the calibrated links and the run's contention
        inter = bool(crosses_nodes(plan, c, ("tp",)))
        size = layer_bytes(model, plan)
        tp_comm = (
            out["contention_factor"]
            * sum(n * collective_s(op, plan.tp, size, cal, inter=inter) for op, n in layer_calls(model, plan).items())
            if plan.tp > 1
            else 0.0
        )
        # against what the step pays (each call's mean cost, untraced: the quantity the fit models),
        # not the median transfer the analytic link model is compared with; an older sweep has only that
        m = p.get("measured") or {}
        paid = m.get("tp_comm_paid_s") is not None
        measured_comm = m.get("tp_comm_paid_s") if paid else m.get("tp_comm_s")
        points.append(
            {
                "tp": int(p["tp"]),
                "sp": bool(p["sp"]),
                "predicted_step_s": pred,
                "measured_step_s": measured,
                "error_pct": _none(_err(measured, pred)),
                "predicted_tp_comm_s": tp_comm,
                "measured_tp_comm_s": measured_comm,
                "measured_tp_comm_kind": "paid" if paid else "transfer",
                "tp_comm_error_pct": _none(_err(measured_comm, tp_comm)) if plan.tp > 1 else None,
                "calibrated_on": p in pick,
            }
        )
    return {"calibration": cal.to_dict(), "points": points}
