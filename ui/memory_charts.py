"""Altair chart builders for the Activation-memory page (frames of parallel.core.memory_sweeps in, charts out).

Stacked bars: one segment per component of parallel.core.memory, coloured by the paper's group
(attention / MLP / LayerNorm-dropout-residual), without SP beside with SP. Pure: altair, pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from parallel.core.memory_sweeps import GROUPS, MODEL_STATE_KINDS, SP_LABEL, STATE_KINDS
from parallel.core.plan import RECOMPUTE
from parallel.core.specs import GiB
from ui.text import MiB
from ui.theme import GROUP_COLORS, MEMORY_COLORS, scale

_SP_ORDER = [SP_LABEL[False], SP_LABEL[True]]


def _sp_column() -> alt.Column:
    return alt.Column("sp:N", sort=_SP_ORDER, title=None, header=alt.Header(labelFontSize=14, labelFontWeight="bold"))


def _y_title(scope: str) -> tuple[str, str]:
    unit = "GiB" if scope == "gpu" else "MiB"
    return unit, (f"{unit} per layer per microbatch" if scope == "layer" else f"{unit} of activations per GPU")


def _stack(data: pd.DataFrame, x: alt.X, scope: str, x_tooltip: alt.Tooltip) -> alt.Chart:
    """Stacked component bars over `data` (bytes already in the scope's unit); no data attached,
    so the caller can layer it with others on the same data."""
    unit, title = _y_title(scope)
    value = f"bytes_{unit}"
    return (
        alt.Chart()
        .mark_bar(stroke="white", strokeWidth=0.6)
        .encode(
            x=x,
            y=alt.Y(f"sum({value}):Q", title=title, stack="zero"),
            color=alt.Color(
                "group:N",
                title="component group",
                scale=scale(GROUP_COLORS, data["group"]),
                sort=list(GROUPS),
                legend=alt.Legend(labelLimit=260),
            ),
            order=alt.Order("order:Q"),
            detail=alt.Detail("component:N"),
            tooltip=[
                alt.Tooltip("sp:N", title="SP"),
                x_tooltip,
                alt.Tooltip("component:N", title="component"),
                alt.Tooltip("group:N", title="group"),
                alt.Tooltip(f"{value}:Q", title=unit, format=",.1f"),
            ],
        )
    )


def recompute_chart(df: pd.DataFrame, *, scope: str = "layer") -> alt.FacetChart:
    """Bytes by component for each recompute mode (frame of memory_data.layer_components)."""
    unit = _y_title(scope)[0]
    data = with_units(df, unit, "bytes")
    x = alt.X("recompute:N", sort=list(RECOMPUTE), title="activation recompute", axis=alt.Axis(labelAngle=0))
    bars = _stack(data, x, scope, alt.Tooltip("recompute:N", title="recompute"))
    labels = _total_labels(data, unit, x, by="recompute", marked=False)
    return alt.layer(bars, *labels, data=data, width=220, height=280).facet(column=_sp_column())


def sweep_chart(df: pd.DataFrame, *, axis: str, scope: str = "layer") -> alt.FacetChart:
    """Bytes by component as sequence length or TP varies (frame of memory_data.components_sweep),
    each bar labelled with its total; the plan's own value is labelled in bold with a ▼."""
    unit, _ = _y_title(scope)
    data = with_units(df, unit, "bytes")
    name = {"seq_len": "sequence length (tokens)", "tp": "tensor-parallel size (TP)"}[axis]
    x = alt.X("x:O", title=name, axis=alt.Axis(labelAngle=0))
    bars = _stack(data, x, scope, alt.Tooltip("x:O", title=name.split(" (")[0]))
    labels = _total_labels(data, unit, x, by="x", marked=True)
    chart = alt.layer(bars, *labels, data=data, width=300, height=260).facet(column=_sp_column())
    # SP needs TP > 1: a shared TP axis would leave the with-SP panel an empty TP = 1 column
    return chart.resolve_scale(x="independent") if axis == "tp" else chart


def _total_labels(data: pd.DataFrame, unit: str, x: alt.X, *, by: str, marked: bool) -> list[alt.Chart]:
    """Each stacked bar's total above it (two decimals when every bar is under 10 units: 0.24 MiB, not
    0); with `marked`, the plan's own bar (the frame's `current`) labelled in bold with a ▼."""
    small = len(data) and data.groupby(["sp", by])[f"bytes_{unit}"].sum().max() < 10
    fmt = ",.2f" if small else ",.0f" if unit == "MiB" else ",.1f"
    totals = alt.Chart().transform_aggregate(
        total=f"sum(bytes_{unit})", groupby=["sp", by, *(["current"] if marked else [])]
    )
    out = []
    for current in (False, True) if marked else (False,):
        chart = totals.transform_filter(("" if current else "!") + "datum.current") if marked else totals
        out.append(
            chart.transform_calculate(label=("'▼ ' + " if current else "") + f"format(datum.total, '{fmt}')")
            .mark_text(
                baseline="bottom",
                dy=-3,
                fontSize=11 if current else 10,
                fontWeight="bold" if current else "normal",
                color="#212529" if current else "#868e96",
            )
            .encode(x=x, y=alt.Y("total:Q"), text=alt.Text("label:N"))
        )
    return out


def stage_chart(df: pd.DataFrame) -> alt.FacetChart:
    """Params, grads, optimizer states and activations per pipeline stage, against the GPU's memory
    (frame of memory_data.stage_memory). A model far below the GPU's memory (tiny) is drawn in MiB
    without the capacity line, which would squash its bars flat."""
    unit = stage_unit(df)
    data = with_units(df, unit, "bytes", "total_bytes", "capacity_bytes")
    data["kind_order"] = data["kind"].map({k: i for i, k in enumerate(STATE_KINDS)})
    bars = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=alt.X("stage:O", title="pipeline stage", axis=alt.Axis(labelAngle=0)),
            y=alt.Y(f"sum(bytes_{unit}):Q", title=f"{unit} per GPU"),
            color=alt.Color("kind:N", title="memory", scale=scale(MEMORY_COLORS), sort=list(STATE_KINDS)),
            order=alt.Order("kind_order:Q"),
            tooltip=[
                alt.Tooltip("sp:N", title="SP"),
                alt.Tooltip("stage:O", title="stage"),
                alt.Tooltip("kind:N", title="kind"),
                alt.Tooltip(f"bytes_{unit}:Q", title=unit, format=",.2f"),
                alt.Tooltip(f"total_bytes_{unit}:Q", title=f"stage total {unit}", format=",.2f"),
            ],
        )
    )
    layers = [bars]
    if capacity_drawn(df):
        layers.append(
            alt.Chart()
            .mark_rule(color="#c92a2a", strokeDash=[6, 3], strokeWidth=2)
            .encode(
                y=alt.Y(f"max(capacity_bytes_{unit}):Q"),
                tooltip=[alt.Tooltip(f"max(capacity_bytes_{unit}):Q", title=f"GPU memory {unit}", format=",.1f")],
            )
        )
    width = max(160, min(420, 26 * int(df["stage"].nunique())))
    return alt.layer(*layers, data=data, width=width, height=280).facet(column=_sp_column())


