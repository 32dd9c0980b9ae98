"""ProfilerStep windows per rank, and which step a time falls in.

`step_windows(traces)` -> one row per (rank, step): start_ns, end_ns of the `ProfilerStep#N` range on
the CPU. `assign_steps` maps (rank, time) pairs to the step whose window holds the time, -1 if none.

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.traces.model import Traces
from profiler.traces.patterns import profiler_step


def step_windows(traces: Traces) -> pd.DataFrame:
    ev = traces.events
    steps = ev.loc[ev["kind"] == "step", ["rank", "name", "ts_ns", "dur_ns"]]
    frame = pd.DataFrame(
        {
            "rank": steps["rank"].to_numpy(dtype=np.int64),
            "step": [profiler_step(str(n)) for n in steps["name"]],
            "start_ns": steps["ts_ns"].to_numpy(),
            "end_ns": (steps["ts_ns"] + steps["dur_ns"]).to_numpy(),
        }
    )
    # One window per (rank, step): a step recorded twice (nested exports) keeps its widest span.
    frame = frame.groupby(["rank", "step"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    return frame.sort_values(["rank", "start_ns"], ignore_index=True)


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
        starts, ends, steps = (w[c].to_numpy() for c in ("start_ns", "end_ns", "step"))
        i = np.searchsorted(starts, times[sel], side="right") - 1
        ok = i >= 0
        ok[ok] = times[sel][ok] < ends[i[ok]]
        out[sel[ok]] = steps[i[ok]]
    return out
