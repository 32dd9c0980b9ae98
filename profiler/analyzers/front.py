"""The one front of the analyzers (HolisticTraceAnalysis' `TraceAnalysis` is the model): a trace set
and an optional plan, each analysis computed once, on first use, from the pieces it shares with the
others (the collectives table feeds all of them; clock offsets feed the matching and the timeline).

    from profiler import TraceAnalysis
    a = TraceAnalysis.load("runs/demo")            # or TraceAnalysis(traces, plan)
    a.collectives, a.offsets, a.per_rank_wait, a.instances, a.breakdown, a.comm_by_dim
    a.stragglers(top=20), a.timeline(ranks=..., start_ns=..., end_ns=...), a.export_perfetto(path)
    a.layout_plan, a.graph                         # the plan the set ran (given, run.json's, inferred);
                                                   # the steps' dependency graph (replay.py)
    a.summary(top=20)                              # `python -m profiler analyze --json`'s object
    a.step_split()                                 # the step split as the plan model splits it (split.py)

The pages, `profiler analyze`, the TP sweep and the benches all ask this object; none chains the
analyzers itself. Results are shared, never copied: callers must not mutate them. For a set in the
cache, the tables are kept in its entry (per plan and alignment), so the next analysis of the same
bytes reads them: a warm `profiler analyze` does no analysis at all.

Pure: pandas and numpy.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.plan import Plan
from profiler.analyzers import aggregates, bubble
from profiler.analyzers.breakdown import breakdowns
from profiler.analyzers.collectives import collectives
from profiler.analyzers.export import export_collectives, export_perfetto
from profiler.analyzers.labels import plan_of
from profiler.analyzers.layout import infer_layout
from profiler.analyzers.matching import clock_offsets, instances, per_rank_wait, stragglers
from profiler.analyzers.replay import Graph, build_graph
from profiler.analyzers.split import StepSplit, compute_classes, step_split
from profiler.analyzers.timeline import timeline
from profiler.traces.loader import load_traces
from profiler.traces.model import Traces, node_of_ranks
from profiler.traces.store import load_frame, save_frame

ANALYSIS_VERSION = "3"  # bump when an analyzer's table changes: it keys the results kept in the cache


class TraceAnalysis:
    """Every analysis of one trace set under one plan (a Plan, its dict, or None: run.json's or none)
    and one clock alignment ('auto' aligns hosts on collective ends, 'ranks' every rank, 'none')."""

    def __init__(
        self, traces: Traces, plan: Any = None, *, align: str = "auto", workers: int = 1, scheduler: str | None = None
    ):
        self.traces = traces
        self.plan = plan
        self.align = align
        self.workers = workers  # processes for the per-rank work (the collectives' rows) ...
        self.scheduler = scheduler  # ... or a Dask cluster's tasks

    @cached_property
    def _results(self) -> Path | None:
        """Where this (set, plan, alignment)'s tables are kept: inside the set's cache entry, keyed by
        the plan the labels use; None for a set outside the cache (nothing is kept)."""
        folder = self.traces.store.folder
        if folder is None or not self.traces.key or folder.name != self.traces.key:
            return None
        plan = plan_of(self.plan, self.traces)  # the plan that labels (run.json's when none is given)
        text = f"{ANALYSIS_VERSION}:{self.align}:{plan!r}"
        return folder / f"analysis-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def _kept(self, name: str, compute) -> pd.DataFrame:
        """`compute()`, or the table kept from an earlier analysis of the same set and plan."""
        return self._kept_all((name,), lambda: (compute(),))[0]

    def _kept_all(self, names: tuple[str, ...], compute) -> tuple[pd.DataFrame, ...]:
        """The tables `names` kept together (all or none), else `compute()`'s, which are then kept."""
        where = self._results
        if where is not None:
            hits = tuple(load_frame(where / f"{n}.arrow") for n in names)
            if all(h is not None for h in hits):
                return hits
        frames = compute()
        if where is not None:
            for name, frame in zip(names, frames):
                save_frame(frame, where / f"{name}.arrow")
        return frames

    @classmethod
    def load(cls, source: Any, plan: Any = None, *, align: str = "auto", **load_options: Any) -> TraceAnalysis:
        """Load `source` (a run directory, folder, files or archive; see load_traces) and analyse it."""
        return cls(
            load_traces(source, **load_options),
            plan,
            align=align,
            workers=load_options.get("workers", 1),
            scheduler=load_options.get("scheduler"),
        )

    @cached_property
    def collectives(self) -> pd.DataFrame:
        return self._kept(
            "collectives",
            lambda: collectives(self.traces, self.plan, workers=self.workers, scheduler=self.scheduler),
        )

    @cached_property
    def offsets(self) -> pd.DataFrame:
        return self._kept("offsets", lambda: clock_offsets(self.traces, table=self.collectives, align=self.align))

    @cached_property
    def per_rank_wait(self) -> pd.DataFrame:
        return self._kept(
            "per_rank_wait",
            lambda: per_rank_wait(
                self.traces, self.plan, table=self.collectives, align=self.align, offsets=self.offsets
            ),
        )

    @cached_property
    def instances(self) -> pd.DataFrame:
        return self._kept(
            "instances",
            lambda: instances(self.traces, self.plan, table=self.collectives, align=self.align, per=self.per_rank_wait),
        )

    @cached_property
    def _breakdowns(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self._kept_all(
            ("breakdown", "comm_by_dim"),
            lambda: breakdowns(
                self.traces, self.plan, table=self.collectives, workers=self.workers, scheduler=self.scheduler
            ),
        )

    @property
    def breakdown(self) -> pd.DataFrame:
        return self._breakdowns[0]

    @property
    def comm_by_dim(self) -> pd.DataFrame:
        return self._breakdowns[1]

    @cached_property
    def layout_plan(self) -> Plan:
        """The plan that places ranks: the one given, else run.json's, else the layout the process groups
        imply (analyzers.layout; DP over the world when nothing is known)."""
        plan = plan_of(self.plan, self.traces)
        if plan is None:
            plan = infer_layout(self.traces, self.collectives).plan
        return plan

    @cached_property
    def graph(self) -> Graph:
        """The traced steps' dependency graph (replay.build_graph), stages from layout_plan."""
        plan = self.layout_plan
        topo = plan.topology(max(plan.world_size, 1))
        stage = {r: int(topo.coords_of(r)["pp"]) for r in self.traces.rank_ids if r < plan.world_size}
        return build_graph(
            self.traces,
            self.per_rank_wait,
            self.breakdown,
            self.offsets,
            stage=stage,
            nodes=node_of_ranks(self.traces.run, self.traces.hosts()),
        )

    def step_split(self) -> StepSplit:
        """The measured step split as the plan model splits it (analyzers.split): compute by kernel
        class, exposed communication per dimension, bubble (layout_plan's pipeline), idle, optimizer."""
        plan = self.layout_plan
        classes = self._kept(
            "compute_classes", lambda: compute_classes(self.traces, workers=self.workers, scheduler=self.scheduler)
        )
        phases = None
        if plan.pp > 1:
            phases = bubble.pipeline_phases(self.graph, pp=plan.pp, vpp=plan.vpp, microbatches=plan.microbatches)
        return step_split(self.breakdown, self.comm_by_dim, classes, phases)

    def stragglers(self, top: int | None = 20) -> pd.DataFrame:
        """The `top` (None: all) instances with the largest arrival skew."""
        return stragglers(
            self.traces, self.plan, table=self.collectives, align=self.align, top=top, inst=self.instances
        )

    def timeline(
        self, *, ranks: Any = None, start_ns: int | None = None, end_ns: int | None = None, max_rects: int = 1000
    ) -> pd.DataFrame:
        """Level-of-detail rectangles of a window, on aligned clocks (see analyzers.timeline)."""
        return timeline(
            self.traces,
            self.plan,
            ranks=ranks,
            start_ns=start_ns,
            end_ns=end_ns,
            max_rects=max_rects,
            table=self.collectives,
            offsets=self.offsets,
        )

    def export_perfetto(self, path: str | Path, *, ranks: Any = None) -> Path:
        return export_perfetto(self.traces, path, ranks=ranks, offsets=self.offsets, table=self.collectives)

    def export_collectives(self, path: str | Path) -> Path:
        return export_collectives(self.collectives, path)

    def page_tables(self) -> dict:
        """What the dashboard's run pages show, as plain records: rank_step_heat (every rank x step: step
        ms, exposed ms, arrival lateness), skew (per dim and op over all steps: count, median / p95 / max
        arrival skew ms) and tp_measured (TP-group collectives by group size, SP and link: the TP-scaling
        overlay's measured cost)."""
        steps = aggregates.instance_steps(self.collectives)
        heat = aggregates.rank_step_heat(self.breakdown, self.per_rank_wait, steps)
        skew = aggregates.skew_table(self.instances, steps, aggregates.ALL)
        tp = aggregates.tp_measured(self.collectives, node_of_ranks(self.traces.run, self.traces.hosts()))
        return {
            name: _records(frame) for name, frame in (("rank_step_heat", heat), ("skew", skew), ("tp_measured", tp))
        }

    def summary(self, top: int = 20) -> dict:
        """The `profiler analyze --json` object: world_size, ranks, steps, collectives (per op and
        dim: count, bytes, time_us), per_rank (compute/comm/exposed/idle us over steps), stragglers."""
        traces, table = self.traces, self.collectives
        gpu = {r for r in traces.rank_ids if traces.device_of(r) == "gpu"}
        mask = np.array([(s == "kernel") if r in gpu else True for r, s in zip(table["rank"], table["source"])], bool)
        counted = table[mask]  # a boolean array: an empty list would select no columns instead of no rows
        agg = (
            counted.assign(b=counted["bytes"].fillna(0).astype("int64"))
            .groupby(["op", "dim"], observed=True, sort=True)
            .agg(count=("rank", "size"), bytes=("b", "sum"), time_ns=("dur_ns", "sum"))
            .reset_index()
        )
        bd = self.breakdown.groupby("rank", sort=True)[["compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns"]].sum()
        slow = self.stragglers(top=top)
        views = self.page_tables()
        return {
            "world_size": traces.world_size,
            "ranks": traces.rank_ids,
            "steps": traces.steps,
            "collectives": [
                {
                    "op": str(r.op),
                    "dim": str(r.dim),
                    "count": int(r.count),
                    "bytes": int(r.bytes),
                    "time_us": round(float(r.time_ns) / 1000, 3),
                }
                for r in agg.itertuples()
            ],
            "per_rank": [
                {
                    "rank": int(rank),
                    "compute_us": round(float(r.compute_ns) / 1000, 3),
                    "comm_us": round(float(r.comm_ns) / 1000, 3),
                    "exposed_comm_us": round(float(r.exposed_comm_ns) / 1000, 3),
                    "idle_us": round(float(r.idle_ns) / 1000, 3),
                }
                for rank, r in bd.iterrows()
            ],
            "stragglers": [
                {
                    "op": str(r.op),
                    "dim": str(r.dim),
                    "seq": int(r.seq),
                    "late_rank": int(r.late_rank),
                    "skew_us": round(float(r.skew_ns) / 1000, 3),
                }
                for r in slow.itertuples()
            ],
            **views,  # after the original keys: tools that read them in order keep working
        }


def _records(frame: pd.DataFrame) -> list[dict]:
    """A frame as JSON-ready records: numpy scalars as Python numbers, NaN as None."""
    clean = frame.astype(object).where(frame.notna(), None)
    return [
        {str(k): (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in clean.to_dict("records")
    ]
