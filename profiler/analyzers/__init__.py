"""Analyzers: `(traces, plan=None, ...) -> DataFrame`, long-form, no plotting, inputs never mutated.

    collectives(traces, plan)                      one row per collective per rank  (collectives.py)
    instances / per_rank_wait / stragglers / clock_offsets   matched across ranks  (matching.py)
    breakdown / comm_by_dim                        per rank per step time split     (breakdown.py)
    timeline                                       level-of-detail Gantt rectangles (timeline.py)
    export_perfetto / export_collectives           merged trace, CSV/Parquet        (export.py)

Every analyzer but `collectives` takes `table=` (a collectives table already computed for the same
traces and plan) so a page computes it once.
"""

from .breakdown import breakdown, comm_by_dim
from .collectives import collectives
from .export import export_collectives, export_perfetto
from .matching import clock_offsets, instances, per_rank_wait, stragglers
from .timeline import timeline

__all__ = ["breakdown", "clock_offsets", "collectives", "comm_by_dim", "export_collectives", "export_perfetto",
           "instances", "per_rank_wait", "stragglers", "timeline"]
