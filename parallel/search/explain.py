"""Why one plan beats another: the two step breakdowns side by side, and the key that orders them.

    explain(model, cluster, top, other, options, fastest_s=None) -> {"top", "other", "parts", "summary", ...}

`parts` lists each part of the step (compute, bubble, each dimension's exposed communication, the
optimizer) in seconds for both plans, with the difference; `memory_per_gpu_bytes` the same for memory.
`summary` says in one sentence which plan the search lists first and why, by the search's own rule
(parallel.search.space.EQUIVALENCE_RULE): plans within the model's error (MODEL_ERROR) of the fastest
are equally fast and go simplest first (simplicity_terms), then by time; the rest go by time. Every
sentence comparing two plans is written here (`verdict_text`), with percentages one way only: the
slower step over the faster, less one ("B is 18.3% slower than A").

`fastest_s`: the fastest step of the search the two came from (the reference of the band); without
it the faster of the two is the reference, as when they are the search's top two. Pure: the plan
model's own report (parallel.core.report.plan_report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from parallel.core.comm import DIMS, crosses_nodes
from parallel.core.plan import Plan
from parallel.core.report import Options, plan_report
from parallel.core.specs import Cluster, GiB, Model
from parallel.search.space import (
    CP_NEEDED_TOKENS,
    EQUIVALENCE_RULE,
    LINKS,
    MODEL_ERROR,
    simplicity_terms,
    within_model_error,
)

PARTS = (
    ("compute", "compute_s"),
    ("pipeline bubble", "bubble_s"),
    *((f"exposed {d.upper()}", f"exposed_{d}_s") for d in DIMS),
    ("optimizer", "optimizer_s"),
)
DEGREES = ("dp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Contender:
    """One side of a comparison: the plan, its predicted step and its simplicity terms."""

    label: str
    plan: Plan
    step_s: float
    terms: dict[str, int]
    errors: tuple[str, ...] = ()  # why the plan is not valid here (it fits no search then)

    @property
    def simplicity(self) -> int:
        return sum(self.terms.values())


def contender(plan: Plan, step_s: float, model: Model, cluster: Cluster, errors: tuple = ()) -> Contender:
    """`plan` counted by the search's own simplicity_terms (one row, the same columns as a search's)."""
    row = {k: [getattr(plan, k)] for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero", "recompute")}
    row["tp_link"] = [LINKS[int(bool(crosses_nodes(plan, cluster, ("tp",))))]]
    terms = simplicity_terms(pd.DataFrame(row), model.seq_len)
    return Contender(plan.label(), plan, float(step_s), {k: int(v[0]) for k, v in terms.items()}, tuple(errors))


@dataclass(frozen=True)
class Verdict:
    """Which of two plans the search lists first, and by which key."""

    first: Contender
    second: Contender
    reason: str  # "valid" | "faster" | "simpler" | "faster_within_error" | "tie"
    fastest_s: float  # the band's reference: the fastest step of the search (or of the two)

    @property
    def equivalent(self) -> bool:
        return bool(within_model_error(self.second.step_s, self.fastest_s))

    @property
    def slower_fraction(self) -> float:
        """The slower step over the faster one, less one (>= 0)."""
        fast, slow = sorted((self.first.step_s, self.second.step_s))
        return slow / fast - 1


def verdict(a: Contender, b: Contender, fastest_s: float | None = None) -> Verdict:
    """EQUIVALENCE_RULE for two plans: a valid plan before an invalid one; within the model's error of
    the fastest, the simpler first, then the faster; otherwise the faster. A full tie keeps `a` first."""
    fastest = min(a.step_s, b.step_s, math.inf if fastest_s is None else fastest_s)
    if bool(a.errors) != bool(b.errors):  # a search lists valid plans only
        return Verdict(b, a, "valid", fastest) if a.errors else Verdict(a, b, "valid", fastest)
    faster, slower = (a, b) if a.step_s <= b.step_s else (b, a)
    if not (within_model_error(a.step_s, fastest) and within_model_error(b.step_s, fastest)):
        return Verdict(faster, slower, "faster", fastest)
    if a.simplicity != b.simplicity:
        simpler, other = (a, b) if a.simplicity < b.simplicity else (b, a)
        return Verdict(simpler, other, "simpler", fastest)
    if a.step_s != b.step_s:
        return Verdict(faster, slower, "faster_within_error", fastest)
    return Verdict(a, b, "tie", fastest)


def _value(term: str, c: Contender) -> str:
    """How `c` stands on one simplicity term, for the text: "PP8", "ZeRO-3", "TP16 across nodes"."""
    p = c.plan
    if term in DEGREES:
        return f"{term.upper()}{getattr(p, term)}"
    if term == "vpp":
        return f"vpp {p.vpp}"
    if term == "zero":
        return f"ZeRO-{p.zero}"
    if term == "recompute":
        return f"recompute {p.recompute}"
    if term == "tp_across_nodes":
        return f"TP{p.tp} {'across nodes' if c.terms[term] else 'inside a node'}"
    return f"CP{p.cp}"  # cp_short_sequence


LESS = {
    **{d: f"no {d.upper()}" for d in DEGREES},
    "vpp": "no interleaving",
    "zero": "a lower ZeRO stage",
    "recompute": "no recomputation",
    "tp_across_nodes": "TP inside a node",
    "cp_short_sequence": f"no CP below {CP_NEEDED_TOKENS:,} tokens",
}
MORE = {
    **{d: d.upper() for d in DEGREES},
    "vpp": "interleaving",
    "zero": "a higher ZeRO stage",
    "recompute": "recomputation",
    "tp_across_nodes": "TP across nodes",
    "cp_short_sequence": f"CP below {CP_NEEDED_TOKENS:,} tokens",
}


def differing_terms(first: Contender, second: Contender) -> tuple[list[str], list[str]]:
    """(the terms where `first` counts less, those where it counts more), in EQUIVALENCE_RULE's order."""
    less = [t for t in first.terms if first.terms[t] < second.terms[t]]
    more = [t for t in first.terms if first.terms[t] > second.terms[t]]
    return less, more


