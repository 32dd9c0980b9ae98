"""Compute time of one microbatch on one GPU, operator by operator, from shapes and the device.

Each transformer layer is the GEMMs, the attention core and the element-wise kernels Megatron-LM /
Transformer Engine run for it, each timed by a roofline on the accelerator (parallel.core.devices):

    GEMM (M x K) @ (K x N), forward and its two backward products (dgrad: M x N @ N x K, wgrad:
        K x M @ M x N): 2MNK FLOPs at peak x gemm_efficiency x q(M, N, K), or its operand bytes at the
        HBM bandwidth if that is slower. q is the shape's own loss, after NVIDIA's "Matrix
        Multiplication Background" guide (docs.nvidia.com/deeplearning/performance/
        dl-performance-matrix-multiplication): tile quantization (a 128 x 256 output tile computes
        whole), wave quantization (tiles run in waves of one per SM: a last, partial wave idles the
        rest), the best of the tile shapes a BLAS library picks from; and a short K, which leaves
        too few multiply-accumulates per loaded tile to hide its loads (K / (K + 96), 1 at K >= 2048,
        where the MAMF shapes sit).
        Per layer, on one TP rank of T = b s/cp tokens: QKV T x h -> (q + 2k)/t (MLA: its down and
        up projections, attention_gemms), projection T x o/t -> h, MLP T x h -> g f/t (g = 2 for SwiGLU's gate and up) and T x f/t -> h; a MoE
        layer's experts run R = (T/t) top_k etp routed rows (parallel.core.memory.routed_rows)
        through E/ep local experts of width f_e/etp, its shared experts T rows of f_s/t, its router
        T/t x h -> E; the output layer T x h -> V/t on the last stage. FP8 GEMMs run at the fp8
        peak and its MAMF; the output layer and the router stay bf16 (Transformer Engine's default).
    attention core (flash / fused, and ring CP's blocks): causal, so half of the 2 b a (d_qk + d_v)
        s_q s_kv forward FLOPs (4 b a d s_q s_kv but for MLA, whose query/key heads are d + d_r wide
        and values d_v) (Megatron-LM's num_floating_point_operations counts the same half), backward
        twice the forward, at peak x attention_efficiency x s/(s + 320) x d/(d + 16) (the forward-plus-
        backward rate of FlashAttention-2/3 rises with the sequence and the head dim: Dao 2023 Fig. 6,
        Shah et al. 2024 Fig. 5-7; normalised at s = 16k, d = 128). Without flash attention the
        scores are materialised: QK^T and scores@V as batched GEMMs of the whole s x s, and the
        softmax, mask and dropout stream the s x s scores through HBM (Korthikanti et al. 2022's
        Table 2 tensors: A bytes each, 1-byte masks).
    element-wise (memory-bound): per layer forward, on T/t tokens under SP (else T: plain TP repeats
        them on every rank), two norms (read + write), two residual adds (+ dropout: read 2, write 1,
        a 1-byte mask), RoPE on Q and K (Llama), the MLP activation (GeLU: read + write f/t; SwiGLU:
        read 2, write 1); a MoE layer's token permutation (read + write R h, each way); FP8's casts of
        each GEMM input (write 1 byte, and its transpose for the weight gradient: A + 2 bytes per
        element) and of each output gradient in backward. Backward moves twice the forward's bytes
        (it reads the saved input and the incoming gradient and writes the outgoing one). All at HBM
        bandwidth x memory_efficiency.
    recomputation: full repeats the layer's forward; selective the forward of each module in
        plan.recompute_modules (selective_recompute_seconds: the attention core and its score
        traffic, the separate norms, MLA's up projections and RoPE, the dense MLP, the MoE block,
        its shared experts, the experts' activation).
    ends of the model: the embedding's gather (first stage), the final norm, the output layer and the
        vocab-parallel cross entropy in fp32 (2A + 16 bytes per logit over forward and backward; last
        stage).
    optimizer (once per step): fused Adam over the rank's optimizer shard reads and writes fp32
        master weights and both moments, reads the gradient and writes the bf16 weight: 34 bytes per
        parameter with the gradient-norm pass.

Every function takes one Plan or a PlanColumns; the search's columns are costed once per distinct
(tp, cp, micro batch, sp, recompute, cp kind, ep) row.

Pure: numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parallel.core.devices import Device
from parallel.core.memory import ActivationOptions, AnyPlan, cp_kind_flags, has_dropout, routed_copies, routed_rows
from parallel.core.plan import RECOMPUTE_MODULES, Plan, PlanColumns, equals, recomputed_share, recomputes
from parallel.core.specs import Model
from parallel.core.vector import minimum, where

# Output tiles a BLAS library chooses among, rows x cols x their relative speed (a smaller tile
# reuses each loaded operand less: cuBLAS/CUTLASS Hopper kernels use 128x256 for large GEMMs).
TILES = ((128, 256, 1.0), (256, 128, 1.0), (128, 128, 0.95), (64, 128, 0.8))
# A GEMM's fixed cost per output tile (its main loop's fill and its epilogue), in multiply-accumulates
# along K: the time is (1 + K_FIXED / K) x the main loop's. Fitted to 368 bf16 and 121 fp8 shapes
# timed on an H200 (bench/gpu_kernels.py: 3.8% / 6.3% mean |log error| with the tiles above).
K_FIXED = {"bf16": 128, "fp8": 512}
ATTN_S_HALF = 900  # flash attention's rate grows as s / (s + 900) (cuDNN and FlashAttention-2 on H200)
ATTN_D_HALF = {"fused": 43, "fa2": 22}  # ... and with the head dim as d / (d + c), normalised at d = 128
# Kernels inside a multi-GPU training job run at this share of the speed the same kernels reach
# alone on one GPU (bench/gpu_kernels.py's isolated measurements): communication kernels co-running
# on the SMs and HBM, the node's shared power and cooling, the framework's glue kernels between the
# ones listed here. One number for every device and framework, set by the published runs
# (bench/published.py --loso: 59 dense and Blackwell runs of nine sources fit 0.81, 6.1% mean |error|;
# each source held out in turn, the others' fit predicts it at 1.1-14.7% mean). `profiler calibrate`
# fits a job's own.
JOB_EFFICIENCY = 0.82
CE_BYTES = 16  # fp32 cross entropy per logit beyond its two A-byte reads/writes (4 fp32 passes)
ADAM_BYTES = (
    34  # per parameter of the optimizer shard: fp32 weight r/w 8, moments r/w 16, grad 4 (+4 norm), bf16 weight 2
)
ATTENTION_KERNELS = ("fused", "fa2")


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a layer's forward: (m x k) @ (k x n), `count` of them, fp8 where the plan is."""

    name: str
    m: Any
    n: Any
    k: Any
    count: Any = 1
    fp8: bool = True  # runs in FP8 when the plan trains in FP8 (False: the router, the output layer)
    repeat: Any = 1  # separate calls of the `count` GEMMs, one after another (experts without grouped GEMM)


