"""Issue #14, mixture of experts: the presets against their published sizes, expert parallelism's
share of the weights and of ZeRO, the plan's checks, and Megatron-LM's MoE flags."""

import pytest

from parallel.core.memory import expert_params_per_stage, model_state_bytes, params_per_stage
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Model
from parallel.core.validate import check
from parallel.importers import import_text


@pytest.mark.parametrize(
    "name,total,active,rel",
    [
        ("mixtral-8x7b", 46.7, 12.9, 0.01),  # Jiang et al. 2024: 46.7B, 12.9B active
        ("llama4-scout", 109, 17, 0.02),  # Meta: 109B total, 17B active
        ("llama4-maverick", 400, 17, 0.02),  # Meta: 400B total, 17B active
        ("deepseek-v3", 671, 37, 0.05),  # DeepSeek-V3 report: 671B, 37B active (MLA approximated)
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
    from parallel.core.specs import CLUSTERS

    h100 = CLUSTERS["dgx-h100"].with_nodes(8)
    errors = lambda model, plan: " ".join(check(plan, model, h100).errors)  # noqa: E731
    assert "needs a mixture-of-experts model" in errors(MODELS["llama3-70b"], Plan(dp=8, tp=8, ep=8, global_batch=8))
    assert "not divisible by ep 3" in errors(MODELS["mixtral-8x7b"], Plan(dp=6, tp=8, ep=3, global_batch=6))
    assert "dp×cp = 2×1 = 2 is not divisible by ep 4" in errors(
        MODELS["mixtral-8x7b"], Plan(dp=2, tp=8, pp=4, ep=4, global_batch=8)
    )
    assert errors(MODELS["mixtral-8x7b"], Plan(dp=8, tp=8, ep=8, zero=1, global_batch=8)) == ""
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
