"""Step time: model FLOPs as users' logs count them, compute from shapes per device, the pipeline's
stages and bubble, and communication exposed or hidden as the frameworks overlap it.

FLOPs -- Megatron-LM's `num_floating_point_operations` (megatron/training/training.py): per token,
3 passes (forward, dgrad, wgrad) x 2 FLOPs per multiply-add over every GEMM weight a token passes --
QKV h(q + 2k), projection qh, the MLP (2hf, SwiGLU 3hf; a MoE layer its top_k routed experts and its
shared ones; no router), the logits h V (the padded vocabulary) -- plus the attention core's
QK^T and scores @ V, 6 q s per token and layer, halved for the causal mask (the "/ 2" Megatron-LM
added in 2025; Narayanan et al. 2021 Eq. 3 and older logs count the whole s x s: `causal=False`).
`model_flops` is that (MFU's numerator); `hardware_flops` adds what recomputation runs again (full:
a layer's forward, selective: its modules', selective_recompute_flops_per_token).

Time -- one microbatch on one GPU of each pipeline stage (parallel.core.plan.stage_layer_counts: the
first, the middle ones, the last), its layers' compute (parallel.core.compute: GEMMs, attention and
element-wise kernels from shapes on the cluster's device; the embedding on the first stage, the
output layer and loss on the last) plus the communication on its critical path:

    TP / SP     the layer's collectives; with plan.tp_overlap (Megatron-LM --tp-comm-overlap,
                torchtitan's async TP: both on SP's collectives, inside a node's NVLink domain) they
                run in chunks under the GEMMs they feed, and only what the GEMMs cannot cover, or at
                least the ring's one unhidden reduce-scatter chunk (1/(2 tp) of the traffic), is exposed.
    CP          all-gather and Ulysses exposed; ring attention's K/V blocks beyond what the attention
                core's compute hides (Liu et al. 2023, Sec. 3).
    EP          the MoE dispatch and combine, exposed; with plan.ep_overlap (Megatron-core's batch-
                level overlap) each under the window of another microbatch's computation that the
                schedule pairs it with (ep_exposed_seconds).
    PP          a microbatch's sends and receives, exposed unless plan.p2p_overlap under the
                interleaved schedule (vpp > 1): Megatron-LM overlaps P2P only there and turns the
                flag off without it (megatron/training/arguments.py).
    offload     plan.offload_modules' bytes (parallel.core.memory.offloaded_bytes_per_layer) copied to
                host memory in forward and back in backward over the device's host link, each way on
                its own stream (offload_exposed_seconds): only what one layer's compute cannot hide.

The pipeline (1F1B, GPipe, interleaved; Narayanan et al. 2021 Sec. 2.2) runs m microbatches at the
pace of its slowest stage, and its fill and drain pass once through every other stage: m t_max +
(sum_s t_s - t_max)/v -- with equal stages the familiar (m + (p-1)/v) t; the bubble multiplies only
what is on that critical path, not hidden traffic. Then once per step:

    DP          the gradients' reduction and ZeRO's weight gathers. With plan.grad_reduce_overlap
                (Megatron --overlap-grad-reduce, DDP, FSDP2) the reduction runs bucket by bucket
                under the last microbatch's backward (ZeRO 2/3: every microbatch's), exposing what the
                backward cannot cover and at least its last bucket; with plan.param_gather_overlap
                (--overlap-param-gather, FSDP2's prefetch) the gathers run under the forward the same
                way (ZeRO 3: forward and backward of every microbatch). PerfOptions.dp_overlap, when
                given, hides that fraction instead.
    optimizer   fused Adam over the rank's optimizer shard (memory-bound).

PerfOptions.mfu, when given (and always on a CPU cluster, at 0.5), replaces the per-operator model
by every hardware FLOP at that fraction of the bf16 peak -- the explicit flat-efficiency assumption.

Every function takes one Plan or a PlanColumns (the search).

Pure: stdlib and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parallel.core.comm import (
    DIMS,
    CommOptions,
    comm_terms,
    crosses_nodes,
    dispatcher_flags,
    ranks_per_node,
    term_seconds,
)
from parallel.core.compute import JOB_EFFICIENCY, LayerCost, layer_cost, optimizer_seconds
from parallel.core.devices import Device, cluster_device
from parallel.core.memory import ActivationOptions, AnyPlan, max_params_per_stage, offloaded_bytes_per_layer
from parallel.core.plan import PlanColumns, equals, offloaded_modules, recomputed_share, recomputes, stage_layer_counts
from parallel.core.specs import Cluster, Model
from parallel.core.vector import maximum, minimum, where

CPU_MFU = 0.5  # the flat efficiency of a CPU cluster, whose own model is the calibrated one


@dataclass(frozen=True)
class PerfOptions:
    # an explicit flat efficiency: every hardware FLOP at this fraction of the bf16 peak; None = the
    # per-operator model of parallel.core.compute (a CPU cluster: CPU_MFU)
    mfu: float | None = None
    # an explicit fraction of DP communication hidden behind backward; None = from the plan's
    # grad_reduce_overlap / param_gather_overlap
    dp_overlap: float | None = None
    # the share of their isolated speed kernels keep inside a job (parallel.core.compute)
    job_efficiency: float = JOB_EFFICIENCY
    # the GPU to time operators on; None = the cluster's (devices.cluster_device). `profiler calibrate
    # --kernels` fits one to a job's own kernel times (profiler.analyzers.device_fit)
    device: Device | None = None

    def __post_init__(self):
        if not 0 < self.job_efficiency <= 1:
            raise ValueError(f"job efficiency must be in (0, 1], got {self.job_efficiency}")


def device_of(cluster: Cluster, perf: PerfOptions) -> Device:
    """The GPU operators are timed on: the options' fitted one, else the cluster's."""
    return perf.device or cluster_device(cluster)


def layer_forward_flops(model: Model, tokens_per_seq: int, batch: int) -> dict[str, float]:
    """Forward FLOPs of one (average) layer for `batch` sequences: GEMMs and the attention core's full
    s x s (2 FLOPs per MAC; Narayanan et al. 2021, Sec. 5.1: 24Bsh^2 + 4Bs^2h for GPT). A MoE
    model's MLP counts the weights a token passes through (the active parameters), and the router."""
    h, f, s = model.hidden, model.ffn_hidden, tokens_per_seq
    mlp = model.mlp_matrix_params(f)  # 8h^2 for GPT
    if model.experts:  # a token passes top_k routed experts and the shared ones, on the MoE layers
        share = model.moe_share
        routed = model.top_k * model.mlp_matrix_params(model.expert_width) + model.mlp_matrix_params(
            model.shared_expert_ffn
        )
        mlp = mlp * (1 - share) + (routed + h * model.experts) * share  # + the router
    gemm_weights = model.attention_matrix_params() + mlp  # 12h^2 for GPT
    return {"gemm": 2 * batch * s * gemm_weights, "attention": 4 * batch * s * s * model.attention_core_width}


