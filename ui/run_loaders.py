"""Cached loaders for the run pages: a trace set's analysis computed once per server (the collectives
table feeds every other analyzer), and each view's frames cached by plain arguments.

    key = set_key(trace_set)             # (path, file signature, plan JSON): changes when the files do
    b = analysis(key)                    # Analysis: its TraceAnalysis (front) and the pages' derived frames
    b = open_analysis(key)               # the same, for a page: first prepared in a process of its own
                                         # (profiler.analyzers.prepare), with progress and Cancel
    overview_view(key, step, first_rank)           # the step, coarse (cached without the window)
    detail_view(key, step, window, first_rank)     # the brushed window in detail

`analysis` is an st.cache_resource (the tables are shared, never copied: nobody mutates them);
views are st.cache_data. A set whose files change (a run that finished, a re-upload) gets a new key.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from profiler.analyzers import aggregates
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.layout import infer_layout
from profiler.analyzers.prepare import Preparation, State, budget_from_env
from profiler.analyzers.replay import critical_path as path_of
from profiler.analyzers.replay import replay
from profiler.analyzers.whatif import whatif as whatif_of
from profiler.collect.trace_sets import TraceSet
from profiler.traces.errors import TraceError
from profiler.traces.loader import default_workers
from profiler.traces.model import node_of_ranks
from profiler.traces.sources import resolve
from runfiles.rundir import METRICS_JSON, read_json
from ui import run_tables
from ui import whatif_tables as whatif_data
from ui.text import md

MAX_GANTT_RANKS = 64  # ranks drawn at once; larger sets pick a range
OVERVIEW_RECTS = 2500  # rectangles in the overview, over all ranks shown
DETAIL_RECTS = 6000  # ... in the detail view


def set_key(s: TraceSet) -> tuple:
    """(path, signature of its trace files, plan JSON) -- plain values, so the caches can key on them."""
    folder = s.path / "traces" if (s.path / "traces").is_dir() else s.path
    sig = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
    plan = json.dumps(s.plan, sort_keys=True) if s.kind == "upload" and s.plan else ""
    return str(s.path), sig, plan


@dataclass(frozen=True, eq=False)
class Analysis:
    """A set's TraceAnalysis (every analyzer, computed once) and what the run pages derive from it."""

    front: TraceAnalysis
    strag: pd.DataFrame  # every straggler, the largest skew first
    steps: list[int]
    inst_steps: pd.Series

    @property
    def traces(self):
        return self.front.traces

    @property
    def table(self) -> pd.DataFrame:
        return self.front.collectives

    @property
    def offsets(self) -> pd.DataFrame:
        return self.front.offsets

    @property
    def bd(self) -> pd.DataFrame:
        return self.front.breakdown

    @property
    def inst(self) -> pd.DataFrame:
        return self.front.instances

    @property
    def by_dim(self) -> pd.DataFrame:
        return self.front.comm_by_dim


PREVIEW = ("first ranks", MAX_GANTT_RANKS)  # appended to a key: the set's first ranks, drawn while it loads


def preview_key(key: tuple) -> tuple:
    """The key of `key`'s first MAX_GANTT_RANKS ranks (profiler.traces.sources.TraceSet.first_ranks)."""
    return key[:3] + PREVIEW


def _source(key: tuple):
    """What `key` loads: the set's path, or for a preview key the part of it holding its first ranks."""
    if key[3:] != PREVIEW:
        return key[0]
    return resolve(key[0]).first_ranks(PREVIEW[1])


def _load_options() -> dict:
    """Files parsed by one process per core, or on the Dask cluster of $PARASCOPE_DASK_SCHEDULER."""
    return {"workers": default_workers(), "scheduler": os.environ.get("PARASCOPE_DASK_SCHEDULER") or None}


@st.cache_resource(show_spinner="Opening the analysed traces …", max_entries=6)
def analysis(key: tuple) -> Analysis:
    """Load and analyse a set; raises profiler.TraceError with the loader's message when it cannot."""
    plan_json = key[2]
    front = TraceAnalysis.load(_source(key), json.loads(plan_json) if plan_json else None, **_load_options())
    # the pages read every table, so compute them now, inside the spinner, not on first click
    front.comm_by_dim  # noqa: B018
    return Analysis(
        front=front,
        strag=front.stragglers(top=None),
        steps=run_tables.steps_of(front.breakdown),
        inst_steps=aggregates.instance_steps(front.collectives),
    )


