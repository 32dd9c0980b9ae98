"""Altair chart builders for the TP-scaling page (frames of parallel.core.scaling.tp_scaling in).

Every chart marks the NVLink/InfiniBand boundary: TP degrees whose group leaves the node sit on a
shaded band. `layer_time_chart` and `busbw_chart` take an optional `measured` frame — columns tp,
sp (bool), link ('intra'/'inter' or the legend's words), and `seconds` (TP communication per layer)
and/or `busbw_bytes_per_s` — from commbench results or TP-group collectives of uploaded traces,
drawn as black diamonds over the prediction. `sweep_chart` draws a lab TP sweep against the
prediction for the lab's own links (profiler/lab/sweep_views.py). Pure: altair, pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ui.theme import INTER_COLOR, INTRA_COLOR, link_colors, link_names, named_links, scale

SP_NAME = {False: "TP without SP", True: "TP + SP"}
PARTS = {"compute": "#4c6ef5", "TP communication (exposed)": "#e8590c", "TP communication (overlapped)": "#ffc9a8"}
_PART_OF = {
    "compute_s": "compute",
    "tp_comm_s": "TP communication (exposed)",
    "overlapped_s": "TP communication (overlapped)",
}


def _tp_x(pred: pd.DataFrame, title: str = "tensor-parallel size (TP)") -> alt.X:
    return alt.X("tp:O", title=title, axis=alt.Axis(labelAngle=0), scale=alt.Scale(domain=sorted(pred["tp"].unique())))


def _boundary(gpus_per_node: int, x: alt.X, first_inter, names: dict | None = None) -> list[alt.Chart]:
    """Layers (on the parent's data, which has a `tp` column) that shade the TP degrees whose group
    spans nodes and label the first of them (with the cluster's inter-node link, `names`)."""
    inter = (names or link_names())["inter"]
    base = alt.Chart().transform_filter(f"datum.tp > {gpus_per_node}").transform_aggregate(n="count()", groupby=["tp"])
    band = base.mark_rect(color=INTER_COLOR, opacity=0.08).encode(
        x=x, tooltip=[alt.Tooltip("tp:O", title=f"TP group crosses nodes ({gpus_per_node} GPUs/node) at TP")]
    )
    text = (
        base.transform_filter(f"datum.tp == {first_inter if pd.notna(first_inter) else -1}")
        .mark_text(
            align="left",
            baseline="top",
            dx=4,
            dy=4,
            color=INTER_COLOR,
            fontWeight="bold",
            text=f"> {gpus_per_node} GPUs: {inter}",
        )
        .encode(x=x, y=alt.YValue(0))
    )
    return [band, text]


def _valid(pred: pd.DataFrame, names: dict | None = None) -> pd.DataFrame:
    return pred[pred["valid"]].assign(link=lambda d: named_links(d["link"], names))


def _first_inter(pred: pd.DataFrame, gpus_per_node: int):
    return pred.loc[pred["valid"] & (pred["tp"] > gpus_per_node), "tp"].min()


def _sp_column() -> alt.Column:
    return alt.Column(
        "variant:N",
        sort=list(SP_NAME.values()),
        title=None,
        header=alt.Header(labelFontSize=14, labelFontWeight="bold"),
    )


def layer_time_chart(
    pred: pd.DataFrame, gpus_per_node: int, measured: pd.DataFrame | None = None, names: dict | None = None
) -> alt.FacetChart:
    """Per-layer time on one GPU, split into compute and TP communication, for each TP degree:
    without SP | with SP. Measured `seconds` (TP comm per layer) drawn as black diamonds."""
    data = _valid(pred, names)
    long = data.melt(
        id_vars=["tp", "sp", "link", "layer_s", "comm_fraction"],
        value_vars=list(_PART_OF),
        var_name="part",
        value_name="seconds",
    )
    long["part"] = long["part"].map(_PART_OF)
    long = long[long["seconds"] > 0]
    if measured is not None and "seconds" in measured and len(measured):
        long = pd.concat(
            [
                long,
                measured[["tp", "sp", "link", "seconds"]].assign(
                    part="measured", link=lambda d: named_links(d["link"], names)
                ),
            ],
            ignore_index=True,
        )
    long = long.assign(
        ms=long["seconds"] * 1e3,
        layer_ms=long["layer_s"] * 1e3,
        order=long["part"].map({p: i for i, p in enumerate(PARTS)}),
        variant=long["sp"].map(SP_NAME),
    )
    x = _tp_x(pred)
    y_title = "ms per layer per microbatch (one GPU)"
    hidden = "TP communication (overlapped)"
    bars = (  # the bar is the layer's time: compute + exposed; what runs hidden under compute is no part of it
        alt.Chart()
        .transform_filter(f"datum.part != 'measured' && datum.part != '{hidden}'")
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("sum(ms):Q", title=y_title),
            color=alt.Color(
                "part:N", title=None, scale=scale(PARTS), sort=list(PARTS), legend=alt.Legend(labelLimit=260)
            ),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("tp:O", title="TP"),
                alt.Tooltip("link:N", title="link"),
                alt.Tooltip("part:N", title="part"),
                alt.Tooltip("ms:Q", title="ms", format=",.3f"),
                alt.Tooltip("layer_ms:Q", title="layer ms (compute + exposed)", format=",.3f"),
                alt.Tooltip("comm_fraction:Q", title="exposed comm share", format=".0%"),
            ],
        )
    )
    points = (
        alt.Chart()
        .transform_filter("datum.part == 'measured'")
        .mark_point(shape="diamond", filled=True, size=90, color="#212529")
        .encode(
            x=x,
            y=alt.Y("ms:Q", title=y_title),
            tooltip=[
                alt.Tooltip("tp:O", title="TP"),
                alt.Tooltip("link:N", title="link"),
                alt.Tooltip("ms:Q", title="measured TP comm ms", format=",.3f"),
            ],
        )
    )
    overlapped = (  # a tick at its own height, beside the bar, never stacked on it
        alt.Chart()
        .transform_filter(f"datum.part == '{hidden}'")
        .mark_tick(thickness=3, size=18, color=PARTS[hidden])
        .encode(
            x=x,
            y=alt.Y("ms:Q", title=y_title),
            tooltip=[
                alt.Tooltip("tp:O", title="TP"),
                alt.Tooltip("ms:Q", title="TP comm hidden under compute, ms", format=",.3f"),
            ],
        )
    )
    # a layer only where it has data: a filter that leaves nothing gives Vega an infinite extent
    shown = [bars]
    if (long["part"] == hidden).any():
        shown.append(overlapped)
    if (long["part"] == "measured").any():
        shown.append(points)
    layers = [*_boundary(gpus_per_node, x, _first_inter(pred, gpus_per_node), names), *shown]
    return alt.layer(*layers, data=long, width=300, height=280).facet(column=_sp_column())


