"""The Hang page's rank grid: nodes x local GPUs, each rank coloured by its last completed collective
in the root cause's dimension, the suspects outlined (frames of profiler.analyzers.hang.diagnose in,
an `alt.Chart` out).

Pure: altair and pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

MAX_CELLS = 4096  # ranks drawn; past it the first MAX_CELLS and the suspects


def rank_cells(report: dict, world: int, gpus_per_node: int, nodes: dict[int, int] | None = None) -> pd.DataFrame:
    """One row per rank (the first MAX_CELLS and every suspect): rank, node, gpu (local index), last
    (its last completed collective of the root cause's dimension, None without a dump), suspect (kind
    or '')."""
    last = {int(r): v for r, v in report["progress"]["last_completed"].items()}
    kinds = {}
    for s in report["suspects"]:
        kinds.setdefault(s["rank"], s["kind"])
    nodes = nodes or {}
    rows = []
    shown = range(world) if world <= MAX_CELLS else sorted({*range(MAX_CELLS), *(r for r in kinds if r < world)})
    dumped = set(report["ranks"])
    for r in shown:
        node = nodes.get(r, r // gpus_per_node)
        rows.append(
            {
                "rank": r,
                "node": node,
                "gpu": r % gpus_per_node,
                "last": last.get(r),
                "dumped": r in dumped,
                "suspect": kinds.get(r, ""),
            }
        )
    return pd.DataFrame(rows)


def rank_grid_chart(cells: pd.DataFrame, dim: str | None) -> alt.LayerChart:
    """Nodes down, local GPUs across; colour: the last completed collective number (grey: no dump);
    red outline and a label: the suspects."""
    base = alt.Chart(cells).encode(
        x=alt.X("gpu:O", title="GPU in node"),
        y=alt.Y("node:O", title="node"),
        tooltip=[
            alt.Tooltip("rank:Q"),
            alt.Tooltip("node:Q"),
            alt.Tooltip("gpu:Q", title="GPU"),
            alt.Tooltip("last:Q", title=f"last completed {dim or ''} collective"),
            alt.Tooltip("suspect:N"),
        ],
    )
    cells_layer = base.mark_rect(stroke="white", strokeWidth=1).encode(
        color=alt.condition(
            "datum.last === null",
            alt.value("#dee2e6"),
            alt.Color(
                "last:Q",
                title=f"last completed {dim.upper() if dim else ''} collective #",
                scale=alt.Scale(scheme="blues"),
            ),
        )
    )
    outline = base.transform_filter("datum.suspect !== ''").mark_rect(fill=None, stroke="#e03131", strokeWidth=3)
    labels = base.mark_text(fontSize=10).encode(text=alt.Text("rank:Q"))
    height = max(160, 40 * int(cells["node"].nunique()))
    return alt.layer(cells_layer, outline, labels).properties(height=height, title="Ranks by last completed collective")
