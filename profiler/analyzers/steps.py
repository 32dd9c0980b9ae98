"""ProfilerStep windows per rank, and which step a time falls in.

`step_windows(traces)` -> one row per (rank, step): start_ns, end_ns of the `ProfilerStep#N` range on
the CPU. `assign_steps` maps (rank, time) pairs to the step whose window holds the time, -1 if none.

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.traces.model import Traces


def step_windows(traces: Traces) -> pd.DataFrame:
    """One row per (rank, step): rank, step, start_ns, end_ns (made by the loader from each file)."""
    return traces.step_windows


def assign_steps(ranks: np.ndarray, times: np.ndarray, windows: pd.DataFrame) -> np.ndarray:
    """Step number of each (rank, time), -1 when no window of that rank holds the time."""
    ranks = np.asarray(ranks, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    out = np.full(len(times), -1, dtype=np.int64)
    for rank, w in windows.groupby("rank", sort=False):
        sel = np.flatnonzero(ranks == rank)
        if not len(sel):
            continue
        w = w.sort_values("start_ns")
        out[sel] = step_of(times[sel], *(w[c].to_numpy() for c in ("start_ns", "end_ns", "step")))
    return out


def step_of(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Step number of each time on one rank whose windows (sorted by start) are starts/ends/steps;
    -1 where no window holds it."""
    out = np.full(len(times), -1, dtype=np.int64)
    i = np.searchsorted(starts, times, side="right") - 1
    ok = i >= 0
    ok[ok] = times[ok] < ends[i[ok]]
    out[ok] = steps[i[ok]]
    return out


STEP_DEFINITION = (
    "the mean over ranks of the step's window: its ProfilerStep#N range in each rank's trace file "
    "(a trace without ProfilerStep: its first to last event)"
)
STEPS_DEFINITION = f"every step: the median over the traced steps of {STEP_DEFINITION.replace('the step', 'each step')}"


def measured_step_s(files: pd.DataFrame | None, fallback: pd.DataFrame, step: int | None = None) -> float | None:
    """The measured step, STEP_DEFINITION, wherever it is shown (the timeline's headline, what-if): the
    files' ProfilerStep#N windows (Traces.step_windows: rank, step, start_ns, end_ns) -- not a GPU's kernel
    span inside them, nor the span over all ranks; a set without ProfilerStep (or without `step`) takes
    `fallback`'s windows (the breakdown's: the whole trace per rank). step_time_s of them."""
    if files is not None and len(files) and (step is None or (files["step"] == step).any()):
        return step_time_s(files, step)
    return step_time_s(fallback, step)


def steady_step_s(windows: pd.DataFrame) -> float | None:
    """The trace's step time, one definition everywhere (what-if, the pages): the median over traced
    steps of the mean over ranks of the step's window (rank, step, start_ns, end_ns). None when empty."""
    return step_time_s(windows)


def step_time_s(windows: pd.DataFrame, step: int | None = None) -> float | None:
    """The measured step: the mean over ranks of `step`'s window; with no step, the median of that over
    the traced steps (steady_step_s). None when the windows hold no such step."""
    if windows is None or not len(windows):
        return None
    if step is not None:
        windows = windows[windows["step"] == step]
        if not len(windows):
            return None
    dur = (windows["end_ns"] - windows["start_ns"]).astype("float64")
    per_step = dur.groupby(windows["step"]).mean()
    return float(np.median(per_step.to_numpy())) / 1e9
