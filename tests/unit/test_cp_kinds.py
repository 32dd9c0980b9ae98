"""The plan model knows the three context-parallel exchanges: memory, communication,
step time, validation, the search and the importers, each for cp_kind allgather | ring | ulysses."""

import dataclasses

import numpy as np
import pytest

from parallel.core import comm, memory, perf
from parallel.core.memory import ActivationOptions
from parallel.core.plan import CP_KINDS, Plan, PlanColumns
from parallel.core.specs import CLUSTERS, MODELS
from parallel.core.validate import check
from parallel.importers import import_text
from parallel.review.document import NamedPlan
from parallel.review.urls import parse_plan_code, plan_code, plan_from_params, plan_to_params
from parallel.search import space as S

L70 = MODELS["llama3-70b"]
GPT = MODELS["gpt3-175b"]
A = 2  # bf16


def comps(model, **plan):
    """Components of a plan that materialises the scores (attention "unfused") unless it says otherwise."""
    return memory.activation_components_bytes(model, Plan(**{"attention": "unfused", **plan}))


def test_memory_per_kind_follows_what_each_exchange_keeps():
    b, s, cp, t = 1, L70.seq_len, 4, 8
    s_q, a, q, k = s // cp, L70.heads, L70.q_hidden, L70.kv_hidden
    gathered = comps(L70, tp=t, cp=cp, sp=True, cp_kind="allgather")
    ring = comps(L70, tp=t, cp=cp, sp=True, cp_kind="ring")
    uly = comps(L70, tp=t, cp=cp, sp=True, cp_kind="ulysses")
    k_t = k / min(t, L70.kv_heads)
    # all-gather into a materialised attention keeps K/V of all s tokens and s_q x s scores
    assert gathered["attention.v"] == A * b * s * k_t
    assert gathered["attention.scores"] == A * a * b * s_q * s / t
    # a flash kernel keeps its own K/V, output and log-sum-exp and gathers K/V again in backward
    flash = comps(L70, tp=t, cp=cp, sp=True, cp_kind="allgather", attention="fused")
    ring_flash = comps(L70, tp=t, cp=cp, sp=True, cp_kind="ring", attention="fused")
    assert flash["attention.v"] == A * b * s_q * k_t and flash["attention.scores"] == 0
    assert flash == ring_flash
    # ring: only its own block of K/V, no s x s tensor, an fp32 log-sum-exp per query row
    assert ring["attention.v"] == A * b * s_q * k_t
    assert ring["attention.qk"] == A * b * s_q * (q / t + k_t)
    assert ring["attention.scores"] == ring["attention.dropout_mask"] == 0
    assert ring["attention.softmax_stats"] == 4 * a * b * s_q / t
    # Ulysses: heads/(t cp) of all s tokens = s_q tokens of heads/t; scores as large as all-gather's
    assert uly["attention.v"] == A * b * s * k / (t * cp) == A * b * s_q * k / t
    assert uly["attention.scores"] == gathered["attention.scores"]
    assert uly["attention.softmax_stats"] == 0
    # what the three share: everything outside the attention core
    for c in ("layernorm", "attention.qkv_input", "attention.proj_input", "mlp.fc1_input", "mlp.act_input"):
        assert gathered[c] == ring[c] == uly[c], c
    # at cp 1 the kind changes nothing
    assert comps(L70, tp=8, cp_kind="ring") == comps(L70, tp=8, cp_kind="allgather")


def test_ring_keeps_no_attention_dropout_and_selective_recompute_keeps_its_stats():
    ring = comps(GPT, tp=8, cp=2, cp_kind="ring")  # GPT-3 trains with dropout
    assert ring["attention.dropout_mask"] == ring["attention.dropout_output"] == 0
    assert ring["residual.dropout_masks"] > 0  # the residual branches keep theirs
    sel = comps(GPT, tp=8, cp=2, cp_kind="ring", recompute="selective")
    assert sel["attention.softmax_stats"] == ring["attention.softmax_stats"] > 0


