"""Predicted beside measured on Home (and the form that fits a calibration from chosen runs): thin
Streamlit views over profiler.collect.runs_calibration."""

from __future__ import annotations

import os

import streamlit as st

from parallel.core.calibrated import CalibrationError, contention_line
from profiler.collect import runs_calibration
from profiler.collect.trace_sets import TraceSet
from ui import whatif_charts
from ui.text import md

HOW = (
    "Fit one from runs here (below), or `python -m profiler calibrate RUN RUN --out "
    f"$PARASCOPE_RUNS/{runs_calibration.CALIBRATION_FILE}` — profile with `--wait 3` so the fit can take the "
    "tracing overhead out."
)


def calibration():
    """(the calibration in use or None, the problem reading it or None)."""
    try:
        return runs_calibration.load_calibration(runs_calibration.calibration_path()), None
    except CalibrationError as err:
        return None, str(err)


def run_prediction(s: TraceSet, metrics: dict | None) -> None:
    """The calibrated model's step beside the run's measured one, with the error and the phases."""
    cal, problem = calibration()
    if problem:
        st.warning(f"The calibration cannot be used: {md(problem)}")
        return
    if cal is None:
        st.caption("No calibrated step-time model yet, so no prediction beside the measured step. " + HOW)
        return
    row = runs_calibration.run_prediction(s, metrics, cal)
    if row is None:
        return
    c1, c2 = st.columns([1, 2])
    c1.metric(
        "Predicted step (calibrated)",
        f"{row['predicted_s']:.3f} s",
        delta=f"{row['error_pct']:+.1f}% vs measured" if abs(row["error_pct"]) >= 0.05 else None,
        delta_color="off",
        help="parallel.core.calibrated with the calibration fitted from "
        + ", ".join(str(src.get("plan")) for src in cal.sources)
        + ("; this run is one of them" if row["calibrated_on"] else "; this run was not used to fit it"),
    )
    c2.altair_chart(whatif_charts.prediction_chart(row["phases"], row["measured_s"] * 1e3))
    if not row["measured_unprofiled"]:
        st.caption(
            "Measured here with the profiler attached on most steps (the run started it after one step): the "
            "prediction is of an unprofiled step, so expect the measured one to be higher. Profile with "
            "`--wait 3` to have unprofiled steps to compare with."
        )


def calibrate_form(candidates: list[TraceSet]) -> None:
    cal, problem = calibration()
    with st.expander("Step-time calibration", expanded=False):
        if cal is not None:
            st.caption("In use: fitted from")
            st.dataframe(
                [
                    {
                        "run": src.get("path"),
                        "plan": src.get("plan"),
                        "overhead removed": src.get("overhead_removed"),
                        # per kind (the engine times its communication calls); absent in older calibrations
                        "work overhead x": src.get("work_overhead_factor"),
                        "transfer overhead x": src.get("comm_overhead_factor"),
                        # work's wall over CPU time (> 1: ranks waited for a core); absent without CPU clocks
                        "work stretch x": src.get("work_stretch"),
                        "unprofiled step s": src.get("unprofiled_step_s"),
                        "fit gives s": src.get("fitted_step_s"),
                    }
                    for src in cal.sources
                ],
                hide_index=True,
            )
            if line := contention_line(cal):
                st.caption(line)
        elif problem:
            st.warning(md(problem))
        if not candidates:
            st.caption("No completed profiled run, or uploaded set with a plan and a model, to fit from yet.")
            return
        with st.form("calibrate_form"):
            names = {s.id: s.label for s in candidates}
            picked = st.multiselect(
                "Fit from these runs or uploaded sets (on a CPU: two runs, one whose ranks each had a core, one "
                "with more ranks than cores; your GPU job: its uploaded traces)",
                list(names),
                format_func=names.get,
                max_selections=4,
            )
            go = st.form_submit_button("Fit and save")
        if go and picked:
            chosen = [s for s in candidates if s.id in picked]
            with st.spinner("fitting the step-time model to the runs' traces"):
                try:
                    new = runs_calibration.calibrate_runs(chosen, cores=os.cpu_count() or 1)
                except Exception as err:  # a bad trace or a run the fit cannot use: say which, keep the old one
                    st.error(f"Cannot calibrate from these sets: {md(err)}")
                    return
            runs_calibration.save_calibration(new, runs_calibration.calibration_path())
            st.success(f"Saved {runs_calibration.CALIBRATION_FILE}: every run now shows its prediction.")
            st.rerun()
