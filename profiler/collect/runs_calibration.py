"""The calibrated step-time model over the trace sets here (runs and uploads): the calibration in use,
a set's prediction beside its measured step, fitting a new calibration from chosen sets, and Plan
review's analytic, calibrated and measured steps side by side.

    path = calibration_path()            # $PARASCOPE_RUNS/calibration.json (written by the dashboard
                                         # or `python -m profiler calibrate ... --out` that path)
    cal = load_calibration(path)         # None when there is none; CalibrationError when it is bad
    row = run_prediction(s, metrics, cal)   # predicted vs measured steady step, its phases
    cal = calibrate_runs(sets, cores)    # profiler.analyzers.calibrate over the runs' traces
    save_calibration(cal, path)          # temp file, then rename: never half-written

Pure-ish: stdlib, pandas, parallel.core, profiler.analyzers, trace_sets; no streamlit, no torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from parallel.core.calibrated import Calibration, CalibrationError, predict, read_calibration
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Cluster, Model, SpecError
from profiler.analyzers.calibrate import fit, traced_device
from profiler.analyzers.calibrate import measured_step as step_of
from profiler.analyzers.run_inputs import measured_run, run_cluster
from profiler.collect.trace_sets import TraceSet, runs_dir
from runfiles.rundir import read_json

CALIBRATION_FILE = "calibration.json"
PHASES = {
    "compute_s": "compute",
    "bubble_s": "bubble",
    "exposed_tp_s": "tp comm",
    "exposed_sp_s": "sp comm",
    "exposed_cp_s": "cp comm",
    "exposed_ep_s": "ep comm",
    "exposed_pp_s": "pp comm",
    "exposed_dp_s": "dp comm",
    "fixed_s": "per-step fixed",
}


def calibration_path() -> Path:
    return runs_dir() / CALIBRATION_FILE


def load_calibration(path: Path) -> Calibration | None:
    """The calibration at `path`, None when there is none; CalibrationError naming what is wrong."""
    if not path.is_file():
        return None
    try:
        return read_calibration(path)
    except CalibrationError as err:
        raise CalibrationError(f"{path.name}: {err}") from None


def save_calibration(cal: Calibration, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1))
    tmp.replace(path)


def _model_plan(s: TraceSet) -> tuple[Model, Plan] | None:
    """A run's model and plan (its run.json), or an uploaded set's (its plan.json: the model's shape or a
    preset's name); None when either is missing or unreadable."""
    try:
        if s.kind == "upload":
            doc = read_json(s.path / "plan.json") or {}
            spec = doc.get("model")
            model = MODELS.get(spec) if isinstance(spec, str) else Model.from_dict(spec) if spec else None
            return (model, Plan.from_dict(doc["plan"])) if model is not None else None
        return Model.from_dict(s.run["model"]), Plan.from_dict(s.run["plan"])
    except (KeyError, TypeError, SpecError):
        return None


def measured_step(s: TraceSet, metrics: dict | None) -> tuple[float, bool] | None:
    """(seconds, unprofiled) of a run's measured step (profiler.analyzers.calibrate.measured_step, its
    traced steps from run.json); None without two step times."""
    return step_of(metrics or {}, ((s.run.get("profile") or {}).get("profiled_steps")) or [])


def run_prediction(s: TraceSet, metrics: dict | None, cal: Calibration) -> dict | None:
    """{predicted_s, measured_s, measured_unprofiled, error_pct, phases (DataFrame: phase, ms),
    contention, calibrated_on (this run is one of the calibration's sources)}; None when the run names
    no model and plan or has no step times. measured_s: the steps a profiled run ran before the
    profiler started (after the first), else the steady step (median after the first)."""
    mp = _model_plan(s)
    step = measured_step(s, metrics)
    if mp is None or step is None:
        return None
    model, plan = mp
    out = predict(model, plan, cal, cluster=run_cluster(s.path, plan))  # a run over two nodes: inter-node groups
    measured, unprofiled = step
    phases = pd.DataFrame(
        [{"phase": name, "ms": out[key] * 1e3} for key, name in PHASES.items() if out.get(key)],
        columns=["phase", "ms"],
    )
    return {
        "predicted_s": out["step_time_s"],
        "measured_s": measured,
        "error_pct": _error(out["step_time_s"], measured),
        "phases": phases,
        "contention": out["contention_factor"],
        "measured_unprofiled": unprofiled,
        "calibrated_on": any(str(src.get("path")) == str(s.path) for src in cal.sources),
    }


def calibration_candidates(sets: list[TraceSet]) -> list[TraceSet]:
    """Completed runs with traces, a plan and a model, and uploaded sets with a plan and a model: what a
    calibration can be fitted from."""
    return [
        s
        for s in sets
        if s.has_traces and (s.kind == "upload" or s.status == "completed") and _model_plan(s) is not None
    ]


def calibrate_runs(sets: list[TraceSet], *, cores: int) -> Calibration:
    """Fit the model to these runs or uploaded sets (profiler.analyzers.calibrate), each read as `python
    -m profiler calibrate` reads it (profiler.analyzers.run_inputs.measured_run: its plan, model, metrics and
    nodes), for the device their traces ran on (GPU sets: a device per rank, `cores` unused);
    CalibrationError (sets of both kinds, nothing to fit) / TraceError."""
    runs = [measured_run(str(s.path)) for s in sets]
    return fit(runs, cores=cores, device=traced_device(runs))


SOURCES = ("analytic", "calibrated", "measured")
REVIEW_PARTS = {  # calibrated.predict's keys -> the Plan review's step-time parts (ui.review_charts.PARTS)
    "compute_s": "compute",
    "bubble_s": "bubble",
    "exposed_tp_s": "exposed TP",
    "exposed_sp_s": "exposed SP",
    "exposed_cp_s": "exposed CP",
    "exposed_ep_s": "exposed EP",
    "exposed_pp_s": "exposed PP",
    "exposed_dp_s": "exposed DP",
    "fixed_s": "per-step fixed",
}


def _runs_of(sets: list[TraceSet], model: Model, plan: Plan, cluster: Cluster) -> list[TraceSet]:
    """Completed runs of exactly this model and plan on this kind of machine (the cluster preset's
    name and device), the latest first."""
    out = []
    for s in sets:
        if s.kind != "run" or s.status != "completed" or not s.has_metrics:
            continue
        c = s.run.get("cluster") if isinstance(s.run.get("cluster"), dict) else {}
        if c.get("name") != cluster.name or c.get("device", "gpu") != cluster.device:
            continue
        mp = _model_plan(s)
        if mp is not None and mp == (model, plan):
            out.append(s)
    return sorted(out, key=lambda s: s.finished_at or s.started_at, reverse=True)


def review_predictions(
    plans: list[tuple[str, Model, Plan, float | None]],
    cluster: Cluster,
    cal: Calibration | None,
    sets: list[TraceSet],
    metrics_of: Callable[[TraceSet], dict | None],
) -> dict:
    """Plan review's step times side by side: for each (name, model, plan, analytic seconds) the
    analytic model's step, the calibrated model's (when `cal` was measured on this kind of device:
    a CPU calibration says nothing about a GPU cluster) and the measured step of the latest completed
    run of that very model and plan on this cluster (`sets`; metrics_of reads a run's metrics).
    {table (one row per plan), chart (plan, source, seconds), phases (plan, part, seconds: the
    calibrated step's parts), calibrated (bool), note (str | None)}."""
    usable = cal is not None and cal.device == cluster.device
    note = None
    if cal is None:
        note = "no calibration yet"
    elif not usable:
        note = (
            f"the calibration was measured on {cal.device.upper()} ranks and this cluster runs on "
            f"{cluster.device.upper()}s: it cannot predict these plans"
        )
    rows, chart, phases = [], [], []
    for name, model, plan, analytic in plans:
        if analytic is not None and not math.isfinite(analytic):  # a table's NaN: no analytic step
            analytic = None
        calibrated = None
        if usable and analytic is not None:  # a plan the plan model cannot evaluate gets no prediction
            here = plan.world_size if cluster.nodes == 1 else min(plan.world_size, cluster.gpus_per_node)
            out = predict(model, plan, cal, ranks_here=here, cluster=cluster)
            calibrated = out["step_time_s"]
            phases += [
                {"plan": name, "part": part, "seconds": float(out[key])}
                for key, part in REVIEW_PARTS.items()
                if out.get(key)
            ]
        runs = _runs_of(sets, model, plan, cluster)
        step = next((m for m in (measured_step(r, metrics_of(r)) for r in runs) if m is not None), None)
        measured = step[0] if step else None
        rows.append(
            {
                "plan": name,
                "analytic s": analytic,
                "calibrated s": calibrated,
                "measured s": measured,
                "measured by": f"{runs[0].name}" + (f" (+{len(runs) - 1} more)" if len(runs) > 1 else "")
                if runs and step
                else "",
                "calibrated error %": _error(calibrated, measured),
                "analytic error %": _error(analytic, measured),
            }
        )
        for source, value in zip(SOURCES, (analytic, calibrated, measured)):
            if value is not None and value > 0:
                chart.append({"plan": name, "source": source, "seconds": value})
    return {
        "table": pd.DataFrame(rows),
        "chart": pd.DataFrame(chart, columns=["plan", "source", "seconds"]),
        "phases": pd.DataFrame(phases, columns=["plan", "part", "seconds"]),
        "calibrated": usable,
        "note": note,
    }


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted / measured - 1) * 100