def speedup_chart(pred: pd.DataFrame, gpus_per_node: int, names: dict | None = None) -> alt.FacetChart:
    """Speedup of one layer over TP = 1 and efficiency = speedup / TP (dashed: ideal), SP off and
    on; points coloured by the TP group's link."""
    data = _valid(pred, names).assign(variant=lambda d: d["sp"].map(SP_NAME))
    metrics = {"speedup": "speedup over TP = 1", "efficiency": "efficiency = speedup / TP"}
    cols = ["tp", "variant", "link", "comm_fraction", "speedup", "efficiency"]
    long = pd.concat(
        [
            data[cols].assign(metric=label, value=data[field], ideal=data["tp"] if field == "speedup" else 1.0)
            for field, label in metrics.items()
        ],
        ignore_index=True,
    )
    x = _tp_x(pred)
    variants = list(SP_NAME.values())
    y = alt.Y("value:Q", title=None)
    ideal = (
        alt.Chart()
        .transform_filter(f"datum.variant == '{variants[0]}'")
        .mark_line(strokeDash=[4, 4], color="#adb5bd")
        .encode(x=x, y=alt.Y("ideal:Q", title=None))
    )
    line = (
        alt.Chart()
        .mark_line(color="#495057")
        .encode(x=x, y=y, strokeDash=alt.StrokeDash("variant:N", title=None, sort=variants))
    )
    dots = (
        alt.Chart()
        .mark_point(filled=True, size=70)
        .encode(
            x=x,
            y=y,
            shape=alt.Shape("variant:N", title=None, sort=variants),
            color=alt.Color("link:N", title="TP group link", scale=scale(link_colors(names or link_names()))),
            tooltip=[
                alt.Tooltip("tp:O", title="TP"),
                alt.Tooltip("variant:N", title="variant"),
                alt.Tooltip("link:N", title="link"),
                alt.Tooltip("speedup:Q", title="speedup", format=".2f"),
                alt.Tooltip("efficiency:Q", title="efficiency", format=".0%"),
                alt.Tooltip("comm_fraction:Q", title="exposed comm share", format=".0%"),
            ],
        )
    )
    layers = [*_boundary(gpus_per_node, x, _first_inter(pred, gpus_per_node), names), ideal, line, dots]
    return (
        alt.layer(*layers, data=long, width=300, height=260)
        .facet(
            column=alt.Column(
                "metric:N",
                sort=list(metrics.values()),
                title=None,
                header=alt.Header(labelFontSize=14, labelFontWeight="bold"),
            )
        )
        .resolve_scale(y="independent")
    )