def test_columns_equal_one_plan_at_a_time_for_every_kind():
    rows = [Plan(tp=t, cp=c, sp=t > 1, cp_kind=k) for t in (1, 8) for c in (1, 2, 8) for k in CP_KINDS]
    cols = PlanColumns(
        dp=np.ones(len(rows), int),
        tp=np.array([p.tp for p in rows]),
        pp=np.ones(len(rows), int),
        cp=np.array([p.cp for p in rows]),
        sp=np.array([p.sp for p in rows]),
        micro_batch=np.ones(len(rows), int),
        vpp=np.ones(len(rows), int),
        zero=np.zeros(len(rows), int),
        recompute=np.array(["none"] * len(rows)),
        cp_kind=np.array([p.cp_kind for p in rows]),
    )
    vec = memory.activation_components_bytes(L70, cols)
    cluster = CLUSTERS["dgx-h100"].with_nodes(8)
    t_vec = perf.step_time(L70, cols, cluster)
    for i, p in enumerate(rows):
        one = memory.activation_components_bytes(L70, p)
        for key, value in one.items():
            assert vec[key][i] == pytest.approx(value), (p.label(), key)
        assert t_vec["exposed_cp_s"][i] == pytest.approx(perf.step_time(L70, p, cluster)["exposed_cp_s"])


def cp_rows(model, plan, cluster):
    return [r for r in comm.comm_per_step(model, plan, cluster) if r["dim"] == "cp"]


def test_comm_per_kind_volumes_and_calls():
    m = MODELS["tiny-llama"]
    cluster = CLUSTERS["local-cpu"].sized_for(8)
    cp, t, gb = 4, 2, 8
    layers, mbs = m.layers, gb  # dp 1, micro batch 1
    s_q = m.seq_len // cp
    k_t = m.kv_hidden / t
    base = dict(tp=t, cp=cp, sp=True, global_batch=gb)
    gathered = cp_rows(m, Plan(**base, cp_kind="allgather", attention="unfused"), cluster)
    assert {(r["collective"], r["calls"]) for r in gathered} == {  # K and V in a call each
        ("all_gather", 2 * layers * mbs),
        ("reduce_scatter", 2 * layers * mbs),
    }
    assert all(r["bytes_per_call"] == m.seq_len * k_t * 4 for r in gathered)
    # a flash kernel kept only its own K/V: backward gathers them again (Transformer Engine's all-gather CP)
    flash = cp_rows(m, Plan(**base, cp_kind="allgather", attention="fused"), cluster)
    assert {(r["collective"], r["calls"]) for r in flash} == {
        ("all_gather", 4 * layers * mbs),
        ("reduce_scatter", 2 * layers * mbs),
    }
    (ring,) = cp_rows(m, Plan(**base, cp_kind="ring"), cluster)
    # forward cp-1 K/V blocks, backward cp-1 again and cp dK/dV blocks
    assert (ring["collective"], ring["calls"]) == ("send_recv", (3 * cp - 2) * layers * mbs)
    assert ring["bytes_per_call"] == 2 * s_q * k_t * 4 and ring["hidden_by"] == "attention"
    uly = cp_rows(m, Plan(**base, cp_kind="ulysses"), cluster)
    assert [r["collective"] for r in uly] == ["all_to_all", "all_to_all"]
    assert all(r["calls"] == 4 * layers * mbs for r in uly)  # Q (or K) forward and its gradient, + output / V
    assert sorted(r["bytes_per_call"] for r in uly) == [s_q * m.kv_hidden / t * 4, s_q * m.q_hidden / t * 4]
    full = cp_rows(m, Plan(**base, cp_kind="ring", recompute="full"), cluster)[0]
    assert full["calls"] == (4 * cp - 3) * layers * mbs  # the forward ring runs again