def _tiles_quantized(dev: Device, m: Any, n: Any, batch: Any = 1) -> Any:
    """The useful share of the SMs' time over the waves of output tiles (a batched GEMM's `batch`
    products share the waves): the best tile shape's."""
    best = 0.0
    for tm, tn, rate in TILES:
        tiles = np.ceil(m / tm) * np.ceil(n / tn) * batch
        waves = np.ceil(tiles / dev.sms)
        useful = (m * n * batch) / (tiles * tm * tn)  # tile quantization: edge tiles compute whole
        best = np.maximum(best, rate * useful * tiles / (waves * dev.sms))
    return best


def gemm_efficiency(dev: Device, m: Any, n: Any, k: Any, fp8: bool = False, batch: Any = 1) -> Any:
    """The fraction of the device's peak a (m x k) @ (k x n) GEMM (`batch` of them in one batched
    call) reaches (module docstring)."""
    m, n, k = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in (m, n, k))
    fixed = K_FIXED["fp8" if fp8 and dev.fp8_flops else "bf16"]
    return dev.gemm_max(fp8) * _tiles_quantized(dev, m, n, batch) / (1.0 + fixed / k)


def gemm_seconds(dev: Device, m: Any, n: Any, k: Any, fp8: bool = False, batch: Any = 1) -> Any:
    """Seconds of `batch` GEMMs in one call: their FLOPs at their efficiency, or their operands'
    bytes at the HBM rate."""
    flops = 2.0 * m * n * k * batch
    compute = flops / (dev.peak(fp8) * gemm_efficiency(dev, m, n, k, fp8, batch))
    elt = 1 if fp8 and dev.fp8_flops else 2
    traffic = batch * (elt * (m * k + k * n) + 2 * m * n) / (dev.hbm_bytes_per_s * dev.memory_efficiency)
    return np.maximum(compute, traffic)


