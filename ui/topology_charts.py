"""Altair chart builders for the Topology page; each takes frames of parallel.core.rank_grid, returns a chart.

Layout: nodes along x, local GPUs along y (GPU 0 at the top), one cell per GPU. Cell geometry is
computed in the browser (Vega `calculate`), so the data sent is one short row per GPU.
Pure: altair and pandas only.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ui.theme import INTER_COLOR, INTRA_COLOR, link_names, palette

_HALF = 0.44  # half a cell: cells are 0.88 wide, leaving a gap between GPUs
_TOOLTIP = (
    ("rank", "rank"),
    ("node", "node"),
    ("local", "local GPU"),
    ("domain", "NVLink domain"),
    ("dp", "dp"),
    ("pp", "pp"),
    ("cp", "cp"),
    ("tp", "tp"),
)


def _link_scale(links: pd.Series) -> alt.Scale:
    """Intra-node green, inter-node orange, under whatever names the cluster gives its links (the
    frame's categories: [intra, inter], topology_data)."""
    names = list(links.cat.categories) if hasattr(links, "cat") else list(link_names().values())
    return alt.Scale(domain=names, range=[INTRA_COLOR, INTER_COLOR])


def _cell_tooltip() -> list[alt.Tooltip]:
    return [alt.Tooltip(f"{field}:Q", title=title) for field, title in _TOOLTIP]


def _cells_base(cells: pd.DataFrame, *, top: float = 0.0) -> alt.Chart:
    """The GPU cells' geometry; `top`: rows of room above GPU 0 (the NVLink domains' labels)."""
    first, last = int(cells["node"].min()), int(cells["node"].max())
    gpn = int(cells["local"].max()) + 1
    # Streamlit fits axes and the legends below into `height` too: leave them ~120 px.
    return (
        alt.Chart(cells, width="container", height=max(160, gpn * 30) + 120 + int(30 * top))
        .transform_calculate(
            x0=f"datum.node - {_HALF}",
            x1=f"datum.node + {_HALF}",
            y0=f"datum.local - {_HALF}",
            y1=f"datum.local + {_HALF}",
        )
        .encode(
            x=alt.X(
                "x0:Q",
                title="node",
                scale=alt.Scale(domain=[first - 0.5, last + 0.5], nice=False, zero=False),
                axis=alt.Axis(tickMinStep=1, format="d", grid=False),
            ),
            x2=alt.X2("x1"),
            y=alt.Y(
                "y0:Q",
                title="local GPU",
                scale=alt.Scale(domain=[gpn - 0.5, -0.5 - top], nice=False, zero=False),
                axis=alt.Axis(values=list(range(gpn)), format="d", grid=False),
            ),
            y2=alt.Y2("y1"),
        )
    )


# Above this many coordinates a categorical palette repeats (Tableau 20) and its legend outgrows the
# chart: coordinates are then drawn on a sequential scale, neighbours in similar colours.
CATEGORICAL_MAX = 16


def _sequential(field: str, size: int, title: str) -> alt.Color:
    return alt.Color(
        field,
        title=title,
        scale=alt.Scale(scheme="viridis", domain=[0, size - 1]),
        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=320, format="d"),
    )


def _coordinate_color(dim: str, size: int) -> alt.Color:
    """Coordinate k of `dim` always gets palette colour k, whichever window of nodes is shown; a
    sequential scale past CATEGORICAL_MAX coordinates."""
    if size > CATEGORICAL_MAX:
        return _sequential(f"{dim}:Q", size, f"{dim.upper()} coordinate")
    return alt.Color(
        f"{dim}:O",
        title=f"{dim.upper()} coordinate",
        scale=alt.Scale(domain=list(range(size)), range=palette(size)),
        legend=alt.Legend(orient="bottom", direction="horizontal", columns=min(size, 16), symbolLimit=64),
    )


# Above this many NVLink domains in the window their bands go unlabelled (the tooltip names each).
LABELLED_DOMAINS_MAX = 24


