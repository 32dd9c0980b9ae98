"""Altair charts of the Long-context page (frames of parallel.core.long_context in, charts out): activation
memory and communication per layer against sequence length on log axes, one line per variant.

Pure: altair, pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

# powers of two, labelled 64, 4K, 1M (a run of the tiny models sits at 64 tokens)
_LEN_LABEL = "datum.value >= 1048576 ? datum.value / 1048576 + 'M' : datum.value >= 1024 ? datum.value / 1024 + 'K' : datum.value"


def _x(lengths) -> alt.X:
    ticks = [int(v) for v in sorted(set(lengths))]
    return alt.X(
        "seq_len:Q",
        title="sequence length (tokens)",
        scale=alt.Scale(type="log", base=2, nice=False),
        axis=alt.Axis(values=ticks, labelExpr=_LEN_LABEL),
    )


def _color(variants: list[str], orient: str = "bottom") -> alt.Color:
    legend = alt.Legend(orient=orient, columns=2) if orient == "bottom" else alt.Legend(orient=orient, labelLimit=260)
    return alt.Color("variant:N", title="plan", sort=variants, legend=legend)


# Streamlit fits the axes and a bottom legend into a chart's height: eight decades of GiB need the
# whole height for the plot, so that chart's legend goes to the right
MEMORY_CHART_PX = 420


def memory_chart(curves: pd.DataFrame, measured: pd.DataFrame, capacity_gib: float) -> alt.LayerChart:
    """GiB of activations per microbatch on one GPU against length; the GPU's memory as a dashed rule;
    measured runs as black-edged points on their variant's curve."""
    variants = list(dict.fromkeys(curves["variant"]))
    y = alt.Y("GiB:Q", title="GiB per GPU (activations, one microbatch)", scale=alt.Scale(type="log"))
    tips = [
        alt.Tooltip("variant:N", title="plan"),
        alt.Tooltip("seq_len:Q", title="tokens", format=","),
        alt.Tooltip("GiB:Q", title="GiB", format=",.3f"),
    ]
    x = _x(curves["seq_len"])
    lines = (
        alt.Chart(curves)
        .mark_line(point=alt.OverlayMarkDef(size=40), strokeWidth=2)
        .encode(x=x, y=y, color=_color(variants, "right"), tooltip=tips)
    )
    cap = (
        alt.Chart(pd.DataFrame({"GiB": [capacity_gib], "label": [f"GPU memory {capacity_gib:,.0f} GiB"]}))
        .mark_rule(strokeDash=[6, 4], color="#495057")
        .encode(y=alt.Y("GiB:Q"), tooltip=[alt.Tooltip("label:N", title="")])
    )
    layers = [lines, cap]
    if len(measured):
        layers.append(
            alt.Chart(measured)
            .mark_point(filled=True, size=140, shape="diamond", stroke="#000000", strokeWidth=1.5)
            .encode(
                x=x,
                y=y,
                color=_color(variants, "right"),
                tooltip=[*tips, alt.Tooltip("run:N", title="measured in run")],
            )
        )
    return alt.layer(*layers).properties(height=MEMORY_CHART_PX)


def comm_chart(curves: pd.DataFrame) -> alt.FacetChart:
    """Milliseconds of TP/SP/CP communication per layer per microbatch against length, one panel per
    link; the dashed grey line is the attention core's compute per layer (ring attention's transfers
    are hidden up to it)."""
    variants = list(dict.fromkeys(curves["variant"]))
    y = alt.Y("ms:Q", title="ms per layer per microbatch", scale=alt.Scale(type="log"))
    tips = [
        alt.Tooltip("variant:N", title="plan"),
        alt.Tooltip("seq_len:Q", title="tokens", format=","),
        alt.Tooltip("ms:Q", title="ms", format=",.3f"),
        alt.Tooltip("attention_ms:Q", title="attention compute ms", format=",.3f"),
    ]
    x = _x(curves["seq_len"])
    lines = (
        alt.Chart().mark_line(point=alt.OverlayMarkDef(size=30)).encode(x=x, y=y, color=_color(variants), tooltip=tips)
    )
    compute = (
        alt.Chart()
        .transform_aggregate(attention_ms="min(attention_ms)", groupby=["seq_len", "link"])
        .mark_line(strokeDash=[4, 4], color="#868e96")
        .encode(x=x, y=alt.Y("attention_ms:Q"), tooltip=[alt.Tooltip("attention_ms:Q", title="attention compute ms")])
    )
    return alt.layer(lines, compute, data=curves, width=360, height=280).facet(
        column=alt.Column("link:N", title=None, header=alt.Header(labelFontSize=13, labelFontWeight="bold"))
    )