def gemm_fwd_bwd_seconds(dev: Device, g: Gemm, fp8: bool) -> tuple[Any, Any]:
    """(forward, backward) seconds of `g.count` GEMMs in one batched call each: backward is dgrad
    (m x n @ n x k) and wgrad (k x m @ m x n)."""
    dgrad, wgrad = gemm_bwd_parts_seconds(dev, g, fp8)
    f8, c = fp8 and g.fp8, g.count
    return g.repeat * gemm_seconds(dev, g.m, g.n, g.k, f8, c), dgrad + wgrad


def gemm_bwd_parts_seconds(dev: Device, g: Gemm, fp8: bool) -> tuple[Any, Any]:
    """(dgrad, wgrad) seconds of `g`'s backward: m x n @ n x k and k x m @ m x n, `g.repeat` calls each."""
    f8, c = fp8 and g.fp8, g.count
    return g.repeat * gemm_seconds(dev, g.m, g.k, g.n, f8, c), g.repeat * gemm_seconds(dev, g.k, g.n, g.m, f8, c)


def _tokens(model: Model, plan: AnyPlan) -> Any:
    """T: the tokens of one microbatch on one rank (its sequence shard under CP)."""
    return plan.micro_batch * model.seq_len / plan.cp


def layer_gemms(model: Model, plan: AnyPlan) -> tuple[list[Gemm], list[Gemm]]:
    """The forward GEMMs of one dense layer and of one MoE layer (module docstring's shapes)."""
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    g = 2 if model.gated_mlp else 1
    attention = attention_gemms(model, plan)
    dense = attention + [Gemm("fc1", T, g * model.ffn_hidden / t, h), Gemm("fc2", T, h, model.ffn_hidden / t)]
    if not model.experts:
        return dense, []
    moe = attention + [Gemm("router", T / t, model.experts, h, fp8=False), *expert_gemms(model, plan)]
    if model.shared_expert_ffn:
        fs = model.shared_expert_ffn / t
        moe += [Gemm("shared fc1", T, g * fs, h), Gemm("shared fc2", T, h, fs)]
    return dense, moe


def expert_gemms(model: Model, plan: AnyPlan) -> list[Gemm]:
    """The routed experts' forward GEMMs on one rank: its experts / ep local experts, each on its
    share of the R routed rows (routing balanced: R ep / experts), of width f_e / etp. With
    plan.grouped_gemm one grouped call (TE GroupedLinear, Megatron-core's TEGroupedMLP): the
    experts' output tiles share the SMs' waves; without, one GEMM per expert in turn
    (SequentialMLP), each with its own last wave. Either way each expert's rows fill whole tiles,
    so a few tokens per expert (fine-grained experts, small micro batches, large ep) waste most of
    a 128-row tile (gemm_efficiency's tile quantization)."""
    g = 2 if model.gated_mlp else 1
    local = model.experts / plan.ep
    rows = routed_rows(model, plan) / local  # one expert's rows
    fe = model.expert_width / plan.expert_tp
    count, repeat = where(plan.grouped_gemm, local, 1), where(plan.grouped_gemm, 1, local)
    return [
        Gemm("expert fc1", rows, g * fe, model.hidden, count=count, repeat=repeat),
        Gemm("expert fc2", rows, model.hidden, fe, count=count, repeat=repeat),
    ]


def attention_gemms(model: Model, plan: AnyPlan) -> list[Gemm]:
    """The forward GEMMs of one layer's attention on one TP rank of T tokens.

    GQA/MHA: QKV T x h -> (q + 2k)/t (k/min(t, kv heads): replicated K/V heads), out-projection
    T x o/t -> h. MLA (Megatron-LM's MLASelfAttention with Transformer Engine): the down projections
    are replicated linears on the rank's own tokens (T/t under SP, else T), h -> q_l and
    h -> kv_l + d_r; the up projections split by heads over the gathered T tokens, q_l -> heads
    (d + d_r)/t and kv_l -> heads (d + d_v)/t; without a query latent Q is T x h -> heads (d + d_r)/t."""
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    proj = Gemm("proj", T, h, model.o_hidden / t)
    if not model.mla:
        q, kv = model.q_hidden / t, model.kv_hidden / minimum(t, model.kv_heads)
        return [Gemm("qkv", T, q + 2 * kv, h), proj]
    own = T / where(plan.sp, t, 1)  # the tokens a replicated down projection runs on
    ql, kl, heads = model.q_lora_rank, model.kv_lora_rank, model.heads
    gemms = [Gemm("kv down", own, kl + model.qk_pos_head_dim, h)]
    if ql:
        gemms += [Gemm("q down", own, ql, h), Gemm("q up", T, model.q_hidden / t, ql)]
    else:
        gemms += [Gemm("q", T, model.q_hidden / t, h)]
    return gemms + [Gemm("kv up", T, heads * (model.head_dim + model.v_head_width) / t, kl), proj]


