"""Why one plan beats another: the two step breakdowns side by side, and what the difference is made of.

    explain(model, cluster, top, other, options) -> {"top", "other", "rows", "summary", "equivalent"}

`rows` list each part of the step (compute, bubble, each dimension's exposed communication, the
optimizer) and the memory per GPU for both plans, with the difference; `summary` says in one
sentence how much faster the top plan is and which parts make the difference -- or that the two are
within the model's error of each other (parallel.search.space.MODEL_ERROR) and the top one is listed
first for being simpler. Pure: the plan model's own report (parallel.core.report.plan_report).
"""

from __future__ import annotations

from parallel.core.comm import DIMS
from parallel.core.plan import Plan
from parallel.core.report import Options, plan_report
from parallel.core.specs import Cluster, GiB, Model
from parallel.search.space import MODEL_ERROR

PARTS = (
    ("compute", "compute_s"),
    ("pipeline bubble", "bubble_s"),
    *((f"exposed {d.upper()}", f"exposed_{d}_s") for d in DIMS),
    ("optimizer", "optimizer_s"),
)


def explain(model: Model, cluster: Cluster, top: Plan, other: Plan, options: Options = Options()) -> dict:
    """The two plans' breakdowns side by side (module docstring)."""
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
    rows = [
        {"part": name, "top": float(ta.get(key, 0.0)), "other": float(tb.get(key, 0.0))}
        for name, key in (("step", "step_time_s"), *PARTS)
    ]
    for r in rows:
        r["difference"] = r["other"] - r["top"]
    mem = {"part": "memory per GPU (GiB)"}
    mem.update(top=a["memory_per_gpu_bytes"]["total"] / GiB, other=b["memory_per_gpu_bytes"]["total"] / GiB)
    mem["difference"] = mem["other"] - mem["top"]
    step_a, step_b = ta["step_time_s"], tb["step_time_s"]
    gain = step_b / step_a - 1
    equivalent = abs(gain) <= MODEL_ERROR
    parts = sorted(rows[1:], key=lambda r: -abs(r["difference"]))
    why = ", ".join(
        f"{r['part']} {'+' if r['difference'] > 0 else '−'}{abs(r['difference']):.3g} s"
        for r in parts[:3]
        if abs(r["difference"]) > 0.01 * step_a
    )
    if equivalent:
        summary = (
            f"{top.label()} and {other.label()} are within the model's {MODEL_ERROR:.0%} error of each other "
            f"({step_a:.3f} s vs {step_b:.3f} s, {gain:+.1%}); the model cannot tell them apart, and the first is "
            f"listed first as the simpler plan" + (f" (the differences: {why})" if why else "")
        )
    else:
        summary = (
            f"{top.label()} takes {step_a:.3f} s a step against {step_b:.3f} s for {other.label()}: "
            f"{gain:.1%} {'faster' if gain > 0 else 'slower'}"
            + (f", mostly from {why} on the other plan" if why else "")
        )
    return {
        "top": top.label(),
        "other": other.label(),
        "rows": [*rows, mem],
        "summary": summary,
        "equivalent": equivalent,
        "rule": f"plans within {MODEL_ERROR:.0%} (the model's mean error against published GPU runs) are equivalent",
    }


def explain_text(ex: dict) -> str:
    """The side-by-side table and the summary, as text."""
    w = max(len(r["part"]) for r in ex["rows"])
    lines = [f"{'':<{w}}  {'top':>10}  {'other':>10}  {'other - top':>11}"]
    for r in ex["rows"]:
        lines.append(f"{r['part']:<{w}}  {r['top']:>10.3f}  {r['other']:>10.3f}  {r['difference']:>+11.3f}")
    return "\n".join([f"top:   {ex['top']}", f"other: {ex['other']}", "", *lines, "", ex["summary"]])
