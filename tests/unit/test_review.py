"""Plan review: compare 2-4 plans, justifications from the numbers, Markdown, JSON round trip."""

import dataclasses
import json
import subprocess
import sys

import pytest

from parallel.core.plan import Plan
from parallel.core.report import Options, plan_report
from parallel.core.specs import CLUSTERS, MODELS, GiB, SpecError
from parallel.importers import import_text
from parallel.importers.plan_json import import_plan_json
from parallel.review.document import NamedPlan, Review, compare, justify, plan_rows, review_markdown
from tests.conftest import ROOT

CLUSTER = CLUSTERS["dgx-h100"].with_nodes(64)
A = NamedPlan("A", Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536))
B = NamedPlan("B", Plan(dp=8, tp=8, pp=8, sp=True, vpp=2, zero=1, recompute="selective", global_batch=1536))
C = NamedPlan("C", Plan(dp=4, tp=16, pp=8, sp=True, global_batch=1536))
BAD = NamedPlan("bad", Plan(dp=4, tp=5, pp=8, global_batch=1536))


def review(*plans, **kw) -> Review:
    return Review(title="175B on 64 nodes", model=MODELS["gpt3-175b"], cluster=CLUSTER, plans=plans or (A, B, C), **kw)


def test_the_side_by_side_table_shows_every_setting_a_compared_plan_changes():
    """Two MoE plans that differ in what is recomputed, offloaded, dispatched and the attention kernel:
    each of those fields is a row flagged as differing (the labels differ by them); a field both leave at
    its default is not; the expert groups' crossings are a row beside the other dimensions'."""
    mixtral = MODELS["mixtral-8x7b"]
    base = Plan(dp=8, tp=2, pp=4, sp=True, ep=8, global_batch=256, recompute="selective")
    one = NamedPlan("one", base)
    two = NamedPlan(
        "two",
        dataclasses.replace(
            base,
            recompute_modules="moe_act+layernorm",
            offload_modules="attn_norm",
            moe_dispatcher="allgather",
            expert_imbalance=1.3,
            attention="fa2",
        ),
    )
    cmp = compare(Review(title="t", model=mixtral, cluster=CLUSTERS["dgx-h100"].with_nodes(8), plans=(one, two)))
    t = cmp.table.set_index(["section", "metric"])
    changed = ["recompute_modules", "offload_modules", "moe_dispatcher", "expert_imbalance", "attention"]
    assert all(t.loc[("plan", k), "differs"] for k in changed)
    assert t.loc[("plan", "recompute_modules"), "two"] == "moe_act+layernorm"
    assert ("plan", "capacity_pad") not in t.index and ("plan", "tp") in t.index  # the degrees always
    assert (
        t.loc[("groups crossing NVLink domains", "EP"), "one"]
        == plan_report(base, mixtral, CLUSTERS["dgx-h100"].with_nodes(8))["crossing_groups"]["ep"]
    )


def test_compare_matches_plan_report_and_flags_differences():
    cmp = compare(review())
    t = cmp.table.set_index(["section", "metric"])
    for p in (A, B, C):
        rep = plan_report(p.plan, MODELS["gpt3-175b"], CLUSTER)
        assert t.loc[("time", "step time (s)"), p.name] == rep["step_time_s"]
        assert t.loc[("memory per GPU (GiB)", "total"), p.name] == round(rep["memory_per_gpu_bytes"]["total"] / GiB, 2)
        assert t.loc[("groups crossing NVLink domains", "TP"), p.name] == rep["crossing_groups"]["tp"]
        mem = cmp.memory[cmp.memory["plan"] == p.name].set_index("component")["bytes"]
        assert mem.sum() == pytest.approx(rep["memory_per_gpu_bytes"]["total"])
        parts = cmp.time[cmp.time["plan"] == p.name]["seconds"].sum()
        assert parts == pytest.approx(rep["step_time_s"])
    assert t.loc[("plan", "tp"), "differs"] and not t.loc[("plan", "pp"), "differs"]
    assert t.loc[("communication per step (s)", "SP on InfiniBand"), "C"] > 0  # TP 16 crosses nodes
    assert set(cmp.comm["link"]) == {"intra", "inter"}
    assert (cmp.issues["plan"] == "C").any()  # the crossing-TP warning


def test_an_invalid_plan_is_shown_with_its_reasons_not_dropped():
    cmp = compare(review(A, BAD))
    rows = plan_rows(cmp).set_index("name")
    assert bool(rows.loc["A", "valid"]) and not bool(rows.loc["bad", "valid"])
    errors = cmp.issues[(cmp.issues["plan"] == "bad") & (cmp.issues["level"] == "error")]["message"]
    assert any("heads 96 are not divisible by tp 5" in m for m in errors)
    assert set(cmp.memory["plan"]) == {"A"}
    md = review_markdown(review(A, BAD))
    assert "cannot be evaluated" in md and "heads 96 are not divisible by tp 5" in md


def test_justifications_quote_the_numbers():
    rep = plan_report(A.plan, MODELS["gpt3-175b"], CLUSTER)
    why = dict(justify(A.plan, rep, MODELS["gpt3-175b"], CLUSTER))
    exposed = (rep["step_time"]["exposed_tp_s"] + rep["step_time"]["exposed_sp_s"]) / rep["step_time_s"]
    assert why["TP"].startswith(
        f"TP=8: the group stays inside a node on NVLink; its exposed communication is {100 * exposed:.1f}% of the step"
    )
    assert (
        "spans nodes (64 of 64 groups), so it runs on InfiniBand" in why["PP"] and "(8−1)/(1·192) = 3.6%" in why["PP"]
    )
    assert "102 MiB per layer per microbatch instead of 312 MiB" in why["SP"]
    assert "ZeRO-1 would cut them to 3.9 GiB" in why["ZeRO"]
    assert set(why) == {"TP", "SP", "PP", "DP", "CP", "ZeRO", "recompute", "memory", "time"}
    rep_c = plan_report(C.plan, MODELS["gpt3-175b"], CLUSTER)
    assert (
        "spans nodes (32 of 32 groups), so it runs on InfiniBand"
        in dict(justify(C.plan, rep_c, MODELS["gpt3-175b"], CLUSTER))["TP"]
    )


