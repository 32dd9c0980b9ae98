"""Memory per GPU: parameters, gradients, optimizer states and activations, per pipeline stage.

Sources (symbols as in the papers: s sequence, b micro-batch, h hidden, a heads, L layers, t TP size,
p PP size, v vocabulary, m interleaved stages):

* Activations per layer — Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Sec. 4.1 (the per-tensor account) and Table 2:

      no parallelism             sbh (34 + 5as/h)
      tensor parallel (TP)       sbh (10 + 24/t + 5as/(ht))
      TP + sequence parallel     sbh (34/t + 5as/(ht))
      TP + selective recompute   sbh (10 + 24/t)
      TP + SP + selective        sbh (34/t)
      full recompute             sbh (2)

  assuming 2-byte activations, 1-byte dropout masks, dropout after the attention softmax and on
  both residual branches, GeLU MLP of 4h, and attention that stores its s x s scores.
* Activations of the whole stage — same paper, Sec. 4.3: 1F1B keeps p microbatches in flight on the
  first stage (stage i: p - i), the interleaved schedule multiplies the first stage's memory by
  (1 + (p - 1)/(p m)); plus sbhp/t of embedding-dropout masks on the first stage and
  4sbh/t (1 + v/h) for the final LayerNorm, output projection and fp32 cross-entropy logits on the
  last stage.
* Model states — Rajbhandari et al. 2020, "ZeRO", Sec. 3.1 and 5: mixed-precision Adam keeps 2 + G +
  K bytes per parameter (bf16 weights, G bytes of gradients, K = 12 bytes of fp32 master weights,
  momentum and variance); stage 1 partitions the K part over the N_d data-parallel ranks, stage 2
  also the gradients, stage 3 also the weights. G = 4: Megatron-LM accumulates and reduces fp32 main
  gradients by default (its theoretical_memory_usage.py: 18 bytes per parameter, 6 + 12/d with the
  distributed optimizer); G = 2 with bf16 gradients. FP8 weights: see model_state_bytes.

Variants the paper does not cover are explicit `ActivationOptions` (each writes its formula out in
`activation_components_bytes`): grouped-query attention (K and V of width kv_heads * head_dim), a
SwiGLU MLP, flash attention (no s x s tensors; an fp32 log-sum-exp per query row instead),
activations wider than 2 bytes, no dropout, and context parallelism by all-gathered K/V (the query
side keeps s/cp tokens, K and V are gathered to all s; Dubey et al. 2024, "The Llama 3 Herd of
Models", Sec. 3.3.2), by ring attention and by Ulysses all-to-all.

Selective recomputation by module (Plan.recompute_modules, Megatron-core's) drops what each module
saves (activation_components_bytes); fine-grained activation offloading (Plan.offload_modules) moves
what each module saves to host memory for all in-flight layers but one (offloaded_bytes_per_layer).

Every formula takes one Plan or a PlanColumns (the search evaluates the same functions over all
its candidates at once).

Pure: stdlib and numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from parallel.core.pipeline_layout import parse_layout
from parallel.core.plan import (
    CP_KINDS,
    MOMENT_BYTES,
    RECOMPUTE_MODULES,
    Plan,
    PlanColumns,
    equals,
    layers_on_stage,
    memoized,
    offloaded_modules,
    recomputed_share,
    recomputes,
)
from parallel.core.specs import Model
from parallel.core.vector import is_array, maximum, minimum, where

AnyPlan = Plan | PlanColumns  # one plan, or a column of plans (the search)

ATTENTION = (
    "attention.qkv_input",
    "attention.qk",
    "attention.scores",
    "attention.dropout_mask",
    "attention.dropout_output",
    "attention.softmax_stats",
    "attention.v",
    "attention.proj_input",
)
MLP = ("mlp.fc1_input", "mlp.act_input", "mlp.fc2_input")
NORM_DROPOUT_RESIDUAL = ("layernorm", "residual.dropout_masks")
COMPONENTS = (*NORM_DROPOUT_RESIDUAL[:1], *ATTENTION, *MLP, NORM_DROPOUT_RESIDUAL[1], "layer_input")

# The paper's three groups, for stacked bars: what SP shards is the "layernorm/dropout/residual" group.
COMPONENT_GROUP = {
    **{c: "attention" for c in ATTENTION},
    **{c: "mlp" for c in MLP},
    "layernorm": "layernorm/dropout/residual",
    "residual.dropout_masks": "layernorm/dropout/residual",
    "layer_input": "layer input (checkpoint)",
}


SWIGLU = ("fused", "unfused")


@dataclass(frozen=True)
class ActivationOptions:
    """What the activations look like besides the plan's own choices (its attention kernel and
    dropout: Plan.attention, Plan.dropout). Defaults are Table 2's assumptions."""

    act_bytes: int | None = None  # bytes per activation element; None = the model's dtype_bytes
    mask_bytes: int = 1  # bytes per dropout-mask element (torch saves bool masks)
    # SwiGLU (llama arch): "fused" saves only its input (Megatron-LM's default bias_swiglu_fusion,
    # silu recomputed in backward); "unfused" is silu(gate) * up in PyTorch, which also saves silu(gate).
    swiglu: str = "fused"

    def __post_init__(self):
        if self.swiglu not in SWIGLU:
            raise ValueError(f"swiglu must be one of {', '.join(SWIGLU)}, got {self.swiglu!r}")

    @classmethod
    def table2(cls) -> "ActivationOptions":
        """The paper's 2-byte activations, whatever the model's dtype (its plans: Plan(attention="unfused",
        dropout=True))."""
        return cls(act_bytes=2)


