"""How a plan field is declared: its default, bounds, help, and every name it goes by.

A `Plan` field is written once, in parallel/core/plan.py, as `knob(default, ...)`: the dataclass
default plus a `Knob` in the field's metadata. Everything that reads or writes a plan -- argparse
(parallel.cli.args), the dashboard URL and plan codes (parallel.review.urls), the review page's
editor, plan JSON and the label (parallel.core.plan: plan_from_values, plan_values, Plan.label), the
exporters' options (parallel.importers.export), PlanColumns' fields -- is generated from these
declarations, so adding a field is one edit there plus its cost terms.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("int", "bool", "choice", "text", "opt_int", "opt_bool", "opt_float")
OPTIONAL_KINDS = ("opt_int", "opt_bool", "opt_float")  # None (unset) is a value of these


@dataclass(frozen=True)
class Knob:
    """Everything about one plan field besides its name and default.

    kind: int | bool | choice | text | opt_int (an int or None) | opt_bool (true, false or None) |
    opt_float (a finite number or None);
    url: its key in dashboard URLs, plan codes and the review editor (short: links stay readable);
    flag: its command-line flag; column: the editor's column title; help: one line for all of them;
    choices (kind choice), lo / hi (numbers: inclusive bounds; opt_float: lo exclusive);
    token: the label's word for a plan whose value differs from the default ('' for none), given the
    plan (some settings only count together with another, e.g. p2p overlap needs vpp > 1);
    megatron / torchtitan: the options of those frameworks the field maps to (docs/plan-schema.md);
    group: the argparse group and the form section it belongs to."""

    kind: str
    url: str
    flag: str
    column: str
    help: str
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    token: Callable[[Any], str] | None = None
    megatron: tuple[str, ...] = ()
    torchtitan: tuple[str, ...] = ()
    group: str = "plan"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"knob kind must be one of {', '.join(KINDS)}, got {self.kind!r}")


def knob(default: Any, kind: str, url: str, help: str, **rest: Any) -> Any:
    """A dataclass field declared with its Knob; `flag` defaults to --<name>, set by the class below."""
    return dataclasses.field(default=default, metadata={"knob": {"kind": kind, "url": url, "help": help, **rest}})


@dataclass(frozen=True)
class FieldSpec:
    """One declared field: its name, default and Knob."""

    name: str
    default: Any
    knob: Knob

    @property
    def kind(self) -> str:
        return self.knob.kind


def field_specs(cls: type) -> tuple[FieldSpec, ...]:
    """The declared fields of a dataclass, in declaration order (flag and column defaulted from the name)."""
    out = []
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata.get("knob") or {})
        if not meta:
            continue
        meta.setdefault("flag", "--" + f.name.replace("_", "-"))
        meta.setdefault("column", meta["url"])
        out.append(FieldSpec(f.name, f.default, Knob(**meta)))
    return tuple(out)


def value_error(spec: FieldSpec, value: Any) -> str | None:
    """What is wrong with `value` for this field ('must be ...'), or None: its kind, choices and bounds."""
    k = spec.knob
    if value is None and k.kind in OPTIONAL_KINDS:
        return None
    if k.kind == "opt_float":
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or (k.lo is not None and value <= k.lo) or (k.hi is not None and value > k.hi):
            return (
                f"must be a number above {k.lo:g}" + (f" and at most {k.hi:g}" if k.hi is not None else "") + " or null"
            )
        return None
    if k.kind in ("bool", "opt_bool"):
        return (
            None if isinstance(value, bool) else "must be true or false" + (" or null" if k.kind == "opt_bool" else "")
        )
    if k.kind == "choice":
        ok = value in k.choices and isinstance(value, type(k.choices[0])) and not isinstance(value, bool)
        return None if ok else f"must be one of {', '.join(map(str, k.choices))}"
    if k.kind == "text":
        return None if isinstance(value, str) else "must be text"
    what = "a non-negative integer" if k.lo == 0 else "a positive integer" if k.lo == 1 else "an integer"
    what += " or null" if k.kind == "opt_int" else ""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be {what}"
    if k.lo is not None and value < k.lo:
        return f"must be {what}"
    if k.hi is not None and value > k.hi:
        return f"must be at most {k.hi:,}"
    return None


def schema_table(specs: tuple[FieldSpec, ...]) -> str:
    """The declared fields as a Markdown table (docs/plan-schema.md holds it; a test keeps them equal)."""

    def cell(text: object) -> str:
        return str(text).replace("|", "\\|")

    rows = [
        "| field | kind | default | CLI flag | URL key | editor column | Megatron-LM | torchtitan | what |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        k = s.knob
        kind = f"{k.kind}: {', '.join(map(str, k.choices))}" if k.choices else k.kind
        rows.append(
            "| "
            + " | ".join(
                cell(x)
                for x in (
                    f"`{s.name}`",
                    kind,
                    "unset" if s.default is None else s.default,
                    f"`{k.flag}`",
                    f"`{k.url}`",
                    k.column,
                    ", ".join(k.megatron) or "—",
                    ", ".join(k.torchtitan) or "—",
                    k.help,
                )
            )
            + " |"
        )
    return "\n".join(rows) + "\n"