def _phrases(terms: list[str], words: dict[str, str], a: Contender, b: Contender) -> str:
    # CP below CP_NEEDED_TOKENS differs only with CP itself (one sequence length): one phrase for both
    shown = [t for t in terms if not (t == "cp_short_sequence" and "cp" in terms)]
    extra = f"; CP counts one more below {CP_NEEDED_TOKENS:,} tokens"
    return ", ".join(
        f"{words[t]} ({_value(t, a)} against {_value(t, b)}{extra if t == 'cp' and 'cp_short_sequence' in terms else ''})"
        for t in shown
    )


def _slower(v: Verdict) -> str:
    fast, slow = sorted((v.first, v.second), key=lambda c: c.step_s)
    if slow.step_s == fast.step_s:
        return f"both take {fast.step_s:.3f} s a step"
    return f"{slow.label} is {v.slower_fraction:.1%} slower than {fast.label} ({slow.step_s:.3f} s against {fast.step_s:.3f} s)"


def verdict_text(v: Verdict) -> str:
    """The sentences that say which plan goes first and why (every comparison text is this one)."""
    a, b, err = v.first, v.second, f"{MODEL_ERROR:.0%}"
    if v.reason == "valid":
        return f"{a.label} is listed first: {b.label} is not a valid plan here ({b.errors[0]})."
    if v.reason == "faster":
        head = f"{a.label} is faster: {_slower(v)}"
        if a.step_s == v.fastest_s:
            return f"{head}, beyond the model's {err} error."
        if within_model_error(a.step_s, v.fastest_s):
            return (
                f"{head}, and {b.step_s / v.fastest_s - 1:.1%} slower than the search's fastest plan "
                f"({v.fastest_s:.3f} s), beyond the model's {err} error."
            )
        return (
            f"{head}; both are beyond the model's {err} error of the search's fastest plan "
            f"({v.fastest_s:.3f} s), where plans are ordered by time."
        )
    same = f"{a.label} is listed first: equally fast as {b.label} within the model's error ({err})"
    if v.reason == "simpler":
        less, more = differing_terms(a, b)
        text = f"{same} and simpler: {_phrases(less, LESS, a, b)}"
        text += f"; against that, it has {_phrases(more, MORE, a, b)}" if more else ""
        times = _slower(v)
        return f"{text} ({a.simplicity} against {b.simplicity} by the counting rule). {times[:1].upper()}{times[1:]}."
    simple = f"equally simple ({a.simplicity} each by the counting rule)"
    if v.reason == "faster_within_error":
        return f"{same} and {simple}, so the shorter predicted step decides: {_slower(v)}."
    return f"{a.label} and {b.label} are equally fast ({a.step_s:.3f} s a step) and {simple}: the model cannot tell them apart."