def has_dropout(model: Model, plan: AnyPlan) -> bool:
    """Whether the plan keeps dropout masks: Plan.dropout, or the model's own (Model.dropout) when unset."""
    return model.dropout if plan.dropout is None else plan.dropout


def _sizes(model: Model, plan: AnyPlan, opts: ActivationOptions) -> tuple[int, Any, Any]:
    act = opts.act_bytes or model.dtype_bytes
    s_q = model.seq_len // plan.cp  # tokens of the query side on this rank
    s_kv = where(plan.cp > 1, model.seq_len, s_q)  # keys each query attends over: all s under CP
    return act, s_q, s_kv


def cp_kind_flags(plan: AnyPlan) -> tuple[Any, Any, Any]:
    """(allgather, ring, ulysses): which context-parallel exchange each plan uses, False at cp 1."""
    cp = plan.cp > 1
    return tuple(cp & equals(plan, "cp_kind", k) for k in CP_KINDS)


def _kv_hidden_per_tp_rank(model: Model, tp: Any) -> Any:
    """Model.kv_hidden_per_tp_rank over arrays: k/t, or one replicated head when tp > kv_heads."""
    return model.kv_hidden / minimum(tp, model.kv_heads)


def activation_components_bytes(
    model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()
) -> dict[str, Any]:
    """Bytes saved for backward by ONE transformer layer for ONE microbatch on ONE GPU, by component.

    Notation: b micro_batch, s_q = s/cp local tokens, s_kv = s if cp > 1 else s_q, h hidden,
    k = kv_heads * head_dim (= h without GQA), f ffn_hidden, a heads, t tp, r = 1/t under SP else 1
    (the tensors plain TP keeps whole on every rank), A act bytes, M mask bytes:

        layernorm                 2 * A b s_q h r          inputs of the two LayerNorms
        attention.qkv_input       A b s_q h r              QKV GEMM input (SP: stored sharded, re-gathered);
                                                            MLA adds its latents: (A + G) b s_q (q_l + kv_l) r
                                                            (each norm's input, each up projection's input
                                                            of G bytes) + A b s_q d_r (the shared RoPE key)
        attention.qk              A b (s_q q + s_k k)/t    Q and K for QK^T (q = heads * head_dim = h,
                                                            but for models that set their head width) (K: k/t is k/min(t, kv_heads),
                                                            one replicated head when tp > kv_heads;
                                                            s_k: the K/V tokens kept, see below)
        attention.scores          A a b s_q s_kv / t       softmax output      (0 with flash attention)
        attention.dropout_mask    M a b s_q s_kv / t       (0 without dropout or with flash attention)
        attention.dropout_output  A a b s_q s_kv / t       input of scores @ V (0 without dropout: it is
                                                            the softmax output, counted once)
        attention.softmax_stats   4 a b s_q / t            fp32 log-sum-exp (flash or ring attention only)
        attention.v               A b s_k k / t            V for scores @ V
        attention.proj_input      A b s_q o / t            out-projection input (o = heads * v head width)

    MLA (model.mla): Q and K are heads (d + d_r) wide, V and the output heads d_v, up-projected on
    every TP rank for its heads (DeepSeek-V2 Sec. 2.1; Megatron-LM's MLASelfAttention saves them for
    the attention kernel as any attention does).
        mlp.fc1_input             A b s_q h r
        mlp.act_input             A b s_q f / t            GeLU input  (SwiGLU: gate and up, g = 2: 2A)
        mlp.fc2_input             A b s_q f / t            GeLU output (SwiGLU fused: the product only;
                                                            unfused: silu(gate) too, 2A)
        residual.dropout_masks    2 * M b s_q h r          (0 without dropout)

    FP8 (plan.fp8 gemm or weights): the four GEMM inputs (qkv_input, proj_input, fc1_input and the
    product in fc2_input) are saved as their 1-byte FP8 casts, which is what Transformer Engine's
    Linear/LayerNormLinear keep for the weight gradient; LayerNorm inputs, Q/K/V, the SwiGLU/GeLU input
    and silu(gate) stay at A bytes; with flash attention the attention output is saved twice (A bytes
    by the attention kernel for its backward, 1 byte by the out-projection), so proj_input = (1 + A).

    Context parallelism (plan.cp > 1), by plan.cp_kind:
      allgather  K and V of all s tokens are gathered (Dubey et al. 2024, Sec. 3.3.2). A flash
                 kernel keeps only the rank's own s_q tokens of them (s_k = s_q) and its output and
                 log-sum-exp, and gathers them again in backward: Transformer Engine's
                 AttnFuncWithCPAndKVAllGather saves the local k and v and re-runs
                 gather_along_first_dim in its backward, as PyTorch's ring flash-attention op does
                 with its all-gather rotater. Materialised attention keeps the gathered K/V
                 (s_k = s) and s_q x s scores;
      ring       each rank keeps its own s_q tokens of Q, K, V (s_k = s_q), the attention output and
                 the fp32 log-sum-exp; blocks of K/V arrive one at a time and the s_q x s_q block
                 scores are recomputed in backward (Liu et al. 2023, Ring Attention: flash-style), so
                 no s x s tensor and no attention-dropout mask is kept, as with flash attention;
      ulysses    after the all-to-all a rank holds all s tokens of a/(t·cp) heads: Q, K, V of
                 s·(q, k)/(t·cp) = s_q·(q, k)/t (s_k = s_q) and scores a/(t·cp) x s x s = the
                 all-gather's s_q x s per t (Jacobs et al. 2023, DeepSpeed-Ulysses).

    Mixture of experts (model.experts > 0): on the MoE share of the layers the MLP terms are those of
    the routed tokens, dropless with balanced routing (no capacity factor). Megatron-LM's token
    dispatcher (megatron/core/transformer/moe/token_dispatcher.py) starts from the rank's sequence
    shard of b s_q / t tokens (MoE with TP runs under SP) and all-gathers routed tokens over the
    expert-TP group only, so a rank holds R = b (s_q / t) top_k etp routed copies: fc1_input adds
    A R h (an expert's TP shards all need the whole hidden) and the router's fp32 probabilities
    (4 b s_q E r); act_input and fc2_input take R rows of expert_ffn / etp plus the shared experts'
    b s_q rows of shared_expert_ffn / t, in place of b s_q rows of f / t.

    With A=2, M=1, dropout, f=4h, k=h, cp=1 the sum is Table 2's TP (sp off) and TP+SP rows.
    SwiGLU, measured with saved_tensors_hooks (bytes per s b f at A = 2): GeLU 4, fused 6, unfused
    PyTorch 8 (this formula; megatron-core's unfused path was measured at 10, see README's sources).
    Selective recompute drops what each of plan.recompute_modules saves (Megatron-core's modules,
    parallel.core.plan.RECOMPUTE_MODULES; the norms as its Transformer Engine layer spec builds them,
    megatron/core/models/gpt/gpt_layer_specs.py):
      core_attn       scores, dropout_mask and dropout_output (Korthikanti et al.'s selective recompute)
      layernorm       the outputs of the norms that are modules of their own, which the next GEMMs
                      saved as their input (transformer_layer.py discards them after the forward,
                      CheckpointWithoutOutput): MLA's input norm (A' b s_q h r of qkv_input, A' the
                      GEMM-input bytes) and a MoE layer's pre-MLP norm (its router's and shared
                      experts' input); a dense GQA/MHA layer's norms are fused into the next linear
                      (TELayerNormColumnParallelLinear) and recompute nothing
      mla_up_proj     MLA's up-projected Q, K and V (attention.qk and attention.v: multi_latent_attention.py
                      discards them once the attention core has run)
      mlp             a dense layer's MLP terms (tensor_parallel.checkpoint keeps only its input, the
                      norm's input, already counted)
      moe             a MoE layer's MLP terms but its input, the pre-MLP norm's output at A bytes
                      (moe_layer.py checkpoints the whole block; 0 with layernorm too)
      shared_experts  the shared experts' act_input and fc2_input rows (their input is the router's)
      moe_act         the routed experts' fc2_input (experts.py: the activation's output discarded,
                      recomputed from fc1's output, which stays)
    Full recompute keeps only the layer's input, A b s_q h r (Table 2 lists 2sbh without SP; with SP
    the checkpointed input is the sequence shard, as in Megatron-LM).

    `plan` may be a PlanColumns: every value is then an array, one per plan, and every component
    is present (0 where it does not apply); for one Plan under full recompute only layer_input is.
    """
    act, s_q, s_kv = _sizes(model, plan, opts)
    gathered, ring, _ = cp_kind_flags(plan)
    # K/V tokens kept: all s only when all-gathered into a materialised attention (a flash kernel
    # re-gathers them in backward)
    kv_tokens = where(gathered & np.logical_not(plan.flash), model.seq_len, s_q)
    b, h, f, a, t = plan.micro_batch, model.hidden, model.ffn_hidden, model.heads, plan.tp
    q = model.q_hidden  # = h unless the model sets its head width (Qwen3) or uses MLA
    k_local = _kv_hidden_per_tp_rank(model, t)  # = k/t unless GQA replicates K/V heads (tp > kv_heads)
    v_local = k_local
    if model.mla:  # K and V up-projected for every head: heads (d + d_r) and heads d_v wide
        k_local, v_local = model.k_hidden / t, model.v_hidden / t
    r = where(plan.sp, 1 / t, 1.0)
    dropout = has_dropout(model, plan)
    mask = opts.mask_bytes if dropout else 0
    full = equals(plan, "recompute", "full")
    layer_input = act * b * s_q * h * r
    if not is_array(full) and full:
        return {"layer_input": layer_input}
    rc = {m: recomputes(plan, m) for m in RECOMPUTE_MODULES}  # what selective recomputation drops
    scores = act * a * b * s_q * s_kv / t
    flash = plan.flash | ring  # ring attention is blockwise: an online softmax, no s x s tensor
    keep_scores = np.logical_not(flash) & np.logical_not(rc["core_attn"])
    gate = 2 if model.gated_mlp else 1
    gemm_in = 1 if plan.fp8 != "none" else act  # bytes of a saved GEMM input
    proj_in = gemm_in + where(flash & (plan.fp8 != "none"), act, 0)
    silu_out = act if model.gated_mlp and opts.swiglu == "unfused" else 0  # saved by the gate product
    # MLA's latents (the query's and the K/V's): each norm's input (A) and the up projection's input
    # (a GEMM input), sequence-sharded under SP, and the RoPE key shared by the heads (whole)
    latents = (act + gemm_in) * b * s_q * (model.q_lora_rank + model.kv_lora_rank) * r
    latents = latents + act * b * s_q * model.qk_pos_head_dim
    # a norm's output saved by the GEMMs after it: dropped under layernorm recompute where the norm is a
    # module of its own (MLA's input norm; the pre-MLP norm of MoE layers only: see the docstring)
    norm_out = gemm_in * b * s_q * h * r
    up = np.logical_not(rc["mla_up_proj"] & model.mla)  # MLA's up-projected Q, K, V kept
    dense_mlp = np.logical_not(rc["mlp"])
    parts = {
        "layernorm": 2 * act * b * s_q * h * r,
        "attention.qkv_input": where(rc["layernorm"] & model.mla, 0.0, norm_out) + latents,
        "attention.qk": where(up, act * b * (s_q * q / t + kv_tokens * k_local), 0.0),
        "attention.scores": where(keep_scores, scores, 0.0),
        "attention.dropout_mask": where(keep_scores, mask * a * b * s_q * s_kv / t, 0.0),
        "attention.dropout_output": where(keep_scores & dropout, scores, 0.0),
        "attention.softmax_stats": where(flash, 4 * a * b * s_q / t, 0.0),
        "attention.v": where(up, act * b * kv_tokens * v_local, 0.0),
        "attention.proj_input": proj_in * b * s_q * model.o_hidden / t,
        "mlp.fc1_input": where(dense_mlp, norm_out, 0.0),
        "mlp.act_input": where(dense_mlp, gate * act * b * s_q * f / t, 0.0),
        "mlp.fc2_input": where(dense_mlp, (gemm_in + silu_out) * b * s_q * f / t, 0.0),
        "residual.dropout_masks": 2 * mask * b * s_q * h * r,
    }
    if model.experts:  # the MoE layers' share of the layers: routed tokens instead of one MLP
        share = model.moe_share
        routed = routed_rows(model, plan)  # R: the routed token copies this rank holds
        # MLP elements per layer: R rows of expert_ffn / etp, and b s_q rows of the shared experts / t
        routed_el = routed * model.expert_width / plan.expert_tp
        shared_el = where(rc["shared_experts"], 0.0, b * s_q * model.shared_expert_ffn / t)
        kept = np.logical_not(rc["moe"])  # the whole MoE block recomputed: only its input stays
        block_input = where(rc["layernorm"], 0.0, act * b * s_q * h * r)
        moe = {
            # the router's and shared experts' input (the norm's output, as a dense MLP's), the
            # routed copies (whole h on every TP shard of an expert), the router's fp32 probabilities
            "mlp.fc1_input": where(
                kept,
                where(rc["layernorm"], 0.0, norm_out) + gemm_in * routed * h + 4 * b * s_q * model.experts * r,
                block_input,
            ),
            "mlp.act_input": where(kept, gate * act * (routed_el + shared_el), 0.0),
            "mlp.fc2_input": where(
                kept, (gemm_in + silu_out) * (where(rc["moe_act"], 0.0, routed_el) + shared_el), 0.0
            ),
        }
        for key, value in moe.items():
            parts[key] = parts[key] * (1 - share) + value * share
    if not is_array(full):
        return parts
    return {**{k: where(full, 0.0, v) for k, v in parts.items()}, "layer_input": where(full, layer_input, 0.0)}


