"""Your job, re-planned: from a job's own traces to the plans that would run it faster, and by how much.

    r = replan(TraceAnalysis.load("runs/demo"))                  # or launch= / plan= / model= / cluster= / gpus=
    r.job, r.measured, r.modelled, r.gaps, r.plans, r.verdict, r.export
    r.to_dict()   # {job, measured, modelled, device_fit, plans, export}: `profiler replan --json`

The parts live beside it: replan_model prices the plans, replan_gaps says what the numbers mean.

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

import pandas as pd

from parallel.core.calibrated import Calibration
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, Cluster, GiB, Model
from parallel.importers.export import megatron_script, torchtitan_toml
from profiler.analyzers.calibrate import measured_step
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.identify import Identified, identify
from profiler.analyzers.replan_gaps import gap_lines, gaps, verdict, why
from profiler.analyzers.replan_model import cpu_calibration, price_cpu, price_gpu
from profiler.analyzers.split import COMPONENTS
from runfiles.rundir import load_json_object

TOP = 5
MISMATCH = 2.0  # a modelled step this many times off the measured one (either way): not this job's plan or model


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
        for k, reason in j["missing"].items():  # a fact nothing showed: its reason, never a default
            evidence.setdefault(k, {"value": None, "source": "missing", "evidence": reason})
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
    if job.kind.value == "not training":
        raise ReplanError(f"not a training job: {job.kind.evidence}")
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
        cal = calibration or cpu_calibration(analysis, own, m, metrics, cores)
        priced = price_cpu(m, own, cal, cl, world, given=calibration is not None)
    else:
        priced = price_gpu(traces, m, own, cl_job, cl, top)
    error, own_parts, own_step = priced.error, priced.parts, priced.step_s
    say("ranking the plans", 0.9)
    modelled = {"step_s": own_step, "components": own_parts, "error": error, "how": priced.how}
    found = gaps(measured, own_parts, error)
    ratio = own_step / measured["step_s"]
    modelled["mismatch"] = (
        f"the model puts this job at {ratio:.2g}× its measured step: the plan or the model given likely does "
        "not describe these traces"
        if not 1 / MISMATCH <= ratio <= MISMATCH
        else None
    )
    scale = measured["step_s"] / own_step if own_step > 0 else math.nan
    plans = []
    for plan_i, r in priced.rows:  # best first: the search's order
        if plan_i == own or (runnable is not None and not runnable(plan_i, m)):
            continue
        if any(x["label"] == plan_i.label() for x in plans):
            continue
        step = r["step"] * scale
        gain = 1 - step / measured["step_s"]
        reason = why({k: v * scale for k, v in r["parts"].items()}, {k: v * scale for k, v in own_parts.items()})
        if gain <= error:
            reason = f"no better plan by more than the model's error ({error:.0%}); {reason}"
        plans.append(
            {
                "label": plan_i.label(),
                "plan": plan_i.to_dict(),
                "step_s": step,
                "gain": gain,
                "memory_gib": r["mem"] / GiB,
                "why": reason,
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
    return Replan(job, measured, modelled, priced.device_fit, plans, found, line, export)


__all__ = ["Replan", "ReplanError", "gap_lines", "replan", "verdict"]
