"""Altair chart builders for the Collective timeline page (frames of ui.run_tables in).

    gantt_overview_chart(frame, window=(a, b))   # every rank, coarse; drag to brush a time window
    gantt_detail_chart(frame, window=(a, b))     # the window in detail; click a collective to highlight
                                                 # the same instance on every rank of its group
    breakdown_chart(parts)                       # per-rank stacked bar: compute / overlapped / exposed / idle

Rows are ranks; in the detail view each rank has a compute lane and a collective lane (and memory
copies on GPU ranks). Collectives are coloured by the parallel dimension they serve (ui.theme
DIM_COLORS), compute and memory copies in quiet greys. Pure: altair, pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ui.run_tables import PARTS
from ui.theme import ACTIVITY_COLORS, scale

PATH_COLOR = "#d6336c"  # the critical path: a colour no activity uses

PART_COLORS = dict(zip(PARTS, ("#adb5bd", "#ffc9a8", "#e8590c", "#b197fc", "#f1f3f5")))
BRUSH = "brush"  # the overview's interval selection: st.altair_chart(..., on_select=...) reports it by this name
PICK = "pick"
LEGEND_PX = 130  # x axis, its title and the legend below the plot


def _tooltip(detail: bool = True) -> list[alt.Tooltip]:
    """Hover text; the overview's frame has fewer columns (run_data.OVERVIEW_COLUMNS), and compute or
    memory-copy rectangles have no collective fields (detail=False), so they show no empty ones."""
    head = [alt.Tooltip("rank:O", title="rank"), alt.Tooltip("label:N", title="op / kernel")]
    comm = [
        alt.Tooltip("dim:N", title="dimension"),
        alt.Tooltip("bytes:Q", title="bytes", format=",d"),
        alt.Tooltip("group:N", title="group ranks"),
        alt.Tooltip("busbw_gbps:Q", title="busbw GB/s", format=",.3g"),
    ]
    tail = [
        alt.Tooltip("start_ms:Q", title="start ms", format=",.3f"),
        alt.Tooltip("dur_ms:Q", title="ms", format=",.3f"),
        alt.Tooltip("n_events:Q", title="events merged"),
        alt.Tooltip("busy_pct:Q", title="busy %"),
    ]
    return head + (comm if detail else []) + tail


def _color(frame: pd.DataFrame) -> alt.Color:
    present = set(frame["category"].astype(str)) if len(frame) else set()
    return alt.Color(
        "category:N",
        title=None,
        scale=scale(ACTIVITY_COLORS, present),
        legend=alt.Legend(orient="bottom", direction="horizontal", columns=9),
    )


OVERVIEW_X = "ms from the step's start (drag to zoom the detail view)"


def _x(window: tuple[float, float], title: str = "ms from the step's start") -> alt.X:
    return alt.X("start_ms:Q", title=title, scale=alt.Scale(domain=list(window), nice=False, zero=False))


def _rank_y(n_ranks: int) -> alt.Y:
    step = max(1, n_ranks // 32)  # label every rank up to 32, then thin out
    return alt.Y(
        "rank:O",
        title="rank",
        # labelOverlap off: the expression already thins them, and Vega's own pass dropped every other
        # label of 8 ranks
        axis=alt.Axis(
            labelExpr=f"datum.value % {step} == 0 ? datum.value : ''", ticks=False, labelFontSize=10, labelOverlap=False
        ),
    )


def overview_classes(frame: pd.DataFrame) -> list[str]:
    """The overview's strips within a rank's row: compute, memory copies, then each dimension's collectives."""
    present = set(frame["category"].astype(str)) if len(frame) else set()
    return [c for c in ("compute", "memory") if c in present] + sorted(present - {"compute", "memory"})