def token_weights(model: Model) -> float:
    """GEMM weights one token passes through per layer on average, as Megatron-LM's FLOPs count them
    (no router): attention's projections (MLA's down and up projections: Model.attention_matrix_params)
    and the MLP (a MoE layer's top_k routed and shared experts)."""
    attention = model.attention_matrix_params()
    dense = model.mlp_matrix_params(model.ffn_hidden)
    moe = model.top_k * model.mlp_matrix_params(model.expert_width) + model.mlp_matrix_params(model.shared_expert_ffn)
    share = model.moe_share
    return attention + dense * (1 - share) + moe * share


def flops_per_step(model: Model, plan: AnyPlan, *, causal: bool = True) -> dict[str, Any]:
    """Model FLOPs (Megatron-LM's count: MFU's numerator) and hardware FLOPs (with recomputation) of
    one step over all GPUs, and the attention core's share of the hardware FLOPs. `causal=False`:
    the whole s x s attention (Narayanan et al. 2021 Eq. 3, Megatron-LM before 2025)."""
    B, s, L = plan.global_batch, model.seq_len, model.layers
    tokens = B * s
    core = (1.0 if causal else 2.0) * 2 * s * model.attention_core_width  # per token and layer, forward
    layer_fwd = 2 * token_weights(model) + core
    logits = 2 * model.hidden * model.padded_vocab(plan.tp)
    model_flops = 3 * tokens * (L * layer_fwd + logits)
    extra = where(
        equals(plan, "recompute", "selective"),
        tokens * L * selective_recompute_flops_per_token(model, plan, core),
        tokens * L * layer_fwd * recomputed_share(L, plan),
    )
    # forward, backward (2x), a recomputed forward (selective: where it recomputes the attention core)
    again = where(equals(plan, "recompute", "selective"), where(recomputes(plan, "core_attn"), 1.0, 0.0), 1.0)
    passes = 3.0 + where(equals(plan, "recompute", "none"), 0.0, again)
    return {
        "model_flops": model_flops,
        "hardware_flops": model_flops + extra,
        "attention_flops": tokens * L * core * passes,
    }