def attention_rate(dev: Device, keys: Any, head_dim: Any, kernel: str = "fused") -> Any:
    """The fraction of the bf16 peak flash attention's forward + backward reaches (model FLOPs: causal
    half, backward twice the forward) at `keys` per query block and `head_dim`: the kernel's
    efficiency x s / (s + 900) x the head dim's d / (d + c) normalised at 128 (module docstring)."""
    top = dev.attention_efficiency if kernel == "fused" else dev.fa2_efficiency
    c = ATTN_D_HALF[kernel]
    return top * keys / (keys + ATTN_S_HALF) * (head_dim / (head_dim + c)) * (128 + c) / 128


def attention_kernel(plan: AnyPlan) -> str:
    """The flash kernel whose rate times the plan's attention (ATTENTION_KERNELS): fa2 for Plan.attention
    "fa2", else the fused one (an unfused plan's ring CP still runs blockwise through it)."""
    return "fa2" if plan.attention == "fa2" else "fused"


def attention_core_seconds_per_layer(
    dev: Device, model: Model, plan: AnyPlan, opts: ActivationOptions
) -> dict[str, Any]:
    """Forward and backward seconds of one layer's attention core for one microbatch on one rank, and
    the bytes its materialised scores stream (0 with flash attention or ring CP)."""
    gathered, ring, ulysses = cp_kind_flags(plan)
    t, b, s = plan.tp, plan.micro_batch, model.seq_len
    d_qk, d_v = model.qk_head_width, model.v_head_width  # MLA: 192 and 128 (DeepSeek-V3)
    d = (d_qk + d_v) / 2  # the head width the kernel's rate is read at (= head_dim but for MLA)
    heads = model.heads / t / where(ulysses, plan.cp, 1)  # Ulysses: all s tokens of fewer heads
    s_q = where(ulysses, s, s / plan.cp)
    s_kv = s  # every rank's queries meet all keys (ring: over cp blocks)
    full = 2.0 * b * heads * (d_qk + d_v) * s_q * s_kv  # QK^T and scores @ V, 2 FLOPs per MAC
    flash = plan.flash | ring
    block = where(ring, s / plan.cp, s_kv)  # one kernel call's keys
    # causal: half the products; forward, then a backward of twice its FLOPs
    fused = 3 * 0.5 * full / (dev.bf16_flops * attention_rate(dev, block, d, attention_kernel(plan)))
    # materialised: two batched GEMMs per head over the whole s x s (no causal skipping)
    count = b * heads
    qk = Gemm("qk", s_q, s_kv, d_qk, count=count, fp8=False)
    pv = Gemm("pv", s_q, d_v, s_kv, count=count, fp8=False)
    qk_f, qk_b = gemm_fwd_bwd_seconds(dev, qk, False)
    pv_f, pv_b = gemm_fwd_bwd_seconds(dev, pv, False)
    act = opts.act_bytes or model.dtype_bytes
    mask = opts.mask_bytes if has_dropout(model, plan) else 0
    scores = b * heads * s_q * s_kv
    # scale-mask-softmax reads and writes the scores; dropout reads them, writes them and a mask
    score_bytes = scores * (2 * act + (2 * act + mask if mask else 0))
    fwd = where(flash, fused / 3, qk_f + pv_f)
    bwd = where(flash, 2 * fused / 3, qk_b + pv_b)
    return {"fwd": fwd, "bwd": bwd, "score_bytes": where(flash, 0.0, score_bytes)}


