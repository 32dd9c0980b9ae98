"""What a re-plan says in words: where the measured step differs from the modelled one by more than
the model's error and what such a gap usually means (GAP_MEANINGS), why a plan is faster (the part
that shrinks most), and the verdict in one line. Pure: stdlib (parallel.core.comm's dimension names).
"""

from __future__ import annotations

from parallel.core.comm import DIMS
from profiler.analyzers.split import COMPONENTS

PARTS = ("compute", "bubble", *(f"exposed_{d}" for d in DIMS), "optimizer")  # what a plan's why compares
GAP_MEANINGS = {  # component -> (measured above the model, measured below it)
    "gemm": (
        "GEMMs ran slower than the fitted device times them: small or odd shapes, kernels slowed by communication "
        "kernels beside them, or (on a CPU) ranks sharing cores",
        "GEMMs ran faster than modelled",
    ),
    "attention": ("attention ran slower than modelled: an unfused or masked kernel", "attention ran faster"),
    "elementwise": (
        "element-wise kernels and host dispatch took longer than modelled: unfused norms and activations, many "
        "small operators",
        "element-wise work was fused more than the model assumes",
    ),
    "optimizer": ("the optimizer step is slower than modelled: an unfused optimizer", "the optimizer step is cheaper"),
    "exposed_tp": (
        "TP collectives were not hidden under the GEMMs, or the TP group crossed a slower link",
        "TP communication overlapped more than modelled",
    ),
    "exposed_sp": ("SP's gathers and scatters were not hidden", "SP's collectives overlapped more than modelled"),
    "exposed_cp": ("the K/V exchange was not hidden behind attention", "the K/V exchange overlapped more"),
    "exposed_ep": ("expert all-to-alls waited: unbalanced routing", "expert all-to-alls overlapped more"),
    "exposed_pp": (
        "pipeline sends and receives waited: unbalanced stages, or P2P not overlapped",
        "pipeline transfers were cheaper than modelled",
    ),
    "exposed_dp": (
        "gradient reduction did not overlap the backward pass (or ran over a slower link than modelled)",
        "gradient reduction overlapped the backward pass more than modelled",
    ),
    "exposed_other": (
        "collectives outside the plan's groups (loss and metric all-reduces, barriers) that the model does not know",
        "",
    ),
    "bubble": (
        "the pipeline idled more than (p-1)/(v·m) of a step: unbalanced stages or a slow stage",
        "the pipeline's bubble was smaller than the schedule's",
    ),
    "memory": ("memory copies not overlapped: host-device transfers, offloading", ""),
    "idle": (
        "the host kept the device waiting: data loading, Python, launch latency, synchronisation (the model has none)",
        "",
    ),
}


def parts(c: dict[str, float]) -> dict[str, float]:
    """A plan's components folded into PARTS (compute: its kernel classes together)."""
    out = {k: c.get(k, 0.0) for k in PARTS}
    out["compute"] = c["gemm"] + c["attention"] + c["elementwise"]
    return out


def why(mine: dict[str, float], job: dict[str, float]) -> str:
    """The part that shrinks most from the job's plan to this one (both as modelled, scaled alike)."""
    a, b = parts(job), parts(mine)
    k = max(PARTS, key=lambda p: a[p] - b[p])
    if a[k] - b[k] <= 0:
        return "no part shrinks"
    name = k.replace("exposed_", "exposed ").replace("_", " ")
    return f"{name} {a[k] * 1e3:.1f} → {b[k] * 1e3:.1f} ms"


def gaps(measured: dict, modelled: dict, error: float) -> list[dict]:
    out = []
    limit = error * measured["step_s"]
    for c in COMPONENTS:
        m, p = measured["components"].get(c, 0.0), modelled.get(c, 0.0)
        if abs(m - p) > limit:
            above, below = GAP_MEANINGS[c]
            text = above if m > p else below or above
            out.append({"component": c, "measured_s": m, "modelled_s": p, "meaning": text})
    return out


def gap_lines(gaps: list[dict]) -> list[str]:
    """Each gap as one line: 'exposed DP 3.1 s measured vs 0.2 s modelled: gradient reduction ...'."""
    out = []
    for g in gaps:
        name = g["component"].replace("exposed_", "exposed ").replace("_", " ")
        out.append(f"{name} {g['measured_s']:.4g} s measured vs {g['modelled_s']:.4g} s modelled: {g['meaning']}")
    return out


def verdict(plans: list[dict], error: float) -> str:
    """The re-plan in one line: the best plan and its gain, or no better plan beyond the model's error."""
    if not plans:
        return "no other plan fits these GPUs"
    best = plans[0]
    if best["gain"] <= error:
        return (
            f"no better plan by more than the model's error ({error:.0%}): the best, {best['label']}, "
            f"gains {best['gain']:.0%}"
        )
    return f"{best['label']} runs this job {best['gain']:.0%} faster ({best['why']})"
