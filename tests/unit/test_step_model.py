"""The step-time model: FLOPs as Megatron-LM counts them, the per-device compute model, overlap,
uneven pipeline stages, partial recomputation -- and the plan-model corrections checked against
Megatron-LM's own code (the MoE dispatcher's tokens, its refused layouts, vocabulary padding)."""

import dataclasses

import pytest

from parallel.cli import plan as plan_cli
from parallel.cli import search as search_cli
from parallel.cli.args import cluster_from_args, model_from_args, plan_from_args
from parallel.core import compute
from parallel.core.devices import DEVICES, cluster_device
from parallel.core.memory import ActivationOptions, activation_components_bytes, memory_per_stage, routed_rows
from parallel.core.perf import PerfOptions, flops_per_step, step_time
from parallel.core.plan import Plan, stage_layer_counts
from parallel.core.report import Options, plan_report
from parallel.core.specs import CLUSTERS, MODELS, Model
from parallel.core.validate import check
from parallel.importers import import_text
from parallel.search.explain import explain
from parallel.search.space import MODEL_ERROR, Constraints, search

H100 = CLUSTERS["dgx-h100"]
FLASH = ActivationOptions()  # flash attention: every plan's default (Plan.attention)


def megatron_flops(m: Model, batch: int, tp: int) -> float:
    """megatron/training/training.py num_floating_point_operations (BSHD, no MLA/MTP), restated."""
    s, h = m.seq_len, m.hidden
    tokens, seq_sq = batch * s, batch * s * s
    q_size, kv_size = m.head_dim * m.heads, m.head_dim * m.kv_heads
    self_attn = 3 * 2 * (h * (q_size + kv_size + kv_size) + q_size * h)
    core = 3 * 2 * q_size / 2 * 2
    ffn_factor = 3 if m.gated_mlp else 2
    moe_layers = m.moe_layers
    dense_layers = m.layers - moe_layers
    mlp = h * (
        m.ffn_hidden * ffn_factor * dense_layers
        + m.expert_width * m.top_k * ffn_factor * moe_layers
        + m.shared_expert_ffn * ffn_factor * moe_layers
    )
    logits = 3 * 2 * h * m.padded_vocab(tp)
    return tokens * (3 * 2 * mlp + self_attn * m.layers + logits) + seq_sq * core * m.layers


@pytest.mark.parametrize(
    "name,tp", [("gpt3-175b", 8), ("llama3-8b", 1), ("llama3-70b", 8), ("llama3-405b", 8), ("mixtral-8x7b", 4)]
)
def test_model_flops_follow_megatrons_count(name, tp):
    m = MODELS[name]
    got = flops_per_step(m, Plan(tp=tp, global_batch=64))["model_flops"]
    assert got == pytest.approx(megatron_flops(m, 64, tp), rel=0.005)


def test_causal_attention_halves_the_core_and_recompute_adds_to_hardware_flops():
    m, p = MODELS["llama3-8b"], Plan(global_batch=8)
    causal, full = flops_per_step(m, p)["model_flops"], flops_per_step(m, p, causal=False)["model_flops"]
    assert full - causal == pytest.approx(3 * 8 * m.seq_len**2 * 2 * m.q_hidden * m.layers)
    sel = flops_per_step(m, dataclasses.replace(p, recompute="selective"))
    rec = flops_per_step(m, dataclasses.replace(p, recompute="full"))
    assert causal < sel["hardware_flops"] < rec["hardware_flops"] and rec["model_flops"] == causal


