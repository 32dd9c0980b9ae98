"""Formulas written once for one plan and for a column of plans: the few numpy operations the plan
model needs, which keep Python scalars scalar (plan_report's JSON, exact ints) and work elementwise
over numpy arrays (the vectorised search evaluates the same functions over every candidate).

Pure: numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_array(*values: Any) -> bool:
    return any(np.ndim(v) for v in values)


def where(cond: Any, a: Any, b: Any) -> Any:
    """`a if cond else b`, elementwise when `cond` is an array."""
    if np.ndim(cond) == 0:
        return a if cond else b
    return np.where(cond, a, b)


def minimum(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if is_array(a, b) else min(a, b)


def maximum(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if is_array(a, b) else max(a, b)


def ceil(x: Any) -> Any:
    return np.ceil(x) if is_array(x) else float(np.ceil(x))
