"""`parallel.search.space`: the vectorised search equals the plain loop over plan_report, the
`--json` contract, Pareto front, and an empty space that names the constraint that emptied it."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from parallel.cli import search as search_cli
from parallel.core.comm import comm_per_step
from parallel.core.perf import PerfOptions
from parallel.core.plan import PLAN_DEFAULTS, Plan
from parallel.core.report import Options, plan_report
from parallel.core.specs import CLUSTERS, MODELS, GiB, Model
from parallel.core.validate import check
from parallel.search import space as S

GQA = Model(
    name="gqa", layers=4, hidden=256, heads=8, kv_heads=2, ffn_hidden=704, vocab=1000, seq_len=128, arch="llama"
)
GPT = Model(name="gpt", layers=4, hidden=512, heads=4, vocab=1000, seq_len=64)
# a vocabulary worth three layers: the search also tries a pipeline with a lighter last stage
VOCAB = dataclasses.replace(GQA, name="vocab", layers=8, vocab=8000)
MOE = dataclasses.replace(GQA, name="moe", experts=4, top_k=2, expert_ffn=256, shared_expert_ffn=128, moe_every=2)
# 2 nodes of 4 GPUs (so groups land on both links) with a memory small enough that some plans do not fit
SMALL = dataclasses.replace(CLUSTERS["dgx-h100"], nodes=2, gpus_per_node=4, gpu_memory_bytes=int(0.03 * GiB))
# (the plans' shared fields, the modelling options): Table 2's materialised attention with dropout; flash
# attention without dropout and a fixed DP overlap
TABLE2 = (Plan(attention="unfused", dropout=True), Options())
VARIANT = (Plan(dropout=False), Options(perf=PerfOptions(dp_overlap=0.5)))


@pytest.mark.parametrize("model", [GQA, GPT, MOE], ids=["llama-gqa", "gpt", "moe-ep"])
@pytest.mark.parametrize("variant", [TABLE2, VARIANT], ids=["table2", "flash-nodropout-overlap"])
def test_fast_search_equals_plain_loop_over_plan_report(model, variant):
    base, options = variant
    constraints = S.Constraints(headroom=0.0, base=base)
    fast = S.search(model, SMALL, 8, constraints, options)
    slow = S.search_naive(model, SMALL, 8, constraints, options)
    assert fast.funnel[-1]["remaining"] < fast.funnel[-2]["remaining"], "the memory limit should bite"
    assert_same_plans(fast.table, slow)


def assert_same_plans(fast: pd.DataFrame, slow: pd.DataFrame):
    keys = list(S.PLAN_KEYS)
    both = fast.merge(slow, on=keys, how="outer", suffixes=("_fast", "_slow"), indicator=True)
    assert (both["_merge"] == "both").all(), both[both["_merge"] != "both"][keys]
    for col in ("memory_per_gpu_bytes", "step_time_s", "bubble_fraction", "mfu"):
        np.testing.assert_allclose(both[f"{col}_fast"], both[f"{col}_slow"], rtol=1e-12)


def test_ranked_fastest_first_and_pareto_flags_undominated():
    result = S.search(GQA, SMALL, 8, S.Constraints(headroom=0.0))
    t = result.table
    # the plans the model cannot tell apart first, simplest first; the rest fastest first
    band, rest = t[t["equivalent"]], t[~t["equivalent"]]
    fastest = t["step_time_s"].min()
    assert (band["step_time_s"] <= fastest * (1 + S.MODEL_ERROR)).all() and (rest["step_time_s"] > fastest).all()
    assert band["simplicity"].is_monotonic_increasing and t["equivalent"].iloc[: len(band)].all()
    assert (rest["step_time_s"].round(9).diff().dropna() >= 0).all()
    front = t[t["pareto"]]
    for row in front.itertuples():
        dominated = (t["memory_per_gpu_bytes"] < row.memory_per_gpu_bytes) & (t["step_time_s"] < row.step_time_s)
        assert not dominated.any()
    fastest_leanest = t.sort_values(["step_time_s", "memory_per_gpu_bytes"], kind="stable").index[0]
    assert bool(t.loc[fastest_leanest, "pareto"])  # the fastest plan (the leanest of a tie) is always on the front


def test_pareto_front_by_hand():
    t = pd.DataFrame({"memory_per_gpu_bytes": [5, 3, 4, 1, 3], "step_time_s": [1, 2, 3, 4, 2]})
    assert S.pareto_front(t).tolist() == [True, True, False, True, False]


def run(capsys, argv):
    code = search_cli.main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_cli_json_contract_175b_on_512(capsys):
    code, out, _ = run(
        capsys, "--model gpt3-175b --cluster dgx-h100 --gpus 512 --global-batch 1536 --top 7 --json".split()
    )
    rows = json.loads(out)
    assert code == 0 and len(rows) == 7
    for row in rows:
        assert set(row["plan"]) == set(PLAN_DEFAULTS)  # every field of the schema, not only the explored ones
        p = row["plan"]
        assert row["label"] == Plan.from_dict(p).label()
        assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 512
        assert isinstance(p["sp"], bool) and p["recompute"] in ("none", "selective", "full")
        assert 0 < row["memory_per_gpu_bytes"] <= 0.9 * 80 * GiB and row["step_time_s"] > 0
        assert 0 <= row["bubble_fraction"] < 1
    # the equivalent plans (within the model's error of the fastest) first, simplest first; then by time
    times = [r["step_time_s"] for r in rows if not r["equivalent"]]
    assert times == sorted(times) and rows[0]["equivalent"]
    assert all(
        r["step_time_s"] <= min(x["step_time_s"] for x in rows) * (1 + S.MODEL_ERROR) for r in rows if r["equivalent"]
    )


def test_cli_text_and_constraints(capsys):
    code, out, _ = run(
        capsys,
        "--model gpt3-175b --gpus 64 --global-batch 512 --max-tp 8 --require-sp --zero 0,1 "
        "--recompute none,selective --top 5".split(),
    )
    assert code == 0 and "SP required whenever tp > 1" in out and "max TP 8" in out
    table = S.search(
        MODELS["gpt3-175b"],
        CLUSTERS["dgx-h100"].with_nodes(8),
        512,
        S.Constraints(max_tp=8, require_sp=True, zero=(0, 1), recompute=("none", "selective")),
    ).table
    assert table["tp"].max() <= 8 and table.loc[table["tp"] > 1, "sp"].all()
    assert set(table["zero"]) <= {0, 1} and "full" not in set(table["recompute"])


@pytest.mark.parametrize(
    "model,gpus,gb,constraints,message",
    [
        (
            MODELS["gpt3-175b"],
            8,
            512,
            S.Constraints(),
            "no plan fits: all 26,712 valid plans of gpt3-175b on 8 GPUs need more than 72.0 GiB per GPU",
        ),
        (
            MODELS["tiny"],
            8,
            1,
            S.Constraints(max_tp=1, max_pp=1, max_cp=1),
            "the constraint 'global batch 1 divisible by dp' removed the last 1 candidates",
        ),
        (
            Model(name="odd", layers=1, hidden=64, heads=8, vocab=64, seq_len=12),
            8,
            1,
            S.Constraints(require_sp=True),
            "the constraint 'SP required whenever tp > 1' removed the last",
        ),
        (
            MODELS["gpt3-22b"],
            8,
            64,
            S.Constraints(max_tp=1, max_pp=1, max_cp=1, zero=(0,)),
            "try more GPUs, allowing ZeRO-3, a --max-tp above 1, a --max-pp above 1, a --max-cp above 1 or less headroom",
        ),
    ],
)
def test_impossible_space_names_the_constraint(model, gpus, gb, constraints, message):
    cluster = CLUSTERS["dgx-h100"].with_nodes(gpus // 8)
    with pytest.raises(S.SearchEmpty) as err:
        S.search(model, cluster, gb, constraints)
    assert message in str(err.value)


def test_memory_hints_name_the_levers_left(capsys):
    code, out, err = run(capsys, "--model gpt3-175b --gpus 8 --global-batch 512 --zero 0,1 --json".split())
    assert code == 2 and json.loads(out) == []
    assert "try more GPUs, allowing ZeRO-3 or less headroom" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv,message",
    [
        ("--model gpt3-175b --gpus 12 --global-batch 8", "--gpus 12 is not a whole number of 8-GPU nodes"),
        ("--model gpt3-175b --global-batch 8", "give the GPUs to plan for"),
        ("--model gpt3-175b --gpus 8 --global-batch 8 --zero x", "--zero must list stages"),
        ("--model gpt3-175b --gpus 8 --global-batch 8 --recompute some", "recompute modes must be among"),
        ("--model gpt3-175b --gpus 8 --global-batch 8 --headroom 1.5", "headroom must be in [0, 1)"),
    ],
)
def test_bad_flags_are_one_clear_line(capsys, argv, message):
    code, _, err = run(capsys, argv.split())
    assert code == 2 and message in err


def test_plan_of_row_round_trips_through_plan_report():
    result = S.search(MODELS["gpt3-22b"], CLUSTERS["dgx-h100"].with_nodes(4), 256)
    row = result.table.iloc[0].to_dict()
    rep = plan_report(S.plan_of(row, Plan(global_batch=256)), MODELS["gpt3-22b"], CLUSTERS["dgx-h100"].with_nodes(4))
    assert rep["valid"] and rep["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-12)


def test_zero2_and_3_pay_per_microbatch_with_gradient_accumulation():
    """ZeRO-2/3 keep a shard of the gradients, so m microbatches mean m reduce-scatters (and ZeRO-3 2m
    weight all-gathers); ZeRO 0/1 accumulate full gradients and reduce once. So with m > 1, ZeRO-2 no
    longer ties ZeRO-1 for free (it used to top the 175B search, with PP 16 that DeepSpeed forbids for it)."""
    cluster = CLUSTERS["dgx-h100"].with_nodes(2)
    for zero, rs, ag in ((1, 1, 1), (2, 4, 1), (3, 4, 4)):
        rows = comm_per_step(GPT, Plan(dp=16, global_batch=64, zero=zero), cluster)  # m = 64 / 16 = 4
        calls = {r["collective"]: r["calls"] for r in rows if r["dim"] == "dp" and r["what"] != "loss"}
        base = {
            r["collective"]: r["calls"]
            for r in comm_per_step(GPT, Plan(dp=16, global_batch=16, zero=zero), cluster)
            if r["dim"] == "dp" and r["what"] != "loss"
        }  # m = 1
        assert calls == {"reduce_scatter": rs * base["reduce_scatter"], "all_gather": ag * base["all_gather"]}
    top = S.search(MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].with_nodes(64), 1536).table.head(5)
    assert (top["zero"] <= 1).all(), top[list(S.PLAN_KEYS)]


def test_a_heavy_output_layer_gets_a_lighter_last_stage():
    llama8b = MODELS["llama3-8b"]  # logits weigh h·V / 218M = 2.4 layers
    assert S.balanced_split(llama8b, 4) == (7, 9, 7)
    assert S.stage_splits(llama8b, 4) == [(-1, -1), (7, 7)]
    assert S.balanced_split(llama8b, 2) == (17, 0, 15)
    assert S.balanced_split(MODELS["gpt3-175b"], 8) is None  # 51k vocabulary on h 12288: a third of a layer
    assert S.stage_splits(dataclasses.replace(llama8b, layers=30), 4) == [(7, 7), (8, 6)]  # uneven, then balanced
    fast = S.search(VOCAB, SMALL, 4, S.Constraints(headroom=0.0))
    assert ((fast.table["pp"] == 2) & (fast.table["last_stage_layers"] == 2)).any()
    assert_same_plans(fast.table, S.search_naive(VOCAB, SMALL, 4, S.Constraints(headroom=0.0)))


def test_interleaving_of_uneven_stages_divides_every_stage_not_their_sum():
    """Llama 3 70B's 80 layers at pp 8 split 4/10 leave 11 on each middle stage: vpp 2 divides the
    first, the last and the middle stages' 66 together, but not one middle stage (validate refuses)."""
    model, cluster = MODELS["llama3-70b"], CLUSTERS["dgx-h100"].with_nodes(8)
    c = S.Constraints(max_pp=8, zero=(1,), recompute=("full",), cp_kinds=("ring",))
    table = S.search(model, cluster, 512, c).table
    uneven = table[(table["pp"] == 8) & (table["first_stage_layers"] >= 0)]
    assert len(uneven) and set(uneven["vpp"]) == {1}
    for row in table.drop_duplicates(["pp", "vpp", "first_stage_layers", "last_stage_layers"]).to_dict("records"):
        plan = S.plan_of(row, dataclasses.replace(c.base, global_batch=512))
        assert not check(plan, model, cluster).errors, plan.label()


