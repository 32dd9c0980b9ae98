"""Analyzers: `(traces, plan=None, ...) -> DataFrame`, long-form, no plotting, inputs never mutated.

    collectives(traces, plan)                      one row per collective per rank  (collectives.py)
    instances / per_rank_wait / stragglers / clock_offsets   matched across ranks  (matching.py)
    breakdown / comm_by_dim                        per rank per step time split     (breakdown.py)
    timeline                                       level-of-detail Gantt rectangles (timeline.py)
    export_perfetto / export_collectives           merged trace, CSV/Parquet        (export.py)

Every analyzer but `collectives` takes `table=` (a collectives table already computed for the same
traces and plan). Callers do not chain them: `TraceAnalysis` (front.py) computes each once, on demand.
"""

from profiler.analyzers.breakdown import breakdown, comm_by_dim
from profiler.analyzers.collectives import collectives
from profiler.analyzers.export import export_collectives, export_perfetto
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.matching import clock_offsets, instances, per_rank_wait, stragglers
from profiler.analyzers.timeline import timeline

__all__ = [
    "TraceAnalysis",
    "breakdown",
    "clock_offsets",
    "collectives",
    "comm_by_dim",
    "export_collectives",
    "export_perfetto",
    "instances",
    "per_rank_wait",
    "stragglers",
    "timeline",
]