def elementwise_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions) -> dict[str, Any]:
    """Bytes the element-wise kernels of one dense and one MoE layer move in forward (module docstring)."""
    act = opts.act_bytes or model.dtype_bytes
    mask = opts.mask_bytes if has_dropout(model, plan) else 0
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    th = T / where(plan.sp, t, 1)  # tokens of the h-wide element-wise work on this rank
    q = model.q_hidden / t
    kv = model.kv_hidden / minimum(t, model.kv_heads)
    common = th * h * (2 * 2 * act + 2 * (3 * act + mask))  # two norms, two residual adds (+ dropout)
    if model.mla:  # RoPE on the heads' d_r query part and the one shared d_r key; the latents' norms
        d_r = model.qk_pos_head_dim
        common = common + 2 * act * T * (model.heads * d_r / t + d_r)
        common = common + 2 * act * th * (model.q_lora_rank + model.kv_lora_rank)
    elif model.arch == "llama":
        common = common + 2 * act * T * (q + kv)  # RoPE on Q and K
    act_rw = 3 * act if model.gated_mlp else 2 * act  # SwiGLU reads gate and up, GeLU its input
    dense = common + act_rw * T * model.ffn_hidden / t
    if not model.experts:
        return {"dense": dense, "moe": 0.0}
    return {"dense": dense, "moe": common + moe_elementwise_bytes(model, plan, opts), "common": common}


ROUTER_BYTES = 16  # per token and expert, forward: fp32 logits written, the score read and written, top-k read


def moe_elementwise_bytes(model: Model, plan: AnyPlan, opts: ActivationOptions) -> Any:
    """Forward bytes of a MoE layer's element-wise work besides the norms and residuals (Megatron-core
    moe_utils.py, router.py): the experts' activation on R routed rows of f_e / etp (and the shared
    experts' on T tokens of f_s / t); the router's scores, ROUTER_BYTES per own token (T / t) and
    expert (its fp32 logits, the sigmoid/softmax, top-k: topk_routing_with_score_function); the
    token permutation before the dispatch (each own token read, each of its copies written:
    moe_utils.permute) and its inverse after the combine (copies read, tokens written), and with
    several local experts the received rows sorted by expert again (sort_chunks_by_idxs) both ways."""
    act = opts.act_bytes or model.dtype_bytes
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    act_rw = 3 * act if model.gated_mlp else 2 * act
    rows, own = routed_rows(model, plan), T / t
    mlp = act_rw * (rows * model.expert_width / plan.expert_tp + T * model.shared_expert_ffn / t)
    router = own * model.experts * ROUTER_BYTES
    local = model.experts / plan.ep
    permute = 2 * act * h * (own + routed_copies(model, plan)) + where(local > 1, 2 * 2 * act * h * rows, 0.0)
    return mlp + router + permute


def fp8_cast_bytes(model: Model, plan: AnyPlan, gemms: list[Gemm], opts: ActivationOptions) -> Any:
    """Forward + backward bytes of FP8's casts around `gemms`: each input (m x k) cast to 1 byte and
    transposed (A + 2 bytes an element), each output gradient (m x n) likewise in backward."""
    act = opts.act_bytes or model.dtype_bytes
    total = 0.0
    for g in gemms:
        if g.fp8:
            total = total + g.repeat * g.count * (act + 2) * (g.m * g.k + g.m * g.n)
    return total


@dataclass(frozen=True)
class LayerCost:
    """Seconds of one layer (the model's average of dense and MoE layers) for one microbatch on one
    rank, forward and backward, and of the ends and the optimizer: the parts perf.step_time adds."""

    gemm_fwd: Any
    gemm_bwd: Any
    attn_fwd: Any
    attn_bwd: Any
    ew_fwd: Any
    ew_bwd: Any
    recompute: Any  # the forward work recomputed in backward (full: the layer's; selective: attention's)
    head: Any  # the last stage's final norm, output layer and cross entropy (forward + backward)
    embedding: Any  # the first stage's embedding gather and its gradient
    # one MoE layer's phases as Megatron-core's EP overlap schedules them (moe_phases): what runs
    # before the dispatch (attention, norms, router), the experts forward, their input and weight grads
    moe_pre_fwd: Any = 0.0
    moe_pre_bwd: Any = 0.0
    moe_mlp_fwd: Any = 0.0
    moe_mlp_dgrad: Any = 0.0
    moe_mlp_wgrad: Any = 0.0

    @property
    def layer(self) -> Any:
        return (
            self.gemm_fwd + self.gemm_bwd + self.attn_fwd + self.attn_bwd + self.ew_fwd + self.ew_bwd + self.recompute
        )

    @property
    def fwd(self) -> Any:
        return self.gemm_fwd + self.attn_fwd + self.ew_fwd

    @property
    def bwd(self) -> Any:
        return self.gemm_bwd + self.attn_bwd + self.ew_bwd + self.recompute