# a run's measurement beside the plan model's prediction, in every measured-vs-predicted chart
SOURCE_OFFSET = alt.XOffset("source:N", sort=["measured", "predicted"])
SOURCE_COLOR = alt.Color(
    "source:N", title=None, scale=alt.Scale(domain=["measured", "predicted"], range=["#f59f00", "#adb5bd"])
)


def _by_source(data: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """measured_bytes_MiB / predicted_bytes_MiB columns as rows: keys..., source, MiB."""
    long = data.melt(
        id_vars=keys, value_vars=["measured_bytes_MiB", "predicted_bytes_MiB"], var_name="source", value_name="MiB"
    )
    long["source"] = long["source"].str.removesuffix("_bytes_MiB")
    return long


def measured_vs_predicted_chart(df: pd.DataFrame) -> alt.VConcatChart:
    """Per rank, measured activation bytes beside predicted, and the error in % below
    (frame of memory_data.measured_vs_predicted)."""
    data = with_units(df, "MiB", "measured_bytes", "predicted_bytes", "error_bytes")
    long = _by_source(data, ["rank", "error_pct"])
    rank_x = alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0))
    bars = (
        alt.Chart(long, height=240)
        .mark_bar()
        .encode(
            x=rank_x,
            xOffset=SOURCE_OFFSET,
            y=alt.Y("MiB:Q", title="activation MiB (peak, one GPU)"),
            color=SOURCE_COLOR,
            tooltip=[
                alt.Tooltip("rank:O", title="rank"),
                alt.Tooltip("source:N", title="source"),
                alt.Tooltip("MiB:Q", title="MiB", format=",.1f"),
                alt.Tooltip("error_pct:Q", title="error %", format="+.1f"),
            ],
        )
    )
    # symmetric around 0 and at least ±1 %, so an exact match reads as 0 and not as an empty axis
    lim = max(1.0, float(data["error_pct"].abs().max()) * 1.1) if len(data) else 1.0
    error = (
        alt.Chart(data, height=140)
        .mark_bar()
        .encode(
            x=rank_x,
            y=alt.Y(
                "error_pct:Q",
                title="error vs predicted, %",
                scale=alt.Scale(domain=[-lim, lim]),
                axis=alt.Axis(format="+.2~f"),
            ),
            color=alt.ColorValue("#4c6ef5", condition={"test": "datum.error_pct >= 0", "value": "#e8590c"}),
            tooltip=[
                alt.Tooltip("rank:O", title="rank"),
                alt.Tooltip("error_pct:Q", title="error %", format="+.1f"),
                alt.Tooltip("error_bytes_MiB:Q", title="error MiB", format="+,.1f"),
            ],
        )
    )
    return alt.vconcat(bars, error)