def test_justification_of_a_partial_full_recompute_prices_the_plan_itself():
    """recompute full of 48 of 96 layers (as torchtitan's selective AC is read): its activations are the
    report's, and the alternatives are whole modes (none, selective) that carry no layer count."""
    plan = dataclasses.replace(A.plan, recompute="full", recompute_layers=6)
    rep = plan_report(plan, MODELS["gpt3-175b"], CLUSTER)
    why = dict(justify(plan, rep, MODELS["gpt3-175b"], CLUSTER))["recompute"]
    acts = rep["memory_per_gpu_bytes"]["activations"] / GiB
    assert why.startswith(f"recompute full: activations {acts:.1f} GiB per GPU")
    assert "the alternatives: none " in why and ", selective " in why


def test_markdown_has_tables_verdict_notes_and_bold_differences():
    r = review(verdict="B fits with room to spare", chosen="B", author="ana", created="2026-11-30T10:00:00+00:00")
    r = r.with_note("bo", "why not CP 2?", at="2026-11-30T11:00:00+00:00")
    md = review_markdown(r)
    assert md.startswith("# 175B on 64 nodes\n")
    assert "## Verdict\n\n**B** — B fits with room to spare" in md
    assert "| plan | layout | valid | memory/GPU (GiB) | step (s) | MFU | bubble | warnings |" in md
    assert "| **plan: tp** | 8 | 8 | 16 |" in md and "| plan: pp | 8 | 8 | 8 |" in md
    for name in ("A", "B", "C"):
        assert f"## Why {name}:" in md
    assert "- **bo** (2026-11-30T11:00:00+00:00): why not CP 2?" in md


def test_json_round_trip_and_import_back():
    opts = Options()
    opts = dataclasses.replace(opts, perf=dataclasses.replace(opts.perf, mfu=0.4, dp_overlap=0.5))
    r = review(verdict="go with B", chosen="B", author="ana", created="2026-11-30T10:00:00+00:00", options=opts)
    r = r.with_note("bo", "looks good", at="2026-11-30T11:00:00+00:00")
    text = r.to_json()
    assert Review.from_json(text) == r
    data = json.loads(text)
    assert data["kind"] == "parascope-review" and [s["name"] for s in data["summary"]] == ["A", "B", "C"]
    imp = import_text(text, "review.json")  # the plan importer reads a review export too (first plan)
    assert imp.plan == A.plan and imp.model == MODELS["gpt3-175b"] and imp.cluster == CLUSTER


@pytest.mark.parametrize(
    "bad,message",
    [
        ('{"kind": "other"}', "not a ParaScope review"),
        ('{"kind": "parascope-review", "title": "x"}', "missing or has a wrong field"),
        ('{"kind": \n', "review JSON line"),
    ],
)
def test_bad_review_json(bad, message):
    with pytest.raises(SpecError, match=message):
        Review.from_json(bad)


def test_review_checks_its_names():
    with pytest.raises(SpecError, match="plan names must differ"):
        review(A, dataclasses.replace(B, name="A"))
    with pytest.raises(SpecError, match="chosen plan 'Z'"):
        review(chosen="Z")


PURE = ["parallel.search.space", "parallel.importers", "parallel.review.document", "parallel.review.store"]


def test_issue7_modules_import_neither_torch_nor_streamlit():
    code = (
        "import sys, importlib\n"
        f"for m in {PURE!r}: importlib.import_module(m)\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'streamlit'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def _dense_vs_moe_review():
    """Llama-3 70B (the review's model) beside Mixtral 8x7B with EP 8, on the same 8 nodes."""
    return Review(
        title="dense vs MoE",
        model=MODELS["llama3-70b"],
        cluster=CLUSTERS["dgx-h100"].with_nodes(8),
        plans=(
            NamedPlan("dense", Plan(dp=2, tp=8, pp=4, sp=True, zero=1, global_batch=64)),
            NamedPlan("moe", Plan(dp=16, pp=4, ep=8, zero=1, global_batch=64), MODELS["mixtral-8x7b"]),
        ),
    )


def test_a_plan_of_another_model_round_trips_through_review_json():
    review = _dense_vs_moe_review()
    back = Review.from_json(review.to_json())
    assert back == review and back.plans[1].model == MODELS["mixtral-8x7b"]
    cmp = compare(back)
    assert cmp.models == {"dense": MODELS["llama3-70b"], "moe": MODELS["mixtral-8x7b"]}
    assert cmp.reports["moe"]["model"]["name"] == "mixtral-8x7b"
    text = review_markdown(back, cmp)
    assert "**EP** — EP=8: each of the 32 MoE layers' 8 experts (top-2) is split 1 per GPU" in text


def test_importing_a_reviews_moe_plan_takes_its_own_model():
    review = _dense_vs_moe_review()
    moe = import_plan_json(review.to_json(), "r.json", plan_name="moe")
    assert moe.model == MODELS["mixtral-8x7b"] and moe.plan.ep == 8
    assert import_plan_json(review.to_json(), "r.json").model == MODELS["llama3-70b"]