def test_gemm_efficiency_grows_with_the_shape_and_short_k_costs():
    dev = DEVICES["h100-sxm"]
    small, big = compute.gemm_efficiency(dev, 1024, 1024, 4096), compute.gemm_efficiency(dev, 8192, 8192, 8192)
    assert small < big <= dev.gemm_efficiency
    assert compute.gemm_efficiency(dev, 8192, 8192, 256) < 0.7 * compute.gemm_efficiency(dev, 8192, 8192, 8192)
    # one wave of 132 SMs: 132 tiles run in one wave, 133 take two
    assert compute.gemm_efficiency(dev, 128 * 12, 256 * 11, 8192) > compute.gemm_efficiency(
        dev, 128 * 12 + 1, 256 * 11, 8192
    )
    bf16, fp8 = (compute.gemm_seconds(dev, 8192, 8192, 8192, f) for f in (False, True))
    assert 1.3 < bf16 / fp8 < 2.0  # fp8's peak is twice bf16's, its kernels reach less of it
    a100 = DEVICES["a100-sxm-80gb"]
    assert compute.gemm_seconds(a100, 4096, 4096, 4096, True) == compute.gemm_seconds(a100, 4096, 4096, 4096, False)


def test_attention_rate_rises_with_sequence_and_head_dim_and_fa2_is_slower():
    dev = DEVICES["h200-sxm"]
    rates = [compute.attention_rate(dev, s, 128) for s in (1024, 4096, 16384)]
    assert rates == sorted(rates) and rates[-1] < dev.attention_efficiency
    assert compute.attention_rate(dev, 8192, 64) < compute.attention_rate(dev, 8192, 128)
    assert compute.attention_rate(dev, 8192, 128, "fa2") < 0.7 * compute.attention_rate(dev, 8192, 128)