CANCELLED = "loads_cancelled"  # session state: the set keys whose first load the user stopped
MAX_PREPARING = 2  # sets analysed at once on this server; more wait their turn
POLL_S = 0.25
_READY: set = set()  # keys whose analysis this server has opened (their tables are in the cache)
_PREPARING: dict = {}  # key -> profiler.analyzers.prepare.Preparation, shared by every session
_PREPARING_LOCK = threading.Lock()


def open_analysis(key: tuple, preview: Callable[[tuple], None] | None = None) -> Analysis | None:
    """`analysis(key)` for a page. A set this server has not opened yet is first prepared in a process
    of its own (profiler.analyzers.prepare: parsed into the cache, every table computed and kept): the
    script thread only waits, drawing its progress and a Cancel button, so the server answers everyone
    meanwhile. A large set's first ranks are prepared first: `preview(preview_key(key))` then draws
    them above the progress bar (without widgets: the page draws its own once the set is ready).
    None when this session cancelled the load or the preparation ran out of its budget (the page then
    says so); raises profiler.TraceError when the set cannot be read."""
    cancelled = st.session_state.setdefault(CANCELLED, set())
    if key in cancelled:
        if not _drawn("load_again"):  # a page may ask in several sections
            st.info("Loading these traces was cancelled; nothing of that load was kept.")
            st.button("Load again", key="load_again", on_click=cancelled.discard, args=(key,))
        return None
    if key not in _READY:
        state = _wait(key, preview)
        if state.status == "cancelled":
            return None
        if state.status == "failed":
            if state.trace_error:
                raise TraceError(state.message)
            if not _drawn("prepare_again"):
                st.error(f"These traces could not be analysed: {md(state.message)}")
                st.button("Try again", key="prepare_again", on_click=_forget, args=(key,))
            return None
        _READY.add(key)
        _forget(key)
    return analysis(key)


def _drawn(widget_key: str) -> bool:
    """Whether this script run has already drawn the widget `widget_key`."""
    return widget_key in (getattr(get_script_run_ctx(), "widget_user_keys_this_run", None) or ())


def _wait(key: tuple, preview: Callable[[tuple], None] | None):
    """The preparation's final State, its progress drawn every POLL_S until then (and its first ranks,
    once ready, by `preview`). The loop only sleeps; a click (Cancel) or leaving the page stops it at
    the next draw, as any script run."""
    state = _prepared(key)
    if state is not None and state.status != "running":
        return state
    first, slot = st.empty(), st.empty()
    with slot.container():
        bar = st.progress(0.0, text="Starting the analysis …")
        st.button("Cancel", key="cancel_load", on_click=_cancel, args=(key,))
    shown = False
    while state is None or state.status == "running":
        if state is None:
            bar.progress(0.0, text="Waiting for the analysis of other trace sets to finish …")
        else:
            bar.progress(state.fraction, text=f"{state.text} ({state.elapsed_s:,.0f} s)")
            if state.preview and preview is not None and not shown:
                shown = True
                _draw_preview(first, key, preview)
        time.sleep(POLL_S)
        state = _prepared(key)
    first.empty()
    slot.empty()
    return state


def _draw_preview(where, key: tuple, preview: Callable[[tuple], None]) -> None:
    with where.container():
        try:
            preview(preview_key(key))
        except TraceError:  # the whole set's load says what is wrong
            pass


def _prepared(key: tuple):
    """The state of `key`'s preparation, started when there is none (or the last was cancelled by
    another session); None while MAX_PREPARING others run."""
    with _PREPARING_LOCK:
        if key in _READY:
            return State("done")
        p = _PREPARING.get(key)
        if p is not None and p.state().status != "cancelled":
            return p.state()
        if sum(q.state().status == "running" for q in _PREPARING.values()) >= MAX_PREPARING:
            return None
        time_s, memory_mb = budget_from_env()
        options = _load_options()
        p = _PREPARING[key] = Preparation(
            key[0],
            json.loads(key[2]) if key[2] else None,
            time_s=time_s,
            memory_mb=memory_mb,
            workers=options["workers"],
            scheduler=options["scheduler"],
            preview=PREVIEW[1],
        )
        return p.state()