def _domain_layers(domains: pd.DataFrame, gpn: int) -> list[alt.Chart]:
    """Each NVLink domain of several nodes as a band behind its nodes' GPUs, shaded every other
    domain, with its number above (rank_grid.domain_spans); nothing when every domain is one node."""
    if domains is None or not (domains["last_node"] > domains["first_node"]).any():
        return []
    tooltip = [alt.Tooltip("label:N", title="NVLink domain")]
    band = (
        alt.Chart(domains)
        .transform_calculate(shade="datum.domain % 2", y0="-0.5 - 0.9", y1=f"{gpn - 0.5}")
        .mark_rect(stroke="#495057", strokeWidth=1.2, strokeDash=[4, 3], color="#adb5bd")
        .encode(
            x=alt.X("x0:Q"),
            x2=alt.X2("x1"),
            y=alt.Y("y0:Q"),
            y2=alt.Y2("y1"),
            fillOpacity=alt.FillOpacityValue(0.08, condition={"test": "datum.shade == 1", "value": 0.22}),
            tooltip=tooltip,
        )
    )
    if len(domains) > LABELLED_DOMAINS_MAX:
        return [band]
    widest = float((domains["x1"] - domains["x0"]).max())
    text = (
        alt.Chart(domains)
        .transform_filter(f"datum.x1 - datum.x0 >= {widest / 2}")  # a rack's sliver at the window's edge: no room
        .transform_calculate(x="(datum.x0 + datum.x1) / 2", y="-0.5 - 0.45", text="'rack ' + datum.domain")
        .mark_text(fontSize=11, fontWeight="bold", color="#343a40")
        .encode(x=alt.X("x:Q"), y=alt.Y("y:Q"), text=alt.Text("text:N"), tooltip=tooltip)
    )
    return [band, text]


def gpu_grid_chart(
    cells: pd.DataFrame,
    paths: pd.DataFrame,
    *,
    color_dim: str,
    color_size: int,
    group_dim: str,
    compare_order: str | None,
    domains: pd.DataFrame | None = None,
) -> alt.LayerChart:
    """Every GPU of the window coloured by its `color_dim` coordinate, the `group_dim` groups drawn
    (of `color_size` values) as lines coloured by their link, ranks whose coordinates change under `compare_order` marked
    with a dot, each NVLink domain of several nodes (`domains`: rank_grid.domain_spans) as a labelled
    band around its nodes. Click a GPU to highlight its group; double-click to clear."""
    pick = alt.selection_point(fields=["group"], on="click", clear="dblclick", name="group_pick")
    dim = group_dim.upper()
    tooltip = [
        *_cell_tooltip(),
        alt.Tooltip("group_ranks:N", title=f"{dim} group"),
        alt.Tooltip("group_link:N", title="its link"),
    ]
    encode = {
        "color": _coordinate_color(color_dim, color_size),
        "opacity": alt.OpacityValue(0.25, condition={"param": "group_pick", "value": 1.0}),
    }
    bands = _domain_layers(domains, int(cells["local"].max()) + 1)
    base = _cells_base(cells, top=1.0 if bands else 0.0)
    layers = []
    if compare_order:
        base = base.transform_calculate(
            compare="'dp ' + datum.c_dp + ' · pp ' + datum.c_pp + ' · cp ' + datum.c_cp + ' · tp ' + datum.c_tp"
        )
        tooltip.append(alt.Tooltip("compare:N", title=f"under {compare_order}"))
        moved = f"moves under {compare_order}"
        layers.append(
            alt.Chart(cells)
            .transform_filter("datum.moved")
            .transform_calculate(mark=f"'{moved}'")
            .mark_point(filled=True, size=14, color="#212529", opacity=0.8)
            .encode(
                x=alt.X("node:Q"),
                y=alt.Y("local:Q"),
                shape=alt.Shape(
                    "mark:N",
                    title="vs another rank order",
                    scale=alt.Scale(domain=[moved], range=["circle"]),
                    legend=alt.Legend(orient="bottom"),
                ),
                tooltip=tooltip,
            )
        )
    cell_layer = base.mark_rect().encode(**encode, tooltip=tooltip).add_params(pick)
    links = (
        alt.Chart(paths)
        .mark_line(strokeCap="round", strokeJoin="round", point=alt.OverlayMarkDef(size=12, filled=True))
        .encode(
            x=alt.X("x:Q"),
            y=alt.Y("y:Q"),
            detail=alt.Detail("group:N"),
            order=alt.Order("step:Q"),
            color=alt.Color(
                "link:N",
                title=f"{dim} group link",
                scale=_link_scale(paths["link"]),
                legend=alt.Legend(orient="bottom"),
            ),
            strokeWidth=alt.StrokeWidthValue(2.4, condition={"param": "group_pick", "empty": False, "value": 4}),
            opacity=alt.OpacityValue(0.15, condition={"param": "group_pick", "value": 0.95}),
            tooltip=[alt.Tooltip("group:Q", title=f"{dim} group"), alt.Tooltip("link:N", title="link")],
        )
    )
    return alt.layer(*bands, cell_layer, links, *layers).resolve_scale(color="independent")


