"""Why one plan beats another: the verdict follows the search's own ordering key and says it in one way.

The search lists plans within the model's error of the fastest as equally fast, simplest first (its
counting rule), then by time; the rest by time. Each pair below is a case of that rule; the text must
name the key that decided it, the dimension that differs, and a percentage one way only (the slower
step over the faster, less one)."""

import re

import pandas as pd
import pytest

from parallel.core.plan import Plan
from parallel.core.report import Options
from parallel.core.specs import CLUSTERS, MODELS
from parallel.search.explain import contender, differing_terms, explain, runner_up, verdict, verdict_text
from parallel.search.space import MODEL_ERROR, Constraints, search

L70 = MODELS["llama3-70b"]  # 8,192 tokens: CP counts one more (below 32,768)
H100x8 = CLUSTERS["dgx-h100"].with_nodes(8)  # 64 GPUs, 8 a node
GB = 512


def plan(**kw) -> Plan:
    return Plan(global_batch=GB, **kw)


def side(p: Plan, step_s: float, errors=()):
    return contender(p, step_s, L70, H100x8, errors)


A = plan(dp=8, tp=8)  # the simplest two-dimension plan every case compares against
# (a, a's step, b, b's step, the search's fastest or None, which goes first, the key, the text it must hold)
CASES = {
    "faster": (
        A, 10.0, plan(dp=4, tp=8, pp=2), 11.83, None, "a", "faster",
        "DP8 TP8 gb512 is faster: DP4 TP8 PP2 gb512 is 18.3% slower than DP8 TP8 gb512 (11.830 s against "
        "10.000 s), beyond the model's 7% error.",
    ),
    "faster, the slower one given first": (
        plan(dp=4, tp=8, pp=2), 11.83, A, 10.0, None, "b", "faster",
        "DP8 TP8 gb512 is faster: DP4 TP8 PP2 gb512 is 18.3% slower than DP8 TP8 gb512",
    ),
    "faster, the simpler one beyond the error": (
        A, 10.0, plan(dp=64), 10.9, None, "a", "faster", "DP64 gb512 is 9.0% slower than DP8 TP8 gb512",
    ),
    "simpler by pp": (
        A, 10.3, plan(dp=4, tp=8, pp=2), 10.0, None, "a", "simpler",
        "DP8 TP8 gb512 is listed first: equally fast as DP4 TP8 PP2 gb512 within the model's error (7%) and "
        "simpler: no PP (PP1 against PP2) (2 against 3 by the counting rule). DP8 TP8 gb512 is 3.0% slower "
        "than DP4 TP8 PP2 gb512 (10.300 s against 10.000 s).",
    ),
    "simpler by dp": (
        plan(dp=1, tp=8, pp=8), 10.0, plan(dp=2, tp=8, pp=4), 9.9, None, "a", "simpler",
        "simpler: no DP (DP1 against DP2) (2 against 3",
    ),
    "simpler by tp": (plan(dp=64), 10.5, A, 10.0, None, "a", "simpler", "simpler: no TP (TP1 against TP8) (1 against 2"),
    "simpler by cp, which counts one more at 8K tokens": (
        A, 10.0, plan(dp=4, tp=8, cp=2), 9.5, None, "a", "simpler",
        "simpler: no CP (CP1 against CP2; CP counts one more below 32,768 tokens) (2 against 4",
    ),
    "simpler by ep": (A, 10.0, plan(dp=8, tp=8, ep=2), 9.8, None, "a", "simpler", "simpler: no EP (EP1 against EP2)"),
    "simpler by interleaving": (
        plan(dp=4, tp=8, pp=2), 10.0, plan(dp=4, tp=8, pp=2, vpp=2), 9.6, None, "a", "simpler",
        "simpler: no interleaving (vpp 1 against vpp 2) (3 against 4",
    ),
    "simpler by ZeRO": (
        plan(dp=8, tp=8, zero=3), 10.0, plan(dp=8, tp=8, zero=1), 10.2, None, "b", "simpler",
        "simpler: a lower ZeRO stage (ZeRO-1 against ZeRO-3) (2 against 3",
    ),
    "simpler by recomputation": (
        plan(dp=8, tp=8, recompute="selective"), 10.0, A, 10.1, None, "b", "simpler",
        "simpler: no recomputation (recompute none against recompute selective)",
    ),
    "simpler by TP inside a node": (
        plan(dp=4, tp=16), 10.0, A, 10.4, None, "b", "simpler",
        "simpler: TP inside a node (TP8 inside a node against TP16 across nodes) (2 against 4",
    ),
    "simpler on the whole, though not in every term": (
        plan(dp=8, tp=8, zero=3), 10.0, plan(dp=2, tp=8, pp=2, cp=2, zero=1), 9.8, None, "a", "simpler",
        "simpler: no PP (PP1 against PP2), no CP (CP1 against CP2; CP counts one more below 32,768 tokens); "
        "against that, it has a higher ZeRO stage (ZeRO-3 against ZeRO-1) (3 against 5",
    ),
    "equally fast, equally simple": (
        plan(dp=16, tp=4, zero=3), 58.062, plan(dp=8, tp=8, zero=3, micro_batch=2), 58.520, None, "a",
        "faster_within_error",
        "DP16 TP4 ZeRO-3 gb512 is listed first: equally fast as DP8 TP8 ZeRO-3 mb2 gb512 within the model's "
        "error (7%) and equally simple (3 each by the counting rule), so the shorter predicted step decides: "
        "DP8 TP8 ZeRO-3 mb2 gb512 is 0.8% slower than DP16 TP4 ZeRO-3 gb512 (58.520 s against 58.062 s).",
    ),
    "equally simple, the slower given first": (
        plan(dp=4, tp=8, pp=2), 10.5, plan(dp=2, tp=8, pp=4), 10.0, None, "b", "faster_within_error",
        "DP4 TP8 PP2 gb512 is 5.0% slower than DP2 TP8 PP4 gb512",
    ),
    "a full tie": (
        plan(dp=4, tp=8, pp=2), 10.0, plan(dp=2, tp=8, pp=4), 10.0, None, "a", "tie",
        "DP4 TP8 PP2 gb512 and DP2 TP8 PP4 gb512 are equally fast (10.000 s a step) and equally simple (3 each",
    ),
    # against the search's fastest (9.9 s): 10.5 is inside its band, 10.8 is not, however simple it is
    "out of the search's band": (
        plan(dp=4, tp=8, pp=2), 10.5, plan(dp=64), 10.8, 9.9, "a", "faster",
        "DP64 gb512 is 2.9% slower than DP4 TP8 PP2 gb512 (10.800 s against 10.500 s), and 9.1% slower than "
        "the search's fastest plan (9.900 s), beyond the model's 7% error.",
    ),
    "both out of the search's band": (
        A, 11.0, plan(dp=64), 11.2, 10.0, "a", "faster",
        "both are beyond the model's 7% error of the search's fastest plan (10.000 s), where plans are ordered by time",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_verdict_states_the_key_that_orders_two_plans(case):
    pa, sa, pb, sb, fastest, first, reason, text = CASES[case]
    a, b = side(pa, sa), side(pb, sb)
    v = verdict(a, b, fastest)
    assert (v.first, v.reason) == ((a, reason) if first == "a" else (b, reason))
    assert v.slower_fraction == pytest.approx(max(sa, sb) / min(sa, sb) - 1) and v.slower_fraction >= 0
    words = verdict_text(v)
    assert text in words
    assert not re.search(r"[-−]\d[\d.]*%", words)  # one direction: no negative percentages
    assert ("simpler:" in words) == (reason == "simpler")  # never "simpler" when equally simple
    if reason == "simpler":
        assert v.first.simplicity < v.second.simplicity and differing_terms(v.first, v.second)[0]
    assert v.equivalent == (reason in ("simpler", "faster_within_error", "tie"))
    if reason in ("simpler", "faster_within_error"):
        assert f"within the model's error ({MODEL_ERROR:.0%})" in words
    if sa != sb:
        fast, slow = sorted(((sa, pa), (sb, pb)), key=lambda x: x[0])
        assert f"{slow[1].label()} is {slow[0] / fast[0] - 1:.1%} slower than {fast[1].label()}" in words


def test_a_valid_plan_goes_before_one_that_does_not_fit():
    a, b = side(A, 12.0), side(plan(dp=64), 10.0, ["memory per GPU 99.0 GiB exceeds the GPU's 80.0 GiB"])
    for v in (verdict(b, a), verdict(a, b)):  # faster, simpler, but it fits no search
        assert v.first is a and v.reason == "valid"
        assert verdict_text(v) == (
            "DP8 TP8 gb512 is listed first: DP64 gb512 is not a valid plan here (memory per GPU 99.0 GiB "
            "exceeds the GPU's 80.0 GiB)."
        )


def test_the_search_top_two_are_explained_by_its_own_key():
    """llama3-70b on 8 DGX-H100, global batch 512: the first two are equally simple; the first is only
    faster, within the model's error."""
    options = Options()
    overlapped = Plan(tp_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True, p2p_overlap=True)
    result = search(L70, H100x8, GB, Constraints(base=overlapped), options)
    rows = result.table.head(2).to_dict("records")
    top, second = result.plan_at(0), result.plan_at(1)
    ex = explain(L70, H100x8, top, second, options, float(result.table["step_time_s"].min()))
    assert (ex["first"], ex["reason"], ex["equivalent"]) == ("top", "faster_within_error", True)
    assert ex["simplicity"]["top"] == ex["simplicity"]["other"] == rows[0]["simplicity"] == rows[1]["simplicity"]
    step = ex["parts"][0]
    assert step["part"] == "step" and step["top_s"] == pytest.approx(rows[0]["step_time_s"], rel=1e-9)
    assert step["difference_s"] == pytest.approx(step["other_s"] - step["top_s"])
    assert ex["slower_fraction"] == pytest.approx(step["other_s"] / step["top_s"] - 1)
    s = ex["summary"]
    assert "simpler:" not in s and f"equally simple ({ex['simplicity']['top']} each" in s
    assert f"{second.label()} is {ex['slower_fraction']:.1%} slower than {top.label()}" in s


def test_a_slower_plan_given_first_is_named_slower_with_a_positive_percentage():
    """Plan review's "Why one plan beats another" with A slower than B: B is first, A is x% slower."""
    m, c = MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].with_nodes(64)
    overlaps = dict(tp_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True, p2p_overlap=True)
    a = Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)
    b = Plan(dp=8, tp=8, pp=8, sp=True, vpp=2, zero=1, recompute="selective", global_batch=1536, **overlaps)
    ex = explain(m, c, a, b)
    step = ex["parts"][0]
    assert step["top_s"] > step["other_s"] * (1 + MODEL_ERROR)
    assert (ex["first"], ex["reason"], ex["equivalent"]) == ("other", "faster", False)
    ratio = step["top_s"] / step["other_s"] - 1
    assert ex["slower_fraction"] == pytest.approx(ratio)
    assert ex["summary"].startswith(f"{b.label()} is faster: {a.label()} is {ratio:.1%} slower than {b.label()}")
    assert ex["memory_per_gpu_bytes"]["difference"] == pytest.approx(
        ex["memory_per_gpu_bytes"]["other"] - ex["memory_per_gpu_bytes"]["top"]
    )


def test_the_runner_up_skips_exact_twins_of_the_top():
    """Mirrored stage splits (3/2 and 2/3) cost the same but for rounding: the runner-up the
    explanation compares with is the first plan whose step or memory differs."""
    table = pd.DataFrame(
        {"step_time_s": [1.0, 1.0 + 1e-7, 1.0, 1.2], "memory_per_gpu_bytes": [5e9, 5e9 + 1e3, 6e9, 5e9]},
    )
    assert runner_up(table) == (2, 1)
    assert runner_up(table.iloc[[0, 1]]) == (None, 1)
    assert runner_up(table.iloc[[0, 3]]) == (1, 0)