def critical_path_layers(path: pd.DataFrame, links: pd.DataFrame, span: tuple[float, float], n: int) -> list[alt.Chart]:
    """The cross-rank critical path over a Gantt: a dark rule along each segment on its rank's row
    (ui.whatif_tables.path_frame), dotted where the rank was idle (no kernel, no host
    code), and a vertical hop where the path changes rank (path_links)."""
    seg = (
        alt.Chart(path)
        .mark_rule(color=PATH_COLOR, strokeWidth=3, opacity=0.9)
        .encode(
            x=_x(span, OVERVIEW_X),  # the Gantt's own axis title: Vega appends a different one to it
            x2=alt.X2("end_ms"),
            y=_rank_y(n),
            strokeDash=alt.condition("datum.kind == 'idle'", alt.value([2, 3]), alt.value([1, 0])),
            tooltip=[
                alt.Tooltip("rank:O"),
                alt.Tooltip("category:N", title="on the path"),
                alt.Tooltip("label:N", title="op"),
                alt.Tooltip("dur_ms:Q", title="ms", format=",.3f"),
            ],
        )
    )
    hop = (
        alt.Chart(links)
        .mark_rule(color=PATH_COLOR, strokeWidth=1.5, strokeDash=[3, 2])
        .encode(
            x=alt.X("at_ms:Q", title=OVERVIEW_X, scale=alt.Scale(domain=list(span), nice=False, zero=False)),
            y=alt.Y("from_rank:O"),
            y2=alt.Y2("to_rank"),
        )
    )
    return [seg, hop] if len(links) else [seg]  # a layer with no rows would draw nothing


def gantt_overview_chart(
    frame: pd.DataFrame,
    *,
    span: tuple[float, float],
    window: tuple[float, float] | None = None,
    path: pd.DataFrame | None = None,
    links: pd.DataFrame | None = None,
) -> alt.Chart | alt.LayerChart:
    """The whole step, one thin row per rank; an x-interval brush named BRUSH picks the detail window.
    The window shown in detail is outlined (a dashed box), since a brush does not survive a reload.

    Each row is a stack of strips, one per class (compute, memory, each dimension's collectives: the
    analyzer never merges across them), and a merged rectangle is as opaque as it is busy, so a span of
    ten short copies that are 1% busy reads as a faint tint, not as a solid bar over the compute.
    `path`/`links`: the critical path drawn over the rows (critical_path_layers)."""
    n = int(frame["rank"].nunique()) if len(frame) else 1
    classes = overview_classes(frame) or ["compute"]
    brush = alt.selection_interval(encodings=["x"], name=BRUSH, value={"x": list(window)} if window else alt.Undefined)
    # Streamlit fits the axes and the legend below into `height` too: ~130 px on top of the plot.
    # 14 px a rank (its label fits), 6 px a strip (a class stays visible)
    height = min(360, max(60, 14 * n, 6 * n * len(classes))) + LEGEND_PX
    x = _x(span, OVERVIEW_X)
    rects = (
        alt.Chart(frame, width="container", height=height)
        .transform_calculate(
            dur_ms="datum.end_ms - datum.start_ms",
        )
        .mark_rect()
        .encode(
            x=x,
            x2=alt.X2("end_ms"),
            y=_rank_y(n),
            yOffset=alt.YOffset("category:N", scale=alt.Scale(domain=classes, paddingInner=0.1)),
            color=_color(frame),
            opacity=alt.Opacity("busy_pct:Q", scale=alt.Scale(domain=[0, 100], range=[0.12, 1.0]), legend=None),
            tooltip=_tooltip(detail=False),
        )
        .add_params(brush)
    )
    layers = [rects]
    if path is not None and len(path):
        layers += critical_path_layers(path, links if links is not None else path.iloc[:0], span, n)
    if window is None:
        return layers[0] if len(layers) == 1 else alt.layer(*layers)
    box = (
        alt.Chart(pd.DataFrame({"start_ms": [window[0]], "end_ms": [window[1]]}))
        .mark_rect(
            fill="#212529",
            fillOpacity=0.06,
            stroke="#212529",
            strokeDash=[4, 3],
            strokeWidth=1.5,
        )
        .encode(
            x=x,
            x2=alt.X2("end_ms"),
            tooltip=[
                alt.Tooltip("start_ms:Q", title="detail from ms", format=",.2f"),
                alt.Tooltip("end_ms:Q", title="to ms", format=",.2f"),
            ],
        )
    )
    return alt.layer(*layers, box)