def test_ring_is_exposed_only_beyond_the_attention_compute():
    cluster = CLUSTERS["dgx-h100"].with_nodes(4)
    p = Plan(tp=8, cp=4, sp=True, cp_kind="ring", global_batch=8)
    rows = comm.comm_per_step(L70, p, cluster)
    ring = sum(r["seconds"] for r in rows if r["dim"] == "cp")
    flat = perf.PerfOptions(mfu=0.5)  # the attention core's FLOPs at half the peak
    attention = perf.flops_per_step(L70, p)["attention_flops"] / p.world_size / (cluster.peak_flops * 0.5)
    assert perf.attention_seconds_per_step(L70, p, cluster, flat) == pytest.approx(
        attention
    )  # the helper the page uses
    exposed = perf.step_time(L70, p, cluster, flat)["exposed_cp_s"]
    assert exposed == pytest.approx(max(0.0, ring - attention))
    modelled = perf.attention_seconds_per_step(L70, p, cluster)  # the per-operator model's attention core
    assert perf.step_time(L70, p, cluster)["exposed_cp_s"] == pytest.approx(max(0.0, ring - modelled))
    slow = dataclasses.replace(cluster, inter=dataclasses.replace(cluster.inter, bandwidth_bytes_per_s=1e8))
    assert perf.step_time(L70, p, slow)["exposed_cp_s"] > 0  # a slow link the attention cannot hide


def test_ulysses_needs_heads_divisible_by_cp_times_tp():
    cluster = CLUSTERS["dgx-h100"].with_nodes(4)
    bad = check(Plan(tp=8, cp=4, sp=True, cp_kind="ulysses", global_batch=8), L70, cluster)
    assert any("kv_heads 8 is not divisible by cp×tp = 4×8 = 32" in e for e in bad.errors), bad.errors
    assert not any(e.startswith("heads 64") for e in bad.errors)  # 64 heads divide by 32
    ok = check(Plan(tp=2, cp=4, dp=4, sp=True, cp_kind="ulysses", global_batch=8), L70, cluster)
    assert not [e for e in ok.errors if "Ulysses" in e]
    with pytest.raises(Exception, match="cp_kind must be one of allgather, ring, ulysses"):
        Plan(cp=2, cp_kind="p2p")


def test_search_tries_each_kind_and_drops_impossible_ulysses():
    cluster = CLUSTERS["dgx-h100"].with_nodes(4)
    cands, funnel = S.candidates(L70, cluster.gpus, 32)
    kinds = {(int(t), int(c), CP_KINDS[int(k)]) for t, c, k in cands[["tp", "cp", "ck"]].drop_duplicates().to_numpy()}
    assert (8, 4, "ring") in kinds and (8, 4, "allgather") in kinds and (8, 4, "ulysses") not in kinds
    assert (2, 4, "ulysses") in kinds and (2, 1, "ring") not in kinds  # no kinds to try at cp 1
    table = S.search(L70, cluster, 32, S.Constraints(cp_kinds=("ring",))).table
    assert set(table.loc[table["cp"] > 1, "cp_kind"]) == {"ring"}
    # without flash attention only Ulysses' all-to-all CP is tried: ring and all-gather run inside it
    unfused = Plan(attention="unfused")
    plain = S.search(L70, cluster, 32, S.Constraints(base=unfused)).table
    assert set(plain.loc[plain["cp"] > 1, "cp_kind"]) == {"ulysses"}
    assert (S.search(L70, cluster, 32, S.Constraints(cp_kinds=("ring",), base=unfused)).table["cp"] == 1).all()
    ring = Plan(tp=8, cp=4, sp=True, cp_kind="ring", global_batch=8, attention="unfused")
    warned = check(ring, L70, cluster, ActivationOptions())
    assert any("ring context parallelism without flash attention" in w for w in warned.warnings)
    with pytest.raises(Exception, match="cp kinds must be among"):
        S.Constraints(cp_kinds=("p2p",))