def _forget(key: tuple) -> None:
    with _PREPARING_LOCK:
        _PREPARING.pop(key, None)


def _cancel(key: tuple) -> None:
    st.session_state.setdefault(CANCELLED, set()).add(key)
    with _PREPARING_LOCK:
        p = _PREPARING.get(key)
    if p is not None:
        p.cancel(wait=False)  # the click returns at once; its processes go in the background


@st.cache_data(show_spinner=False, max_entries=16)
def heat(key: tuple) -> pd.DataFrame:
    """Every rank x step: step time, exposed communication, arrival lateness (aggregates.rank_step_heat)."""
    b = analysis(key)
    return aggregates.rank_step_heat(b.bd, b.front.per_rank_wait, b.inst_steps)


def _budget(total: int, ranks: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, total // max(1, ranks)))


def _ranks(b: Analysis, first_rank: int) -> list[int]:
    return [r for r in b.traces.rank_ids if first_rank <= r < first_rank + MAX_GANTT_RANKS]


@st.cache_data(show_spinner=False, max_entries=32)
def overview_view(key: tuple, step: int, first_rank: int) -> dict:
    """The whole of `step` for ranks [first_rank, first_rank + MAX_GANTT_RANKS), coarse: frame (columns
    run_tables.OVERVIEW_COLUMNS), span (0, step length in ms), t0_ns (the step's start), ranks."""
    b = analysis(key)
    t0, t1 = run_tables.step_span(b.bd, b.offsets, step)
    ranks = _ranks(b, first_rank)
    rects = b.front.timeline(ranks=ranks, start_ns=t0, end_ns=t1, max_rects=_budget(OVERVIEW_RECTS, len(ranks), 8, 60))
    frame = run_tables.gantt_frame(rects, b.table, t0_ns=t0)[run_tables.OVERVIEW_COLUMNS]
    return {"frame": frame, "span": (0.0, (t1 - t0) / 1e6), "t0_ns": t0, "ranks": ranks}


@st.cache_data(show_spinner=False, max_entries=64)
def detail_view(key: tuple, step: int, window: tuple[float, float] | None, first_rank: int) -> dict:
    """`window` of `step` (ms from the step's start, clipped to it; None: the whole step) in detail,
    within the detail budget (timeline's level of detail): frame, window (None when the whole step)."""
    b = analysis(key)
    t0, t1 = run_tables.step_span(b.bd, b.offsets, step)
    span = (0.0, (t1 - t0) / 1e6)
    if window is not None:
        lo, hi = max(span[0], window[0]), min(span[1], window[1])
        window = (lo, hi) if hi > lo else None
    w = window or span
    ranks = _ranks(b, first_rank)
    rects = b.front.timeline(
        ranks=ranks,
        start_ns=t0 + int(w[0] * 1e6),
        end_ns=t0 + int(w[1] * 1e6),
        max_rects=_budget(DETAIL_RECTS, len(ranks), 20, 400),
    )
    return {"frame": run_tables.gantt_frame(rects, b.table, t0_ns=t0), "window": window}


@st.cache_data(show_spinner=False, max_entries=32)
def step_tables(key: tuple, step: int) -> dict:
    """The step's tables: per-rank breakdown (and its stacked parts), per-dimension totals, skew by
    (dim, op), the worst stragglers."""
    b = analysis(key)
    out = {
        "breakdown": run_tables.breakdown_table(b.bd, step),
        "parts": run_tables.breakdown_parts(b.bd, step),
        "dims": run_tables.dim_table(b.by_dim, step, b.table),
        "counts": aggregates.collective_counts(b.table, step),
        "skew": aggregates.skew_table(b.inst, b.inst_steps, step),
        "stragglers": run_tables.straggler_table(b.strag, b.inst_steps, step).head(20),
    }
    out["labels"] = run_tables.straggler_labels(out["stragglers"])
    out["summary"] = run_tables.step_summary(out["breakdown"], out["skew"], out["counts"])
    out["skew"] = out["skew"].rename(columns=lambda c: c.replace("_", " "))  # the table's headers
    moved = b.offsets[b.offsets["offset_ns"] != 0]
    out["clock_note"] = (
        f"Clocks of {len(moved)} ranks shifted onto rank {int(b.offsets['rank'].min())}'s clock "
        f"(aligned on collective ends; up to {moved['offset_ns'].abs().max() / 1e6:,.3f} ms)."
        if len(moved)
        else ""
    )
    return out


@st.cache_data(show_spinner=False, max_entries=16)
def rank_values(key: tuple) -> pd.DataFrame:
    b = analysis(key)
    return run_tables.rank_values(b.bd, b.table, b.inst)


@st.cache_data(show_spinner=False, max_entries=16)
def layout(key: tuple):
    """The layout of a set without a plan, from its process groups (profiler.analyzers.layout)."""
    b = analysis(key)
    return infer_layout(b.traces, b.table)


@st.cache_data(show_spinner=False, max_entries=16)
def device(key: tuple) -> dict | None:
    """The GPU the set ran on (profiler.analyzers.aggregates.job_device)."""
    return aggregates.job_device(analysis(key).traces.ranks)


@st.cache_data(show_spinner=False, max_entries=16)
def tp_measured(key: tuple) -> pd.DataFrame:
    b = analysis(key)
    return aggregates.tp_measured(b.table, node_of_ranks(b.traces.run, b.traces.hosts()))


def perfetto_bytes(key: tuple) -> bytes:
    """The merged Perfetto trace (gzip JSON), made when the download button is clicked."""
    with tempfile.TemporaryDirectory() as tmp:
        path = analysis(key).front.export_perfetto(Path(tmp) / "merged.json.gz")
        return path.read_bytes()


def collectives_csv(key: tuple) -> bytes:
    return analysis(key).table.to_csv(index=False).encode()


@st.cache_data(show_spinner=False, max_entries=16)
def metrics(path: str, mtime_ns: int) -> dict | None:
    """A run's metrics.json, read bounded (None when it cannot be read)."""
    return read_json(Path(path) / METRICS_JSON)


def run_metrics(s) -> dict | None:
    """A run's metrics.json (a TraceSet's), cached by its modification time; None when it has none
    or it cannot be read."""
    try:
        mtime = (s.path / "metrics.json").stat().st_mtime_ns
    except OSError:
        return None
    return metrics(str(s.path), mtime)


@st.cache_data(show_spinner=False, max_entries=32)
def critical_path(key: tuple, step: int) -> dict:
    """The cross-rank critical path of `step` (every step for ALL), measured: frame (whatif_data.path_frame,
    ms from the step's aligned start, as the overview draws), links (rank hops), categories."""
    b = analysis(key)
    g = b.front.graph
    t0, t1 = run_tables.step_span(b.bd, b.offsets, step)
    rp = replay(g)
    steps = b.steps if step == aggregates.ALL else [step]
    path = pd.concat([path_of(g, rp, s) for s in steps], ignore_index=True)
    frame = whatif_data.path_frame(path, t0)
    return {
        "frame": frame,
        "links": whatif_data.path_links(frame),
        "categories": whatif_data.path_categories(path),
        "extent": whatif_data.path_extent(frame, span_ms=(t1 - t0) / 1e6, steps=len(steps)),
    }


@st.cache_data(show_spinner=False, max_entries=32)
def whatif(
    key: tuple,
    rank: int | None,
    speed: str | float | None,
    link: str | None,
    link_factor: float,
    overlap: tuple[str, ...],
    microbatches: int | None,
    step: int | None = None,
) -> dict:
    """profiler.analyzers.whatif's object for the form's scenario at `step` (None: every step; plain
    values: the cache key)."""
    b = analysis(key)
    scenario = whatif_data.scenario_of(rank=rank, speed=speed, link=link, link_factor=link_factor, overlap=overlap)
    return whatif_of(b.front.graph, scenario, plan=b.front.layout_plan, microbatches=microbatches, step=step)