def model_state_chart(df: pd.DataFrame) -> alt.FacetChart:
    """Per rank, measured parameter / gradient / optimizer bytes beside predicted, one panel per kind
    (frame of memory_data.model_state_vs_predicted)."""
    data = with_units(df, "MiB", "measured_bytes", "predicted_bytes")
    long = _by_source(data, ["rank", "kind", "error_pct"])
    width = max(120, min(300, 22 * int(data["rank"].nunique())))
    return (
        alt.Chart(long, width=width, height=200)
        .mark_bar()
        .encode(
            x=alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0)),
            xOffset=SOURCE_OFFSET,
            y=alt.Y("MiB:Q", title="MiB (one GPU)"),
            color=SOURCE_COLOR,
            tooltip=[
                alt.Tooltip("rank:O", title="rank"),
                alt.Tooltip("kind:N", title="state"),
                alt.Tooltip("source:N", title="source"),
                alt.Tooltip("MiB:Q", title="MiB", format=",.3f"),
                alt.Tooltip("error_pct:Q", title="error %", format="+.2f"),
            ],
        )
        .facet(column=alt.Column("kind:N", title=None, sort=list(MODEL_STATE_KINDS)))
        .resolve_scale(y="independent")
    )


def stage_unit(df: pd.DataFrame) -> str:
    """GiB for real models, MiB when even the fullest stage holds under 1 GiB (frame of stage_memory)."""
    return "GiB" if len(df) and df["total_bytes"].max() >= GiB else "MiB"


def capacity_drawn(df: pd.DataFrame) -> bool:
    """Whether the GPU's memory belongs on the stage chart: not when the fullest stage uses under 2 %
    of it, since the bars would flatten to nothing under the line (frame of stage_memory)."""
    return bool(len(df)) and df["total_bytes"].max() >= 0.02 * df["capacity_bytes"].max()


def with_units(df: pd.DataFrame, unit: str, *columns: str) -> pd.DataFrame:
    """`df` with each bytes column also in `unit` ('MiB' or 'GiB'): column name '<col>_<unit>'."""
    div = {"MiB": MiB, "GiB": GiB}[unit]
    return df.assign(**{f"{c}_{unit}": df[c] / div for c in columns})
