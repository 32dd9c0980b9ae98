"""parallel.core.memory's activation components swept: with and without SP, by recompute mode, against
sequence length and against TP, model states by pipeline stage.

Long-form frames (one row per bar segment) for Altair: per layer and per GPU, by recompute mode,
against sequence length and against TP, model states by pipeline stage; and a run's measured
activation bytes beside the prediction (`measured_vs_predicted`, from the `metrics.json` that
`python -m parallel train` writes).

Pure: pandas and parallel/ only (no streamlit).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from parallel.core.memory import (
    COMPONENT_GROUP,
    COMPONENTS,
    ActivationOptions,
    activation_components_bytes,
    embedding_chunks,
    first_stage_extra_bytes,
    inflight_layers,
    last_stage_extra_bytes,
    memory_per_stage,
    mixed_over_recompute,
    offloaded_components_bytes,
)
from parallel.core.plan import RECOMPUTE, Plan
from parallel.core.specs import Model
from parallel.core.validate import _shape_errors

MiB = 2**20
SP_LABEL = {False: "without SP", True: "with SP"}
EMBEDDING = "embedding/output"
GROUPS = ("attention", "mlp", "layernorm/dropout/residual", "layer input (checkpoint)", EMBEDDING)
STATE_KINDS = ("params", "grads", "optimizer", "activations")
SEQ_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
TP_SIZES = (1, 2, 4, 8, 16, 32)
SCOPES = {"layer": "per layer", "gpu": "per GPU"}  # short: the label is also the URL's value


class MetricsError(ValueError):
    """A metrics.json without what the measured-vs-predicted view needs."""


def sp_variants(plan: Plan) -> list[Plan]:
    """The plan without and with SP; only without when tp = 1 (SP shards across the TP group)."""
    off = dataclasses.replace(plan, sp=False)
    return [off] if plan.tp == 1 else [off, dataclasses.replace(plan, sp=True)]


def _component_rows(model: Model, plan: Plan, opts: ActivationOptions, scope: str) -> list[dict]:
    """Bytes by component for one layer and microbatch, or for the whole first-stage GPU (the
    per-layer bytes x layers per chunk x chunks in flight, plus the embedding/output terms)."""
    if scope != "gpu":
        parts = activation_components_bytes(model, plan, opts)
    else:  # as memory.activation_bytes_per_stage counts stage 0: its own layers, its chunks
        parts = mixed_over_recompute(model, plan, lambda p: activation_components_bytes(model, p, opts))
        off = mixed_over_recompute(model, plan, lambda p: offloaded_components_bytes(model, p, opts))
        scale = inflight_layers(model, plan, 0)  # its own layers: uneven stages and layouts included
        # offloaded tensors stay on the device for one layer only (memory.activation_bytes_per_stage)
        parts = {c: b * scale - off.get(c, 0.0) * (scale - 1) for c, b in parts.items()}
        extra = first_stage_extra_bytes(model, plan, opts) * embedding_chunks(plan)
        if plan.pp == 1:
            extra += last_stage_extra_bytes(model, plan, opts)
        parts[EMBEDDING] = extra
    order = {c: i for i, c in enumerate((*COMPONENTS, EMBEDDING))}
    return [
        {"component": c, "group": COMPONENT_GROUP.get(c, EMBEDDING), "order": order[c], "bytes": float(b)}
        for c, b in parts.items()
        if b > 0
    ]


def layer_components(model: Model, plan: Plan, opts: ActivationOptions, *, scope: str = "layer") -> pd.DataFrame:
    """Every recompute mode, without and with SP: sp, recompute, component, group, order, bytes."""
    rows = []
    for variant in sp_variants(plan):
        for mode in RECOMPUTE:  # a partial full recompute's layer count stays with the full mode only
            p = dataclasses.replace(
                variant, recompute=mode, recompute_layers=variant.recompute_layers if mode == "full" else None
            )
            rows += [{"sp": SP_LABEL[p.sp], "recompute": mode, **r} for r in _component_rows(model, p, opts, scope)]
    return pd.DataFrame(rows)


def components_sweep(
    model: Model,
    plan: Plan,
    opts: ActivationOptions,
    *,
    axis: str,
    scope: str = "layer",
    values: tuple[int, ...] | None = None,
) -> pd.DataFrame:
    """The plan's components as `axis` ('seq_len' or 'tp') varies, without and with SP:
    sp, x, current (the plan's own value), component, group, order, bytes. Values the model cannot
    be split by (heads % tp, seq % tp under SP, ...) are left out."""
    if axis not in ("seq_len", "tp"):
        raise ValueError(f"axis must be 'seq_len' or 'tp', got {axis!r}")
    current = model.seq_len if axis == "seq_len" else plan.tp
    values = tuple(sorted(set(values or (SEQ_LENGTHS if axis == "seq_len" else TP_SIZES)) | {current}))
    rows = []
    for sp in (False, True):
        for x in values:
            m = dataclasses.replace(model, seq_len=x) if axis == "seq_len" else model
            tp = x if axis == "tp" else plan.tp
            if sp and tp == 1:
                continue
            p = dataclasses.replace(plan, tp=tp, sp=sp)
            if _shape_errors(p, m):
                continue
            rows += [
                {"sp": SP_LABEL[sp], "x": x, "current": x == current, **r} for r in _component_rows(m, p, opts, scope)
            ]
    return pd.DataFrame(rows)


def stage_memory(model: Model, plan: Plan, opts: ActivationOptions, capacity_bytes: int) -> pd.DataFrame:
    """Per pipeline stage, without and with SP: sp, stage, kind (params/grads/optimizer/activations),
    bytes, total_bytes (the stage's sum) and capacity_bytes (the GPU's memory)."""
    rows = []
    for variant in sp_variants(plan):
        for st in memory_per_stage(model, variant, opts):
            rows += [
                {
                    "sp": SP_LABEL[variant.sp],
                    "stage": st["stage"],
                    "kind": k,
                    "bytes": st[k],
                    "total_bytes": st["total"],
                    "capacity_bytes": capacity_bytes,
                }
                for k in STATE_KINDS
            ]
    return pd.DataFrame(rows)


def _by_rank(metrics: dict, key: str) -> pd.Series:
    value = metrics.get(key)
    if not isinstance(value, dict):
        raise MetricsError(
            f"metrics.json has no {key!r} object ({{rank: bytes}}); keys present: "
            f"{', '.join(sorted(metrics)) or 'none'}"
        )
    try:
        return pd.Series({int(r): float(b) for r, b in value.items()}, dtype="float64")
    except (TypeError, ValueError) as err:
        raise MetricsError(f"metrics.json {key!r} must map ranks to bytes: {err}") from None


def measured_vs_predicted(metrics: dict) -> pd.DataFrame:
    """Per rank: measured_bytes (activation_bytes), predicted_bytes (predicted_activation_bytes),
    error_bytes = measured - predicted, error_pct = 100 * error / predicted. Ranks sorted."""
    measured = _by_rank(metrics, "activation_bytes")
    predicted = _by_rank(metrics, "predicted_activation_bytes")
    df = pd.DataFrame({"measured_bytes": measured, "predicted_bytes": predicted}).sort_index()
    df.index.name = "rank"
    df["error_bytes"] = df["measured_bytes"] - df["predicted_bytes"]
    df["error_pct"] = 100 * df["error_bytes"] / df["predicted_bytes"]
    return df.reset_index()


def measured_breakdown(metrics: dict) -> pd.DataFrame:
    """activation_breakdown {rank: {component: bytes}} long-form: rank, component, group, bytes."""
    data = metrics.get("activation_breakdown") or {}
    rows = [
        {"rank": int(r), "component": c, "group": COMPONENT_GROUP.get(c, "other"), "bytes": float(b)}
        for r, parts in data.items()
        for c, b in parts.items()
    ]
    return pd.DataFrame(rows, columns=["rank", "component", "group", "bytes"])


MODEL_STATE_KINDS = ("params", "grads", "optimizer")


def model_state_vs_predicted(metrics: dict) -> pd.DataFrame:
    """Per rank and kind (params, grads, optimizer): measured_bytes (model_state_bytes: the tensors the
    run held, parallel.engine.modelstate), predicted_bytes (predicted_model_state_bytes: the plan
    model for the engine's dtypes), error_bytes, error_pct. Ranks sorted, kinds in MODEL_STATE_KINDS order."""
    held, predicted = metrics.get("model_state_bytes"), metrics.get("predicted_model_state_bytes")
    if not isinstance(held, dict) or not isinstance(predicted, dict) or not held:
        raise MetricsError(
            "metrics.json has no model_state_bytes / predicted_model_state_bytes ({rank: {params, grads, "
            "optimizer}}): the run predates model-state measurement"
        )
    rows = []
    try:
        for rank, parts in held.items():
            for kind in MODEL_STATE_KINDS:
                rows.append(
                    {
                        "rank": int(rank),
                        "kind": kind,
                        "measured_bytes": float(parts[kind]),
                        "predicted_bytes": float(predicted[rank][kind]),
                    }
                )
    except (KeyError, TypeError, ValueError) as err:
        raise MetricsError(
            f"metrics.json model_state_bytes must map ranks to {{params, grads, optimizer}}: {err!r}"
        ) from None
    df = pd.DataFrame(rows)
    df["kind"] = pd.Categorical(df["kind"], MODEL_STATE_KINDS, ordered=True)
    df = df.sort_values(["rank", "kind"]).reset_index(drop=True)
    df["kind"] = df["kind"].astype(str)
    df["error_bytes"] = df["measured_bytes"] - df["predicted_bytes"]
    df["error_pct"] = 100 * df["error_bytes"] / df["predicted_bytes"].where(df["predicted_bytes"] > 0)
    return df
