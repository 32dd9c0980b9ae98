"""parallel.review.urls, the review page's part: plan codes, custom model shapes, the whole page
state <-> URL round trip, the plan table, and links to the plan pages."""

import dataclasses

import pytest

from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Model, SpecError
from parallel.review.document import NamedPlan
from parallel.review.urls import (
    ReviewState,
    default_review_state,
    model_code,
    model_from_code,
    parse_plan_code,
    plan_code,
    plan_from_params,
    plan_page_params,
    plan_rows_of,
    plan_to_params,
    plans_from_rows,
    review_from_params,
    review_of,
    review_to_params,
    state_of_review,
)

PLANS = (
    NamedPlan("baseline", Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)),
    NamedPlan(
        "lean, v2",
        Plan(
            dp=4,
            tp=8,
            pp=8,
            cp=2,
            sp=True,
            vpp=2,
            micro_batch=2,
            global_batch=1536,
            zero=1,
            recompute="selective",
            order="tp-cp-pp-dp",
        ),
    ),
    NamedPlan(
        "megatron-core",
        Plan(
            dp=2,
            tp=8,
            pp=16,
            sp=True,
            global_batch=64,
            tp_overlap=True,
            grad_reduce_overlap=True,
            param_gather_overlap=True,
            p2p_overlap=True,
            first_stage_layers=7,
            last_stage_layers=7,
            zero=1,
            attention="fa2",
            dropout=False,
        ),
    ),
)


@pytest.mark.parametrize("named", PLANS)
def test_plan_code_round_trip(named):
    assert parse_plan_code(plan_code(named)) == named


def test_plan_code_defaults_and_errors():
    assert parse_plan_code("x|tp=4,dp=2").plan == Plan(dp=2, tp=4, global_batch=2)
    # a code holds the degrees and global batch, then every field that differs from its default
    assert plan_code(PLANS[0]) == "baseline|dp=8,tp=8,pp=8,sp=1,gb=1536"
    assert plan_code(PLANS[2]).endswith(",tpo=1,gro=1,pgo=1,p2po=1,first=7,last=7,attn=fa2,dropout=0")
    # a code of an older link: its defaults are the declared ones, whatever it spelled out
    old = "baseline|dp=8,tp=8,pp=8,cp=1,sp=1,mb=1,gb=1536,vpp=1,zero=0,recompute=none,order=tp-cp-ep-dp-pp"
    assert parse_plan_code(old) == PLANS[0]
    for bad, message in (
        ("no-separator", "must look like"),
        ("x|tp=4,foo=1", "unknown key"),
        ("x|tp=four", "tp='four'"),
        ("x|tp=2,tpo=yes", "tpo='yes' must be 0 or 1"),
        ("x|pp=4,first=a", "first='a'"),
        ("|tp=2", "must look like"),
    ):
        with pytest.raises(SpecError, match=message):
            parse_plan_code(bad)


def test_custom_model_shape_round_trip():
    m = Model(name="megatron L32 h3840 a32", layers=32, hidden=3840, heads=32, vocab=50432, seq_len=2048)
    assert model_from_code(model_code(m), m.name) == m
    with pytest.raises(SpecError, match="shape="):
        model_from_code("L=3,zz=1")
    # an older link's nine keys still read
    old = model_from_code("L=32,h=3840,a=32,kv=32,f=15360,s=2048,V=50432,d=2,arch=gpt", m.name)
    assert old == m


@pytest.mark.parametrize("preset", ["deepseek-v3", "gpt-oss-120b", "llama4-maverick", "qwen3-30b-a3b"])
def test_a_link_carries_a_mixture_of_experts_model_whole(preset):
    # an imported variant of a preset (e.g. another sequence length) travels as its shape: experts, top-k,
    # the expert width, MLA's ranks and the MoE layer pattern with it, so its parameters survive the link
    m = dataclasses.replace(MODELS[preset], name=f"{preset} variant", seq_len=8192, dropout=True)
    back = model_from_code(model_code(m), m.name)
    assert back == m and back.param_counts(1) == m.param_counts(1)
    state = dataclasses.replace(default_review_state(), model=m)
    assert review_from_params(review_to_params(state)).model == m


@pytest.mark.parametrize(
    "bad", ["L=2,experts=x", "L=2,moe_pattern=012", "L=2,dropout=yes", "L=2,name=x", "L=2,moe_pattern=" + "1" * 70000]
)
def test_a_malformed_model_field_in_a_link_is_named(bad):
    with pytest.raises(SpecError, match="shape="):
        model_from_code(bad)


STATES = [
    default_review_state(),
    ReviewState(
        model=MODELS["llama3-70b"],
        cluster="dgx-a100",
        nodes=32,
        plans=PLANS,
        title="70B & friends: a/b?",
        chosen="lean, v2",
        verdict="CP 2 keeps 8k tokens; ok.",
        view="search",
        review_id=7,
        search_gb=512,
        headroom=0.2,
        max_tp=8,
        require_sp=True,
        zero=(1, 3),
        recompute=("selective",),
        top=5,
        mfu=0.45,
        dp_overlap=0.5,
    ),
    ReviewState(
        model=Model(name="custom 24L", layers=24, hidden=2048, heads=16, vocab=32000, seq_len=4096, arch="llama"),
        nodes=2,
        plans=(NamedPlan("A", Plan(dp=4, tp=4, global_batch=64)),),
        view="import",
    ),
]