def explain(
    model: Model,
    cluster: Cluster,
    top: Plan,
    other: Plan,
    options: Options = Options(),
    fastest_s: float | None = None,
) -> dict:
    """The two plans' breakdowns side by side and the verdict (module docstring)."""
    for plan in (top, other):
        if plan.world_size != cluster.gpus:
            raise ValueError(
                f"{plan.label()}: dp×tp×pp×cp = {plan.world_size} GPUs, but the search is for {cluster.gpus}"
            )
    a, b = plan_report(top, model, cluster, options), plan_report(other, model, cluster, options)
    for plan, rep in ((top, a), (other, b)):
        if rep["step_time_s"] is None:
            raise ValueError(f"{plan.label()} cannot be split this way: {'; '.join(rep['errors'])}")
    ta, tb = a["step_time"], b["step_time"]
    parts = [
        {"part": name, "top_s": float(ta.get(key, 0.0)), "other_s": float(tb.get(key, 0.0))}
        for name, key in (("step", "step_time_s"), *PARTS)
    ]
    for r in parts:
        r["difference_s"] = r["other_s"] - r["top_s"]
    mem = {"top": a["memory_per_gpu_bytes"]["total"], "other": b["memory_per_gpu_bytes"]["total"]}
    mem["difference"] = mem["other"] - mem["top"]
    sides = {
        "top": contender(top, ta["step_time_s"], model, cluster, a["errors"]),
        "other": contender(other, tb["step_time_s"], model, cluster, b["errors"]),
    }
    v = verdict(sides["top"], sides["other"], fastest_s)
    sign = 1.0 if v.first is sides["top"] else -1.0  # the differences as second minus first
    big = sorted(parts[1:], key=lambda r: -abs(r["difference_s"]))
    why = ", ".join(
        f"{r['part']} {sign * r['difference_s']:+.3g} s"
        for r in big[:3]
        if abs(r["difference_s"]) > 0.01 * min(ta["step_time_s"], tb["step_time_s"])
    )
    return {
        "top": top.label(),
        "other": other.label(),
        "parts": parts,
        "memory_per_gpu_bytes": mem,
        "first": "top" if v.first is sides["top"] else "other",
        "reason": v.reason,
        "slower_fraction": v.slower_fraction,
        "fastest_step_time_s": v.fastest_s,
        "equivalent": v.equivalent,
        "simplicity": {k: c.simplicity for k, c in sides.items()},
        "simplicity_terms": {k: dict(c.terms) for k, c in sides.items()},
        "summary": verdict_text(v)
        + (f" Largest differences, {v.second.label} minus {v.first.label}: {why}" if why else ""),
        "rule": EQUIVALENCE_RULE,
    }


def runner_up(table: pd.DataFrame) -> tuple[int | None, int]:
    """The row of the first plan after the top whose step (by a millionth) or memory (by a MiB) differs
    from the top's, and how many plans before it tie with the top (None when none differs): rounding
    apart, such twins (a mirrored stage split) cost the same."""
    step = table["step_time_s"].to_numpy()
    mem = table["memory_per_gpu_bytes"].to_numpy()
    differs = np.flatnonzero((abs(step[1:] - step[0]) > 1e-6 * step[0]) | (abs(mem[1:] - mem[0]) >= 2**20))
    if not len(differs):
        return None, len(table) - 1
    return int(differs[0]) + 1, int(differs[0])


def explain_text(ex: dict) -> str:
    """The side-by-side table and the summary, as text."""
    rows = [(r["part"], r["top_s"], r["other_s"], r["difference_s"]) for r in ex["parts"]]
    m = ex["memory_per_gpu_bytes"]
    rows.append(("memory per GPU (GiB)", m["top"] / GiB, m["other"] / GiB, m["difference"] / GiB))
    w = max(len(r[0]) for r in rows)
    lines = [f"{'':<{w}}  {'top':>10}  {'other':>10}  {'other - top':>11}"]
    lines += [f"{p:<{w}}  {t:>10.3f}  {o:>10.3f}  {d:>+11.3f}" for p, t, o, d in rows]
    ties = ex.get("exact_ties", 0)
    verb = "plans tie" if ties > 1 else "plan ties"
    twins = (
        [
            f"({ties} other {verb} with the top: the same step and memory but for rounding, e.g. a mirrored stage split; compared with the first plan that differs)"
        ]
        if ties
        else []
    )
    return "\n".join([f"top:   {ex['top']}", f"other: {ex['other']}", *twins, "", *lines, "", ex["summary"]])