def busbw_chart(
    pred: pd.DataFrame, gpus_per_node: int, measured: pd.DataFrame | None = None, names: dict | None = None
) -> alt.LayerChart:
    """Predicted bus bandwidth (nccl-tests convention: algbw × 2(n−1)/n) of the layer's TP collective
    by TP size (ring model), coloured by link;
    measured `busbw_bytes_per_s` drawn as black diamonds. One point per TP size: the all-reduce's (SP
    off), else SP's all-gather / reduce-scatter where only SP can run (a MoE model), the same busbw."""
    data = _valid(pred, names)
    data = data[data["tp"] > 1].sort_values("sp", kind="stable").drop_duplicates("tp").assign(source="predicted")
    if measured is not None and "busbw_bytes_per_s" in measured and len(measured):
        extra = [c for c in ("source", "op") if c in measured]  # who measured it, which collective
        data = pd.concat(
            [
                data,
                measured[["tp", "link", "busbw_bytes_per_s", *extra]]
                .rename(columns={"source": "measured_by"})
                .assign(source="measured", link=lambda d: named_links(d["link"], names)),
            ],
            ignore_index=True,
        )
    data = data.assign(busbw_gbs=data["busbw_bytes_per_s"] / 1e9, msg_mib=data["bytes_per_call"] / 2**20)
    x = _tp_x(pred, "TP group size")
    y = alt.Y("busbw_gbs:Q", title="busbw, GB/s")  # short: a long title squeezes the plot
    predicted = alt.Chart().transform_filter("datum.source == 'predicted'")
    line = predicted.mark_line(color="#adb5bd").encode(x=x, y=y)
    dots = predicted.mark_point(filled=True, size=80).encode(
        x=x,
        y=y,
        color=alt.Color("link:N", title="link", scale=scale(link_colors(names or link_names()))),
        tooltip=[
            alt.Tooltip("tp:O", title="TP"),
            alt.Tooltip("link:N", title="link"),
            alt.Tooltip("busbw_gbs:Q", title="predicted busbw GB/s", format=",.1f"),
            alt.Tooltip("msg_mib:Q", title="message MiB", format=",.1f"),
        ],
    )
    points = (
        alt.Chart()
        .transform_filter("datum.source == 'measured'")
        .mark_point(shape="diamond", filled=True, size=90, color="#212529")
        .encode(
            x=x,
            y=y,
            tooltip=[
                alt.Tooltip("tp:O", title="TP"),
                alt.Tooltip("link:N", title="link"),
                alt.Tooltip("busbw_gbs:Q", title="measured busbw GB/s", format=",.3g"),
                alt.Tooltip("measured_by:N", title="measured by"),
                alt.Tooltip("op:N", title="collective"),
            ],
        )
    )
    shown = [line, dots, points] if (data["source"] == "measured").any() else [line, dots]
    layers = [*_boundary(gpus_per_node, x, _first_inter(pred, gpus_per_node), names), *shown]
    return alt.layer(*layers, data=data, width=420, height=280)


CALIBRATED_COLOR = "#4c6ef5"


