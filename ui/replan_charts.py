"""The Re-plan page's chart: the measured step and the modelled one, each one bar stacked by the parts
the plan model splits a step into. Pure chart builder: a DataFrame in (Replan.components_frame), an
`alt.Chart` out.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from profiler.analyzers.split import COMPONENTS
from ui.timeline_charts import LEGEND_PX

COLORS = {  # compute in greys and greens, communication by dimension, the rest warm
    "gemm": "#2b8a3e",
    "attention": "#69db7c",
    "elementwise": "#b2f2bb",
    "optimizer": "#868e96",
    "exposed_tp": "#1c7ed6",
    "exposed_sp": "#74c0fc",
    "exposed_cp": "#7048e8",
    "exposed_ep": "#be4bdb",
    "exposed_pp": "#f08c00",
    "exposed_dp": "#e03131",
    "exposed_other": "#ffa8a8",
    "bubble": "#ffd43b",
    "memory": "#a5d8ff",
    "idle": "#dee2e6",
}
assert set(COLORS) == set(COMPONENTS)


def step_parts_chart(frame: pd.DataFrame) -> alt.Chart:
    """Measured and modelled step, one stacked bar each, in ms, parts in the split's order."""
    present = [c for c in COMPONENTS if c in set(frame["component"])]
    data = frame.assign(ms=frame["seconds"] * 1e3)
    return (
        alt.Chart(data, width="container", height=120 + LEGEND_PX)
        .mark_bar()
        .encode(
            y=alt.Y("side:N", title=None, sort=["measured", "modelled"]),
            x=alt.X("ms:Q", title="ms per step", stack="zero"),
            color=alt.Color(
                "component:N",
                title=None,
                scale=alt.Scale(domain=present, range=[COLORS[c] for c in present]),
                legend=alt.Legend(orient="bottom", columns=5),
            ),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("side:N"), alt.Tooltip("component:N"), alt.Tooltip("ms:Q", format=",.2f")],
        )
    )
