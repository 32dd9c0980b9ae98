"""Selective recomputation by module (Megatron-core's --recompute-modules): the plan field, the bytes
each module drops (its own saved activations, by the rule of the Megatron-core module that recomputes
it), the forward each runs again, and the Megatron-LM importer's and exporter's reading of the flag."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from parallel.core.comm import comm_terms
from parallel.core.compute import JOB_EFFICIENCY, gemm_fwd_bwd_seconds, layer_cost, layer_gemms
from parallel.core.devices import cluster_device
from parallel.core.memory import activation_components_bytes, memory_per_gpu_bytes, routed_rows
from parallel.core.perf import flops_per_step, step_time
from parallel.core.plan import RECOMPUTE_MODULES, Plan, plan_from_values
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.importers import ImportFailed, import_text
from parallel.importers.export import megatron_script, torchtitan_toml
from parallel.search.space import Constraints, result_json, search

sys.path.insert(0, str(Path(__file__).parent))
from test_moe_models import V3_LAUNCH  # noqa: E402
from test_plan_schema import DOORS  # noqa: E402

V3, QWEN, LLAMA = MODELS["deepseek-v3"], MODELS["qwen3-30b-a3b"], MODELS["llama3-8b"]
A = 2  # bf16 activations
H100 = CLUSTERS["dgx-h100"]
V3_PLAN = Plan(dp=8, tp=2, pp=4, ep=8, sp=True, zero=1, global_batch=64, recompute="selective")
QWEN_PLAN = Plan(dp=8, tp=2, ep=8, sp=True, zero=1, global_batch=64, recompute="selective")
LLAMA_PLAN = Plan(dp=2, tp=4, sp=True, global_batch=16, recompute="selective")


def dropped(model, plan, modules: str) -> float:
    """Bytes one layer keeps with core_attn alone less with core_attn + `modules` (flash attention:
    core_attn alone drops nothing)."""
    base = sum(activation_components_bytes(model, plan).values())
    more = dataclasses.replace(plan, recompute_modules="core_attn+" + modules)
    return base - sum(activation_components_bytes(model, more).values())


# ---------------------------------------------------------------- the plan field


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("core_attn", "core_attn"),
        ("mla_up_proj layernorm moe_act", "moe_act+layernorm+mla_up_proj"),  # Megatron-LM's spelling
        ("moe+mlp+mlp", "mlp+moe"),
        (" shared_experts , core_attn ", "core_attn+shared_experts"),
    ],
)
def test_modules_have_one_spelling(text, canonical):
    plan = Plan(recompute="selective", recompute_modules=text)
    assert plan.recompute_modules == canonical
    assert plan.label() == "DP1 " + ("rc-selective" if canonical == "core_attn" else f"rc-selective[{canonical}]")


def test_modules_count_only_under_selective_recompute():
    for recompute in ("none", "full"):
        plan = dataclasses.replace(V3_PLAN, recompute=recompute)
        kept = dataclasses.replace(plan, recompute_modules="moe+mla_up_proj")
        assert kept.recompute_modules == "mla_up_proj+moe" and kept.label() == plan.label()
        assert memory_per_gpu_bytes(V3, kept) == memory_per_gpu_bytes(V3, plan)
        assert step_time(V3, kept, H100.with_nodes(8)) == step_time(V3, plan, H100.with_nodes(8))


def test_a_search_carries_the_base_plans_modules_to_its_selective_rows():
    base = Plan(recompute_modules="mlp+layernorm")
    c = Constraints(recompute=("selective",), base=base, max_pp=1, zero=(1,))
    rows = result_json(search(LLAMA, H100.with_nodes(1), 16, c))
    assert rows and all(Plan.from_dict(r["plan"]).recompute_modules == "layernorm+mlp" for r in rows)
    assert all("rc-selective[layernorm+mlp]" in r["label"] for r in rows)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"recompute_modules": "core_attn gdn_norm_out"}, "'gdn_norm_out' unknown"),
        ({"recompute_modules": " + "}, "at least one"),
        ({"recompute_modules": "moe_act", "grouped_gemm": False}, "moe_act needs grouped_gemm"),
    ],
)
def test_bad_modules_are_refused_with_their_name(values, message):
    with pytest.raises(SpecError, match=message):
        plan_from_values({"recompute": "selective", **values})


def test_modules_reach_every_door():
    plan = dataclasses.replace(LLAMA_PLAN, recompute_modules="layernorm+mlp")
    for door in DOORS:
        assert door(plan) == plan, door.__name__


# ---------------------------------------------------------------- memory: each module's own bytes


def test_each_module_drops_its_own_saved_activations():
    b, s, t, r = 1, V3.seq_len, 2, 1 / 2  # micro batch, tokens, tp, SP's share of the h-wide tensors
    h, share = V3.hidden, V3.moe_share
    routed = routed_rows(V3, V3_PLAN)  # b s / t x top_k x etp copies
    assert routed == b * s / t * V3.top_k * t
    # MoE experts' activation output (the SwiGLU product fc2 reads), routed rows only
    assert dropped(V3, V3_PLAN, "moe_act") == pytest.approx(share * A * routed * V3.expert_width / t)
    # MLA's up-projected Q and K (heads x 192) and V (heads x 128) on this rank's heads
    qkv = A * b * s * (V3.heads * (128 + 64) * 2 + V3.heads * 128) / t
    assert dropped(V3, V3_PLAN, "mla_up_proj") == pytest.approx(qkv)
    # the norms' outputs: MLA's input norm on every layer, the pre-MLP norm of the MoE layers
    assert dropped(V3, V3_PLAN, "layernorm") == pytest.approx(A * b * s * h * r * (1 + share))
    # the shared experts' SwiGLU input (gate and up) and product
    assert dropped(V3, V3_PLAN, "shared_experts") == pytest.approx(share * 3 * A * b * s * V3.shared_expert_ffn / t)
    # a dense layer's MLP (DeepSeek-V3's first three layers): fc1 input, gate and up, product
    dense = A * b * s * h * r + 3 * A * b * s * V3.ffn_hidden / t
    assert dropped(V3, V3_PLAN, "mlp") == pytest.approx((1 - share) * dense)


def test_a_dense_gqa_layer_fuses_its_norms_and_the_moe_modules_find_nothing():
    b, s, t, r, h, f = 1, LLAMA.seq_len, 4, 1 / 4, LLAMA.hidden, LLAMA.ffn_hidden
    for module in ("layernorm", "moe_act", "moe", "shared_experts", "mla_up_proj"):
        assert dropped(LLAMA, LLAMA_PLAN, module) == 0, module
    assert dropped(LLAMA, LLAMA_PLAN, "mlp") == pytest.approx(A * b * s * h * r + 3 * A * b * s * f / t)


def test_a_recomputed_moe_block_keeps_only_its_input():
    b, s, r, h = 1, QWEN.seq_len, 1 / 2, QWEN.hidden
    parts = activation_components_bytes(QWEN, QWEN_PLAN)
    mlp = parts["mlp.fc1_input"] + parts["mlp.act_input"] + parts["mlp.fc2_input"]
    assert dropped(QWEN, QWEN_PLAN, "moe") == pytest.approx(mlp - A * b * s * h * r)  # the norm's output stays
    # with the norm recomputed too, its output goes as well: nothing of the MLP stays
    assert dropped(QWEN, QWEN_PLAN, "layernorm") == pytest.approx(A * b * s * h * r)
    assert dropped(QWEN, QWEN_PLAN, "moe+layernorm") == pytest.approx(mlp)


@pytest.mark.parametrize("module", [m for m in RECOMPUTE_MODULES if m != "core_attn"])
def test_memory_per_gpu_falls_by_the_layers_bytes_and_step_time_rises(module):
    plan = V3_PLAN
    more = dataclasses.replace(plan, recompute_modules="core_attn+" + module)
    before, after = memory_per_gpu_bytes(V3, plan), memory_per_gpu_bytes(V3, more)
    assert after["activations"] < before["activations"]
    assert before["params"] == after["params"] and before["optimizer"] == after["optimizer"]
    cluster = H100.with_nodes(8)
    assert step_time(V3, more, cluster)["step_time_s"] > step_time(V3, plan, cluster)["step_time_s"]


# ---------------------------------------------------------------- compute: the forward again


def test_a_recomputed_dense_mlp_costs_its_forward_once_more():
    dev = cluster_device(H100)
    more = dataclasses.replace(LLAMA_PLAN, recompute_modules="core_attn+mlp")
    extra = layer_cost(LLAMA, more, dev).recompute - layer_cost(LLAMA, LLAMA_PLAN, dev).recompute
    dense, _ = layer_gemms(LLAMA, LLAMA_PLAN)
    gemms = sum(gemm_fwd_bwd_seconds(dev, g, False)[0] for g in dense if g.name in ("fc1", "fc2"))
    tokens = LLAMA.seq_len  # micro batch 1, cp 1: SwiGLU reads gate and up, writes the product (3A)
    swiglu = 3 * A * tokens * LLAMA.ffn_hidden / 4 / (dev.hbm_bytes_per_s * dev.memory_efficiency)
    assert extra == pytest.approx((gemms + swiglu) / JOB_EFFICIENCY)
    flops = flops_per_step(LLAMA, more)["hardware_flops"] - flops_per_step(LLAMA, LLAMA_PLAN)["hardware_flops"]
    assert flops == pytest.approx(16 * LLAMA.seq_len * LLAMA.layers * 2 * LLAMA.mlp_matrix_params(LLAMA.ffn_hidden))


def test_a_recomputed_moe_block_dispatches_again():
    more = dataclasses.replace(QWEN_PLAN, recompute_modules="core_attn+moe")

    def a2a_calls(plan):
        return sum(t.calls for t in comm_terms(QWEN, plan) if t.dim == "ep" and t.collective == "all_to_all")

    # forward dispatch + combine (2) and their backward conjugates (2), then one more dispatch + combine
    assert a2a_calls(more) == pytest.approx(a2a_calls(QWEN_PLAN) * 6 / 4)


# ---------------------------------------------------------------- Megatron-LM and torchtitan files

V3_SCRIPT = V3_LAUNCH + "--moe-layer-freq '([0]*3+[1]*58)' --moe-grouped-gemm "


def test_the_importer_reads_the_modules_as_megatron_core_does():
    imp = import_text(V3_SCRIPT + "--recompute-granularity selective --recompute-modules mla_up_proj layernorm moe_act")
    assert (imp.plan.recompute, imp.plan.recompute_modules) == ("selective", "moe_act+layernorm+mla_up_proj")
    assert import_text(V3_SCRIPT + "--recompute-activations").plan.recompute_modules == "core_attn"  # the default
    moe = import_text(V3_SCRIPT + "--moe-layer-recompute").plan  # deprecated: selective + moe
    assert (moe.recompute, moe.recompute_modules) == ("selective", "core_attn+moe")
    ignored = import_text(V3_SCRIPT + "--recompute-granularity full --recompute-modules moe_act")
    assert ignored.plan.recompute_modules == "core_attn" and any("ignored" in n for n in ignored.notes)


@pytest.mark.parametrize(
    "extra,message",
    [
        ("--recompute-modules core_attn bogus", "bogus: not a Megatron-core module"),
        ("--recompute-modules gdn_norm_out", "gdn_norm_out belongs to GatedDeltaNet layers"),
        ("--recompute-modules moe_act", "needs --moe-grouped-gemm"),
    ],
)
def test_the_importer_refuses_what_megatron_core_refuses(extra, message):
    script = V3_LAUNCH + "--moe-layer-freq '([0]*3+[1]*58)' --recompute-granularity selective " + extra
    with pytest.raises(ImportFailed, match=message):
        import_text(script)
    llama = "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
    with pytest.raises(ImportFailed, match="mla_up_proj needs --multi-latent-attention"):
        import_text(llama + "--recompute-granularity selective --recompute-modules mla_up_proj")


def test_the_exporters_write_the_modules_or_say_they_cannot():
    plan = dataclasses.replace(V3_PLAN, recompute_modules="mla_up_proj+moe_act+layernorm")
    text, notes = megatron_script(plan, V3)
    assert "--recompute-granularity selective" in text
    assert "--recompute-modules moe_act layernorm mla_up_proj" in text and notes == []
    back = import_text(text, "pretrain.sh")
    assert back.plan.recompute_modules == plan.recompute_modules and back.plan.recompute == "selective"
    _, notes = torchtitan_toml(plan, V3)
    assert any("selective recompute (moe_act+layernorm+mla_up_proj)" in n for n in notes)