def sweep_chart(frame: pd.DataFrame, gpus_per_node: int) -> alt.FacetChart:
    """The lab's TP sweep (profiler.lab.sweep_views.chart_frame): per metric (rows) and SP variant (columns), the
    plan model's prediction for the lab's fitted links (grey line, dots coloured by link), the
    measured points (black diamonds; TP comm with a p25–p75 bar) labelled with their error, and on
    the TP-comm and step-time rows the calibrated model (blue dashed line, squares) when the sweep has one."""
    x = alt.X(
        "tp:O",
        title="tensor-parallel size (TP)",
        axis=alt.Axis(labelAngle=0),
        scale=alt.Scale(domain=sorted(frame["tp"].unique())),
    )
    y = alt.Y("value:Q", title=None)
    first_inter = frame.loc[frame["tp"] > gpus_per_node, "tp"].min()
    predicted = alt.Chart().transform_filter("datum.source == 'predicted'")
    measured = alt.Chart().transform_filter("datum.source == 'measured'")
    tip = [
        alt.Tooltip("tp:O", title="TP"),
        alt.Tooltip("link:N", title="TP group"),
        alt.Tooltip("source:N", title="source"),
        alt.Tooltip("value:Q", title="value", format=",.4g"),
    ]
    colors = alt.Scale(
        domain=["inside a node (loopback)", "across nodes (shaped veth)"], range=[INTRA_COLOR, INTER_COLOR]
    )
    line = predicted.mark_line(color="#adb5bd").encode(x=x, y=y)
    dots = predicted.mark_point(filled=True, size=70).encode(
        x=x, y=y, color=alt.Color("link:N", title="predicted, TP group", scale=colors), tooltip=tip
    )
    bars = (
        measured.transform_filter("isValid(datum.lo) && isFinite(datum.lo)")
        .mark_rule(color="#212529")
        .encode(
            x=x,
            y=alt.Y("lo:Q", title=None),
            y2=alt.Y2("hi:Q"),
            tooltip=[alt.Tooltip("lo:Q", title="p25", format=",.4g"), alt.Tooltip("hi:Q", title="p75", format=",.4g")],
        )
    )
    points = measured.mark_point(shape="diamond", filled=True, size=90, color="#212529").encode(
        x=x, y=y, tooltip=[*tip, alt.Tooltip("error_pct:Q", title="error vs predicted, %", format="+.0f")]
    )
    labels = measured.mark_text(align="left", dx=8, fontSize=11, color="#212529").encode(
        x=x, y=y, text=alt.Text("error_label:N")
    )
    base = alt.Chart().transform_filter(f"datum.tp > {gpus_per_node}").transform_aggregate(n="count()", groupby=["tp"])
    band = base.mark_rect(color=INTER_COLOR, opacity=0.08).encode(
        x=x, tooltip=[alt.Tooltip("tp:O", title=f"TP group spans both lab nodes ({gpus_per_node} ranks each) at TP")]
    )
    mark = (
        base.transform_filter(f"datum.tp == {first_inter if pd.notna(first_inter) else -1}")
        .mark_text(
            align="right",
            baseline="top",
            dx=-4,
            dy=4,
            color=INTER_COLOR,
            fontWeight="bold",
            text=f"> {gpus_per_node} ranks: across nodes",
        )
        .encode(x=x, y=alt.YValue(0))
    )
    calibrated = alt.Chart().transform_filter("datum.source == 'calibrated'")
    cal_line = calibrated.mark_line(color=CALIBRATED_COLOR, strokeDash=[5, 3]).encode(x=x, y=y)
    cal_marks = calibrated.mark_point(shape="square", filled=True, size=60, color=CALIBRATED_COLOR).encode(
        x=x,
        y=y,
        tooltip=[*tip, alt.Tooltip("error_pct:Q", title="calibrated vs measured, %", format="+.1f")],
    )
    layers = [band, mark, line, dots, bars, points, labels]
    if (frame["source"] == "calibrated").any():
        layers += [cal_line, cal_marks]
    return (
        alt.layer(*layers, data=frame, width=300, height=200)
        .facet(
            row=alt.Row(
                "metric:N",
                title=None,
                sort=list(dict.fromkeys(frame["metric"])),
                header=alt.Header(labelFontWeight="bold", labelAngle=0, labelAlign="left", labelLimit=120),
            ),
            column=alt.Column(
                "variant:N",
                sort=list(SP_NAME.values()),
                title=None,
                header=alt.Header(labelFontSize=14, labelFontWeight="bold"),
            ),
        )
        .resolve_scale(y="independent")
    )
