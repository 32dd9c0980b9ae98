"""Mixture of experts: the presets against their published sizes, expert parallelism's
share of the weights and of ZeRO, the plan's checks, and Megatron-LM's MoE flags."""

from pathlib import Path

import pytest

from parallel.core.memory import (
    ActivationOptions,
    activation_components_bytes,
    expert_params_per_stage,
    model_state_bytes,
    params_per_stage,
)
from parallel.core.plan import Plan
from parallel.core.report import plan_report
from parallel.core.specs import CLUSTERS, MODELS, Model
from parallel.core.validate import check
from parallel.importers import ImportFailed, import_plan, import_text, place
from parallel.importers.torchtitan import FLAVOUR_SHAPES, FLAVOURS
from tests.unit.test_plan_model import megatron_oracle


@pytest.mark.parametrize(
    "name,total,active,rel",
    [
        ("mixtral-8x7b", 46.7, 12.9, 0.01),  # Jiang et al. 2024: 46.7B, 12.9B active
        ("llama4-scout", 109, 17, 0.02),  # Meta: 109B total, 17B active
        ("llama4-maverick", 400, 17, 0.02),  # Meta: 400B total, 17B active
        ("deepseek-v3", 671, 37, 0.05),  # DeepSeek-V3 report: 671B, 37B active (MLA approximated)
        ("qwen3-235b-a22b", 235, 22, 0.02),  # Qwen3 report: 235B, 22B active
        ("qwen3-32b", 32.8, 32.8, 0.01),  # dense, with 128-wide heads: Q is 8192 wide at hidden 5120
    ],
)
def test_moe_presets_have_their_published_sizes(name, total, active, rel):
    m = MODELS[name]
    assert m.params_total() / 1e9 == pytest.approx(total, rel=min(rel, 0.02))
    assert m.active_params_total() / 1e9 == pytest.approx(active, rel=rel)


def test_moe_layer_pattern():
    assert MODELS["mixtral-8x7b"].moe_layers == 32
    assert MODELS["llama4-maverick"].moe_layers == 24  # MoE every other layer
    assert MODELS["deepseek-v3"].moe_layers == 58  # the first three layers are dense
    assert MODELS["llama3-70b"].moe_layers == 0 and MODELS["llama3-70b"].experts == 0


def test_expert_parallelism_splits_the_experts_and_their_zero_group():
    m = MODELS["mixtral-8x7b"]
    plan = Plan(dp=8, tp=2, pp=4, ep=8, zero=1, global_batch=64)
    per_gpu = expert_params_per_stage(m, plan, 0)
    assert per_gpu * plan.ep * plan.tp * plan.pp == pytest.approx(m.moe_layers * m.expert_params_per_layer())
    dense_plan = Plan(dp=8, tp=2, pp=4, zero=1, global_batch=64)
    dense_part = params_per_stage(m, dense_plan, 0) - expert_params_per_stage(m, dense_plan, 0)
    assert params_per_stage(m, plan, 0) - per_gpu == pytest.approx(dense_part)  # ep moves only the experts
    # ZeRO-1: the dense weights' optimizer over dp x cp = 8, the experts' over dp x cp / ep = 1
    opt = model_state_bytes(m, plan, 0)["optimizer"]
    assert opt == pytest.approx(12 * (dense_part / 8 + per_gpu / 1))
    ep2 = Plan(dp=8, tp=2, pp=4, ep=2, zero=1, global_batch=64)
    experts2 = expert_params_per_stage(m, ep2, 0)
    assert experts2 == pytest.approx(4 * per_gpu)
    assert model_state_bytes(m, ep2, 0)["optimizer"] == pytest.approx(12 * (dense_part / 8 + experts2 / 4))


