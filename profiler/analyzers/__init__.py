"""Analyzers: `(traces, plan=None, ...) -> DataFrame`, long-form, no plotting, inputs never mutated.

    collectives(traces, plan)    one row per collective per rank          (collectives.py)
    instances / per_rank_wait / clock_offsets   matched across ranks       (matching.py)
    breakdown / comm_by_dim      per rank per step time split              (breakdown.py)
    timeline                     level-of-detail rectangles per rank       (timeline.py)
    export_perfetto / export_collectives                                   (export.py)
"""

from .collectives import collectives

__all__ = ["collectives"]