def rank_values_chart(cells: pd.DataFrame, column: str, *, title: str, fmt: str = ",.3g") -> alt.Chart:
    """The GPU grid coloured by a measured per-rank value (parallel.core.rank_grid.with_rank_values);
    ranks without a measurement are grey. The hook for runs: exposed communication, busbw, ..."""
    return (
        _cells_base(cells)
        .mark_rect()
        .encode(
            color=alt.Color(  # the legend in the value's own format (it printed '14.653500')
                f"{column}:Q", title=title, scale=alt.Scale(scheme="viridis"), legend=alt.Legend(format=fmt)
            ),
            tooltip=[*_cell_tooltip(), alt.Tooltip(f"{column}:Q", title=title, format=fmt)],
        )
    )


def node_overview_chart(nodes: pd.DataFrame, *, color_dim: str, window: tuple[int, int]) -> alt.Chart:
    """One cell per node (rows of up to 64 nodes), coloured by the node's `color_dim` coordinate
    ('mixed' when its GPUs differ); the nodes shown in the GPU grid are outlined."""
    lo, hi = window
    size = int(nodes[f"{color_dim}_size"].iloc[0])
    values = [str(v) for v in range(size)]  # the same colour per coordinate as the GPU grid
    mixed = ["mixed"] if (nodes["value"] == "mixed").any() else []
    per_row, rows = int(nodes["col"].max()) + 1, int(nodes["row"].max()) + 1
    title = f"{color_dim.upper()} of the node"
    sequential = size > CATEGORICAL_MAX
    legend_rows = 1 if sequential else -(-(size + len(mixed)) // min(size + 1, 17))
    # Streamlit fits the axes and the legend into `height`: leave them room, or the cells collapse
    base = alt.Chart(nodes, width=min(1000, per_row * 15), height=rows * 16 + 90 + 22 * legend_rows).encode(
        x=alt.X("col:O", title=f"node mod {per_row}", axis=alt.Axis(labelOverlap=True, labelAngle=0)),
        y=alt.Y("row:O", title=f"node ÷ {per_row}"),
        stroke=alt.StrokeValue("#ffffff00", condition={"test": "datum.shown", "value": "#212529"}),
        tooltip=[
            alt.Tooltip("node:Q", title="node"),
            alt.Tooltip("ranks:N", title="ranks"),
            *[alt.Tooltip(f"{d}:N", title=d) for d in ("dp", "pp", "cp", "tp")],
        ],
    )
    base = base.transform_calculate(
        shown=f"datum.node >= {lo} && datum.node <= {hi}", value_num="toNumber(datum.value)"
    )
    if not sequential:
        return base.mark_rect(strokeWidth=1.5).encode(
            color=alt.Color(
                "value:N",
                title=title,
                scale=alt.Scale(domain=values + mixed, range=palette(len(values)) + ["#dee2e6"] * len(mixed)),
                legend=alt.Legend(orient="bottom", direction="horizontal", columns=min(size + 1, 17), symbolLimit=80),
            )
        )
    valued = (
        base.transform_filter("datum.value != 'mixed'")
        .mark_rect(strokeWidth=1.5)
        .encode(color=_sequential("value_num:Q", size, title))
    )
    grey = base.transform_filter("datum.value == 'mixed'").mark_rect(strokeWidth=1.5, color="#dee2e6")
    return alt.layer(valued, grey)