@pytest.mark.parametrize("state", STATES, ids=["default", "everything-set", "custom-model"])
def test_review_state_url_round_trip(state):
    params = review_to_params(state)
    assert all(
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in params.values()
    )
    assert review_from_params(params) == state
    # as parse_qs / st.query_params.get_all hand it back: every value a list
    assert review_from_params({k: v if isinstance(v, list) else [v] for k, v in params.items()}) == state


def test_a_link_naming_only_a_place_carries_the_opening_plans_there():
    """review?model=llama3-70b&nodes=8 (no plan): the opening plans re-fitted to its 64 GPUs, as a switch by
    hand re-fits them, and the title says the link's model and nodes, not GPT-3 175B's 64."""
    state = review_from_params({"model": "llama3-70b", "nodes": "8"})
    assert state.title == "llama3-70b on 8 dgx-h100 nodes"
    assert [p.plan.world_size for p in state.plans] == [64, 64] == [state.cluster_spec.gpus] * 2
    opening = default_review_state().plans
    assert [(p.plan.tp, p.plan.pp) for p in state.plans] == [(p.plan.tp, p.plan.pp) for p in opening]


def test_review_state_defaults_and_bad_urls():
    assert review_from_params({}) == default_review_state()
    d = default_review_state()
    assert d.mfu is None and d.dp_overlap is None  # per-operator compute, each plan's own overlaps
    assert all(p.plan.attention == "fused" for p in d.plans)  # the declared default kernel
    # an older link's review-wide flash / dropout keys become each plan's fields
    old = review_from_params({"plan": ["A|tp=2", "B|tp=4,attn=fa2"], "flash": "0", "dropout": "1"})
    assert [(p.plan.attention, p.plan.dropout) for p in old.plans] == [("unfused", True), ("fa2", True)]
    assert "mfu" not in review_to_params(d) and review_from_params({"mfu": "0.4"}).mfu == 0.4
    assert review_from_params({"chosen": "nobody"}).chosen is None  # a stale choice is dropped, not fatal
    for params, message in (
        ({"plan": ["A|tp=2", "A|tp=4"]}, "different names"),
        ({"view": "nope"}, "view='nope'"),
        ({"model": "gpt9"}, "unknown model preset"),
        ({"s_headroom": "2"}, "s_headroom=2.0"),
        ({"mfu": "fast"}, "mfu='fast'"),
        ({"s_zero": "0,7"}, "s_zero / s_recompute"),
        ({"nodes": "0"}, "nodes=0"),
    ):
        with pytest.raises(SpecError, match=message.replace("(", r"\(")):
            review_from_params(params)


def test_plan_table_rows_round_trip_and_errors():
    assert plans_from_rows(plan_rows_of(PLANS)) == (PLANS, [])
    rows = plan_rows_of(PLANS) + [{**plan_rows_of(PLANS)[0]}, {"name": "bad", "dp": 1, "tp": 0}]
    plans, errors = plans_from_rows(rows)
    assert plans == PLANS
    assert errors[0] == "row 4: the name 'baseline' is used twice" and errors[1].startswith("row 5 (bad):")


def test_links_to_the_plan_pages_use_their_keys():
    s = dataclasses.replace(default_review_state(), plans=PLANS)
    params = plan_page_params(s, PLANS[1])
    model, cluster, plan = plan_from_params(params)
    assert (model.name, cluster.name, cluster.nodes, plan) == ("gpt3-175b", "dgx-h100", 64, PLANS[1].plan)
    assert plan_page_params(STATES[2], STATES[2].plans[0]) is None  # custom models: the pages take presets only


def test_review_of_and_back():
    s = STATES[1]
    r = review_of(s, author="ana")
    assert r.cluster.nodes == 32 and r.options.perf.mfu == 0.45
    back = state_of_review(r, review_id=7, view="search", base=s)
    assert back == s


def test_gpu_memory_of_a_job_round_trips_and_bad_values_name_the_bound():
    v100 = 34_089_730_048  # Tesla V100-SXM2-32GB's totalGlobalMem
    params = plan_to_params("gpt3-175b", "dgx-h100", 2, Plan(dp=16), 8, v100)
    assert params["gpumem"] == "31.75"
    _, cluster, _ = plan_from_params(params)
    assert cluster.gpu_memory_bytes == pytest.approx(v100, rel=1e-3) and cluster.name == "dgx-h100"
    # the preset's own memory writes no key: other plans' links stay as they were
    assert "gpumem" not in plan_to_params("gpt3-175b", "dgx-h100", 2, Plan(dp=16), 8, 80 * 2**30)
    for bad, words in (("lots", "must be a number"), ("0", "above 0"), ("1e9", "at most 65,536 GiB")):
        with pytest.raises(SpecError, match=words):
            plan_from_params({"gpumem": bad})