def test_the_plan_checks_expert_parallelism():
    h100 = CLUSTERS["dgx-h100"].with_nodes(8)
    errors = lambda model, plan: " ".join(check(plan, model, h100).errors)  # noqa: E731
    assert "needs a mixture-of-experts model" in errors(MODELS["llama3-70b"], Plan(dp=8, tp=8, ep=8, global_batch=8))
    assert "not divisible by ep 3" in errors(MODELS["mixtral-8x7b"], Plan(dp=6, tp=8, ep=3, global_batch=6))
    assert "dp×cp = 2×1 = 2 is not divisible by ep 4" in errors(
        MODELS["mixtral-8x7b"], Plan(dp=2, tp=8, pp=4, ep=4, global_batch=8)
    )
    assert errors(MODELS["mixtral-8x7b"], Plan(dp=8, tp=8, sp=True, ep=8, zero=1, global_batch=8)) == ""
    # Megatron-core's MoE layer refuses to train with TP and no SP (moe_layer.py)
    assert "needs sequence parallelism" in errors(MODELS["mixtral-8x7b"], Plan(dp=8, tp=8, ep=8, global_batch=8))
    with pytest.raises(ValueError, match="top_k 3 is more than the 2 experts"):
        Model(name="x", layers=2, hidden=64, heads=4, vocab=100, seq_len=16, experts=2, top_k=3)


def test_megatron_mixtral_flags_import_as_moe_with_ep():
    """The flags of Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh."""
    imp = import_text(
        "torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py --use-mcore-models --disable-bias-linear "
        "--seq-length 4096 --max-position-embeddings 32768 --num-layers 32 --hidden-size 4096 "
        "--ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01 --attention-dropout 0.0 "
        "--hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu "
        "--untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8 "
        "--no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000 --num-experts 8 "
        "--moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 "
        "--moe-grouped-gemm --micro-batch-size 1 --global-batch-size 256 --bf16 "
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8 "
        "--use-distributed-optimizer --sequence-parallel --tokenizer-type Llama2Tokenizer"
    )
    assert imp.model == MODELS["mixtral-8x7b"]  # 32000 from Llama2Tokenizer, top-2, no dropout
    assert (imp.plan.ep, imp.plan.pp, imp.plan.dp, imp.world_size) == (8, 4, 8, 32)
    assert imp.plan.to_dict()["ep"] == 8
    assert not [n for n in imp.notes if "not modelled: the MLP is counted dense" in n]


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-cp-pp-dp"])
@pytest.mark.parametrize(
    "sizes,ep",
    [(dict(dp=4, pp=2, cp=1, tp=2), 4), (dict(dp=2, pp=2, cp=2, tp=2), 4), (dict(dp=8, pp=1, cp=2, tp=4), 8)],
)
def test_expert_groups_match_megatron_expert_rank_generator(order, sizes, ep):
    """Megatron-LM lays the experts out as RankGenerator(tp=etp, cp=1, ep, dp=world/(etp·ep·pp), pp)
    with the same order; restated by the same independent oracle as the dense groups."""
    plan = Plan(**sizes, ep=ep, order=order, global_batch=sizes["dp"])
    topo = plan.topology(gpus_per_node=8)
    world = topo.world_size
    with_ep = order if "ep" in order else order.replace("cp-", "cp-ep-", 1)
    expert_sizes = {
        "tp": sizes["tp"],
        "cp": 1,
        "ep": ep,
        "dp": world // (sizes["tp"] * ep * sizes["pp"]),
        "pp": sizes["pp"],
    }
    want = megatron_oracle(world, expert_sizes, with_ep, "ep")
    assert sorted(map(list, topo.group_ranks("ep").tolist())) == sorted(want)
    assert topo.group_count("ep") == world // ep


def test_plan_report_lists_ep_groups_and_the_all_to_all():
    m = MODELS["mixtral-8x7b"]
    rep = plan_report(Plan(dp=8, pp=4, ep=8, zero=1, global_batch=256), m, CLUSTERS["dgx-h100"].with_nodes(4))
    assert rep["plan"]["ep"] == 8 and rep["group_counts"]["ep"] == 4
    assert rep["groups"]["ep"][0] == {"ranks": list(range(8)), "nodes": [0], "domains": [0], "link": "intra"}
    (a2a,) = [r for r in rep["comm_per_step"] if r["dim"] == "ep"]
    m_b, layers = 256 // 8, m.moe_layers // 4
    assert a2a["collective"] == "all_to_all" and a2a["calls"] == 4 * layers * m_b  # dispatch + combine, fwd + bwd
    assert a2a["bytes_per_call"] == m.seq_len * m.hidden * 2 * m.top_k
    assert rep["step_time"]["exposed_ep_s"] == pytest.approx(a2a["seconds"])