def test_search_agrees_with_the_plain_loop_over_cp_kinds():
    model = dataclasses.replace(MODELS["tiny-llama"], name="t")
    cluster = CLUSTERS["local-cpu"].sized_for(8)
    c = S.Constraints(zero=(0,), recompute=("none",), headroom=0.0)
    fast = S.search(model, cluster, 8, c).table
    slow = S.search_naive(model, cluster, 8, c)
    key = ["dp", "tp", "pp", "cp", "sp", "vpp", "micro_batch", "cp_kind", "first_stage_layers", "last_stage_layers"]
    a = fast.set_index(key)["step_time_s"].sort_index()
    b = slow.set_index(key)["step_time_s"].sort_index()
    assert list(a.index) == list(b.index) and set(fast["cp_kind"]) == {"allgather", "ring", "ulysses"}
    np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-9)


MEGATRON = (
    "torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 80 --hidden-size 8192 "
    "--num-attention-heads 64 --group-query-attention --num-query-groups 8 --ffn-hidden-size 28672 --swiglu "
    "--seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --bf16 --tensor-model-parallel-size 8 "
    "--context-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 32 {extra}"
)


@pytest.mark.parametrize(
    "extra,kind",
    [
        ("", "ring"),
        ("--cp-comm-type p2p", "ring"),
        ("--cp-comm-type a2a", "ulysses"),
        ("--cp-comm-type allgather", "allgather"),
    ],
)
def test_megatron_cp_comm_type(extra, kind):
    got = import_text(MEGATRON.format(extra=extra), "run.sh")
    assert got.plan.cp == 4 and got.plan.cp_kind == kind


def test_megatron_per_layer_and_hierarchical_cp_comm_types_are_noted():
    got = import_text(MEGATRON.format(extra="--cp-comm-type a2a+p2p"), "run.sh")
    assert got.plan.cp_kind == "ring" and any("hierarchical" in n for n in got.notes)
    mixed = import_text(MEGATRON.format(extra="--cp-comm-type a2a a2a p2p"), "run.sh")
    assert mixed.plan.cp_kind == "ulysses" and any("one exchange per layer" in n for n in mixed.notes)
    with pytest.raises(Exception, match="--cp-comm-type must be among"):
        import_text(MEGATRON.format(extra="--cp-comm-type ring"), "run.sh")


TITAN = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
[parallelism]
data_parallel_shard_degree = 1
tensor_parallel_degree = 2
context_parallel_degree = 4
{extra}
"""


@pytest.mark.parametrize(
    "extra,kind",
    [
        ("", "allgather"),
        ('context_parallel_rotate_method = "allgather"', "allgather"),
        ('context_parallel_rotate_method = "alltoall"', "ring"),
    ],
)
def test_torchtitan_rotate_method(extra, kind):
    got = import_text(TITAN.format(extra=extra), "job.toml")
    assert got.plan.cp == 4 and got.plan.cp_kind == kind
    assert any("context_parallel_rotate_method" in n for n in got.notes)


def test_torchtitan_unknown_rotate_method_is_refused_with_its_line():
    with pytest.raises(Exception, match="context_parallel_rotate_method must be one of allgather, alltoall"):
        import_text(TITAN.format(extra='context_parallel_rotate_method = "p2p"'), "job.toml")


def test_urls_and_plan_codes_carry_the_cp_kind_only_when_not_the_default():
    plan = Plan(tp=8, cp=4, sp=True, dp=1, global_batch=8, cp_kind="ring")
    params = plan_to_params("llama3-70b", "dgx-h100", 4, plan)
    assert params["ck"] == "ring"
    assert plan_from_params(params)[2] == plan
    assert "ck" not in plan_to_params("llama3-70b", "dgx-h100", 4, dataclasses.replace(plan, cp_kind="allgather"))
    code = plan_code(NamedPlan("r", plan))
    assert "ck=ring" in code and parse_plan_code(code).plan == plan