def selective_recompute_flops_per_token(model: Model, plan: AnyPlan, core: Any) -> Any:
    """Forward FLOPs per token and layer (the average of dense and MoE layers) that selective
    recomputation runs again, counted as flops_per_step counts them (2 per multiply-add of each GEMM
    weight a token passes; `core`: the attention core's per token): core_attn the core; mla_up_proj
    MLA's up projections, (q_l or h) x heads (d + d_r) + kv_l x heads (d + d_v); mlp a dense layer's
    MLP; moe a MoE layer's top_k routed and shared experts; shared_experts the shared ones. The norms
    and activations (layernorm, moe_act) are element-wise: no GEMM FLOPs (parallel.core.compute
    times them)."""
    share = model.moe_share
    up = 0
    if model.mla:
        up = (model.q_lora_rank or model.hidden) * model.q_hidden
        up += model.kv_lora_rank * model.heads * (model.head_dim + model.v_head_width)
    shared = model.mlp_matrix_params(model.shared_expert_ffn)
    terms = {
        "core_attn": core,
        "mla_up_proj": 2 * up,
        "mlp": 2 * model.mlp_matrix_params(model.ffn_hidden) * (1 - share),
        "moe": 2 * (model.top_k * model.mlp_matrix_params(model.expert_width) + shared) * share,
        "shared_experts": 2 * shared * share,
    }
    return sum(where(recomputes(plan, m), v, 0.0) for m, v in terms.items())


def offload_exposed_seconds(
    model: Model, plan: AnyPlan, cluster: Cluster, perf: PerfOptions, acts: ActivationOptions, cost: LayerCost
) -> Any:
    """Seconds per layer and microbatch that fine-grained activation offloading adds: each layer's
    offloaded bytes cross the host link (Device.host_link, per direction) once in forward (device to
    host) and once in backward (host to device). Assumption: Megatron-core's manager starts a layer's
    copy when its module's forward ends and reloads a layer ahead in backward, on streams of their
    own, so each copy runs under one layer's compute -- the next layer's forward, the previous one's
    backward -- and only the rest is exposed; the GPUs of a node do not contend for host bandwidth.
    0 on a flat (MFU or CPU) cost model."""
    if not offloaded_modules(plan) or perf.mfu is not None or cluster.device == "cpu":
        return 0.0
    copy = sum(offloaded_bytes_per_layer(model, plan, acts).values()) / device_of(cluster, perf).host_link
    return maximum(copy - cost.fwd, 0.0) + maximum(copy - cost.bwd, 0.0)


def bubble_fraction(plan: AnyPlan) -> Any:
    """(p - 1)/(v m): idle time of the pipeline relative to its ideal time (equal stages). With a
    pipeline layout (Plan.pp_layout) whose virtual stages differ, v is still its vpp: the bubble is
    priced with the mean virtual stage (the step's pipeline time: a rank's layers / vpp a chunk), not
    the largest; activation memory counts each chunk (parallel.core.memory.inflight_layers)."""
    return where(plan.pp == 1, 0.0, (plan.pp - 1) / (plan.vpp * maximum(plan.microbatches, 1)))


def flat_cost(model: Model, plan: AnyPlan, cluster: Cluster, mfu: float) -> LayerCost:
    """LayerCost with every hardware FLOP (flops_per_step's count) at `mfu` of the bf16 peak."""
    rate = cluster.peak_flops * mfu
    tokens = plan.micro_batch * model.seq_len / plan.cp  # a rank's queries meet all s keys
    gemm_f = 2 * tokens * token_weights(model) / plan.tp / rate
    attn_f = tokens * 2 * model.seq_len * model.attention_core_width / plan.tp / rate  # causal: half of 4 s q
    head = 3 * 2 * tokens * model.hidden * model.padded_vocab(plan.tp) / plan.tp / rate
    share = recomputed_share(model.layers, plan)
    core = 2 * model.seq_len * model.attention_core_width  # per token, causal (flops_per_step's)
    selective = tokens * selective_recompute_flops_per_token(model, plan, core) / plan.tp / rate
    recompute = where(equals(plan, "recompute", "selective"), selective, share * (gemm_f + attn_f))
    return LayerCost(gemm_f, 2 * gemm_f, attn_f, 2 * attn_f, 0.0, 0.0, recompute, head, 0.0)