# what a layer's cost depends on (pp and vpp too with a partial recompute, whose share they set)
COST_KEYS = ("tp", "cp", "micro_batch", "sp", "recompute", "cp_kind", "ep", "etp")


def layer_cost(
    model: Model,
    plan: AnyPlan,
    dev: Device,
    opts: ActivationOptions = ActivationOptions(),
    job_efficiency: float = JOB_EFFICIENCY,
) -> LayerCost:
    """One layer's and the ends' seconds (LayerCost) in a job: the kernels' isolated times over
    `job_efficiency`; the attention kernel is the plan's (attention_kernel). A PlanColumns is costed
    once per distinct row of COST_KEYS and spread back to its rows."""
    if isinstance(plan, PlanColumns) and len(plan) > 1:
        cost = _distinct(model, plan, dev, opts, COST_KEYS + (("pp", "vpp") if plan.recompute_layers else ()))
    else:
        cost = _layer_cost(model, plan, dev, opts)
    return LayerCost(**{f: getattr(cost, f) / job_efficiency for f in LayerCost.__dataclass_fields__})


def _distinct(
    model: Model, plan: PlanColumns, dev: Device, opts: ActivationOptions, keys: tuple[str, ...]
) -> LayerCost:
    small, inverse = plan.distinct(keys)
    cost = _layer_cost(model, small, dev, opts)
    return LayerCost(
        **{
            f: np.broadcast_to(np.asarray(getattr(cost, f), dtype=np.float64), (len(small),))[inverse]
            for f in LayerCost.__dataclass_fields__
        }
    )


def _layer_cost(model: Model, plan: AnyPlan, dev: Device, opts: ActivationOptions) -> LayerCost:
    fp8 = plan.fp8 != "none"
    dense, moe = layer_gemms(model, plan)
    share = model.moe_share

    def gemms(lst):
        f = b = 0.0
        for g in lst:
            gf, gb = gemm_fwd_bwd_seconds(dev, g, fp8)
            f, b = f + gf, b + gb
        return f, b

    dense_f, dense_b = gemms(dense)
    moe_f, moe_b = gemms(moe) if moe else (0.0, 0.0)
    gemm_f = dense_f * (1 - share) + moe_f * share
    gemm_b = dense_b * (1 - share) + moe_b * share
    attn = attention_core_seconds_per_layer(dev, model, plan, opts)
    ew = elementwise_bytes(model, plan, opts)
    ew_fwd_bytes = ew["dense"] * (1 - share) + ew["moe"] * share + attn["score_bytes"]
    cast = 0.0
    if fp8:
        cast = fp8_cast_bytes(model, plan, dense, opts) * (1 - share)
        if moe:
            cast = cast + fp8_cast_bytes(model, plan, moe, opts) * share
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    ew_fwd = ew_fwd_bytes / bw + cast / 2 / bw
    ew_bwd = 2 * ew_fwd_bytes / bw + cast / 2 / bw
    selective = equals(plan, "recompute", "selective")
    again = sum(selective_recompute_seconds(model, plan, dev, opts, gemms=(dense, moe), attn=attn).values())
    share = recomputed_share(model.layers, plan)  # full: the recomputed layers' share
    recompute = where(selective, again, share * (gemm_f + attn["fwd"] + ew_fwd))
    head, embedding = _ends(model, plan, dev, opts)
    # the phases matter only where the EP overlap schedules them
    phases = moe_phases(model, plan, dev, opts, attn=attn, ew=ew) if moe and np.any(plan.ep_overlap) else {}
    return LayerCost(gemm_f, gemm_b, attn["fwd"], attn["bwd"], ew_fwd, ew_bwd, recompute, head, embedding, **phases)


MLA_UP_GEMMS = ("q up", "q", "kv up")  # attention_gemms' names of MLA's up projections
MOE_BLOCK_GEMMS = ("router", "expert fc1", "expert fc2", "shared fc1", "shared fc2")