def test_moe_activations_are_those_of_the_routed_tokens():
    dense = Model(name="d", layers=4, hidden=64, heads=4, vocab=100, seq_len=32, arch="llama", ffn_hidden=96)
    one = Model(**{**dense.to_dict(), "name": "e", "experts": 4, "top_k": 1})  # top-1 of experts as wide as f
    two = Model(**{**dense.to_dict(), "name": "e2", "experts": 4, "top_k": 2, "shared_expert_ffn": 96})
    plan, opts = Plan(micro_batch=2, attention="unfused", dropout=False), ActivationOptions()
    d, e1, e2 = (activation_components_bytes(m, plan, opts) for m in (dense, one, two))
    b, s, h, a = 2, 32, 64, 2
    assert e1["mlp.act_input"] == d["mlp.act_input"] and e1["mlp.fc2_input"] == d["mlp.fc2_input"]
    assert e1["mlp.fc1_input"] == d["mlp.fc1_input"] + a * b * s * h + 4 * b * s * 4  # a dispatched copy, router
    assert e2["mlp.act_input"] == 3 * d["mlp.act_input"]  # two routed experts and one shared, each of width f
    assert e2["attention.qk"] == d["attention.qk"]


def test_a_head_width_of_its_own_widens_q_and_the_attention_output():
    q3 = MODELS["qwen3-32b"]
    assert (q3.head_dim, q3.q_hidden, q3.kv_hidden) == (128, 8192, 1024)
    plain = Model(**{**q3.to_dict(), "name": "same, hidden/heads heads", "attention_head_dim": None})
    assert plain.head_dim == 80 and plain.q_hidden == plain.hidden
    plan, opts = Plan(tp=8), ActivationOptions()
    wide, narrow = (activation_components_bytes(m, plan, opts) for m in (q3, plain))
    assert wide["attention.proj_input"] == pytest.approx(narrow["attention.proj_input"] * 8192 / 5120)
    assert q3.params_per_layer() - plain.params_per_layer() == 5120 * (8192 - 5120) * 2 + 5120 * 2 * (1024 - 640)


@pytest.mark.parametrize(
    "fixture,preset",
    [
        ("torchtitan_llama4_17bx16e.toml", "llama4-scout"),
        ("torchtitan_qwen3_32b.toml", "qwen3-32b"),
        ("torchtitan_deepseek_v3_671b.toml", "deepseek-v3"),
    ],
)
def test_torchtitan_moe_and_qwen3_train_configs_import(fixture, preset):
    imp = import_plan(Path(__file__).resolve().parents[1] / "data" / "imports" / fixture)
    assert imp.model.name.startswith(preset) and imp.unknown == ()
    assert imp.plan.ep == 1  # as the files ship


def test_torchtitan_expert_parallel_degree_becomes_the_plans_ep():
    text = (Path(__file__).resolve().parents[1] / "data" / "imports" / "torchtitan_llama4_17bx16e.toml").read_text()
    imp = import_text(text.replace("expert_parallel_degree = 1", "expert_parallel_degree = 8"), "scout.toml")
    placed, _ = place(imp, CLUSTERS["dgx-h100"], nodes=8)
    assert (placed.plan.ep, placed.plan.tp, placed.plan.dp) == (8, 8, 8)
    dense = text.replace('name = "llama4"', 'name = "llama3"').replace('"17bx16e"', '"8B"')
    with pytest.raises(ImportFailed, match="expert_parallel_degree 8 for the dense model llama3-8b"):
        import_text(dense.replace("expert_parallel_degree = 1", "expert_parallel_degree = 8"), "dense.toml")


def _toml(name: str, flavor: str) -> str:
    return (
        f'[model]\nname = "{name}"\nflavor = "{flavor}"\n\n[training]\nlocal_batch_size = 1\nseq_len = 2048\n\n'
        "[parallelism]\ndata_parallel_shard_degree = -1\n"
    )


