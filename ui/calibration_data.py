"""The calibrated step-time model on the run pages: the calibration in use, a run's prediction beside
its measured step, and fitting a new calibration from chosen runs (no Streamlit).

    path = calibration_path()            # $PARASCOPE_RUNS/calibration.json (written by the dashboard
                                         # or `python -m profiler calibrate ... --out` that path)
    cal = load_calibration(path)         # None when there is none; CalibrationError when it is bad
    row = run_prediction(s, metrics, cal)   # predicted vs measured steady step, its phases
    cal = calibrate_runs(sets, cores)    # profiler.analyzers.calibrate over the runs' traces
    save_calibration(cal, path)          # temp file, then rename: never half-written

Pure: stdlib, pandas, parallel/, profiler/ (no streamlit, no torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from parallel.core.calibrated import Calibration, CalibrationError, predict
from parallel.core.plan import Plan
from parallel.core.specs import Model, SpecError
from ui.trace_sets import TraceSet, runs_dir

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
        return Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CalibrationError(f"{path.name} cannot be read: {err}") from None


def save_calibration(cal: Calibration, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1))
    tmp.replace(path)


def _model_plan(s: TraceSet) -> tuple[Model, Plan] | None:
    try:
        return Model.from_dict(s.run["model"]), Plan.from_dict(s.run["plan"])
    except (KeyError, TypeError, SpecError):
        return None


def run_prediction(s: TraceSet, metrics: dict | None, cal: Calibration) -> dict | None:
    """{predicted_s, measured_s, measured_unprofiled, error_pct, phases (DataFrame: phase, ms),
    contention, calibrated_on (this run is one of the calibration's sources)}; None when the run names
    no model and plan or has no step times. measured_s: the steps a profiled run ran before the
    profiler started (after the first), else the steady step (median after the first)."""
    mp = _model_plan(s)
    times = [float(t) for t in (metrics or {}).get("step_time_s") or [] if isinstance(t, (int, float))]
    if mp is None or len(times) < 2:
        return None
    model, plan = mp
    out = predict(model, plan, cal)
    from profiler.analyzers.calibrate import unprofiled_step_s

    traced = ((s.run.get("profile") or {}).get("profiled_steps")) or []
    plain = unprofiled_step_s(metrics or {}, traced) if traced else None
    # the model predicts an unprofiled step: compare with the run's unprofiled steps when it has them
    measured = plain if plain is not None else float(pd.Series(times[1:]).median())
    phases = pd.DataFrame(
        [{"phase": name, "ms": out[key] * 1e3} for key, name in PHASES.items() if out.get(key)],
        columns=["phase", "ms"],
    )
    return {
        "predicted_s": out["step_time_s"],
        "measured_s": measured,
        "error_pct": (out["step_time_s"] / measured - 1) * 100,
        "phases": phases,
        "contention": out["contention_factor"],
        "measured_unprofiled": plain is not None or not traced,
        "calibrated_on": any(str(src.get("path")) == str(s.path) for src in cal.sources),
    }


def calibration_candidates(sets: list[TraceSet]) -> list[TraceSet]:
    """Completed runs with traces, a plan and a model: what a calibration can be fitted from."""
    return [s for s in sets if s.kind == "run" and s.status == "completed" and s.has_traces and _model_plan(s)]


def calibrate_runs(sets: list[TraceSet], *, cores: int) -> Calibration:
    """Fit the model to these runs (profiler.analyzers.calibrate); CalibrationError / TraceError."""
    from profiler.analyzers.calibrate import Measured, fit
    from profiler.analyzers.front import TraceAnalysis

    runs = []
    for s in sets:
        model, plan = _model_plan(s)
        metrics = json.loads((s.path / "metrics.json").read_text()) if s.has_metrics else {}
        analysis = TraceAnalysis.load(s.path, plan.to_dict())
        runs.append(Measured(analysis=analysis, metrics=metrics, plan=plan, model=model, path=str(s.path)))
    return fit(runs, cores=cores)