def selective_recompute_seconds(
    model: Model, plan: AnyPlan, dev: Device, opts: ActivationOptions, *, gemms: tuple, attn: dict
) -> dict[str, Any]:
    """Isolated seconds of the forward work selective recomputation runs again in backward, for one
    layer (the model's average of dense and MoE layers) and microbatch, by kernel class
    (KERNEL_CLASSES); 0 for a module not in plan.recompute_modules or not in the model. Each is the
    module's own forward as Megatron-core re-runs it (parallel.core.plan.RECOMPUTE_MODULES):
      core_attn       the attention core and the traffic of its materialised scores
      layernorm       the norms that are modules of their own: MLA's input norm on every layer and
                      a MoE layer's pre-MLP norm (read + write A bytes of h on T/t tokens under SP)
      mla_up_proj     MLA's up-projection GEMMs (MLA_UP_GEMMS) and RoPE on the query and shared key
      mlp             a dense layer's fc1 and fc2 and its activation
      moe             a MoE layer's router, routed and shared experts (MOE_BLOCK_GEMMS) and their
                      element-wise work (moe_elementwise_bytes); parallel.core.comm repeats its dispatch
      shared_experts  the shared experts' GEMMs and activation
      moe_act         the routed experts' activation over their R rows
    Modules nested in one another (moe_act or shared_experts inside moe) run once more each, as
    nested checkpoints do. `gemms`: layer_gemms' (dense, moe) lists; `attn`: the attention core's times."""
    dense, moe = gemms
    fp8 = plan.fp8 != "none"
    share = model.moe_share
    act = opts.act_bytes or model.dtype_bytes
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    th = T / where(plan.sp, t, 1)
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    act_rw = 3 * act if model.gated_mlp else 2 * act  # an activation reads its input (SwiGLU: two), writes one

    def forward(lst: list[Gemm], names: tuple[str, ...]) -> Any:
        return sum((gemm_fwd_bwd_seconds(dev, g, fp8)[0] for g in lst if g.name in names), 0.0)

    rc = {m: recomputes(plan, m) for m in RECOMPUTE_MODULES}
    norms = (1.0 if model.mla else 0.0) + share  # separate norm modules per layer (the average)
    rope = 2 * act * T * (model.heads * model.qk_pos_head_dim / t + model.qk_pos_head_dim) if model.mla else 0.0
    shared_act = act_rw * T * model.shared_expert_ffn / t
    experts_act = act_rw * routed_rows(model, plan) * model.expert_width / plan.expert_tp
    parts = {  # module: (gemm, attention, element-wise bytes)
        "core_attn": (0.0, attn["fwd"], attn["score_bytes"]),
        "layernorm": (0.0, 0.0, 2 * act * th * h * norms),
        "mla_up_proj": (forward(dense, MLA_UP_GEMMS), 0.0, rope),
        "mlp": (forward(dense, ("fc1", "fc2")) * (1 - share), 0.0, act_rw * T * model.ffn_hidden / t * (1 - share)),
        "moe": (
            forward(moe, MOE_BLOCK_GEMMS) * share,
            0.0,
            moe_elementwise_bytes(model, plan, opts) * share if moe else 0.0,
        ),
        "shared_experts": (forward(moe, ("shared fc1", "shared fc2")) * share, 0.0, shared_act * share),
        "moe_act": (0.0, 0.0, experts_act * share if moe else 0.0),
    }
    out = {k: 0.0 for k in KERNEL_CLASSES}
    for module, (gemm, attention, ew_bytes) in parts.items():
        for k, v in zip(KERNEL_CLASSES, (gemm, attention, ew_bytes / bw)):
            out[k] = out[k] + where(rc[module], v, 0.0)
    return out


def moe_phases(
    model: Model, plan: AnyPlan, dev: Device, opts: ActivationOptions, *, attn: dict, ew: dict
) -> dict[str, Any]:
    """Isolated seconds of one MoE layer's parts for one microbatch, split where Megatron-core's EP
    overlap splits a layer (model_chunk_schedule_plan.py, TransformerLayerSchedulePlan): the pre-
    dispatch computation (attention GEMMs and core, norms, residuals, router), forward and backward;
    the MLP (routed and shared experts, their activation and the permutations) forward, and its
    backward as input gradients (dgrad) and weight gradients (wgrad)."""
    fp8 = plan.fp8 != "none"
    _, moe = layer_gemms(model, plan)
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    mlp_names = {"expert fc1", "expert fc2", "shared fc1", "shared fc2"}
    out = {"moe_pre_fwd": attn["fwd"] + ew["common"] / bw, "moe_pre_bwd": attn["bwd"] + 2 * ew["common"] / bw}
    mlp_bytes = ew["moe"] - ew["common"]
    out.update(moe_mlp_fwd=mlp_bytes / bw, moe_mlp_dgrad=2 * mlp_bytes / bw, moe_mlp_wgrad=0.0)
    for g in moe:
        fwd, _ = gemm_fwd_bwd_seconds(dev, g, fp8)
        dgrad, wgrad = gemm_bwd_parts_seconds(dev, g, fp8)
        if g.name in mlp_names:
            out["moe_mlp_fwd"] = out["moe_mlp_fwd"] + fwd
            out["moe_mlp_dgrad"] = out["moe_mlp_dgrad"] + dgrad
            out["moe_mlp_wgrad"] = out["moe_mlp_wgrad"] + wgrad
        else:
            out["moe_pre_fwd"] = out["moe_pre_fwd"] + fwd
            out["moe_pre_bwd"] = out["moe_pre_bwd"] + dgrad + wgrad
    return out


