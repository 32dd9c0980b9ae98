"""The plan model against Megatron-LM's own estimator and against measurement, term by term.

Reference numbers: Megatron-LM's megatron/training/theoretical_memory_usage.py (restated below as the
test's reference formula), the SwiGLU bytes measured with saved_tensors_hooks, and NVIDIA's
examples/llama/train_llama3_8b_h100_fp8.sh, shipped for one 8 x H100 80 GB node.
"""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parallel.core.memory import (
    ActivationOptions,
    activation_components_bytes,
    memory_per_gpu_bytes,
    model_state_bytes,
    params_per_stage,
)
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, GiB
from parallel.importers import import_plan, import_text

DATA = Path(__file__).resolve().parents[1] / "data" / "imports"


def _state_gib(model, plan) -> float:
    return max(sum(model_state_bytes(model, plan, s).values()) for s in range(plan.pp)) / GiB


def _megatron_weights_and_optimizer(m, *, tp, pp, dp, distributed_optimizer) -> float:
    """theoretical_memory_usage.compute_weight_and_optimizer_memory for a dense GPT (bytes): no biases,
    no position embeddings, LayerNorm weight+bias, the final norm split over pp, 18 or 6 + 12/d bytes."""
    h, f = m.hidden, m.ffn_hidden
    layer = 2 * h * (f + 2) + 2 * h * h * (1 + m.kv_heads / m.heads)
    block = layer * m.layers + 2 * h
    shard = (block / pp + h * m.vocab) / tp
    return shard * (6 + 12 / dp if distributed_optimizer else 18)


@pytest.mark.parametrize(
    "tp,pp,dp,zero,megatron_gib",
    [(8, 8, 1, 0, 46.89), (8, 8, 8, 1, 19.54), (8, 16, 4, 1, 12.05)],  # the reference numbers
)
def test_model_state_matches_megatron_lm_with_fp32_main_grads(tp, pp, dp, zero, megatron_gib):
    m = MODELS["gpt3-175b"]
    plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, global_batch=dp * pp)
    ref = _megatron_weights_and_optimizer(m, tp=tp, pp=pp, dp=dp, distributed_optimizer=zero == 1)
    assert ref / GiB == pytest.approx(megatron_gib, abs=0.01)
    ours = _state_gib(m, plan)
    assert ours == pytest.approx(megatron_gib, rel=0.02)  # was 42.06 / 14.46 / 9.54 with 2-byte gradients
    # The whole difference: GPT-3's biases and learned positions, which Megatron's estimator leaves
    # out (the plan model counts them: params_per_layer), at the same bytes per parameter.
    h, s, L = m.hidden, m.seq_len, m.layers
    extra = L / pp * (3 * h / tp + 6 * h) + s * h - 2 * h / (pp * tp)  # 9h biases (6h kept whole) + 4h norms
    per_param = 18 if zero == 0 else 6 + 12 / dp
    assert params_per_stage(m, plan, 0) * per_param - ref == pytest.approx(extra * per_param, rel=1e-9)


def test_bf16_gradients_are_the_old_two_bytes():
    m = MODELS["gpt3-175b"]
    assert _state_gib(m, Plan(tp=8, pp=8, main_grads="bf16", global_batch=8)) == pytest.approx(42.06, abs=0.01)
    fp32 = model_state_bytes(m, Plan(dp=8, zero=2, global_batch=8), 0)
    assert fp32["grads"] == pytest.approx(params_per_stage(m, Plan(dp=8), 0) * 4 / 8)  # ZeRO-2 shards them


def _mlp_bytes_per_sbf(model, opts) -> float:
    c = activation_components_bytes(model, Plan(tp=8, sp=True), opts)
    return (c["mlp.act_input"] + c["mlp.fc2_input"]) / (model.seq_len * model.ffn_hidden / 8)


