"""Your job, re-planned: from a job's own traces to the plans that would run it faster, and by how much.

    r = replan(TraceAnalysis.load("runs/demo"))                  # or launch= / plan= / model= / cluster= / gpus=
    r.job, r.measured, r.modelled, r.gaps, r.plans, r.verdict, r.export
    r.to_dict()   # {job, measured, modelled, device_fit, plans, export}: `profiler replan --json`

1. The job as identified (analyzers.identify): plan, model, device, cluster, each fact with its evidence.
2. Measured: its step split as the plan model splits one (TraceAnalysis.step_split). For our own run
   directory with unprofiled steps (metrics.json) the parts are scaled to the unprofiled step -- what
   the model predicts -- and the traced step is kept beside it.
3. Modelled: the same plan under the plan model with the device fitted to this job -- on a GPU the
   kernels' own times (analyzers.device_fit, the per-operator model of parallel.core.perf); on a CPU
   the step model calibrated to this machine (parallel.core.calibrated; the calibration given, else
   fitted to this run alone). A part that differs by more than the model's error times the step is a
   gap, named with what such a gap usually means (GAP_MEANINGS).
4. Re-planned: every plan on the same GPUs (or `gpus`) with the job's global batch and sequence and
   the fitted device; each plan's step is the model's, scaled by the job's measured over modelled step
   (so the job's own plan has gain 0 and a plan's gain is the model's relative change); gain =
   1 - step / measured step; why = the part that shrinks most. Gains within the model's error are
   "no better plan by more than the model's error". The best plan is exported as a Megatron-LM script
   and a torchtitan TOML (parallel.importers.export).

Pure: numpy, pandas, parallel/ and the analyzers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.calibrated import Calibration, features, predict
from parallel.core.comm import DIMS
from parallel.core.compute import JOB_EFFICIENCY
from parallel.core.memory import memory_per_gpu_bytes
from parallel.core.perf import PerfOptions, layer_forward_flops, step_time
from parallel.core.plan import CP_KINDS, RECOMPUTE, Plan
from parallel.core.report import Options
from parallel.core.specs import CLUSTERS, Cluster, GiB, Model
from parallel.importers.export import megatron_script, torchtitan_toml
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
from profiler.analyzers.calibrate import Measured, fit, measured_step
from profiler.analyzers.device_fit import DeviceFitError, fit_device
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.identify import Identified, identify
from profiler.analyzers.split import COMPONENTS
from runfiles.rundir import load_json_object

# The calibrated CPU model's error: 5-9% mean on 16 held-back plans with up to 2 ranks a core, 38% on
# 8-rank plans at 4 ranks a core (bench/README.md, bench.predict): the larger past 2 a core.
CALIBRATED_ERROR = 0.09
SHARED_CORES_ERROR = 0.38
TOP = 5
MISMATCH = 2.0  # a modelled step this many times off the measured one (either way): not this job's plan or model
PARTS = ("compute", "bubble", *(f"exposed_{d}" for d in DIMS), "optimizer")  # what a plan's why compares
GAP_MEANINGS = {  # component -> (measured above the model, measured below it)
    "gemm": (
        "GEMMs ran slower than the fitted device times them: small or odd shapes, kernels slowed by communication "
        "kernels beside them, or (on a CPU) ranks sharing cores",
        "GEMMs ran faster than modelled",
    ),
    "attention": ("attention ran slower than modelled: an unfused or masked kernel", "attention ran faster"),
    "elementwise": (
        "element-wise kernels and host dispatch took longer than modelled: unfused norms and activations, many "
        "small operators",
        "element-wise work was fused more than the model assumes",
    ),
    "optimizer": ("the optimizer step is slower than modelled: an unfused optimizer", "the optimizer step is cheaper"),
    "exposed_tp": (
        "TP collectives were not hidden under the GEMMs, or the TP group crossed a slower link",
        "TP communication overlapped more than modelled",
    ),
    "exposed_sp": ("SP's gathers and scatters were not hidden", "SP's collectives overlapped more than modelled"),
    "exposed_cp": ("the K/V exchange was not hidden behind attention", "the K/V exchange overlapped more"),
    "exposed_ep": ("expert all-to-alls waited: unbalanced routing", "expert all-to-alls overlapped more"),
    "exposed_pp": (
        "pipeline sends and receives waited: unbalanced stages, or P2P not overlapped",
        "pipeline transfers were cheaper than modelled",
    ),
    "exposed_dp": (
        "gradient reduction did not overlap the backward pass (or ran over a slower link than modelled)",
        "gradient reduction overlapped the backward pass more than modelled",
    ),
    "exposed_other": (
        "collectives outside the plan's groups (loss and metric all-reduces, barriers) that the model does not know",
        "",
    ),
    "bubble": (
        "the pipeline idled more than (p-1)/(v·m) of a step: unbalanced stages or a slow stage",
        "the pipeline's bubble was smaller than the schedule's",
    ),
    "memory": ("memory copies not overlapped: host-device transfers, offloading", ""),
    "idle": (
        "the host kept the device waiting: data loading, Python, launch latency, synchronisation (the model has none)",
        "",
    ),
}


class ReplanError(ValueError):
    """The traces cannot be re-planned: not a transformer job, no plan or model known, no device to model."""


@dataclass(frozen=True)
class Replan:
    job: Identified
    measured: dict  # {step_s, components, traced_step_s, source}
    modelled: dict  # {step_s, components, error, how}
    device_fit: dict | None
    plans: list[dict]  # [{label, plan, step_s, gain, memory_gib, why}] best first
    gaps: list[dict] = field(default_factory=list)  # [{component, measured_s, modelled_s, meaning}]
    verdict: str = ""
    export: dict = field(default_factory=dict)  # {megatron, torchtitan}: the best plan's, or None

    def components_frame(self) -> pd.DataFrame:
        """Long form for one stacked chart: side (measured | modelled), component, seconds, order
        (split.COMPONENTS' position); parts that are 0 on both sides left out."""
        rows = []
        for side, comps in (("measured", self.measured["components"]), ("modelled", self.modelled["components"])):
            for i, c in enumerate(COMPONENTS):
                if self.measured["components"].get(c, 0.0) or self.modelled["components"].get(c, 0.0):
                    rows.append({"side": side, "component": c, "seconds": float(comps.get(c, 0.0)), "order": i})
        return pd.DataFrame(rows, columns=["side", "component", "seconds", "order"])

    def facts_frame(self) -> pd.DataFrame:
        """The job as identified, one row a fact: fact, value, source, evidence (missing ones last)."""
        rows = [
            {"fact": k, "value": str(f.value), "source": f.source, "evidence": f.evidence}
            for k, f in self.job.facts.items()
        ]
        rows += [{"fact": k, "value": "", "source": "missing", "evidence": why} for k, why in self.job.missing.items()]
        return pd.DataFrame(rows, columns=["fact", "value", "source", "evidence"])

    def to_dict(self) -> dict:
        j = self.job.to_dict()
        evidence = dict(j["evidence"])
        for k, why in j["missing"].items():  # a fact nothing showed: its reason, never a default
            evidence.setdefault(k, {"value": None, "source": "missing", "evidence": why})
        return {
            "job": {
                "plan": j["plan"],
                "model": j["model"],
                "device": j["device"],
                "cluster": j["cluster"],
                "evidence": evidence,
                "inferred": j["inferred"],
            },
            "measured": {k: self.measured[k] for k in ("step_s", "components")},
            "modelled": {
                "step_s": self.modelled["step_s"],
                "components": self.modelled["components"],
                "error": {
                    "relative": self.modelled["error"],
                    "how": self.modelled["how"],
                    "mismatch": self.modelled["mismatch"],
                    "gaps": self.gaps,
                },
            },
            "device_fit": self.device_fit,
            "plans": self.plans,
            "export": self.export,
        }


def _metrics(traces) -> dict:
    """Our run directory's metrics.json ({} when the set has none or it cannot be read)."""
    try:
        path = Path(traces.source) / "metrics.json"
        return load_json_object(path) if path.is_file() else {}
    except (OSError, TypeError, ValueError):
        return {}


def _measured(analysis: TraceAnalysis, metrics: dict) -> dict:
    split = analysis.step_split().to_dict()
    traced = split["step_s"]
    profile = metrics.get("profile") if isinstance(metrics.get("profile"), dict) else {}
    steps = profile.get("profiled_steps") if isinstance(profile.get("profiled_steps"), list) else []
    plain = measured_step(metrics, steps) if metrics else None
    scale, source = 1.0, "traced steps"
    if plain is not None and plain[1] and traced > 0:
        scale, source = plain[0] / traced, "the run's unprofiled steps (the traced split scaled to them)"
    comps = {k: v * scale for k, v in split["components"].items()}
    return {"step_s": traced * scale, "components": comps, "traced_step_s": traced, "source": source}


def _gpu_components(t: dict, plan: Plan) -> dict[str, float]:
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


def _cpu_components(p: dict, model: Model, plan: Plan, cal: Calibration) -> dict[str, float]:
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


def _parts(c: dict[str, float]) -> dict[str, float]:
    """A plan's components folded into PARTS (compute: its kernel classes together)."""
    out = {k: c.get(k, 0.0) for k in PARTS}
    out["compute"] = c["gemm"] + c["attention"] + c["elementwise"]
    return out


def _why(mine: dict[str, float], job: dict[str, float]) -> str:
    """The part that shrinks most from the job's plan to this one (both as modelled, scaled alike)."""
    a, b = _parts(job), _parts(mine)
    k = max(PARTS, key=lambda p: a[p] - b[p])
    if a[k] - b[k] <= 0:
        return "no part shrinks"
    name = k.replace("exposed_", "exposed ").replace("_", " ")
    return f"{name} {a[k] * 1e3:.1f} → {b[k] * 1e3:.1f} ms"


def _gaps(measured: dict, modelled: dict, error: float) -> list[dict]:
    out = []
    limit = error * measured["step_s"]
    for c in COMPONENTS:
        m, p = measured["components"].get(c, 0.0), modelled.get(c, 0.0)
        if abs(m - p) > limit:
            above, below = GAP_MEANINGS[c]
            text = above if m > p else below or above
            out.append({"component": c, "measured_s": m, "modelled_s": p, "meaning": text})
    return out


def gap_lines(gaps: list[dict]) -> list[str]:
    """Each gap as one line: 'exposed DP 3.1 s measured vs 0.2 s modelled: gradient reduction ...'."""
    out = []
    for g in gaps:
        name = g["component"].replace("exposed_", "exposed ").replace("_", " ")
        out.append(f"{name} {g['measured_s']:.4g} s measured vs {g['modelled_s']:.4g} s modelled: {g['meaning']}")
    return out


def verdict(plans: list[dict], error: float) -> str:
    """The re-plan in one line: the best plan and its gain, or no better plan beyond the model's error."""
    if not plans:
        return "no other plan fits these GPUs"
    best = plans[0]
    if best["gain"] <= error:
        return (
            f"no better plan by more than the model's error ({error:.0%}): the best, {best['label']}, "
            f"gains {best['gain']:.0%}"
        )
    return f"{best['label']} runs this job {best['gain']:.0%} faster ({best['why']})"


def _cluster(job: Identified, name: str | None, world: int) -> Cluster:
    if name is not None:
        if name not in CLUSTERS:
            raise ReplanError(f"unknown cluster preset {name!r}; known: {', '.join(CLUSTERS)}")
        base = CLUSTERS[name]
    elif job.device["name"] == "cpu":
        base = CLUSTERS["local-cpu"]
    elif job.cluster.get("preset"):
        base = CLUSTERS[job.cluster["preset"]]
    else:
        raise ReplanError(f"no cluster preset is built of {job.device['name']}: give --cluster")
    gpn = job.cluster.get("gpus_per_node") if name is None else None
    if gpn and world % gpn == 0 and base.device != "cpu":
        return dataclasses.replace(base, gpus_per_node=gpn, nodes=world // gpn)
    return base.sized_for(world)


def _cpu_calibration(analysis: TraceAnalysis, job: Identified, metrics: dict, cores: int) -> Calibration:
    run = Measured(analysis=analysis, metrics=metrics, plan=job.plan, model=job.model, path=str(analysis.traces.source))
    return fit([run], cores=cores)


def _cpu_rows(model: Model, base: Plan, world: int, cal: Calibration, cluster: Cluster) -> list[tuple[Plan, dict]]:
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
        rows.append((plan, {"step": p["step_time_s"], "parts": _cpu_components(p, model, plan, cal), "mem": float(m)}))
    return rows


def _by_simplicity(rows: list[tuple[Plan, dict]], error: float, seq_len: int) -> list[tuple[Plan, dict]]:
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


def replan(
    analysis: TraceAnalysis,
    *,
    launch: Any = None,
    plan: Any = None,
    model: Any = None,
    cluster: str | None = None,
    gpus: int | None = None,
    calibration: Calibration | None = None,
    cores: int = 1,
    top: int = TOP,
    runnable: Callable[[Plan, Model], bool] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Replan:
    """The job of `analysis` re-planned (module docstring). `calibration`: a CPU job's step model
    (else fitted to this run alone, on `cores`); `runnable(plan, model)`: only plans it accepts are
    offered (the engine's own limits, for a job that must run here); `progress(text, fraction)` is told
    each phase as it starts (a caller may raise from it to stop). ReplanError in one line."""
    say = progress or (lambda text, fraction: None)
    say("identifying the job", 0.0)
    job = identify(analysis, launch=launch, plan=plan, model=model)
    if job.kind.value == "not a transformer":
        ev = job.kind.evidence
        raise ReplanError(ev if "not a transformer" in ev else f"not a transformer job: {ev}")
    if job.plan is None:
        raise ReplanError(f"the job's plan is not known ({job.missing.get('plan')}): give --launch or --plan")
    if job.model is None:
        raise ReplanError(f"the job's model is not known ({job.missing.get('model')}): give --model or --launch")
    traces = analysis.traces
    if analysis.layout_plan != job.plan:  # the split's labels and bubble under the identified plan
        analysis = TraceAnalysis(traces, job.plan.to_dict(), align=analysis.align, workers=analysis.workers)
    world = gpus or job.plan.world_size
    if gpus is not None and gpus < 1:
        raise ReplanError(f"--gpus {gpus}: give at least one")
    metrics = _metrics(traces)
    say("splitting the measured step", 0.2)
    measured = _measured(analysis, metrics)
    if measured["step_s"] <= 0:
        raise ReplanError("the traces hold no measured step (no ProfilerStep windows with work in them)")
    m, own = job.model, job.plan
    cl_job = _cluster(job, cluster, own.world_size)
    cl = _cluster(job, cluster, world)
    say("modelling the job's plan and searching the plans", 0.5)
    if cl_job.device == "cpu":
        cal = calibration or _cpu_calibration(analysis, job, metrics, cores)
        ranks_per_core = own.world_size / max(cal.cores, 1) if cal.cores else 0
        error = SHARED_CORES_ERROR if ranks_per_core > 2 else CALIBRATED_ERROR
        p = predict(m, own, cal, ranks_here=own.world_size)
        own_parts, own_step = _cpu_components(p, m, own, cal), p["step_time_s"]
        how = f"calibrated CPU step model ({'given' if calibration else 'fitted to this run'}; {cal.cores} cores)"
        device_fit = {"device": "cpu", "calibration": cal.to_dict()}
        rows = _by_simplicity(_cpu_rows(m, own, world, cal, cl), error, m.seq_len)
    else:
        error = MODEL_ERROR
        try:
            fitted = fit_device(traces, m, own, cl_job)
            device_fit, device = fitted.to_dict(), fitted.device
        except DeviceFitError as err:
            device_fit, device = {"device": None, "error": str(err)}, None
        # the fitted kernels ran inside this job: their in-job speed is already in the device
        opts = Options(perf=PerfOptions(device=device, job_efficiency=1.0 if device else JOB_EFFICIENCY))
        t = step_time(m, own, cl_job, opts.perf, opts.comm, opts.activations)
        own_parts, own_step = _gpu_components(t, own), float(t["step_time_s"])
        how = f"plan model on {device.name if device else cl_job.gpu} (kernels fitted: {device is not None})"
        try:
            res = search(m, cl, own.global_batch, Constraints(base=own, max_tp=cl.domain_gpus), opts)
            table = res.table.head(max(top * 20, 50))
            rows = []
            for i, r in enumerate(table.to_dict("records")):
                plan_i = res.plan_at(i)
                parts = {**dict.fromkeys(COMPONENTS, 0.0), "gemm": r["compute_s"], "bubble": r["bubble_s"]}
                parts.update({f"exposed_{d}": r[f"exposed_{d}_s"] for d in DIMS})
                # the table keeps no optimizer column: it is the step's remainder (perf.step_time's sum)
                parts["optimizer"] = max(0.0, r["step_time_s"] - sum(parts.values()))
                rows.append((plan_i, {"step": r["step_time_s"], "parts": parts, "mem": r["memory_per_gpu_bytes"]}))
        except SearchEmpty:
            rows = []
    say("ranking the plans", 0.9)
    modelled = {"step_s": own_step, "components": own_parts, "error": error, "how": how}
    gaps = _gaps(measured, own_parts, error)
    ratio = own_step / measured["step_s"]
    modelled["mismatch"] = (
        f"the model puts this job at {ratio:.2g}× its measured step: the plan or the model given likely does "
        "not describe these traces"
        if not 1 / MISMATCH <= ratio <= MISMATCH
        else None
    )
    scale = measured["step_s"] / own_step if own_step > 0 else math.nan
    plans = []
    for plan_i, r in rows:  # best first: the search's order
        if plan_i == own or (runnable is not None and not runnable(plan_i, m)):
            continue
        if any(x["label"] == plan_i.label() for x in plans):
            continue
        step = r["step"] * scale
        gain = 1 - step / measured["step_s"]
        why = _why({k: v * scale for k, v in r["parts"].items()}, {k: v * scale for k, v in own_parts.items()})
        if gain <= error:
            why = f"no better plan by more than the model's error ({error:.0%}); {why}"
        plans.append(
            {
                "label": plan_i.label(),
                "plan": plan_i.to_dict(),
                "step_s": step,
                "gain": gain,
                "memory_gib": r["mem"] / GiB,
                "why": why,
            }
        )
        if len(plans) >= top:
            break
    best = plans[0] if plans else None
    export = {"megatron": None, "torchtitan": None}
    if best is not None:
        plan_b = Plan.from_dict(best["plan"])
        gpn = cl.gpus_per_node if cl.device != "cpu" else world
        export = {
            "megatron": megatron_script(plan_b, m, gpus_per_node=gpn)[0],
            "torchtitan": torchtitan_toml(plan_b, m)[0],
        }
    line = verdict(plans, error)
    if modelled["mismatch"]:
        line = f"{modelled['mismatch']}; {line}"
    return Replan(job, measured, modelled, device_fit, plans, gaps, line, export)


__all__ = ["Replan", "ReplanError", "gap_lines", "replan", "verdict"]