def test_every_torchtitan_flavour_of_llama3_llama4_qwen3_deepseek_v3_gpt_oss_imports():
    flavours = [(n, f) for n, fs in FLAVOURS.items() for f in fs] + list(FLAVOUR_SHAPES)
    assert {n for n, _ in flavours} == {"llama3", "llama4", "qwen3", "deepseek_v3", "gpt_oss"}
    for name, flavor in flavours:
        imp = import_text(_toml(name, flavor), f"{name}_{flavor}.toml")
        assert imp.model.params_total() > 0 and imp.model.seq_len == 2048, (name, flavor)
    with pytest.raises(ValueError, match="no shape for torchtitan model 'qwen3' flavour '7B'"):
        import_text(_toml("qwen3", "7B"), "x.toml")


@pytest.mark.parametrize(
    "flavor,total,active",
    [("0.6B", 0.6, 0.6), ("1.7B", 1.7, 1.7), ("4B", 4.0, 4.0), ("8B", 8.2, 8.2), ("14B", 14.8, 14.8)]
    + [("30B-A3B", 30.5, 3.3)],  # the Qwen3 report's Tables 1-2 (the small ones tie their embeddings)
)
def test_torchtitan_qwen3_flavours_have_the_published_sizes(flavor, total, active):
    m = import_text(_toml("qwen3", flavor), "q.toml").model
    assert m.params_total() / 1e9 == pytest.approx(total, rel=0.03)
    assert m.active_params_total() / 1e9 == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-pp-dp"])
@pytest.mark.parametrize("sizes,ep,etp", [(dict(dp=2, pp=2, cp=1, tp=4), 8, 1), (dict(dp=4, pp=1, cp=2, tp=2), 4, 1)])
def test_expert_tensor_parallelism_changes_the_expert_layout(order, sizes, ep, etp):
    plan = Plan(**sizes, ep=ep, etp=etp, order=order, global_batch=sizes["dp"])
    topo = plan.topology(gpus_per_node=8)
    world = topo.world_size
    with_ep = order if "ep" in order else order.replace("cp-", "cp-ep-", 1)
    expert_sizes = {"tp": etp, "cp": 1, "ep": ep, "dp": world // (etp * ep * sizes["pp"]), "pp": sizes["pp"]}
    assert sorted(map(list, topo.group_ranks("ep").tolist())) == sorted(
        megatron_oracle(world, expert_sizes, with_ep, "ep")
    )


def test_etp_splits_the_experts_and_sets_their_zero_group():
    m = MODELS["mixtral-8x7b"]
    tp8 = Plan(dp=2, tp=8, pp=4, ep=2, zero=1, global_batch=64)
    etp2 = Plan(dp=2, tp=8, pp=4, ep=8, etp=2, zero=1, global_batch=64)
    etp1 = Plan(dp=2, tp=8, sp=True, pp=4, ep=8, etp=1, zero=1, global_batch=64)
    # the same 64 GPUs: ep x etp = 16 ranks share the experts in the first two, 8 in the third
    assert expert_params_per_stage(m, tp8, 0) == pytest.approx(expert_params_per_stage(m, etp2, 0))
    assert expert_params_per_stage(m, etp1, 0) == pytest.approx(2 * expert_params_per_stage(m, etp2, 0))
    # ZeRO-1 of the experts over the expert-data-parallel ranks, dp*cp*tp / (etp*ep): 1, 1 and 2
    experts_opt = lambda p, n: 12 * expert_params_per_stage(m, p, 0) / n  # noqa: E731
    dense = model_state_bytes(m, tp8, 0)["optimizer"] - experts_opt(tp8, 1)
    assert model_state_bytes(m, etp1, 0)["optimizer"] == pytest.approx(dense + experts_opt(etp1, 2))
    assert etp1.label().endswith("EP8 ETP1 gb64") and check(etp1, m, _h100(8)).errors == []
    bad = Plan(dp=2, tp=8, pp=4, ep=8, etp=4, global_batch=64)
    assert "not divisible by etp×ep = 4×8" in " ".join(check(bad, m, _h100(8)).errors)
    imp = import_text(
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
        "--ffn-hidden-size 14336 --swiglu --untie-embeddings-and-output-weights --bf16 --vocab-size 32000 "
        "--num-experts 8 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 --tensor-model-parallel-size 8"
    )
    assert (imp.plan.ep, imp.plan.etp, imp.plan.tp) == (8, 1, 8)


def _h100(nodes):
    return CLUSTERS["dgx-h100"].with_nodes(nodes)
