"""The job's plan and its alternatives priced by the plan model with the device fitted to this job:
on a GPU the per-operator model (parallel.core.perf) with the device fitted to the job's kernels
(analyzers.device_fit) and the search (parallel.search.space); on a CPU the calibrated step model
(parallel.core.calibrated) over the same structurally valid plans. Each plan's parts come as
split.COMPONENTS, so they stand beside the measured split.

    priced = price_gpu(traces, model, plan, cluster_job, cluster, top)   # Priced
    priced = price_cpu(model, plan, cal, cluster, world, given=True)

Pure: numpy, pandas and parallel/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from parallel.core.calibrated import Calibration, features, predict
from parallel.core.comm import DIMS
from parallel.core.compute import JOB_EFFICIENCY
from parallel.core.memory import memory_per_gpu_bytes
from parallel.core.perf import PerfOptions, layer_forward_flops, step_time
from parallel.core.plan import CP_KINDS, RECOMPUTE, Plan
from parallel.core.report import Options
from parallel.core.specs import Cluster, Model
from parallel.search.space import (
    MODEL_ERROR,
    Constraints,
    SearchEmpty,
    candidates,
    columns_of,
    plan_of,
    search,
    simplicity,
)
from profiler.analyzers.calibrate import Measured, fit
from profiler.analyzers.device_fit import DeviceFitError, fit_device
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.split import COMPONENTS
from profiler.traces.model import Traces

# The calibrated CPU model's error: 5-9% mean on 16 held-back plans with up to 2 ranks a core, 38% on
# 8-rank plans at 4 ranks a core (bench/README.md, bench.predict): the larger past 2 a core.
CALIBRATED_ERROR = 0.09
SHARED_CORES_ERROR = 0.38


@dataclass(frozen=True)
class Priced:
    error: float  # the model's relative error where it is used
    how: str  # which model, in words
    step_s: float  # the job's own plan, modelled
    parts: dict  # ... its split.COMPONENTS
    device_fit: dict | None
    rows: list  # [(Plan, {step, parts, mem})], best first


def gpu_components(t: dict) -> dict[str, float]:
    """step_time's parts as split.COMPONENTS: its compute parts scaled to its compute (the recomputed
    forward and the model's ends shared among the kernel classes as the rest is)."""
    parts = t.get("compute_parts_s") or {}
    base = {k: float(parts.get(k, 0.0)) for k in ("gemm", "attention", "elementwise")}
    whole = sum(base.values())
    out = dict.fromkeys(COMPONENTS, 0.0)
    for k, v in base.items():
        out[k] = float(t["compute_s"]) * v / whole if whole else 0.0
    if not whole:
        out["gemm"] = float(t["compute_s"])
    out["optimizer"] = float(t.get("optimizer_s", 0.0))
    out["bubble"] = float(t["bubble_s"])
    for d in DIMS:
        out[f"exposed_{d}"] = float(t.get(f"exposed_{d}_s", 0.0))
    return out