def _ends(model: Model, plan: AnyPlan, dev: Device, opts: ActivationOptions) -> tuple[Any, Any]:
    """Seconds of the output layer with its norm and loss (last stage), and of the embedding (first
    stage), forward and backward, for one microbatch."""
    gemm, elementwise, embedding = _end_parts(model, plan, dev, opts)
    return gemm + elementwise, embedding


def _end_parts(model: Model, plan: AnyPlan, dev: Device, opts: ActivationOptions) -> tuple[Any, Any, Any]:
    """The output layer's GEMM and its norm and loss's memory traffic, and the embedding's, in seconds."""
    act = opts.act_bytes or model.dtype_bytes
    t, h, T = plan.tp, model.hidden, _tokens(model, plan)
    vocab = model.padded_vocab(t) / t
    f, b = gemm_fwd_bwd_seconds(dev, Gemm("output", T, vocab, h, fp8=False), False)
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    th = T / where(plan.sp, t, 1)
    norm = 3 * 2 * act * th * h  # forward read + write, backward twice that
    ce = T * vocab * (2 * act + CE_BYTES)
    embedding = T * h * (3 * act + 8) / bw  # gather rows, write them; backward scatter-adds into fp32
    return f + b, (norm + ce) / bw, embedding


KERNEL_CLASSES = ("gemm", "attention", "elementwise")


def kernel_class_seconds(model: Model, plan: Plan, dev: Device, opts: ActivationOptions) -> dict[str, dict[str, float]]:
    """Isolated kernel seconds for one microbatch by the class a trace's kernel names fall in
    (KERNEL_CLASSES): a layer's ("layer": forward, backward and its recomputed forward), the output
    layer's ("head") and the embedding's ("embedding"). Full recomputation repeats the forward's mix;
    selective recomputes its modules' forward (selective_recompute_seconds)."""
    c = _layer_cost(model, plan, dev, opts)
    fwd = {"gemm": c.gemm_fwd, "attention": c.attn_fwd, "elementwise": c.ew_fwd}
    layer = {
        "gemm": c.gemm_fwd + c.gemm_bwd,
        "attention": c.attn_fwd + c.attn_bwd,
        "elementwise": c.ew_fwd + c.ew_bwd,
    }
    if equals(plan, "recompute", "selective"):
        attn = attention_core_seconds_per_layer(dev, model, plan, opts)
        again = selective_recompute_seconds(model, plan, dev, opts, gemms=layer_gemms(model, plan), attn=attn)
        for k in KERNEL_CLASSES:
            layer[k] += again[k]
    elif c.recompute:
        total = sum(fwd.values())
        for k in KERNEL_CLASSES:
            layer[k] += c.recompute * fwd[k] / total
    gemm, elementwise, embedding = _end_parts(model, plan, dev, opts)
    return {
        "layer": {k: float(v) for k, v in layer.items()},
        "head": {"gemm": float(gemm), "attention": 0.0, "elementwise": float(elementwise)},
        "embedding": {"gemm": 0.0, "attention": 0.0, "elementwise": float(embedding)},
    }


def optimizer_seconds(dev: Device, shard_params: Any, job_efficiency: float = JOB_EFFICIENCY) -> Any:
    """The optimizer step over `shard_params` parameters (fused Adam, ADAM_BYTES each), in a job."""
    return shard_params * ADAM_BYTES / (dev.hbm_bytes_per_s * dev.memory_efficiency * job_efficiency)