def stage_cost(model: Model, plan: AnyPlan, cluster: Cluster, perf: PerfOptions, acts: ActivationOptions) -> LayerCost:
    """One layer's and the ends' seconds per microbatch: the per-operator model, or the flat one."""
    if perf.mfu is not None or cluster.device == "cpu":
        return flat_cost(model, plan, cluster, perf.mfu or CPU_MFU)
    return layer_cost(model, plan, device_of(cluster, perf), acts, perf.job_efficiency)


def attention_seconds_per_step(
    model: Model,
    plan: AnyPlan,
    cluster: Cluster,
    perf: PerfOptions = PerfOptions(),
    acts: ActivationOptions | None = None,
) -> Any:
    """Seconds of the attention core (forward, backward) on one GPU of the last stage per step: what
    ring attention's K/V transfers run beside (comm.CommTerm.hidden_by)."""
    cost = stage_cost(model, plan, cluster, perf, acts or ActivationOptions())
    layers = stage_layer_counts(model.layers, plan)[2]
    return maximum(plan.microbatches, 1) * layers * (cost.attn_fwd + cost.attn_bwd)


def _comm_units(terms: list, plan: AnyPlan, cluster: Cluster) -> dict[tuple[str, str, str], Any]:
    """Seconds per scope unit (comm.CommTerm.unit_calls) of `terms` by (dim, scope, how): how is
    "exposed", "overlapped" (the plan model's always-hidden rows) or "hidden_by:<computation>"."""
    out: dict[tuple[str, str, str], Any] = {}
    links: dict[tuple[str, ...], Any] = {}
    for t in terms:
        if t.group not in links:
            links[t.group] = (crosses_nodes(plan, cluster, t.group), ranks_per_node(plan, cluster, t.group))
        how = "overlapped" if t.overlapped else f"hidden_by:{t.hidden_by}" if t.hidden_by else "exposed"
        key = (t.dim, t.scope, how)
        inter, per_node = links[t.group]
        out[key] = out.get(key, 0.0) + term_seconds(t, cluster, inter, t.unit_calls, per_node)
    return out


def _unit(units: dict, dims: tuple[str, ...], scope: str, how: str = "exposed") -> Any:
    return sum((units.get((d, scope, how), 0.0) for d in dims), 0.0)


def step_time(
    model: Model,
    plan: AnyPlan,
    cluster: Cluster,
    perf: PerfOptions = PerfOptions(),
    comm: CommOptions = CommOptions(),
    acts: ActivationOptions | None = None,
) -> dict[str, Any]:
    """Seconds per step and its parts (module docstring): compute, bubble, exposed and hidden
    communication per dimension, the optimizer; achieved MFU. `plan` may be a PlanColumns (every
    value is then an array: what ZeRO does not change is computed once per distinct row)."""
    acts = acts or ActivationOptions()
    flops = flops_per_step(model, plan)
    m, p = maximum(plan.microbatches, 1), plan.pp
    if isinstance(plan, PlanColumns) and len(plan) > 1:
        small, inverse = plan.distinct(PIPELINE_KEYS)
        core = _pipeline(model, small, cluster, perf, comm, acts)
        core = {k: _spread(v, inverse, len(small)) for k, v in core.items()}
    else:
        core = _pipeline(model, plan, cluster, perf, comm, acts)
    # once per step: DP (overlapped as the plan says), the other dims' partial sums, the optimizer
    if isinstance(plan, PlanColumns) and len(plan) > 1:
        small, inverse = plan.distinct(DP_KEYS)
        parts = {k: _spread(v, inverse, len(small)) for k, v in _dp_seconds(model, small, cluster, comm).items()}
    else:
        parts = _dp_seconds(model, plan, cluster, comm)
    dp, dp_hidden = _dp_exposed(parts, plan, perf, fwd=core["fwd_mb"], bwd=core["bwd_mb"], m=m)
    flat = perf.mfu is not None or cluster.device == "cpu"
    optimizer = 0.0 if flat else _optimizer_s(model, plan, cluster, perf)
    exposed = {d: core[f"exposed_{d}"] for d in DIMS}
    exposed["dp"] = exposed["dp"] + dp
    hidden = {d: core[f"hidden_{d}"] for d in DIMS if d != "dp"}
    hidden["dp"] = dp_hidden
    step = core["pipe"] + core["step_comm"] + dp + optimizer
    out = {
        "step_time_s": step,
        "compute_s": core["compute"],
        "bubble_s": core["bubble"],
        **{f"exposed_{d}_s": exposed[d] for d in DIMS},
        **{f"hidden_{d}_s": hidden[d] for d in DIMS},
        "optimizer_s": optimizer,
        "offload_exposed_s": core["offload"],
        "model_flops": flops["model_flops"],
        "hardware_flops": flops["hardware_flops"],
        "mfu": flops["model_flops"] / (step * plan.world_size * cluster.peak_flops),
    }
    if not isinstance(plan, PlanColumns):
        first_n, middle_n, last_n = stage_layer_counts(model.layers, plan)
        out["compute_parts_s"] = core["compute_parts"]
        out["stage_layers"] = [first_n, middle_n, last_n] if p > 2 else [first_n, last_n] if p == 2 else [first_n]
        out["compute_model"] = "flat" if flat else device_of(cluster, perf).name
    return out