def cpu_components(p: dict, model: Model, plan: Plan, cal: Calibration) -> dict[str, float]:
    """calibrated.predict's parts as split.COMPONENTS: its compute shared by the work terms' own shares
    (seconds per FLOP of the GEMMs and of the attention core; element-wise bytes and the fixed costs,
    which are the host's dispatch, as element-wise: the rest of compute, as the split measures it)."""
    f = features(model, plan)
    lf = layer_forward_flops(model, model.seq_len // plan.cp, plan.micro_batch)
    attn_share = lf["attention"] * plan.cp / max(lf["gemm"] + lf["attention"] * plan.cp, 1.0)
    flops_s = (sum(f["layer_flops"]) + sum(f["head_flops"])) * cal.flop_s
    attention = sum(f["layer_flops"]) * attn_share * cal.flop_s
    per_layer = (
        cal.layer_fixed_s + cal.tp_layer_s * (plan.tp > 1) + cal.sp_layer_s * plan.sp + cal.cp_layer_s * (plan.cp > 1)
    )
    elementwise = (
        sum(f["elementwise_bytes"]) * cal.elementwise_byte_s
        + sum(f["layers"]) * per_layer
        + plan.pp * cal.microbatch_fixed_s
        + cal.head_fixed_s
    )
    shares = {"gemm": flops_s - attention, "attention": attention, "elementwise": elementwise}
    whole = sum(shares.values()) or 1.0
    out = dict.fromkeys(COMPONENTS, 0.0)
    for k, v in shares.items():
        out[k] = p["compute_s"] * v / whole
    out["optimizer"] = p["fixed_s"]
    out["bubble"] = p["bubble_s"]
    for d in DIMS:
        out[f"exposed_{d}"] = p.get(f"exposed_{d}_s", 0.0)
    return out


def cpu_calibration(analysis: TraceAnalysis, plan: Plan, model: Model, metrics: dict, cores: int) -> Calibration:
    """This run alone calibrates the CPU model (profiler.analyzers.calibrate.fit, one run)."""
    run = Measured(analysis=analysis, metrics=metrics, plan=plan, model=model, path=str(analysis.traces.source))
    return fit([run], cores=cores)


def cpu_rows(model: Model, base: Plan, world: int, cal: Calibration, cluster: Cluster) -> list[tuple[Plan, dict]]:
    """Every structurally valid plan on `world` CPU ranks that fits, with its calibrated parts."""
    gb = base.global_batch
    cands, _ = candidates(model, world, gb, Constraints(base=base, max_tp=world))
    if not len(cands):
        return []
    mem = memory_per_gpu_bytes(model, columns_of(cands, dataclasses.replace(base, global_batch=gb)))["total"]
    keep = np.asarray(mem) <= cluster.gpu_memory_bytes * 0.9
    keep &= (cands["fl"] < 0).to_numpy()  # uneven stages: the calibrated model splits layers evenly
    rows = []
    for row, m in zip(cands[keep].to_dict("records"), np.asarray(mem)[keep]):
        fields = {**row, "recompute": RECOMPUTE[row["rc"]], "cp_kind": CP_KINDS[row["ck"]]}
        fields["first_stage_layers"], fields["last_stage_layers"] = row["fl"], row["ll"]
        plan = plan_of(fields, base)
        p = predict(model, plan, cal, ranks_here=world)
        rows.append((plan, {"step": p["step_time_s"], "parts": cpu_components(p, model, plan, cal), "mem": float(m)}))
    return rows


def by_simplicity(rows: list[tuple[Plan, dict]], error: float, seq_len: int) -> list[tuple[Plan, dict]]:
    """Fastest first, those within `error` of the fastest ordered by the search's simplicity (fewer
    parallel dimensions, no ZeRO-2/3 or recomputation: space.simplicity), as `parallel search` does."""
    rows = sorted(rows, key=lambda x: x[1]["step"])
    if not rows:
        return rows
    table = pd.DataFrame(
        [{k: getattr(p, k) for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero", "recompute")} for p, _ in rows]
    )
    table["tp_link"] = "intra"  # one machine: every group inside it
    simple = simplicity(table, seq_len)
    fastest = rows[0][1]["step"]
    band = [i for i, (_, r) in enumerate(rows) if r["step"] <= fastest * (1 + error)]
    band.sort(key=lambda i: (simple[i], rows[i][1]["step"]))
    return [rows[i] for i in band] + rows[len(band) :]


def price_cpu(model: Model, own: Plan, cal: Calibration, cluster: Cluster, world: int, *, given: bool) -> Priced:
    """The job's plan and every plan on `world` CPU ranks under the calibration (`given`: passed in,
    else fitted to the run); its error by the ranks a core the job ran."""
    ranks_per_core = own.world_size / cal.cores if cal.cores else 0
    error = SHARED_CORES_ERROR if ranks_per_core > 2 else CALIBRATED_ERROR
    p = predict(model, own, cal, ranks_here=own.world_size)
    how = f"calibrated CPU step model ({'given' if given else 'fitted to this run'}; {cal.cores} cores)"
    rows = by_simplicity(cpu_rows(model, own, world, cal, cluster), error, model.seq_len)
    return Priced(
        error,
        how,
        p["step_time_s"],
        cpu_components(p, model, own, cal),
        {"device": "cpu", "calibration": cal.to_dict()},
        rows,
    )


def price_gpu(traces: Traces, model: Model, own: Plan, cl_job: Cluster, cl: Cluster, top: int) -> Priced:
    """The job's plan with the device fitted to its kernels (the default device when they cannot fit
    it, said in device_fit), and the search's best rows on `cl`."""
    try:
        fitted = fit_device(traces, model, own, cl_job)
        device_fit, device = fitted.to_dict(), fitted.device
    except DeviceFitError as err:
        device_fit, device = {"device": None, "error": str(err)}, None
    # the fitted kernels ran inside this job: their in-job speed is already in the device
    opts = Options(perf=PerfOptions(device=device, job_efficiency=1.0 if device else JOB_EFFICIENCY))
    t = step_time(model, own, cl_job, opts.perf, opts.comm, opts.activations)
    how = f"plan model on {device.name if device else cl_job.gpu} (kernels fitted: {device is not None})"
    rows = []
    try:
        res = search(model, cl, own.global_batch, Constraints(base=own, max_tp=cl.domain_gpus), opts)
    except SearchEmpty:
        res = None
    if res is not None:
        for i, r in enumerate(res.table.head(max(top * 20, 50)).to_dict("records")):
            parts = {**dict.fromkeys(COMPONENTS, 0.0), "gemm": r["compute_s"], "bubble": r["bubble_s"]}
            parts.update({f"exposed_{d}": r[f"exposed_{d}_s"] for d in DIMS})
            # the table keeps no optimizer column: it is the step's remainder (perf.step_time's sum)
            parts["optimizer"] = max(0.0, r["step_time_s"] - sum(parts.values()))
            rows.append((res.plan_at(i), {"step": r["step_time_s"], "parts": parts, "mem": r["memory_per_gpu_bytes"]}))
    return Priced(MODEL_ERROR, how, float(t["step_time_s"]), gpu_components(t), device_fit, rows)
