"""A trace set's re-plan (profiler.analyzers.replan) worked out off the script thread, as trace
preparation is (ui.run_loaders.open_analysis): the page waits on it, drawing its phase and a Cancel
button, so the server answers everyone meanwhile; one job per (set, options) on this server, shared
by every session, its result kept once done.

    r = open_replan(key, front, gpus=None)     # Replan, or None when cancelled / failed (the page is told)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import streamlit as st

from parallel.core.calibrated import CalibrationError, read_calibration
from profiler.analyzers.replan import replan
from profiler.collect.runs_calibration import calibration_path
from ui.text import md

POLL_S = 0.25
MAX_KEPT = 16  # finished re-plans kept on this server


class Cancelled(Exception):
    """Raised from the re-plan's progress hook once its job is cancelled."""


@dataclass
class Job:
    text: str = "starting the re-plan"
    fraction: float = 0.0
    result: object = None
    error: str | None = None
    done: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)


_JOBS: dict[tuple, Job] = {}
_LOCK = threading.Lock()


def _calibration():
    """This machine's calibration (Home writes it), for a CPU set; None: fit one to the set itself."""
    path = calibration_path()
    try:
        return read_calibration(path) if path.is_file() else None
    except CalibrationError:
        return None


def _work(job: Job, front, gpus: int | None) -> None:
    def progress(text: str, fraction: float) -> None:
        if job.cancel.is_set():
            raise Cancelled
        job.text, job.fraction = text, fraction

    try:
        job.result = replan(front, gpus=gpus, calibration=_calibration(), cores=os.cpu_count() or 1, progress=progress)
    except Cancelled:
        job.error = "cancelled"
    except ValueError as err:  # ReplanError, IdentifyError, TraceError, SpecError: one line each
        job.error = str(err)
    except Exception as err:  # noqa: BLE001 -- a page shows what went wrong rather than a dead thread
        job.error = f"{type(err).__name__}: {err}"
    finally:
        job.done = True


def _job(key: tuple, front, gpus: int | None) -> Job:
    with _LOCK:
        job = _JOBS.get((key, gpus))
        if job is None or job.error == "cancelled":
            job = _JOBS[(key, gpus)] = Job()
            threading.Thread(target=_work, args=(job, front, gpus), daemon=True, name="replan").start()
            done = [k for k, j in _JOBS.items() if j.done]
            for k in done[: max(0, len(done) - MAX_KEPT)]:
                _JOBS.pop(k, None)
        return job


def _cancel(key: tuple, gpus: int | None) -> None:
    with _LOCK:
        job = _JOBS.get((key, gpus))
    if job is not None:
        job.cancel.set()


def open_replan(key: tuple, front, gpus: int | None = None):
    """The set's Replan, waited for with its progress and a Cancel button; None (the page told why)
    when it was cancelled or cannot be re-planned."""
    job = _job(key, front, gpus)
    if not job.done:
        slot = st.empty()
        with slot.container():
            bar = st.progress(0.0, text="Re-planning …")
            st.button("Cancel", key="replan_cancel", on_click=_cancel, args=(key, gpus))
        while not job.done:
            bar.progress(job.fraction, text=f"{job.text} ({time.monotonic() - job.started:,.0f} s)")
            time.sleep(POLL_S)
        slot.empty()
    if job.error == "cancelled":
        st.info("The re-plan was cancelled.")
        st.button("Re-plan again", key="replan_again", on_click=_forget, args=(key, gpus))
        return None
    if job.error:
        st.error(f"This set cannot be re-planned: {md(job.error)}")
        return None
    return job.result


def _forget(key: tuple, gpus: int | None) -> None:
    with _LOCK:
        _JOBS.pop((key, gpus), None)