# what the pipeline's time depends on: every plan field the search varies but the ZeRO stage
PIPELINE_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "sp",
    "micro_batch",
    "vpp",
    "recompute",
    "cp_kind",
    "ep",
    "etp",
    "moe_dispatcher",
    "first_stage_layers",
    "last_stage_layers",
)


def _spread(value: Any, inverse: np.ndarray, n: int) -> Any:
    if isinstance(value, dict):
        return {k: _spread(v, inverse, n) for k, v in value.items()}
    return np.broadcast_to(np.asarray(value), (n,))[inverse]


def _pipeline(
    model: Model, plan: AnyPlan, cluster: Cluster, perf: PerfOptions, comm: CommOptions, acts: ActivationOptions
) -> dict[str, Any]:
    """Everything of the step but DP and the optimizer: the stages' compute and exposed per-microbatch
    communication, the pipeline over them, the once-per-step partial sums of the other dims, and the
    slowest stage's forward and backward of a microbatch (what DP overlap hides behind)."""
    m, p = maximum(plan.microbatches, 1), plan.pp
    cost = stage_cost(model, plan, cluster, perf, acts)
    units = _comm_units(comm_terms(model, plan, comm, dp=False), plan, cluster)
    per_layer = _layer_comm(
        plan, cost, units, crosses_nodes(plan, cluster, ("tp",)), model.moe_share, device_of(cluster, perf)
    )
    # Megatron-LM overlaps P2P only under the interleaved schedule (arguments.py turns it off at vpp 1)
    p2p_hidden = plan.p2p_overlap & (plan.vpp > 1)
    pp_mb = where(p2p_hidden | (p == 1), 0.0, _unit(units, ("pp",), "microbatch"))
    first_n, middle_n, last_n = stage_layer_counts(model.layers, plan)
    # one microbatch on a stage: its layers' compute, exposed comm and offload copies, and the ends it holds
    offload = offload_exposed_seconds(model, plan, cluster, perf, acts, cost)
    layer_t = cost.layer + sum(per_layer["exposed"].values()) + offload
    ends = {scope: sum(_unit(units, (d,), scope) for d in ("tp", "sp")) for scope in ("first", "last")}
    first_t, last_t = cost.embedding + ends["first"], cost.head + ends["last"]
    kinds = [(first_n, True, False), (middle_n, False, False), (last_n, False, True), (first_n, True, True)]
    counts = [where(p == 1, 0, 1), maximum(p - 2, 0), where(p == 1, 0, 1), where(p == 1, 1, 0)]
    if not isinstance(plan, PlanColumns) and p == 1:
        kinds, counts = kinds[3:], [1]
    elif not isinstance(plan, PlanColumns):
        kinds, counts = kinds[:3], counts[:3]
    times = [n * layer_t + (first_t if f else 0.0) + (last_t if la else 0.0) + pp_mb for n, f, la in kinds]
    t_max, crit = _slowest(times, counts, kinds)
    total = sum(c * t for t, c in zip(times, counts))
    pipe = m * t_max + (total - t_max) / plan.vpp
    compute = (
        crit["layers"] * cost.layer + where(crit["first"], cost.embedding, 0.0) + where(crit["last"], cost.head, 0.0)
    )
    exposed = {d: crit["layers"] * per_layer["exposed"][d] for d in DIMS}
    for d in ("tp", "sp"):
        exposed[d] = (
            exposed[d]
            + where(crit["first"], _unit(units, (d,), "first"), 0.0)
            + where(crit["last"], _unit(units, (d,), "last"), 0.0)
        )
    exposed["pp"] = exposed["pp"] + pp_mb
    step_comm = {d: _unit(units, (d,), "step") for d in DIMS if d != "dp"}
    hidden = {d: m * crit["layers"] * per_layer["hidden"][d] for d in DIMS}
    hidden["pp"] = where(p2p_hidden & (p > 1), m * _unit(units, ("pp",), "microbatch"), 0.0)
    out = {
        "pipe": pipe,
        "compute": m * compute,
        "bubble": pipe - m * t_max,
        "step_comm": sum(step_comm.values()),
        "offload": m * crit["layers"] * offload,
        "fwd_mb": crit["layers"] * cost.fwd,
        "bwd_mb": crit["layers"] * cost.bwd,
        **{f"exposed_{d}": m * exposed[d] + step_comm.get(d, 0.0) for d in DIMS},
        **{f"hidden_{d}": hidden[d] for d in DIMS if d != "dp"},
    }
    if not isinstance(plan, PlanColumns):
        out["compute_parts"] = {k: m * v for k, v in _compute_parts(cost, crit).items()}
    return out


