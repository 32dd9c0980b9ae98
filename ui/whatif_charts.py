"""Charts of the what-if section: measured vs predicted phases, and the pipeline's bubble vs P2P wait.

Pure chart builders: a DataFrame in (ui.whatif_tables), an `alt.Chart` out.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ui.timeline_charts import LEGEND_PX

PIPELINE_PARTS = {"work ms": "#ced4da", "bubble ms": "#74c0fc", "P2P wait ms": "#e03131", "P2P transfer ms": "#1c7ed6"}


def phases_chart(rows: pd.DataFrame) -> alt.Chart:
    """Per phase (work, wait, each dim's transfer), the measured and the predicted ms per rank and step."""
    return (
        alt.Chart(rows, width="container", height=220 + LEGEND_PX)
        .mark_bar()
        .encode(
            y=alt.Y("phase:N", title=None, sort=None),
            yOffset=alt.YOffset("which:N", sort=["measured", "predicted"]),
            x=alt.X("ms:Q", title="ms per rank and step (mean)"),
            color=alt.Color(
                "which:N",
                title=None,
                scale=alt.Scale(domain=["measured", "predicted"], range=["#495057", "#d6336c"]),
                legend=alt.Legend(orient="bottom"),
            ),
            tooltip=[alt.Tooltip("which:N"), alt.Tooltip("phase:N"), alt.Tooltip("ms:Q", format=",.2f")],
        )
    )


def pipeline_chart(table: pd.DataFrame) -> alt.Chart:
    """Per stage, its step split into work, schedule bubble, P2P wait (a late peer) and P2P transfer (ms)."""
    parts = [p for p in PIPELINE_PARTS if p in table.columns]
    long = table.melt(id_vars=["stage"], value_vars=parts, var_name="part", value_name="ms")
    return (
        alt.Chart(long, width="container", height=max(90, 36 * int(table["stage"].nunique())) + LEGEND_PX)
        .mark_bar()
        .encode(
            y=alt.Y("stage:O", title="pipeline stage"),
            x=alt.X("ms:Q", title="ms per step (mean over the stage's ranks)", stack="zero"),
            color=alt.Color(
                "part:N",
                title=None,
                scale=alt.Scale(domain=parts, range=[PIPELINE_PARTS[p] for p in parts]),
                legend=alt.Legend(orient="bottom"),
            ),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("stage:O"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=",.2f")],
        )
        .transform_calculate(order=f"indexof({parts!r}, datum.part)")
    )


def prediction_chart(phases: pd.DataFrame, measured_ms: float) -> alt.LayerChart:
    """The calibrated prediction's phases stacked in one bar, and the measured steady step as a rule."""
    bar = (
        alt.Chart(phases.assign(row="predicted"), width="container", height=60 + LEGEND_PX)
        .mark_bar()
        .encode(
            y=alt.Y("row:N", title=None),
            x=alt.X("ms:Q", title="ms per step", stack="zero"),
            color=alt.Color("phase:N", title=None, sort=None, legend=alt.Legend(orient="bottom", columns=5)),
            tooltip=[alt.Tooltip("phase:N"), alt.Tooltip("ms:Q", format=",.1f")],
        )
    )
    rule = (
        alt.Chart(pd.DataFrame({"ms": [measured_ms], "what": ["measured"]}))
        .mark_rule(color="#212529", strokeWidth=2, strokeDash=[4, 2])
        .encode(x="ms:Q", tooltip=[alt.Tooltip("what:N"), alt.Tooltip("ms:Q", title="measured ms", format=",.1f")])
    )
    return alt.layer(bar, rule)