def test_repeated_list_values_count_once_and_a_huge_space_is_refused_before_it_is_built(monkeypatch):
    c = S.Constraints(zero=(3,) * 300, recompute=("full", "full", "none"), cp_kinds=("ring", "ring"))
    assert (c.zero, c.recompute, c.cp_kinds) == ((3,), ("full", "none"), ("ring",))
    monkeypatch.setattr(S, "MAX_CANDIDATES", 1000)
    with pytest.raises(S.SpecError, match=r"more than 1,000 candidate plans for 512 GPUs .* narrow the search"):
        S.search(MODELS["gpt3-175b"], CLUSTERS["dgx-h100"].with_nodes(64), 1536)


def test_a_space_past_the_bound_keeps_a_thousand_tokens_a_cp_rank_unless_told(monkeypatch, capsys):
    """Past MAX_CANDIDATES the search drops CP degrees that leave a rank under CP_MIN_TOKENS tokens and
    says so in its funnel; with --max-cp it searches what it was told (and refuses past the bound)."""
    model, cluster = MODELS["llama3-8b"], CLUSTERS["dgx-h100"].with_nodes(8)
    assert model.seq_len >= 2 * S.CP_MIN_TOKENS
    whole, _ = S.candidates(model, cluster.gpus, 512, S.Constraints(), cluster)
    assert (model.seq_len // whole["cp"] < S.CP_MIN_TOKENS).any()
    monkeypatch.setattr(S, "MAX_CANDIDATES", 1)
    sizes = []
    for c in (S.Constraints(), S.Constraints(min_cp_tokens=S.CP_MIN_TOKENS)):
        with pytest.raises(S.TooManyPlans) as err:
            S.candidates(model, cluster.gpus, 512, c, cluster)
        sizes.append(err.value.total)
    assert sizes[0] > sizes[1]
    monkeypatch.setattr(S, "MAX_CANDIDATES", sizes[1])  # the whole space is past it, the narrowed one is not
    result = S.search(model, cluster, 512)
    assert (model.seq_len // result.table["cp"] >= S.CP_MIN_TOKENS).all() and (result.table["cp"] > 1).any()
    (rule,) = [f for f in result.funnel if "each CP rank keeps at least" in f["constraint"]]
    assert f"{S.CP_MIN_TOKENS} tokens of the {model.seq_len}" in rule["constraint"]
    with pytest.raises(S.TooManyPlans, match="narrow the search"):
        S.search(model, cluster, 512, S.Constraints(max_cp=64))


def test_a_preset_with_a_published_batch_is_searched_at_it(capsys):
    code, out, _ = run(capsys, "--model gpt3-175b --gpus 512 --top 1".split())
    assert code == 0 and "global batch 1536 (the model's published training batch)" in out
    code, _, err = run(capsys, "--model gpt3-175b --layers 48 --gpus 512 --top 1".split())
    assert code == 2 and "--global-batch is required: " in err and "published training batch" in err


@pytest.mark.parametrize("step_digits", [9, 2, 1])  # few ties, many, almost all rows tied
def test_rank_order_is_the_lexsort_of_step_memory_and_simplicity(step_digits):
    rng = np.random.default_rng(step_digits)
    n = 20_000
    table = pd.DataFrame(
        {
            "step_time_s": rng.uniform(1, 2, n).round(step_digits),
            "memory_per_gpu_bytes": rng.integers(1, 6, n).astype(float) * GiB,
            **{k: rng.choice([1, 2, 4, 8], n) for k in ("micro_batch", "tp", "pp", "cp", "vpp")},
            "zero": rng.integers(0, 4, n),
            "recompute": pd.Categorical(rng.choice(S.RECOMPUTE, n), categories=S.RECOMPUTE),
        }
    )
    rc = table["recompute"].cat.codes.to_numpy()
    ties = [table[k].to_numpy() for k in ("micro_batch", "tp", "pp", "cp", "vpp", "zero")] + [rc]
    want = np.lexsort([*ties, table["memory_per_gpu_bytes"].to_numpy(), table["step_time_s"].to_numpy()])
    assert (S._rank_order(table) == want).all()