def layer_tp_seconds(
    model: Model,
    plan: AnyPlan,
    cluster: Cluster,
    perf: PerfOptions = PerfOptions(),
    comm: CommOptions = CommOptions(),
    acts: ActivationOptions | None = None,
) -> tuple[float, float]:
    """One layer's TP + SP communication for one microbatch: (exposed, hidden) seconds, as the step
    model counts them (with plan.tp_overlap, under the GEMMs they feed)."""
    cost = stage_cost(model, plan, cluster, perf, acts or ActivationOptions())
    units = _comm_units(comm_terms(model, plan, comm, dp=False), plan, cluster)
    layer = _layer_comm(
        plan, cost, units, crosses_nodes(plan, cluster, ("tp",)), model.moe_share, device_of(cluster, perf)
    )
    exposed = layer["exposed"]["tp"] + layer["exposed"]["sp"]
    return float(exposed), float(layer["hidden"]["tp"] + layer["hidden"]["sp"])


def _layer_comm(
    plan: AnyPlan, cost: LayerCost, units: dict, tp_inter: Any, moe_share: float, device: Device
) -> dict[str, dict[str, Any]]:
    """Per layer and microbatch, each dim's exposed and hidden seconds: TP/SP under the GEMMs with
    tp_overlap, ring CP beside the attention core, EP under another microbatch with ep_overlap
    (ep_exposed_seconds), the always-overlapped rows hidden."""
    tp_layer = _unit(units, ("tp", "sp"), "layer")
    gemm = cost.gemm_fwd + cost.gemm_bwd
    # Megatron-LM's and torchtitan's TP overlap both work on SP's all-gathers and reduce-scatters, over
    # NVLink: Transformer Engine's userbuffers and PyTorch's symmetric memory map the peers' memory
    overlap = plan.tp_overlap & plan.sp & np.logical_not(tp_inter)
    tp_exposed = where(overlap, maximum(tp_layer - gemm, tp_layer / (2 * plan.tp)), tp_layer)
    share = where(tp_layer > 0, tp_exposed / where(tp_layer > 0, tp_layer, 1.0), 0.0)
    ring = _unit(units, ("cp",), "layer", "hidden_by:attention")
    ring_exposed = maximum(ring - (cost.attn_fwd + cost.attn_bwd), 0.0)
    exposed = {d: 0.0 for d in DIMS}
    exposed.update(
        tp=_unit(units, ("tp",), "layer") * share,
        sp=_unit(units, ("sp",), "layer") * share,
        cp=_unit(units, ("cp",), "layer") + ring_exposed,
        ep=ep_exposed_seconds(plan, cost, _unit(units, ("ep",), "layer"), moe_share, device),
    )
    hidden = {d: _unit(units, (d,), "layer", "overlapped") for d in DIMS}
    hidden["tp"] = hidden["tp"] + _unit(units, ("tp",), "layer") - exposed["tp"]
    hidden["sp"] = hidden["sp"] + _unit(units, ("sp",), "layer") - exposed["sp"]
    hidden["cp"] = hidden["cp"] + ring - ring_exposed
    hidden["ep"] = hidden["ep"] + _unit(units, ("ep",), "layer") - exposed["ep"]
    return {"exposed": exposed, "hidden": hidden}