def test_mfu_rises_with_model_size_as_gemms_grow():
    """Megatron-LM's weak scaling (H100): larger GEMMs run closer to peak, so MFU rises with size."""

    def mfu(h, layers, tp):  # one node, no data parallelism: compute and the overlapped TP alone
        m = Model(name=f"h{h}", layers=layers, hidden=h, heads=h // 128, vocab=131072, seq_len=4096, dropout=False)
        p = Plan(tp=tp, sp=tp > 1, tp_overlap=tp > 1, global_batch=8)
        return step_time(m, p, H100.sized_for(p.world_size), acts=FLASH)["mfu"]

    assert mfu(2048, 24, 1) < mfu(6144, 32, 4) < mfu(12288, 96, 8)


def test_tp_overlap_hides_tp_traffic_under_the_gemms():
    m, c = MODELS["gpt3-175b"], H100.with_nodes(8)
    base = dict(dp=1, tp=8, pp=8, sp=True, global_batch=64)
    plain = step_time(m, Plan(**base), c, acts=FLASH)
    hidden = step_time(m, Plan(**base, tp_overlap=True), c, acts=FLASH)
    assert hidden["exposed_sp_s"] < 0.5 * plain["exposed_sp_s"] and hidden["hidden_sp_s"] > plain["hidden_sp_s"]
    assert hidden["step_time_s"] < plain["step_time_s"]
    # what TP moves is the same; only where it sits changes
    moved = lambda t: t["exposed_sp_s"] + t["hidden_sp_s"]  # noqa: E731
    assert moved(hidden) == pytest.approx(moved(plain))


def test_dp_overlap_from_the_plan_and_the_explicit_fraction():
    m, c = MODELS["llama3-8b"], H100.with_nodes(8)
    p = Plan(dp=64, zero=1, global_batch=64)
    plain = step_time(m, p, c, acts=FLASH)
    over = step_time(m, dataclasses.replace(p, grad_reduce_overlap=True, param_gather_overlap=True), c, acts=FLASH)
    assert over["exposed_dp_s"] < plain["exposed_dp_s"] and over["hidden_dp_s"] > 0 == plain["hidden_dp_s"]
    none = step_time(m, p, c, PerfOptions(dp_overlap=1.0), acts=FLASH)
    assert none["exposed_dp_s"] == 0


def test_p2p_overlap_removes_the_pipeline_sends_from_the_critical_path():
    m, c = MODELS["gpt3-175b"], H100.with_nodes(8)
    p = Plan(tp=8, pp=8, vpp=2, sp=True, global_batch=64)
    plain = step_time(m, p, c)
    t = step_time(m, dataclasses.replace(p, p2p_overlap=True), c)
    # what stays exposed is the tied embedding's once-per-step all-reduce between the end stages
    assert t["exposed_pp_s"] < 0.2 * plain["exposed_pp_s"] and t["hidden_pp_s"] > 0 == plain["hidden_pp_s"]


def test_uneven_stages_as_megatron_builds_them():
    assert stage_layer_counts(126, Plan(pp=16, first_stage_layers=7, last_stage_layers=7)) == (7, 8, 7)
    assert stage_layer_counts(126, Plan(pp=16, embedding_in_split=True, loss_in_split=True)) == (7, 8, 7)
    assert stage_layer_counts(96, Plan(pp=8, first_stage_layers=5)) == (5, 13, 13)
    m = MODELS["llama3-405b"]
    even = check(Plan(dp=8, tp=8, pp=16, global_batch=128), m, H100.with_nodes(128))
    assert any("layers 126 are not divisible by pp×vpp" in e and "uneven" in e for e in even.errors)
    ok = Plan(dp=8, tp=8, pp=16, sp=True, global_batch=128, first_stage_layers=7, last_stage_layers=7)
    assert check(ok, m, H100.with_nodes(128), FLASH).computable
    bad = dataclasses.replace(ok, first_stage_layers=6)
    assert any("leave 113 for the other 14 stages: not divisible" in e for e in check(bad, m, H100).errors)
    vpp = dataclasses.replace(ok, vpp=2, global_batch=256)
    assert any("vpp 2" in e and "7 layers" in e for e in check(vpp, m, H100).errors)
    ends = Plan(dp=2, tp=8, pp=2, sp=True, global_batch=64, first_stage_layers=18, last_stage_layers=18)
    dsv3 = MODELS["deepseek-v3"]  # 61 layers: two ends of 18 would leave 25 on no stage
    assert any("leave 25 of the model's 61 layers on no stage" in e for e in check(ends, dsv3, H100).errors)
    assert check(dataclasses.replace(ends, last_stage_layers=43), dsv3, H100.with_nodes(4)).computable


def test_uneven_stages_set_memory_per_stage_and_the_pipeline_pace():
    m, c = MODELS["llama3-405b"], H100.with_nodes(128)
    p = Plan(dp=8, tp=8, pp=16, sp=True, global_batch=1024, first_stage_layers=7, last_stage_layers=7, zero=1)
    stages = memory_per_stage(m, p, FLASH)
    assert stages[0]["params"] < stages[1]["params"]  # 7 layers and the embedding against 8 layers
    heavy = dataclasses.replace(p, first_stage_layers=14, last_stage_layers=0)  # 112 left for 14: 8 each
    assert step_time(m, heavy, c, acts=FLASH)["step_time_s"] > step_time(m, p, c, acts=FLASH)["step_time_s"]


def test_partial_recompute_sits_between_none_and_full():
    m, c = MODELS["llama3-70b"], H100.with_nodes(8)
    base = dict(dp=8, tp=8, sp=True, global_batch=64)
    none, full = Plan(**base), Plan(**base, recompute="full")
    half = Plan(**base, recompute="full", recompute_layers=40)
    mem = [memory_per_stage(m, p, FLASH)[0]["activations"] for p in (full, half, none)]
    assert mem == sorted(mem)
    times = [step_time(m, p, c, acts=FLASH)["step_time_s"] for p in (none, half, full)]
    assert times == sorted(times)
    with pytest.raises(ValueError, match="needs recompute 'full'"):
        Plan(recompute_layers=2)


@pytest.mark.parametrize("etp", [1, 2])
def test_moe_routed_tokens_are_the_dispatchers(etp):
    """Megatron's dispatcher all-gathers routed tokens over the expert-TP group only: a rank holds
    b (s/tp) top_k etp of them (Mixtral 8x7B, tp 4)."""
    m = MODELS["mixtral-8x7b"]
    p = Plan(tp=4, sp=True, etp=etp, dp=2, ep=2, global_batch=2)
    tokens = 1 * (m.seq_len / 4) * m.top_k * etp
    assert routed_rows(m, p) == tokens
    parts = activation_components_bytes(m, p, FLASH)
    dense = activation_components_bytes(dataclasses.replace(m, experts=0, top_k=1), p, FLASH)
    # fc1_input: the dense MLP's input plus the routed copies (A bytes of h each) plus fp32 probabilities
    routed = parts["mlp.fc1_input"] - dense["mlp.fc1_input"] - 4 * m.seq_len * m.experts / 4
    assert routed == pytest.approx(2 * tokens * m.hidden)


def test_megatron_refuses_a_non_pp_last_order_whose_expert_dp_differs():
    m = MODELS["llama3-8b"]
    p = Plan(tp=2, pp=2, cp=2, dp=2, order="tp-cp-pp-dp", global_batch=64, zero=1)
    v = check(p, m, H100.with_nodes(2), FLASH)
    assert not v.valid and any(
        "world/(etp×ep×pp) = 16/(2×1×2) = 4 to equal dp 2 (cp > 1)" in e and "pp-last rank ordering" in e
        for e in v.errors
    )
    assert check(dataclasses.replace(p, order="tp-cp-ep-dp-pp"), m, H100.with_nodes(2), FLASH).valid
    assert check(dataclasses.replace(p, cp=1, dp=4), m, H100.with_nodes(2), FLASH).valid  # edp = dp without cp


def test_the_search_does_not_offer_refused_layouts():
    r = search(MODELS["llama3-8b"], H100.with_nodes(2), 64, Constraints(base=Plan(order="tp-cp-pp-dp")))
    t = r.table
    assert not ((t.pp > 1) & (t.cp > 1)).any() and len(t)
    assert any("not pp-last" in f["constraint"] for f in r.funnel)


def test_vocabulary_padding_once_for_presets_imports_and_flags():
    m = MODELS["llama3-8b"]
    assert m.vocab == 128256 and m.padded_vocab(8) == 129024 and m.padded_vocab(1) == 128256
    assert dataclasses.replace(m, vocab_divisor=1).padded_vocab(8) == 128256
    script = (
        "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 "
        "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu "
        "--untie-embeddings-and-output-weights --seq-length 8192 --vocab-size 128256 --bf16 --micro-batch-size 1 "
        "--attention-dropout 0 --hidden-dropout 0"
    )
    imp = import_text(script, "x.sh")
    assert imp.model == m and imp.model.padded_vocab(imp.plan.tp) == 129024  # the same model either way
    args = ["--model", "llama3-8b", "--tp", "8", "--global-batch", "8", "--attention", "fused"]
    assert "V=128256 (padded to 129024 for tp 8)" in plan_cli.render_text(_report(plan_cli, args))
    assert "padded" not in plan_cli.render_text(_report(plan_cli, [*args, "--no-vocab-padding"])).split("\n")[0]


def _report(plan_cli, argv):
    a = plan_cli.build_parser().parse_args(argv)
    model, plan = model_from_args(a), plan_from_args(a)
    return plan_report(plan, model, cluster_from_args(a, plan.world_size), plan_cli.options_from_args(a))


def test_megatron_overlap_uneven_and_block_recompute_flags_become_plan_fields():
    script = (
        "torchrun --nnodes 128 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 16 --num-layers 126 --hidden-size 16384 --num-attention-heads 128 "
        "--group-query-attention --num-query-groups 8 --ffn-hidden-size 53248 --swiglu "
        "--untie-embeddings-and-output-weights --seq-length 8192 --vocab-size 128256 --bf16 --micro-batch-size 1 "
        "--global-batch-size 1024 --sequence-parallel --tp-comm-overlap --overlap-grad-reduce --overlap-param-gather "
        "--use-distributed-optimizer --decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7 "
        "--recompute-granularity full --recompute-method block --recompute-num-layers 2"
    )
    p = import_text(script, "405b.sh").plan
    assert (p.tp_overlap, p.grad_reduce_overlap, p.param_gather_overlap, p.p2p_overlap) == (True, True, True, False)
    assert (p.first_stage_layers, p.last_stage_layers, p.recompute, p.recompute_layers) == (7, 7, "full", 2)
    assert check(p, MODELS["llama3-405b"], H100.with_nodes(128), FLASH).computable


def test_generic_gpu_and_presets_resolve_to_a_device():
    assert cluster_device(H100).name == "h100-sxm"
    custom = dataclasses.replace(H100, gpu="", peak_flops=500e12)
    dev = cluster_device(custom)
    assert dev.bf16_flops == 500e12 and "generic" in dev.name
    assert cluster_device(dataclasses.replace(H100, peak_flops=800e12)).fp8_flops == pytest.approx(1979e12 * 800 / 989)


def test_search_ranks_equivalent_plans_by_simplicity_and_explains():
    """GPT-3 175B on 64 DGX-H100 at 2K tokens: the model's favourite is TP8 inside the node, no CP;
    plans within the model's error are ordered simplest first; --explain says why."""
    m, c = MODELS["gpt3-175b"], H100.with_nodes(64)
    overlapped = Plan(tp_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True, p2p_overlap=True)
    r = search(m, c, 1536, Constraints(base=overlapped), _options())
    top = r.table.iloc[0]
    assert top["tp"] == 8 and top["cp"] == 1 and top["equivalent"]
    band = r.table[r.table["equivalent"]]
    assert band["step_time_s"].max() <= r.table["step_time_s"].min() * (1 + MODEL_ERROR) + 1e-12
    assert band["simplicity"].is_monotonic_increasing
    cp_plans = r.table[r.table["cp"] > 1]
    assert cp_plans.index.min() > 0  # no CP at 2K tokens ahead of the simplest equivalent plan
    spec = "dp=8,tp=2,pp=16,cp=2,sp=1,vpp=1,micro_batch=1,zero=1,cp_kind=ring"
    other = search_cli.plan_spec(spec, r.base)
    ex = explain(m, c, r.plan_at(0), other, _options())
    step = ex["parts"][0]
    assert step["part"] == "step" and step["difference_s"] == pytest.approx(step["other_s"] - step["top_s"])
    assert ex["first"] == "top" and ("faster" in ex["summary"] or "within the model's" in ex["summary"])
    with pytest.raises(ValueError, match="256 GPUs, but the search is for 512"):
        explain(m, c, other, dataclasses.replace(other, dp=4), _options())


def _options():
    return Options(activations=FLASH)


def test_p2p_overlap_hides_pipeline_sends_only_under_the_interleaved_schedule():
    """Megatron-LM overlaps P2P only with vpp > 1 (arguments.py turns --overlap-p2p-communication off
    without it), as the label says: at vpp 1 the flag changes nothing; at vpp 2 the sends are hidden."""
    model, cluster = MODELS["gpt3-175b"], H100.with_nodes(64)
    for vpp, moved in ((1, False), (2, True)):
        plain = Plan(dp=8, tp=8, pp=8, sp=True, vpp=vpp, global_batch=1536)
        over = dataclasses.replace(plain, p2p_overlap=True)
        a, b = step_time(model, plain, cluster), step_time(model, over, cluster)
        assert bool(b["exposed_pp_s"] < a["exposed_pp_s"]) is moved and bool(b["hidden_pp_s"] > 0) is moved
        assert bool(b["step_time_s"] < a["step_time_s"]) is moved and (over.label() != plain.label()) is moved
