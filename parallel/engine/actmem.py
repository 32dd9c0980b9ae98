"""Activation memory, measured: the bytes one forward pass saves for backward, per layer and per component.

`torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd keeps for backward. The meter
counts each *storage* once (a tensor saved by two ops, or a view of an already-saved tensor, costs
nothing more), and skips parameters and the microbatch's own input tensors (token ids), which exist
whether or not anything is saved. The model says what its ops save with two cheap scopes:

    with layer(3):                           # saves below belong to layer 3
        with saves("attention.qk"):          # ... and to this component of memory.py
            att = q @ k.transpose(-2, -1)
        with saves({"attention.dropout_output": pd, "attention.v": v}):   # one op, two components:
            y = pd @ v                                                     # label each tensor

Component names are `parallel.core.memory.COMPONENTS` for the layers; the pipeline ends use
`embedding.*` and `output.*` (reported as memory.py's `first_stage_extra` and `last_stage_extra`).
A save outside any scope is counted as `other`, so nothing is lost. With no meter active the
scopes cost one attribute check.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from parallel.core import memory
from parallel.core.engine_plan import engine_plan
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan
from parallel.core.specs import Model

_active: "ActivationMeter | None" = None  # the meter of the forward being measured, if any
_layer: int | None = None
_component: str | dict | None = None


class _Scope:
    __slots__ = ("layer", "component", "saved")

    def __init__(self, layer, component):
        self.layer, self.component = layer, component

    def __enter__(self):
        global _layer, _component
        self.saved = (_layer, _component)
        if self.layer is not None:
            _layer = self.layer
        if self.component is not None:
            _component = self.component

    def __exit__(self, *exc):
        global _layer, _component
        _layer, _component = self.saved


class _Nothing:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


_NOTHING = _Nothing()


def saves(component: str | dict):
    """Label what the ops inside save: a component name, or {component: tensor or tuple of tensors}
    for ops that save tensors of several components."""
    return _Scope(None, component) if _active is not None else _NOTHING


def layer(index: int):
    """Attribute saves inside to transformer layer `index` (global layer number)."""
    return _Scope(index, None) if _active is not None else _NOTHING


def _key(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


class ActivationMeter:
    """Bytes saved for backward inside `measure()`, by (layer, component).

    `exclude`: tensors never counted (parameters); `measure(inputs=...)` adds the microbatch's inputs.
    Their storages are looked up at each save, not once: under ZeRO-3 a parameter's storage is
    allocated again each time its layer is all-gathered (parallel.engine.zero).
    """

    def __init__(self, *, exclude=()):
        self._exclude_tensors = list(exclude)
        self.bytes: dict[tuple[int | None, str], int] = defaultdict(int)

    def measure(self, *, inputs=()):
        return _Measure(self, inputs)

    def _pack(self, t: torch.Tensor):
        key = _key(t)
        if key in self._seen or key in {_key(p) for p in self._exclude_tensors}:
            return t
        self._seen.add(key)
        comp = _component
        if isinstance(comp, dict):
            comp = next(
                (
                    name
                    for name, refs in comp.items()
                    for ref in (refs if isinstance(refs, (tuple, list)) else (refs,))
                    if _key(ref) == key
                ),
                "other",
            )
        self.bytes[
            (_layer if comp is None or not comp.startswith(("embedding.", "output.")) else None, comp or "other")
        ] += t.untyped_storage().nbytes()
        return t

    def total(self) -> int:
        return int(sum(self.bytes.values()))

    def per_layer(self) -> dict[int, int]:
        out: dict[int, int] = defaultdict(int)
        for (lay, _), n in self.bytes.items():
            if lay is not None:
                out[lay] += n
        return dict(sorted(out.items()))

    def breakdown(self) -> dict[str, int]:
        """{component: bytes} summed over layers; the pipeline ends as first/last_stage_extra."""
        out: dict[str, int] = defaultdict(int)
        for (_, comp), n in self.bytes.items():
            name = (
                "first_stage_extra"
                if comp.startswith("embedding.")
                else "last_stage_extra"
                if comp.startswith("output.")
                else comp
            )
            out[name] += n
        return dict(out)


class _Measure:
    def __init__(self, meter: ActivationMeter, inputs):
        self.meter, self.inputs = meter, inputs

    def __enter__(self):
        global _active
        if _active is not None:
            raise RuntimeError("one activation measurement at a time")
        m = self.meter
        m._seen = {_key(t) for t in self.inputs}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(m._pack, lambda t: t)
        self.hooks.__enter__()
        _active = m
        return m

    def __exit__(self, *exc):
        global _active
        _active = None
        self.hooks.__exit__(*exc)
        del self.meter._seen  # holds storage pointers only; drop them with the measurement


def options(model: Model, *, swiglu: str = "fused") -> ActivationOptions:
    """The plan model's description of this engine's activations: the model's dtype, bool dropout
    masks, the run's SwiGLU mode (its attention and dropout: engine_plan)."""
    return ActivationOptions(act_bytes=model.dtype_bytes, mask_bytes=1, swiglu=swiglu)


def predicted_breakdown(
    model: Model, plan: Plan, *, stage: int, dropout: float, swiglu: str = "fused"
) -> dict[str, float]:
    """memory.py's bytes for one microbatch on one GPU of `stage`, keyed like `ActivationMeter.breakdown`:
    per-layer components times the stage's layers, plus the first/last stage extras."""
    opts = options(model, swiglu=swiglu)
    plan = engine_plan(plan, dropout=dropout)
    n_layers = model.layers // plan.pp
    out = {k: v * n_layers for k, v in memory.activation_components_bytes(model, plan, opts).items() if v}
    if stage == 0:
        out["first_stage_extra"] = memory.first_stage_extra_bytes(model, plan, opts)
    if stage == plan.pp - 1:
        out["last_stage_extra"] = memory.last_stage_extra_bytes(model, plan, opts)
    return {k: v for k, v in out.items() if v}