# SMs the flex dispatcher's kernels hold while they move tokens, where the plan does not say
# (Plan.dispatch_sms): DeepEP's Buffer default, which Megatron-core keeps (TransformerConfig.
# moe_deepep_num_sms, "historical default 20"; HybridEP takes DeepEP's default)
FLEX_DISPATCH_SMS = 20


def ep_exposed_seconds(plan: AnyPlan, cost: LayerCost, ep_layer: Any, moe_share: float, device: Device) -> Any:
    """The exposed part of a layer's `ep_layer` seconds of dispatch and combine per microbatch.

    Without plan.ep_overlap all of it. With it (Megatron-core --overlap-moe-expert-parallel-comm;
    alltoall or flex, ep > 1), the forward of one microbatch runs with the backward of another, layer
    by layer, on a computation and a communication stream (TransformerLayerSchedulePlan.run):

        communication   combine bwd   | dispatch fwd, dispatch bwd         | combine fwd
        computation     pre-dispatch  | MLP dgrad, MLP wgrad, MLP fwd      | pre-dispatch bwd
                        fwd           |                                    |

    so each of the four transfers (a quarter of a MoE layer's) is exposed for what its window
    (LayerCost.moe_*) cannot cover: the pre-dispatch forward, the MLP's input gradients (and weight
    gradients, unless --delay-wgrad-compute moves them after the backward dispatch, whose window they
    then join with the MLP forward), the pre-dispatch backward. A flex dispatch runs on SMs of its own
    (FLEX_DISPATCH_SMS of the device's): while it moves tokens the window's kernels run on the rest,
    so a transfer C under a window W costs max(C - W, C x its SM share), never less. Only the 1F1B steady state pairs
    microbatches: of the last stage's m x v chunk passes, the warm-up's max(1, (v - 1) pp) run
    alone (schedules.py: (pp - rank - 1) 2 + (v - 1) pp warm-up chunks; without a pipeline the first
    forward and the last backward)."""
    _, gathered, flex = dispatcher_flags(plan)
    on = plan.ep_overlap & (plan.ep > 1) & np.logical_not(gathered)
    if not np.any(on) or not moe_share:
        return ep_layer
    quarter = ep_layer / moe_share / 4
    sms = FLEX_DISPATCH_SMS if plan.dispatch_sms is None else plan.dispatch_sms
    held = quarter * where(flex, minimum(np.asarray(sms) / device.sms, 1.0), 0.0)  # the window's SMs it takes
    delay = plan.delay_wgrad
    windows = (
        cost.moe_pre_fwd,
        cost.moe_mlp_dgrad + (0.0 if delay else cost.moe_mlp_wgrad),
        (cost.moe_mlp_wgrad if delay else 0.0) + cost.moe_mlp_fwd,
        cost.moe_pre_bwd,
    )
    paired = moe_share * sum(maximum(quarter - w, held) for w in windows)
    chunks = maximum(plan.microbatches, 1) * plan.vpp
    steady = np.clip((chunks - maximum(1, (plan.vpp - 1) * plan.pp)) / chunks, 0.0, 1.0)
    return where(on, steady * paired + (1 - steady) * ep_layer, ep_layer)


def _slowest(times: list, counts: list, kinds: list) -> tuple[Any, dict]:
    """The slowest stage present (count > 0): its seconds per microbatch, and its layers and whether it
    holds the embedding / the output layer (per row for a PlanColumns; the first slowest wins)."""
    t = [where(c > 0, x, -np.inf) for x, c in zip(times, counts)]
    t_max = t[0]
    for x in t[1:]:
        t_max = maximum(t_max, x)
    layers, first, last = kinds[-1]
    for (n, f, la), x in reversed(list(zip(kinds, t))[:-1]):
        sel = x >= t_max
        layers, first, last = where(sel, n, layers), where(sel, f, first), where(sel, la, last)
    return t_max, {"layers": layers, "first": first, "last": last}


# what the step's DP communication depends on (the search evaluates it once per distinct row)
DP_KEYS = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "micro_batch", "first_stage_layers", "last_stage_layers")