def test_swiglu_bytes_per_token_fused_and_unfused():
    llama, gpt = MODELS["llama3-70b"], MODELS["gpt3-175b"]
    assert _mlp_bytes_per_sbf(gpt, ActivationOptions()) == 4  # GeLU: its input and output
    assert _mlp_bytes_per_sbf(llama, ActivationOptions()) == 6  # fused (Megatron-LM's default)
    assert _mlp_bytes_per_sbf(llama, ActivationOptions(swiglu="unfused")) == 8
    # The old count (8 per s·b·f) on Llama-3 70B was (8 - 6) f/h = 7 sbh/t per layer too high.
    fused = activation_components_bytes(llama, Plan(tp=8, sp=True), ActivationOptions())
    unfused = activation_components_bytes(llama, Plan(tp=8, sp=True), ActivationOptions(swiglu="unfused"))
    sbh_t = llama.seq_len * llama.hidden / 8
    assert (sum(unfused.values()) - sum(fused.values())) / sbh_t == pytest.approx(7.0)


def test_unfused_swiglu_formula_equals_what_pytorch_saves():
    """silu(gate) * up in PyTorch, measured: every tensor saved for backward, each storage once."""
    s, b, h, f = 16, 2, 8, 24
    x = torch.randn(s, b, h, dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.randn(2 * f, h, dtype=torch.bfloat16, requires_grad=True)
    w2 = torch.randn(h, f, dtype=torch.bfloat16, requires_grad=True)
    y = F.linear(x, w1)  # fc1: gate and up
    seen, total = {w2.untyped_storage().data_ptr()}, [0]  # the weight is no activation

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        gate, up = torch.chunk(y, 2, dim=-1)
        z = F.silu(gate) * up
        F.linear(z, w2)
    model = dataclasses.replace(MODELS["llama3-8b"], hidden=h, heads=1, kv_heads=1, ffn_hidden=f, seq_len=s)
    c = activation_components_bytes(model, Plan(micro_batch=b), ActivationOptions(swiglu="unfused"))
    assert total[0] == c["mlp.act_input"] + c["mlp.fc2_input"]


def test_llama_presets_train_without_dropout_and_gpt_presets_with():
    for name, model in MODELS.items():
        if model.arch == "llama":
            assert model.dropout is False, name
            c = activation_components_bytes(model, Plan(tp=8), ActivationOptions())
            assert c["residual.dropout_masks"] == 0 and c["attention.dropout_mask"] == 0
        elif name.startswith("gpt3"):
            assert model.dropout is True, name
    llama = MODELS["llama3-70b"]
    on = activation_components_bytes(llama, Plan(tp=8, dropout=True), ActivationOptions())
    assert on["residual.dropout_masks"] / (llama.seq_len * llama.hidden) == 2  # the +2 sbh (t = 1 here: no SP)


def test_llama3_8b_fp8_script_fits_an_80_gb_h100():
    """NVIDIA ships train_llama3_8b_h100_fp8.sh for one node of 80 GB H100s; it was judged 86.2 GiB."""
    imp = import_plan(DATA / "megatron_llama3_8b_h100_fp8.sh")
    plan, model = imp.plan, imp.model
    assert (plan.fp8, plan.main_grads, plan.zero, plan.dp) == ("weights", "bf16", 1, 8)
    opts = ActivationOptions()
    gib = lambda p, o=opts: {k: v / GiB for k, v in memory_per_gpu_bytes(model, p, o).items()}  # noqa: E731
    now = gib(plan)
    assert now["total"] == pytest.approx(68.2, abs=0.05) and now["total"] < 80
    old = gib(dataclasses.replace(plan, fp8="none"), dataclasses.replace(opts, swiglu="unfused"))
    assert old["total"] == pytest.approx(86.2, abs=0.05)  # bf16 everywhere and 8 bytes per s·b·f of SwiGLU
    fused = gib(dataclasses.replace(plan, fp8="none"))
    # the 18 GiB, term by term: fused SwiGLU 7.0 GiB of activations, FP8 GEMM inputs 4.5 GiB, FP8 weights 6.5 GiB
    assert old["activations"] - fused["activations"] == pytest.approx(7.0, abs=0.05)
    assert fused["activations"] - now["activations"] == pytest.approx(4.5, abs=0.05)
    assert fused["params"] - now["params"] == pytest.approx(6.5, abs=0.05)
    assert now["grads"] == pytest.approx(old["grads"]) == pytest.approx(params_per_stage(model, plan, 0) * 2 / GiB)
    notes = " ".join(imp.notes)
    assert "--fp8-format hybrid: FP8 GEMMs" in notes and "--fp8-param-gather" in notes


def test_megatron_flags_for_gradients_fp8_and_swiglu_fusion():
    base = "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
    base += "--ffn-hidden-size 14336 --swiglu --untie-embeddings-and-output-weights --bf16 --vocab-size 128256 "
    plain = import_text(base)
    assert (plain.plan.main_grads, plain.plan.fp8) == ("fp32", "none") and "swiglu" not in plain.options
    assert plain.model.dropout is True  # Megatron-LM's dropout defaults are 0.1
    imp = import_text(base + "--main-grads-dtype bf16 --fp8-format e4m3 --no-bias-swiglu-fusion")
    assert (imp.plan.main_grads, imp.plan.fp8, imp.options["swiglu"]) == ("bf16", "gemm", "unfused")


def test_megatron_vocab_from_the_tokenizer_type_only_where_it_is_known():
    line = "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
    line += "--ffn-hidden-size 11008 --swiglu --untie-embeddings-and-output-weights --bf16 "
    llama2 = import_text(line + "--tokenizer-type Llama2Tokenizer --tokenizer-model /x/tokenizer.model")
    assert llama2.model.vocab == 32000  # Llama 2's SentencePiece vocabulary, not Llama 3's 128256
    guess = import_text(
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 8192 --swiglu "
        "--untie-embeddings-and-output-weights --bf16 --tokenizer-type HuggingFaceTokenizer"
    )
    assert guess.model.vocab == 128256 and any("is a guess" in n for n in guess.notes)


def test_megatron_script_that_sources_a_config_beside_it(tmp_path):
    (tmp_path / "model.sh").write_text("TP=4\nPP=2\nLAYERS=24\nexport HIDDEN=2048\n")
    script = tmp_path / "run.sh"
    script.write_text(
        ". model.sh\nsource ../secrets.sh\nsource missing.sh\n"
        "torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP "
        "--pipeline-model-parallel-size $PP --num-layers $LAYERS --hidden-size $HIDDEN "
        "--num-attention-heads 16 --seq-length 2048 --vocab-size 51200 --bf16\n"
    )
    (tmp_path.parent / "secrets.sh").write_text("TP=8\n")
    imp = import_plan(script)
    assert (imp.plan.tp, imp.plan.pp, imp.model.layers, imp.model.hidden) == (4, 2, 24, 2048)
    notes = " ".join(imp.notes)
    assert "`. model.sh`: read from the file beside the script (not executed)" in notes
    assert "`source ../secrets.sh` not read (it is not a file beside the script)" in notes
    assert "`source missing.sh` not read" in notes
    pasted = import_text(
        script.read_text().replace("$TP", "2").replace("$PP", "1").replace("$LAYERS", "24").replace("$HIDDEN", "2048")
    )
    assert any("`. model.sh` not read (other files are not read)" in n for n in pasted.notes)


def test_torchtitan_sep_2024_experimental_pipeline_degree():
    """torchtitan's train_configs/llama3_405b.toml of Sep 2024 keeps pipeline_parallel_degree in
    [experimental]; it used to be ignored (pp 1)."""
    imp = import_plan(DATA / "torchtitan_llama3_405b_sep2024.toml")
    assert (imp.plan.tp, imp.plan.pp, imp.plan.schedule) == (8, 4, "1f1b")
    assert any("read from [experimental]" in n for n in imp.notes)
    assert any("enable_async_tensor_parallel: TP communication overlapped" in n for n in imp.notes)
    assert imp.plan.tp_overlap  # async TP: the TP collectives run under the GEMMs
    assert imp.plan.main_grads == "fp32"  # mixed_precision_reduce's default, float32
    assert imp.unknown == ()