def gantt_detail_chart(
    frame: pd.DataFrame, *, window: tuple[float, float], highlight: str | None = None
) -> alt.LayerChart:
    """The window, one row per rank with a lane per activity; click a collective to highlight its
    instance on every rank (double-click clears)."""
    n = int(frame["rank"].nunique()) if len(frame) else 1
    lanes = [lane for lane in ("compute", "memory", "comm") if len(frame) and (frame["lane"] == lane).any()]
    pick = alt.selection_point(
        fields=["instance"],
        on="click",
        clear="dblclick",
        name=PICK,
        value=[{"instance": highlight}] if highlight else alt.Undefined,
    )
    base = (
        alt.Chart()
        .transform_calculate(dur_ms="datum.end_ms - datum.start_ms")
        .encode(
            x=_x(window),
            x2=alt.X2("end_ms"),
            y=_rank_y(n),
            yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=lanes or ["comm"], paddingInner=0.15)),
            color=_color(frame),
        )
    )
    work = (
        base.transform_filter("datum.lane != 'comm'")
        .mark_rect(opacity=0.9, clip=True)
        .encode(tooltip=_tooltip(detail=False))
    )
    comm = (
        base.transform_filter("datum.lane == 'comm'")
        .mark_rect(clip=True, strokeWidth=1.5)
        .encode(
            tooltip=_tooltip(),
            opacity=alt.OpacityValue(0.35, condition={"param": PICK, "value": 1.0}),
            stroke=alt.StrokeValue("#ffffff00", condition={"param": PICK, "empty": False, "value": "#212529"}),
        )
        .add_params(pick)
    )
    # The picked instance is marked at its middle on every rank with a fixed-size symbol, so it is
    # seen at any zoom: a 0.2 ms send is under a pixel wide at whole-step zoom, its outline invisible.
    marker = (
        alt.Chart()
        .transform_filter("datum.lane == 'comm'")
        .transform_filter({"param": PICK, "empty": False})
        .transform_calculate(mid_ms="(datum.start_ms + datum.end_ms) / 2", dur_ms="datum.end_ms - datum.start_ms")
        .mark_point(shape="triangle-down", size=90, filled=True, color="#212529", opacity=1.0, clip=True)
        .encode(
            x=alt.X("mid_ms:Q", scale=alt.Scale(domain=list(window), nice=False, zero=False)),
            y=_rank_y(n),
            yOffset=alt.YOffset("lane:N", scale=alt.Scale(domain=lanes or ["comm"], paddingInner=0.15)),
            tooltip=_tooltip(),
        )
    )
    plot = max(90, 9 * n * max(1, len(lanes)))
    return alt.layer(work, comm, marker, data=frame, width="container", height=plot + LEGEND_PX)


def breakdown_chart(parts: pd.DataFrame) -> alt.Chart:
    """Per rank, the step's window split into compute, comm overlapped with compute, exposed comm,
    memory copies and idle (ms), stacked."""
    present = set(parts["part"].astype(str))
    return (
        alt.Chart(parts, width="container", height=260 + LEGEND_PX)
        .mark_bar()
        .encode(
            x=alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
            y=alt.Y("ms:Q", title="ms", stack="zero"),
            color=alt.Color(
                "part:N",
                title=None,
                scale=scale(PART_COLORS, present),
                sort=list(PARTS),
                legend=alt.Legend(orient="bottom", direction="horizontal", labelLimit=260),
            ),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("rank:O", title="rank"),
                alt.Tooltip("part:N", title="part"),
                alt.Tooltip("ms:Q", title="ms", format=",.2f"),
            ],
        )
    )


def rank_heat_chart(heat: pd.DataFrame, value: str, title: str) -> alt.Chart:
    """Every rank (rows) x profiler step (columns), coloured by `value` on a sequential scale: the
    all-ranks view of a set too large to draw as a Gantt. Rows of more than 256 ranks are thin
    rectangles on a quantitative axis, so 4,096 ranks still fit one chart."""
    n = int(heat["rank"].nunique()) if len(heat) else 0
    height = min(900, max(160, 4 * n))
    y = (
        alt.Y("rank:O", title="rank", axis=alt.Axis(labelOverlap=True, ticks=False))
        if n <= 256
        else alt.Y("rank:Q", title="rank", scale=alt.Scale(domain=[0, int(heat["rank"].max()) + 1], nice=False))
    )
    enc = {
        "x": alt.X("step:O", title="profiler step", axis=alt.Axis(labelAngle=0)),
        "y": y,
        "color": alt.Color(f"{value}:Q", title=title, scale=alt.Scale(scheme="oranges")),
        "tooltip": [
            alt.Tooltip("rank:O", title="rank"),
            alt.Tooltip("step:O", title="step"),
            alt.Tooltip("step_ms:Q", title="step ms", format=",.2f"),
            alt.Tooltip("exposed_ms:Q", title="exposed comm ms", format=",.2f"),
            alt.Tooltip("late_ms:Q", title="late ms", format=",.2f"),
        ],
    }
    if n > 256:
        heat = heat.assign(rank_end=heat["rank"] + 1)
        enc["y2"] = alt.Y2("rank_end:Q")
    return alt.Chart(heat, width="container", height=height).mark_rect().encode(**enc)
