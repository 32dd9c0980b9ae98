"""The plan fields this project's engine (parallel.engine) decides itself rather than its command line: a
contract the engine, `parallel train` and the CPU-calibrated step model (parallel.core.calibrated) share.

Its attention materialises the softmax (the plan model's "unfused"; ring CP keeps none, which the plan
model knows from cp_kind) and its dropout is a rate (`--dropout`), on exactly when the rate is above 0.
"""

from __future__ import annotations

import dataclasses

from parallel.core.plan import PLAN_DEFAULTS, Plan

ENGINE_SETS = ("attention", "dropout")
ENGINE_PLAN_FLAGS = tuple(k for k in PLAN_DEFAULTS if k not in ENGINE_SETS)  # the flags `parallel train` takes


def engine_plan(plan: Plan, *, dropout: float) -> Plan:
    """`plan` as this engine runs it (ENGINE_SETS)."""
    return dataclasses.replace(plan, attention="unfused", dropout=dropout > 0)