def offloaded_bytes_per_layer(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> dict:
    """Bytes of ONE layer's saved activations for ONE microbatch that fine-grained activation offloading
    moves to host memory, by module of plan.offload_modules (OFFLOAD_MODULES; {} when none). Megatron-
    core offloads what a module's region saves for backward (megatron/core/pipeline_parallel/
    fine_grained_activation_offload.py: saved_tensors_hooks around the module), in the terms of
    activation_components_bytes (after recomputation: what a recomputed module no longer saves is not
    offloaded), the norms as Transformer Engine's layer spec builds them:
      attn_norm   the input norm's input, A b s_q h r, where the norm is a module (MLA); else 0
      qkv_linear  attention.qkv_input (MLA: the down and up projections' inputs and latents), and for
                  GQA / MHA the fused norm's input too (TELayerNormColumnParallelLinear saves it)
      core_attn   Q, K, V, the scores and masks where kept, the softmax statistics
      attn_proj   attention.proj_input
      mlp_norm    the pre-MLP norm's input on the MoE layers (a dense layer's is fused into fc1)
      expert_fc1  the routed copies, A' R h, on the MoE layers (0 when the MoE block is recomputed)
      moe_act     the experts' activation input, g A R f_e / etp, likewise
    Tensors under Megatron-core's min_offloaded_tensor_size (1M elements) are not skipped here."""
    return {m: sum(by_component.values()) for m, by_component in _offloaded_parts(model, plan, opts).items()}


def offloaded_components_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> dict:
    """offloaded_bytes_per_layer by activation_components_bytes' component instead of by module (what
    the per-GPU breakdown takes off each component for every in-flight layer but one)."""
    out: dict[str, Any] = {}
    for by_component in _offloaded_parts(model, plan, opts).values():
        for c, b in by_component.items():
            out[c] = out.get(c, 0.0) + b
    return out


def _offloaded_parts(model: Model, plan: AnyPlan, opts: ActivationOptions) -> dict[str, dict[str, Any]]:
    """{module of plan.offload_modules: {component: bytes it offloads of it}} (offloaded_bytes_per_layer)."""
    modules = offloaded_modules(plan)
    if not modules:
        return {}
    parts = activation_components_bytes(model, plan, opts)
    act, s_q, _ = _sizes(model, plan, opts)
    r = where(plan.sp, 1 / plan.tp, 1.0)
    live = where(equals(plan, "recompute", "full"), 0.0, 1.0)  # full recompute keeps only each layer's input
    norm_in = act * plan.micro_batch * s_q * model.hidden * r * live
    share = model.moe_share
    experts = where(recomputes(plan, "moe"), 0.0, share) * live
    gemm_in = 1 if plan.fp8 != "none" else act
    routed = routed_rows(model, plan)
    gate = 2 if model.gated_mlp else 1
    core = ("qk", "v", "scores", "dropout_mask", "dropout_output", "softmax_stats")
    out = {
        "attn_norm": {"layernorm": norm_in if model.mla else 0.0},
        "qkv_linear": {
            "attention.qkv_input": parts.get("attention.qkv_input", 0.0),
            "layernorm": 0.0 if model.mla else norm_in,
        },
        "core_attn": {f"attention.{k}": parts.get(f"attention.{k}", 0.0) for k in core},
        "attn_proj": {"attention.proj_input": parts.get("attention.proj_input", 0.0)},
        "mlp_norm": {"layernorm": norm_in * share},
        "expert_fc1": {"mlp.fc1_input": experts * gemm_in * routed * model.hidden},
        "moe_act": {"mlp.act_input": experts * gate * act * routed * model.expert_width / plan.expert_tp},
    }
    return {m: out[m] for m in modules}


def routed_rows(model: Model, plan: AnyPlan) -> Any:
    """Routed token copies the busiest rank's experts process per MoE layer and microbatch: the copies
    its b s_q / t sequence shard's tokens send (routed_copies), all-gathered over the expert-TP group
    (etp), times the routing's skew (expert_load)."""
    return routed_copies(model, plan) * plan.expert_tp * expert_load(model, plan)


def expert_load(model: Model, plan: AnyPlan) -> Any:
    """The busiest EP rank's routed copies over the balanced share: Plan.expert_imbalance (1 when
    balanced), at most ep (every copy on one rank) and, under a capacity factor C, at most C (each
    expert keeps ceil(C x its balanced share) and drops the rest: moe_utils.get_capacity); with
    capacity_pad every rank holds exactly its capacity (routed_copies), so 1."""
    skew = plan.expert_imbalance
    if skew is None or not model.experts:
        return 1.0
    load = np.minimum(skew, plan.ep)
    c = plan.capacity_factor
    if c is None:
        return load
    return where(plan.capacity_pad, 1.0, np.minimum(load, max(c, 1.0)))


def routed_copies(model: Model, plan: AnyPlan) -> Any:
    """Routed token copies one rank's own tokens (b s_q / t) send to the experts per MoE layer and
    microbatch, with routing balanced: top_k each, dropless; under a capacity factor C each expert
    keeps at most ceil(C x tokens x top_k / experts) (Megatron-core moe_utils.get_capacity), so
    min(C, 1) x top_k a token, and padded to capacity (--moe-pad-expert-input-to-capacity: the
    alltoall dispatcher's num_out_tokens = capacity x experts) exactly experts x that capacity."""
    tokens = plan.micro_batch * (model.seq_len // plan.cp) / plan.tp
    copies = tokens * model.top_k
    c = plan.capacity_factor
    if c is None or not model.experts:
        return copies
    capacity = np.ceil(copies / model.experts * c)  # get_capacity: ceil(num_tokens / num_experts x C)
    return where(plan.capacity_pad, capacity * model.experts, np.minimum(copies, capacity * model.experts))


def activation_bytes_per_layer(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> Any:
    """One layer, one microbatch, one GPU: the sum of `activation_components_bytes`."""
    if not isinstance(plan, PlanColumns):
        return sum(activation_components_bytes(model, plan, opts).values())

    def per_distinct_row():
        small, inverse = plan.distinct(ACTIVATION_KEYS + (("pp", "vpp") if plan.recompute_layers else ()))
        return np.asarray(sum(activation_components_bytes(model, small, opts).values()), dtype=np.float64)[inverse]

    return memoized(plan, ("activation_bytes_per_layer", model, opts), per_distinct_row)


# the fields a layer's activations depend on (the search evaluates them once per distinct row)
ACTIVATION_KEYS = ("tp", "cp", "micro_batch", "sp", "recompute", "cp_kind", "ep", "etp")
# ... the model states (weights, gradients, optimizer) on a stage; and the stage's activations
STATE_KEYS = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "first_stage_layers", "last_stage_layers")
STAGE_ACTIVATION_KEYS = (*ACTIVATION_KEYS, "pp", "vpp", "dp", "first_stage_layers", "last_stage_layers")


def first_stage_extra_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> Any:
    """Embedding-dropout mask of one microbatch on the first stage (Sec. 4.3: sbhp/t for p in flight)."""
    _, s_q, _ = _sizes(model, plan, opts)
    r = where(plan.sp, 1 / plan.tp, 1.0)
    return (opts.mask_bytes if has_dropout(model, plan) else 0) * plan.micro_batch * s_q * model.hidden * r


def last_stage_extra_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> Any:
    """Final LayerNorm input, output-projection input and fp32 logits of one microbatch on the last
    stage: (A sbh + A sbh) r + 4 sbv/t, which is Sec. 4.3's 4sbh/t (1 + v/h) with A = 2 under SP."""
    act, s_q, _ = _sizes(model, plan, opts)
    r = where(plan.sp, 1 / plan.tp, 1.0)
    b = plan.micro_batch
    return 2 * act * b * s_q * model.hidden * r + 4 * b * s_q * model.padded_vocab(plan.tp) / plan.tp


def inflight_chunks(plan: AnyPlan, stage: Any) -> Any:
    """Microbatch-chunks whose activations stage `stage` holds at its peak.

    GPipe: all m microbatches. 1F1B: p - stage (Narayanan et al. 2021). Interleaved (v > 1):
    Megatron-LM's warm-up count + 1 = 2(p - stage - 1) + (v - 1)p + 1 chunks of L/(pv) layers, which
    for stage 0 is Korthikanti's L(1 + (p - 1)/(pv)) layers; when m = p every forward runs before the
    first backward (Megatron-LM's all-warm-up case), so every stage holds all m·v. Never more than m·v.
    `parallel.engine.pipeline` runs this order and reports its peak (test_interleaved_live_chunks).
    """
    p, v, m = plan.pp, plan.vpp, maximum(plan.microbatches, 1)
    if plan.schedule == "gpipe":
        return m * v
    interleaved = where(m == p, m * v, minimum(2 * (p - stage - 1) + (v - 1) * p + 1, m * v))
    return where(v == 1, minimum(p - stage, m), interleaved)


def inflight_layers(model: Model, plan: AnyPlan, stage: Any) -> Any:
    """Transformer layers whose activations stage `stage` holds at its peak, one per layer and
    microbatch in flight.

    Without a pipeline layout every chunk holds the mean, layers_on_stage / vpp (fractional where the
    stage's layers do not divide by vpp: Megatron-LM's flag path refuses that, validate says so), and
    the peak is inflight_chunks of them. With one (Plan.pp_layout), whose chunks may hold any number
    of layers, the schedule is walked with each chunk's own count (layout_peak_layers)."""
    if not (isinstance(plan, Plan) and plan.pp_layout):
        return layers_on_stage(model.layers, plan, stage) / plan.vpp * inflight_chunks(plan, stage)
    layout = parse_layout(plan.pp_layout, plan.pp)

    def peak(rank: int) -> int:
        return layout_peak_layers(
            layout.chunk_layers(rank), plan.pp, int(inflight_chunks(plan, rank)), plan.microbatches
        )

    return np.array([peak(int(r)) for r in stage], float) if np.ndim(stage) else peak(int(stage))


def layout_peak_layers(chunk_layers: tuple[int, ...], p: int, inflight: int, microbatches: int) -> int:
    """The most layer-microbatches a pipeline rank whose chunks hold `chunk_layers` keeps at once,
    under Megatron-core's interleaved 1F1B (schedules.py, forward_backward_pipelining_with_interleaving):
    `inflight` - 1 warm-up forwards (inflight_chunks), then one forward and one backward a step. The
    k-th forward runs chunk (k // p) mod v and the j-th backward chunk v - 1 - (j // p) mod v
    (get_model_chunk_id), each backward freeing what its forward kept; with every chunk equal this is
    inflight x the chunk. Both indices advance together, so the steady state repeats every p·v steps:
    the walk stops there. DeepSeek-V3's "Et|(tt|)*30mL" at pp 8: rank 0 (chunks of 1, 2, 2, 2) peaks
    at 63 layers over its 39 chunks in flight (the mean, 7/4 a chunk, would say 68.25); rank 7 (2, 2,
    2, 0) at 50, where its 25 chunks in flight hold 48: its steady state opens with forwards and
    backwards of the empty chunk, then a forward of chunk 0 runs before the backward of chunk 2 frees.
    The pipeline bubble (parallel.core.perf) keeps the mean chunk, layers_on_stage / vpp.
    """
    v, total = len(chunk_layers), max(microbatches, 1) * len(chunk_layers)
    warmup = total if inflight >= total else inflight - 1
    held = peak = 0
    for k in range(warmup):
        held += chunk_layers[(k // p) % v]
        peak = max(peak, held)
    for j in range(min(total - warmup, p * v)):
        held += chunk_layers[((warmup + j) // p) % v]
        peak = max(peak, held)
        held -= chunk_layers[v - 1 - (j // p) % v]
    return peak


def embedding_chunks(plan: AnyPlan) -> Any:
    """Microbatches whose embedding-dropout mask the first stage holds at its peak: those in flight
    on its chunk 0 (the only chunk with the embedding). 1F1B and GPipe: inflight_chunks(plan, 0).
    Interleaved: the forward order runs p microbatches per chunk in turn, and backward starts from
    the last chunk, so chunk 0 has run 2p microbatches (bounded by m) before its first backward
    frees one -- not the v·p + p - 1 chunks of all the stage's layers."""
    p, m = plan.pp, maximum(plan.microbatches, 1)
    return where(plan.vpp == 1, inflight_chunks(plan, 0), minimum(2 * p, m))


def _replicated_params_per_layer(model: Model) -> int:
    """Parameters every TP rank keeps whole: norms, GPT's out-projection and fc2 biases, and MLA's
    down projections and latent norms (Model.attention_replicated_params)."""
    h = model.hidden
    norms = 2 * h if model.arch == "llama" else 4 * h + 2 * h
    return norms + model.attention_replicated_params()


def expert_params_per_stage(model: Model, plan: AnyPlan, stage: Any) -> Any:
    """Routed-expert weights held by one GPU of `stage`: its MoE layers' experts / ep, each expert's
    matrices split over the expert tensor parallelism (etp, Megatron-LM's default: tp). 0 when dense."""
    moe = model.moe_share * layers_on_stage(model.layers, plan, stage)
    return moe * model.expert_params_per_layer() / (plan.ep * plan.expert_tp)


def params_per_stage(model: Model, plan: AnyPlan, stage: Any) -> Any:
    """Parameters held by one GPU of pipeline stage `stage` (TP-sharded matrices, replicated norms,
    and a MoE model's routed experts split over ep x etp: expert_params_per_stage)."""
    t, p = plan.tp, plan.pp
    rep = _replicated_params_per_layer(model)
    # GQA with tp > kv_heads: each rank keeps a whole K/V head (its weights and GPT's biases), one
    # 1/kv_heads share of the K/V projections instead of 1/tp (Megatron-LM and vLLM replicate them)
    kv = 2 * model.kv_hidden * (model.hidden + (model.arch == "gpt"))
    kv_extra = kv / minimum(t, model.kv_heads) - kv / t
    dense = (model.params_per_layer() - rep) / t + rep + kv_extra
    share = model.moe_share
    # besides its experts a MoE layer holds attention, norms, shared experts (TP-sharded) and the
    # router (hidden x experts, kept whole on every TP rank, as Megatron-LM's router)
    router = model.hidden * model.experts
    moe = (model.moe_layer_params_besides_experts() - rep - router) / t + rep + router + kv_extra
    layers = layers_on_stage(model.layers, plan, stage)
    n = (dense * (1 - share) + moe * share) * layers + expert_params_per_stage(model, plan, stage)
    pos = model.seq_len * model.hidden if model.arch == "gpt" else 0
    vocab = model.padded_vocab(t)
    n = n + where(stage == 0, vocab * model.hidden / t + pos, 0.0)
    head = model.output_params(t) - (0 if model.tied_embeddings else vocab * model.hidden)
    # untied, or a tied copy on the last stage (Megatron)
    head = head + where((not model.tied_embeddings) | (p > 1), vocab * model.hidden / t, 0.0)
    return n + where(stage == p - 1, head, 0.0)


def max_params_per_stage(model: Model, plan: AnyPlan) -> Any:
    """The most parameters any stage holds: the first, the last or (with uneven stages, where the ends
    hold fewer layers) an interior one -- every interior stage holds the same."""

    def most():
        ends = maximum(params_per_stage(model, plan, 0), params_per_stage(model, plan, plan.pp - 1))
        return maximum(ends, params_per_stage(model, plan, minimum(1, plan.pp - 1)))

    return memoized(plan, ("max_params_per_stage", model), most)


def gemm_params_per_stage(model: Model, plan: AnyPlan, stage: Any) -> Any:
    """Parameters of the transformer layers' GEMM weights (QKV, out-projection, MLP) on one GPU of
    `stage`: what FP8 training casts to 1 byte (the embedding, norms, biases and output layer stay
    bf16, as in Transformer Engine and Megatron-LM). Every stage holds the same layers' share. The
    routed experts' matrices are counted apart (expert_params_per_stage)."""
    replicated = model.attention_replicated_params(matrices_only=True)  # MLA's down projections, whole
    attention = (model.attention_matrix_params() - replicated) / plan.tp + replicated
    share = model.moe_share  # MoE layers: the shared experts' MLP (routed experts: model_state_bytes)
    mlp = (
        model.mlp_matrix_params(model.ffn_hidden) * (1 - share)
        + model.mlp_matrix_params(model.shared_expert_ffn) * share
    )
    return (attention + mlp / plan.tp) * layers_on_stage(model.layers, plan, stage)


def model_state_bytes(model: Model, plan: AnyPlan, stage: Any, *, mixed_precision: bool = True) -> dict[str, Any]:
    """Weights, gradients and optimizer states of one GPU of `stage`, split by ZeRO over dp*cp ranks.

    Bytes per parameter (Rajbhandari et al. 2020, Sec. 3.1 and 5, with Megatron-LM's buffers):
      params     the model's dtype (2 for bf16/fp16). FP8 "gemm": + 1 byte per GEMM weight for its
                 FP8 copy (kept from forward to backward); FP8 "weights": the GEMM weights are 1 byte
      grads      the gradient buffer that is reduced and stepped: 4 bytes with fp32 main grads
                 (Megatron-LM's default, --main-grads-dtype fp32), 2 with bf16 (--grad-reduce-in-bf16)
      optimizer  Adam: fp32 master weights, momentum and variance, K = 12 for 2-byte training
                 (8 for fp32: the weights are their own master copy); Megatron-LM's precision-aware
                 optimizer keeps the moments in Plan.exp_avg_dtype / exp_avg_sq_dtype (bf16 both:
                 K = 4 + 2 + 2 = 8)
    ZeRO (N_d = dp * cp: Megatron-LM's distributed optimizer shards over the data-parallel group
    *with* context parallelism, whose ranks hold the same weights): stage 1 divides the optimizer
    by N_d (the distributed optimizer keeps the whole gradient buffer: 2 + 4 + 12/N_d bytes, as
    Megatron-LM's theoretical_memory_usage.py writes 6 + 12/d), stage 2 also the gradients, stage 3
    also the weights. A MoE model's routed experts shard over the expert-data-parallel ranks instead,
    N_d · tp / (etp · ep) (each expert shard lives on one rank of every etp × ep block).
    `mixed_precision=False`: everything in the model's dtype, no master copy -- gradients of w bytes,
    Adam's two moments 2w (this project's engine, parallel.engine.optim; equal to the above at fp32).
    """
    experts = expert_params_per_stage(model, plan, stage)
    dense = params_per_stage(model, plan, stage) - experts
    # ZeRO groups: data x context, and the expert-data-parallel ranks world / (etp x ep x pp)
    nd, ne = plan.dp * plan.cp, plan.dp * plan.cp * plan.tp / (plan.expert_tp * plan.ep)
    w = model.dtype_bytes
    moments = MOMENT_BYTES[plan.exp_avg_dtype] + MOMENT_BYTES[plan.exp_avg_sq_dtype]
    k = moments + (4 if w == 2 else 0)  # + the fp32 master copy of 2-byte weights
    g = 4 if w == 4 or plan.main_grads == "fp32" else 2
    if not mixed_precision:
        k, g = 2 * w, w
    if plan.fp8 != "none":  # the experts' matrices are GEMMs too
        extra = 1 if plan.fp8 == "gemm" else 1 - w
        gemm = gemm_params_per_stage(model, plan, stage)
        weights = (dense * w + gemm * extra, experts * (w + extra))
    else:
        weights = (dense * w, experts * w)

    def split(d, e, stage_min):
        return d / where(plan.zero >= stage_min, nd, 1) + e / where(plan.zero >= stage_min, ne, 1)

    return {
        "params": split(*weights, 3),
        "grads": split(dense * g, experts * g, 2),
        "optimizer": split(dense * k, experts * k, 1),
    }


def activation_bytes_per_stage(
    model: Model, plan: AnyPlan, stage: Any, opts: ActivationOptions = ActivationOptions()
) -> Any:
    """Peak activation bytes on one GPU of `stage`: its layers in flight (inflight_layers), plus the ends."""
    per_layer = mixed_over_recompute(model, plan, lambda p: activation_bytes_per_layer(model, p, opts))
    offloaded = mixed_over_recompute(model, plan, lambda p: sum(offloaded_bytes_per_layer(model, p, opts).values()))
    # offloaded tensors leave the device but for one layer's (the one being copied out or back in:
    # Megatron-core keeps the last groups before backward on the device and reloads a layer ahead)
    total = (per_layer - offloaded) * inflight_layers(model, plan, stage) + offloaded
    first = first_stage_extra_bytes(model, plan, opts) * embedding_chunks(plan)
    total = total + where(stage == 0, first, 0.0)
    return total + where(stage == plan.pp - 1, last_stage_extra_bytes(model, plan, opts), 0.0)


def mixed_over_recompute(model: Model, plan: AnyPlan, measure: Callable[[AnyPlan], Any]) -> Any:
    """measure(plan) for the mean layer of a stage: under a partial full recompute (recompute_layers) the
    recomputed layers' share of it and the rest's, which recompute nothing and keep everything. `measure`
    returns bytes (a number or an array) or a dict of them by component."""
    value = measure(plan)
    if plan.recompute_layers is None:
        return value
    share = recomputed_share(model.layers, plan)
    kept = measure(_without_recompute(plan))
    if isinstance(value, dict):
        return {c: share * value.get(c, 0.0) + (1 - share) * kept.get(c, 0.0) for c in {**value, **kept}}
    return share * value + (1 - share) * kept


def _without_recompute(plan: AnyPlan) -> AnyPlan:
    """The same plan(s) with nothing recomputed (the kept layers of a partial recompute)."""
    none = np.full(len(plan), "none") if isinstance(plan, PlanColumns) else "none"
    return dataclasses.replace(plan, recompute=none, recompute_layers=None)


def stage_memory_bytes(
    model: Model, plan: AnyPlan, stage: Any, opts: ActivationOptions = ActivationOptions()
) -> dict[str, Any]:
    """params, grads, optimizer, activations and total (bytes) of one GPU of `stage`."""
    row = {**model_state_bytes(model, plan, stage), "activations": activation_bytes_per_stage(model, plan, stage, opts)}
    row["total"] = row["params"] + row["grads"] + row["optimizer"] + row["activations"]
    return row


def memory_per_stage(model: Model, plan: Plan, opts: ActivationOptions = ActivationOptions()) -> list[dict[str, float]]:
    """One dict per pipeline stage: params, grads, optimizer, activations, total (bytes per GPU)."""
    return [{"stage": stage, **stage_memory_bytes(model, plan, stage, opts)} for stage in range(plan.pp)]


def memory_per_gpu_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions = ActivationOptions()) -> dict[str, Any]:
    """The most loaded GPU's params, grads, optimizer, activations and total (bytes). For a
    PlanColumns, per plan: the first, the second or the last stage, whichever holds most (later
    interior stages hold no more layers than the second and fewer microbatches in flight; the second
    matters when uneven stages give the first fewer layers)."""
    keys = ("params", "grads", "optimizer", "activations", "total")
    if not isinstance(plan, PlanColumns):
        worst = max(memory_per_stage(model, plan, opts), key=lambda row: row["total"])
        return {k: worst[k] for k in keys}
    first, last = _rows_of_stage(model, plan, "first", opts), _rows_of_stage(model, plan, "last", opts)
    pick = first["total"] >= last["total"]
    worst = {k: np.where(pick, first[k], last[k]) for k in keys}
    if plan.first_stage_layers is None and not plan.embedding_in_split:
        return worst  # the first stage holds as many layers as any, and the most in flight
    second = _rows_of_stage(model, plan, "second", opts)
    pick = second["total"] > worst["total"]
    return {k: np.where(pick, second[k], worst[k]) for k in keys}


def _rows_of_stage(model: Model, plan: PlanColumns, which: str, opts: ActivationOptions) -> dict[str, Any]:
    """stage_memory_bytes of each row's first, second or last stage, the model states computed once per
    distinct row of STATE_KEYS and the activations once per distinct row of STAGE_ACTIVATION_KEYS."""

    def stage(p):
        return 0 if which == "first" else p.pp - 1 if which == "last" else np.minimum(1, p.pp - 1)

    states, i = plan.distinct(STATE_KEYS)
    acts, j = plan.distinct(STAGE_ACTIVATION_KEYS)
    row = {k: np.broadcast_to(v, (len(states),))[i] for k, v in model_state_bytes(model, states, stage(states)).items()}
    row["activations"] = np.broadcast_to(activation_bytes_per_stage(model, acts, stage(acts), opts), (len(acts),))[j]
    row["total"] = row["params"] + row["grads"] + row["optimizer"] + row["activations"]
    return row