def _dp_seconds(model: Model, plan: AnyPlan, cluster: Cluster, comm: CommOptions) -> dict[str, Any]:
    """The step's DP terms (comm.comm_terms(dp=True)) in seconds: the gradients' reduction, the
    weights' gathers, the loss's all-reduce, and the calls of the first two."""
    links: dict = {}
    reduce = gather = loss = 0.0
    reduce_calls = gather_calls = 1.0
    for t in comm_terms(model, plan, comm, dp=True):
        if t.dim != "dp":
            continue
        if t.group not in links:
            links[t.group] = (crosses_nodes(plan, cluster, t.group), ranks_per_node(plan, cluster, t.group))
        seconds = term_seconds(t, cluster, links[t.group][0], None, links[t.group][1])
        if t.what == "loss":
            loss = loss + seconds
        elif t.collective == "all_gather":
            gather, gather_calls = gather + seconds, maximum(t.calls, 1)
        else:
            reduce, reduce_calls = reduce + seconds, maximum(t.calls, reduce_calls)
    return {
        "reduce": reduce,
        "gather": gather,
        "loss": loss,
        "reduce_calls": reduce_calls,
        "gather_calls": gather_calls,
    }


def _dp_exposed(parts: dict, plan: AnyPlan, perf: PerfOptions, *, fwd: Any, bwd: Any, m: Any) -> tuple[Any, Any]:
    """(exposed, hidden) seconds of the step's DP communication (module docstring; `parts`:
    _dp_seconds'), for the stage with the most parameters, hidden behind the slowest stage's
    forward / backward of a microbatch (`fwd`, `bwd`)."""
    reduce, gather, loss = parts["reduce"], parts["gather"], parts["loss"]
    reduce_calls, gather_calls = parts["reduce_calls"], parts["gather_calls"]
    total = reduce + gather + loss
    if perf.dp_overlap is not None:
        exposed = total * (1.0 - perf.dp_overlap)
        return exposed, total - exposed
    z3, z2 = plan.zero == 3, plan.zero >= 2
    gr, pg = plan.grad_reduce_overlap, plan.param_gather_overlap
    rounds = where(z2, m, 1)  # the reduction: once (ZeRO 0/1) or after every microbatch's backward (ZeRO 2/3)
    g_rounds = where(z3, 2 * m, 1)  # the gathers: once (ZeRO 1/2) or for every forward and backward (ZeRO 3)
    r, g = reduce / rounds, gather / g_rounds
    r_last, g_last = reduce / reduce_calls, gather / gather_calls  # a bucket: the last is never hidden
    # a backward window hides the reduction and (ZeRO 3) the backward's gathers together; a forward
    # window the gathers of the forward (ZeRO 3) or of the next step's first microbatch (ZeRO 1/2)
    bwd_hideable = where(gr, r, 0.0) + where(z3 & pg, g, 0.0)
    bwd_last = where(gr, r_last, where(z3 & pg, g_last, 0.0))
    bwd_exposed = where(bwd_hideable > 0, maximum(bwd_last, bwd_hideable - bwd), 0.0)
    bwd_exposed = bwd_exposed + where(gr, 0.0, r) + where(z3 & ~pg, g, 0.0)
    fwd_exposed = where(pg, maximum(g_last, g - fwd), g)
    per_round = where(z3, m * (bwd_exposed + fwd_exposed), rounds * bwd_exposed + fwd_exposed)
    exposed = minimum(per_round, reduce + gather) + loss
    return exposed, total - exposed


def _optimizer_s(model: Model, plan: AnyPlan, cluster: Cluster, perf: PerfOptions) -> Any:
    """The optimizer step of the stage with the most parameters, over its ZeRO shard (ZeRO >= 1
    shards the optimizer over dp x cp)."""
    shard = max_params_per_stage(model, plan) / where(plan.zero >= 1, plan.dp * plan.cp, 1)
    return optimizer_seconds(device_of(cluster, perf), shard, perf.job_efficiency)


def _compute_parts(cost: LayerCost, crit: dict) -> dict[str, float]:
    """The slowest stage's compute of one microbatch by kind: GEMMs, attention, element-wise, the
    recomputed forward, and the model's ends."""
    n = crit["layers"]
    return {
        "gemm": n * (cost.gemm_fwd + cost.gemm_bwd),
        "attention": n * (cost.attn_fwd + cost.attn_bwd),
        "elementwise": n * (cost.ew_fwd + cost.ew_bwd),
        "recompute": n * cost.recompute,
        "ends": (cost.embedding if crit["first"] else 0.0) + (cost.head if crit["last"] else 0.0),
    }
