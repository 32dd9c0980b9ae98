"""The parallel plan: how a job splits one model over dp x tp x pp x cp ranks (frozen, JSON round trip).

A Plan checks what it can on its own when it is built (positive degrees, known names); whether it
fits a given model and cluster is `parallel.core.validate.check`'s job, which returns every problem at
once with the numbers in the message.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.pipeline_layout import parse_layout, plan_split
from parallel.core.plan_schema import OPTIONAL_KINDS, FieldSpec, field_specs, knob, value_error
from parallel.core.specs import SpecError
from parallel.core.topology import DEFAULT_ORDER, Topology, TopologyError, parse_order

RECOMPUTE = ("none", "selective", "full")
# The submodules selective recomputation may recompute (Megatron-core's TransformerConfig.recompute_modules,
# megatron/core/transformer/transformer_config.py; its default ["core_attn"]), in its order:
# core_attn = the attention core (attention.py / transformer_block.py), moe_act = the routed experts'
# activation function (moe/experts.py, CheckpointWithoutOutput), layernorm = the input and pre-MLP
# norms that are modules of their own (transformer_layer.py), mla_up_proj = MLA's up projections and
# RoPE (multi_latent_attention.py), mlp = a dense layer's MLP, moe = a MoE layer's whole MoE block
# (moe/moe_layer.py), shared_experts = its shared experts. parallel.core.memory drops what each saves,
# parallel.core.compute runs each forward again. Megatron-core's GatedDeltaNet and hyper-connection
# modules (gdn_norm_out, gdp_in_proj, gdp_qkv, mhc) belong to layers the plan model does not have.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = "core_attn"
# The submodules whose saved activations fine-grained activation offloading copies to host memory in
# forward and back before backward (Megatron-core's --fine-grained-activation-offloading
# --offload-modules, TransformerConfig.offload_modules; megatron/core/pipeline_parallel/
# fine_grained_activation_offload.py offloads what each module's region saves for backward):
# attn_norm / mlp_norm = the input and pre-MLP norms' inputs (where a norm is a module of its own),
# qkv_linear = the QKV projection's (MLA: the down and up projections'), core_attn = the attention
# core's, attn_proj = the out-projection's input, expert_fc1 / moe_act = the routed experts' fc1
# input and activation input. parallel.core.memory counts each, parallel.core.perf its copy time.
# (fused_group_mlp needs Transformer Engine's op fuser; gdp_qkv belongs to GatedDeltaProduct layers.)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
NO_OFFLOAD = "none"
SCHEDULES = ("1f1b", "gpipe")
# Gradient dtype of the accumulation buffer that is reduced and fed to the optimizer (Megatron-LM:
# fp32 unless --grad-reduce-in-bf16 / --main-grads-dtype bf16; torchtitan: mixed_precision_reduce).
MAIN_GRADS = ("fp32", "bf16")
# Adam's moments under Megatron-LM's precision-aware optimizer (--exp-avg-dtype / --exp-avg-sq-dtype):
# bytes a parameter
MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
MOMENT_DTYPES = tuple(MOMENT_BYTES)
# FP8 training (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; Transformer Engine):
# none; gemm = FP8 GEMMs, bf16 weights with an FP8 copy of each GEMM weight (Megatron --fp8-format,
# torchtitan float8); weights = FP8 primary GEMM weights, fp32 master copy in the optimizer
# (Megatron --fp8-param-gather). See parallel.core.memory for what each stores.
FP8 = ("none", "gemm", "weights")
# How context parallelism exchanges the sequence (parallel.core.memory / comm have each one's cost):
# allgather = K/V all-gathered before attention (Megatron-LM's --cp-comm-type allgather; Llama 3);
# ring = K/V blocks passed around the CP ring with an online softmax (Liu et al. 2023, Ring
# Attention; Megatron-LM's default p2p); ulysses = all-to-all from sequence to head shards and back
# (Jacobs et al. 2023, DeepSpeed-Ulysses; Megatron-LM's a2a).
CP_KINDS = ("allgather", "ring", "ulysses")
# The attention kernel (Plan.attention): what compute times and whether memory keeps the s x s scores.
ATTENTIONS = ("fused", "fa2", "unfused")
# How a MoE layer moves its tokens to the experts' ranks (Megatron-core's --moe-token-dispatcher-type;
# parallel.core.comm prices each): alltoall = every routed copy sent to its expert's rank by one NCCL
# all-to-all over the EP group (MoEAlltoAllTokenDispatcher); allgather = every token gathered over
# the ETP x EP ranks, each keeping the copies of its experts, then reduce-scattered back
# (MoEAllGatherTokenDispatcher); flex = DeepEP / HybridEP kernels (MoEFlexTokenDispatcher): a token
# crosses to another NVLink domain once per domain it has experts in and fans out inside it.
DISPATCHERS = ("alltoall", "allgather", "flex")
# the fields that hold one of a few names: a PlanColumns' maker may keep their integer codes beside them
CODED_FIELDS = {"recompute": RECOMPUTE, "cp_kind": CP_KINDS, "moe_dispatcher": DISPATCHERS}


MAX_WORLD_SIZE = 1 << 24  # 16.8 M GPUs: far past any cluster, small enough to lay out in memory
MAX_GLOBAL_BATCH = 1 << 32  # sequences per step; keeps the divisor searches over it bounded


def _t_degree(label: str, name: str) -> Callable[[Any], str]:
    return lambda p: f"{label}{getattr(p, name)}" if getattr(p, name) > 1 else ""


def _t_tp(p: Any) -> str:
    return (f"TP{p.tp}" if p.tp > 1 else "") + ("+SP" if p.sp else "")


def _t_cp(p: Any) -> str:
    return f"CP{p.cp}" + ("" if p.cp_kind == "allgather" else f"-{p.cp_kind}") if p.cp > 1 else ""


def _t_recompute(p: Any) -> str:
    if p.recompute == "none":
        return ""
    selective = p.recompute == "selective" and p.recompute_modules != DEFAULT_RECOMPUTE_MODULES
    modules = f"[{p.recompute_modules}]" if selective else ""
    return f"rc-{p.recompute}" + (f"{p.recompute_layers}" if p.recompute_layers else "") + modules


def parse_modules(text: str, known: tuple[str, ...] = RECOMPUTE_MODULES, *, what: str = "recompute") -> str:
    """The one spelling of a set of modules: names separated by '+', ',' or spaces (Megatron-LM writes
    `--recompute-modules core_attn moe_act`) -> their order in `known` joined by '+'. SpecError naming
    an unknown module, or an empty set of recompute modules (no offloaded ones: 'none', or '')."""
    names = [n for n in re.split(r"[\s+,]+", text.strip()) if n]
    if what == "offload" and names in ([], ["none"]):
        return NO_OFFLOAD
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecError(f"{what} module(s) {', '.join(map(repr, unknown))} unknown; known: {', '.join(known)}")
    if not names and what == "recompute":
        raise SpecError(f"recompute modules must name at least one of {', '.join(known)}")
    return "+".join(m for m in known if m in names)


def _t_stages(p: Any) -> str:
    if (p.first_stage_layers is None and p.last_stage_layers is None) or p.pp_layout:  # the layout says it
        return ""
    side = lambda n: "=" if n is None else str(n)  # noqa: E731
    return f"stages {side(p.first_stage_layers)}/{side(p.last_stage_layers)}"


def _t_overlap(name: str, short: str, needs: Callable[[Any], bool]) -> Callable[[Any], str]:
    """An overlap's word inside the label's 'ovl:' token; '' where it is off or has no effect."""
    return lambda p: short if getattr(p, name) and needs(p) else ""


@dataclass(frozen=True)
class Plan:
    """One parallel plan. Every field is declared once, here, with its Knob (parallel.core.plan_schema):
    the CLI flags, URL keys, editor columns, JSON keys and label words are generated from it."""

    dp: int = knob(
        1,
        "int",
        "dp",
        "data-parallel degree (the world is dp x tp x pp x cp)",
        lo=1,
        column="DP",
        token=lambda p: f"DP{p.dp}",
        megatron=("world / (tp x pp x cp)",),
        torchtitan=("parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree"),
    )
    tp: int = knob(
        1,
        "int",
        "tp",
        "tensor-parallel degree (inside a node: it needs NVLink)",
        lo=1,
        column="TP",
        token=_t_tp,
        megatron=("--tensor-model-parallel-size",),
        torchtitan=("parallelism.tensor_parallel_degree",),
    )
    pp: int = knob(
        1,
        "int",
        "pp",
        "pipeline-parallel degree (stages)",
        lo=1,
        column="PP",
        token=_t_degree("PP", "pp"),
        megatron=("--pipeline-model-parallel-size",),
        torchtitan=("parallelism.pipeline_parallel_degree",),
    )
    cp: int = knob(
        1,
        "int",
        "cp",
        "context-parallel degree (the sequence split over ranks)",
        lo=1,
        column="CP",
        token=_t_cp,
        megatron=("--context-parallel-size",),
        torchtitan=("parallelism.context_parallel_degree",),
    )
    # Megatron sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2); needs tp > 1
    sp: bool = knob(
        False,
        "bool",
        "sp",
        "Megatron sequence parallelism: norms and dropout on s/tp tokens (needs tp > 1)",
        column="SP",
        token=lambda p: "",  # written with TP: 'TP8+SP'
        megatron=("--sequence-parallel",),
        torchtitan=("always on with TP (SequenceParallel norms)",),
    )
    micro_batch: int = knob(
        1,
        "int",
        "mb",
        "sequences per microbatch",
        lo=1,
        column="micro batch",
        group="batch",
        token=lambda p: f"mb{p.micro_batch}" if p.micro_batch != 1 else "",
        megatron=("--micro-batch-size",),
        torchtitan=("training.local_batch_size", "parallelism.pipeline_parallel_microbatch_size"),
    )
    # sequences per optimizer step; a plan given without it takes dp x micro_batch x pp (one
    # microbatch per pipeline stage: plan_from_values)
    global_batch: int = knob(
        1,
        "int",
        "gb",
        "sequences per optimizer step (default: dp x micro batch x pp)",
        lo=1,
        hi=MAX_GLOBAL_BATCH,
        column="global batch",
        group="batch",
        token=lambda p: f"gb{p.global_batch}" if p.global_batch != p.dp * p.micro_batch * p.pp else "",
        megatron=("--global-batch-size",),
        torchtitan=("training.global_batch_size",),
    )
    # virtual pipeline stages per rank (interleaved 1F1B, Narayanan et al. 2021)
    vpp: int = knob(
        1,
        "int",
        "vpp",
        "virtual pipeline stages per rank (interleaved 1F1B)",
        lo=1,
        column="vpp",
        token=lambda p: f"v{p.vpp}" if p.vpp > 1 else "",
        megatron=("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"),
        torchtitan=("parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_layers_per_stage"),
    )
    schedule: str = knob(
        "1f1b",
        "choice",
        "sched",
        "pipeline schedule",
        choices=SCHEDULES,
        column="schedule",
        token=lambda p: p.schedule if p.schedule != "1f1b" else "",
        megatron=("(1F1B only)",),
        torchtitan=("parallelism.pipeline_parallel_schedule",),
    )
    # ZeRO stage over the DP group (Rajbhandari et al. 2020)
    zero: int = knob(
        0,
        "choice",
        "zero",
        "ZeRO stage over the data-parallel ranks (1: optimizer, 2: +grads, 3: +weights)",
        choices=(0, 1, 2, 3),
        column="ZeRO",
        token=lambda p: f"ZeRO-{p.zero}" if p.zero else "",
        megatron=(
            "--use-distributed-optimizer (1)",
            "--data-parallel-sharding-strategy optim_grads (2), optim_grads_params (3)",
        ),
        torchtitan=("parallelism.data_parallel_shard_degree > 1 (FSDP2: 3)",),
    )
    recompute: str = knob(
        "none",
        "choice",
        "recompute",
        "activation recomputation",
        choices=RECOMPUTE,
        column="recompute",
        token=_t_recompute,
        megatron=("--recompute-activations", "--recompute-granularity"),
        torchtitan=("activation_checkpoint.mode",),
    )
    # With recompute "selective": which submodules (RECOMPUTE_MODULES, '+'-joined); kept but without
    # effect under another mode, so a search's base plan carries them to the rows it makes selective
    recompute_modules: str = knob(
        DEFAULT_RECOMPUTE_MODULES,
        "text",
        "rcm",
        "with selective recompute: the modules recomputed, '+'-joined (" + ", ".join(RECOMPUTE_MODULES) + ")",
        column="rc modules",
        token=lambda p: "",  # written with the recompute mode: 'rc-selective[moe_act+layernorm]'
        megatron=("--recompute-modules",),
        torchtitan=("(per-op or per-block only)",),
    )
    # Fine-grained activation offloading: the modules whose saved activations go to host memory
    # (OFFLOAD_MODULES, '+'-joined), or none
    offload_modules: str = knob(
        NO_OFFLOAD,
        "text",
        "offl",
        "activations offloaded to host memory, '+'-joined (" + ", ".join(OFFLOAD_MODULES) + ") or none",
        column="offload",
        token=lambda p: f"offload[{p.offload_modules}]" if p.offload_modules != NO_OFFLOAD else "",
        megatron=("--fine-grained-activation-offloading", "--offload-modules"),
        torchtitan=("(none)",),
    )
    # With recompute "full": recompute only this many layers of each virtual stage chunk, keeping the
    # others' activations (Megatron-LM --recompute-method block --recompute-num-layers N; torchtitan's
    # activation checkpointing of every k-th layer); None = every layer.
    recompute_layers: int | None = knob(
        None,
        "opt_int",
        "rcl",
        "with full recompute: layers recomputed per stage chunk (default: all)",
        lo=1,
        column="rc layers",
        token=lambda p: "",
        megatron=("--recompute-method block", "--recompute-num-layers"),
        torchtitan=("activation_checkpoint.selective_ac_option",),
    )
    order: str = knob(
        DEFAULT_ORDER,
        "text",
        "order",
        "rank order, fastest axis first (TP innermost keeps TP in a node)",
        column="rank order",
        token=lambda p: f"order {p.order}" if p.order != DEFAULT_ORDER else "",
        megatron=("--use-tp-pp-dp-mapping",),
        torchtitan=("(fixed mesh order)",),
    )
    # Gradient dtype of the accumulation buffer that is reduced and fed to the optimizer
    main_grads: str = knob(
        "fp32",
        "choice",
        "grads",
        "gradient buffer dtype (reduced and fed to the optimizer)",
        choices=MAIN_GRADS,
        column="grads",
        flag="--main-grads",
        token=lambda p: f"grads-{p.main_grads}" if p.main_grads != "fp32" else "",
        megatron=("--grad-reduce-in-bf16", "--main-grads-dtype"),
        torchtitan=("training.mixed_precision_reduce",),
    )
    exp_avg_dtype: str = knob(
        "fp32",
        "choice",
        "m1",
        "Adam's first moment's dtype (Megatron-LM's precision-aware optimizer)",
        choices=MOMENT_DTYPES,
        column="exp_avg",
        token=lambda p: f"m1-{p.exp_avg_dtype}" if p.exp_avg_dtype != "fp32" else "",
        megatron=("--use-precision-aware-optimizer", "--exp-avg-dtype"),
        torchtitan=(),
    )
    exp_avg_sq_dtype: str = knob(
        "fp32",
        "choice",
        "m2",
        "Adam's second moment's dtype (Megatron-LM's precision-aware optimizer)",
        choices=MOMENT_DTYPES,
        column="exp_avg_sq",
        token=lambda p: f"m2-{p.exp_avg_sq_dtype}" if p.exp_avg_sq_dtype != "fp32" else "",
        megatron=("--use-precision-aware-optimizer", "--exp-avg-sq-dtype"),
        torchtitan=(),
    )
    fp8: str = knob(
        "none",
        "choice",
        "fp8",
        "FP8 GEMMs with bf16 weights (gemm) or FP8 weights too (weights)",
        choices=FP8,
        column="FP8",
        token=lambda p: {"none": "", "gemm": "FP8", "weights": "FP8-weights"}[p.fp8],
        megatron=("--fp8-format", "--fp8-param-gather"),
        torchtitan=("model.converters float8",),
    )
    # Expert parallelism (Lepikhin et al. 2021, GShard): a MoE layer's routed experts are split over
    # ep ranks taken from the data-parallel x context ranks (Megatron-LM's expert layout: tp x ep x
    # expert-dp x pp = the world), so ep adds no GPUs; the experts' ZeRO shards over dp*cp/ep.
    ep: int = knob(
        1,
        "int",
        "ep",
        "expert parallelism of a MoE model (ranks taken from dp x cp; adds no GPUs)",
        lo=1,
        column="EP",
        token=_t_degree("EP", "ep"),
        megatron=("--expert-model-parallel-size",),
        torchtitan=("parallelism.expert_parallel_degree",),
    )
    # Expert tensor parallelism: the experts' matrices split over etp ranks instead of tp; None = tp
    etp: int | None = knob(
        None,
        "opt_int",
        "etp",
        "expert tensor parallelism (default: tp)",
        lo=1,
        column="ETP",
        token=lambda p: f"ETP{p.etp}" if p.etp is not None and p.etp != p.tp else "",
        megatron=("--expert-tensor-parallel-size",),
        torchtitan=("parallelism.expert_tensor_parallel_degree",),
    )
    # How the MoE layers dispatch their tokens (DISPATCHERS; parallel.core.comm)
    moe_dispatcher: str = knob(
        "alltoall",
        "choice",
        "disp",
        "MoE token dispatcher: alltoall, allgather (over ETP x EP) or flex (DeepEP/HybridEP: once per domain)",
        choices=DISPATCHERS,
        column="dispatcher",
        # the dispatcher works over the ETP x EP group (comm._ep_terms): named wherever that is a group
        token=lambda p: f"disp-{p.moe_dispatcher}" if p.moe_dispatcher != "alltoall" and p.ep * p.expert_tp > 1 else "",
        megatron=("--moe-token-dispatcher-type", "--moe-enable-deepep", "--moe-flex-dispatcher-backend"),
        torchtitan=("parallelism.expert_parallel_comm_backend (standard: alltoall; deepep, hybridep: flex)",),
    )
    # SMs the flex dispatcher's kernels (DeepEP, HybridEP) hold while they move tokens; None = DeepEP's
    # default of 20, which Megatron-core keeps (TransformerConfig.moe_flex_dispatcher_num_sms)
    dispatch_sms: int | None = knob(
        None,
        "opt_int",
        "dsms",
        "SMs the flex dispatcher's kernels hold (default: DeepEP's 20)",
        lo=1,
        hi=1024,
        column="dispatch SMs",
        token=lambda p: f"sms{p.dispatch_sms}" if p.dispatch_sms is not None and p.moe_dispatcher == "flex" else "",
        megatron=("--moe-flex-dispatcher-num-sms",),
        torchtitan=(),
    )
    # Expert capacity (Lepikhin et al. 2021, GShard; Megatron-core moe_utils.get_capacity): each expert
    # takes at most ceil(capacity_factor x tokens x top_k / experts) copies and drops the rest; None =
    # dropless (Megatron-LM's default). With capacity_pad every expert's input is padded to it.
    capacity_factor: float | None = knob(
        None,
        "opt_float",
        "cap",
        "MoE expert capacity factor: copies past it are dropped (default: dropless)",
        lo=0,
        hi=1024,
        column="capacity",
        token=lambda p: (
            f"cap{p.capacity_factor:g}" + ("-pad" if p.capacity_pad else "") if p.capacity_factor is not None else ""
        ),
        megatron=("--moe-expert-capacity-factor",),
        torchtitan=("(dropless)",),
    )
    capacity_pad: bool = knob(
        False,
        "bool",
        "pad",
        "pad every expert's input to its capacity (needs a capacity factor)",
        column="pad to capacity",
        token=lambda p: "",  # written with the capacity: 'cap1.25-pad'
        megatron=("--moe-pad-expert-input-to-capacity",),
        torchtitan=(),
    )
    # Routing skew: the token copies the busiest EP rank's experts receive over the balanced share
    # (max / mean over the EP ranks, as a trace or the router's statistics measure it). None =
    # balanced, as --moe-router-force-load-balancing runs (the published benchmarks). Every EP rank
    # waits for the busiest at the combine, so its expert GEMMs, activations and received bytes set
    # the layer's pace (parallel.core.memory.expert_load)
    expert_imbalance: float | None = knob(
        None,
        "opt_float",
        "imb",
        "MoE routing skew: the busiest EP rank's routed tokens over the balanced share (default: balanced)",
        lo=0,
        hi=1024,
        column="imbalance",
        token=lambda p: f"imb{p.expert_imbalance:g}" if p.expert_imbalance is not None and p.ep > 1 else "",
        megatron=("(measured routing; --moe-router-force-load-balancing: balanced)",),
        torchtitan=("(measured routing)",),
    )
    # The local experts' GEMMs: one grouped GEMM call (TE GroupedLinear / CUTLASS grouped GEMM) or one
    # GEMM per expert in turn (Megatron-core's SequentialMLP without --moe-grouped-gemm)
    grouped_gemm: bool = knob(
        True,
        "bool",
        "gg",
        "the local experts' GEMMs as one grouped GEMM (else one GEMM per expert)",
        column="grouped GEMM",
        token=lambda p: "" if p.grouped_gemm else "seq-experts",
        megatron=("--moe-grouped-gemm",),
        torchtitan=("(grouped_mm)",),
    )
    cp_kind: str = knob(
        "allgather",
        "choice",
        "ck",
        "context parallelism's exchange: all-gathered K/V, ring attention, or Ulysses all-to-all (no effect at cp 1)",
        choices=CP_KINDS,
        column="CP kind",
        token=lambda p: "",
        megatron=("--cp-comm-type",),
        torchtitan=("parallelism.context_parallel_rotate_method",),
    )
    # Communication hidden behind computation, as the frameworks overlap it (parallel.core.perf)
    tp_overlap: bool = knob(
        False,
        "bool",
        "tpo",
        "TP/SP collectives under the GEMMs they feed",
        column="ovl TP",
        token=_t_overlap("tp_overlap", "tp", lambda p: p.tp > 1),
        group="overlap",
        megatron=("--tp-comm-overlap",),
        torchtitan=("parallelism.enable_async_tensor_parallel",),
    )
    grad_reduce_overlap: bool = knob(
        False,
        "bool",
        "gro",
        "DP gradient reduction bucket by bucket under backward",
        column="ovl DP grads",
        group="overlap",
        token=_t_overlap("grad_reduce_overlap", "dp", lambda p: p.dp * p.cp > 1),
        megatron=("--overlap-grad-reduce",),
        torchtitan=("(FSDP2 and DDP: always)",),
    )
    param_gather_overlap: bool = knob(
        False,
        "bool",
        "pgo",
        "ZeRO's weight all-gathers under the forward",
        column="ovl DP params",
        group="overlap",
        token=_t_overlap("param_gather_overlap", "ag", lambda p: p.zero > 0 and p.dp * p.cp > 1),
        megatron=("--overlap-param-gather",),
        torchtitan=("(FSDP2 prefetch: always)",),
    )
    p2p_overlap: bool = knob(
        False,
        "bool",
        "p2po",
        "pipeline sends/receives under the neighbouring microbatch (interleaved schedule)",
        column="ovl PP",
        group="overlap",
        token=_t_overlap("p2p_overlap", "pp", lambda p: p.pp > 1 and p.vpp > 1),
        megatron=("--overlap-p2p-communication",),
        torchtitan=(),
    )
    # Megatron-core's batch-level EP overlap (model_chunk_schedule_plan.py): the forward of one
    # microbatch runs with the backward of another, each dispatch / combine under the other's compute
    ep_overlap: bool = knob(
        False,
        "bool",
        "epo",
        "MoE dispatch and combine under another microbatch's compute (alltoall/flex; pp > 1 needs vpp)",
        column="ovl EP",
        group="overlap",
        token=_t_overlap("ep_overlap", "ep", lambda p: p.ep > 1),
        megatron=("--overlap-moe-expert-parallel-comm",),
        torchtitan=(),
    )
    # ... with the MLP's weight gradients delayed, so the backward dispatch also runs under them
    delay_wgrad: bool = knob(
        False,
        "bool",
        "dwg",
        "weight gradients after the input gradients (with EP overlap: the backward dispatch under them)",
        column="delay wgrad",
        group="overlap",
        token=_t_overlap("delay_wgrad", "wgrad", lambda p: p.ep > 1 and p.ep_overlap),
        megatron=("--delay-wgrad-compute",),
        torchtitan=(),
    )
    # Uneven pipeline stages: the first / last stage's transformer layers, the rest split evenly
    first_stage_layers: int | None = knob(
        None,
        "opt_int",
        "first",
        "layers on the first pipeline stage (default: even)",
        lo=0,
        column="first stage",
        token=_t_stages,
        group="stages",
        megatron=("--decoder-first-pipeline-num-layers",),
        torchtitan=(),
    )
    last_stage_layers: int | None = knob(
        None,
        "opt_int",
        "last",
        "layers on the last pipeline stage (default: even)",
        lo=0,
        column="last stage",
        token=lambda p: "",
        group="stages",
        megatron=("--decoder-last-pipeline-num-layers",),
        torchtitan=(),
    )
    # the embedding (the loss) counts as one layer of the split, so the first (last) stage holds one fewer
    embedding_in_split: bool = knob(
        False,
        "bool",
        "embsplit",
        "the embedding counts as a layer of the pipeline split",
        column="emb in split",
        token=lambda p: "emb-in-split" if p.embedding_in_split else "",
        group="stages",
        megatron=("--account-for-embedding-in-pipeline-split",),
    )
    loss_in_split: bool = knob(
        False,
        "bool",
        "losssplit",
        "the loss counts as a layer of the pipeline split",
        column="loss in split",
        token=lambda p: "loss-in-split" if p.loss_in_split else "",
        group="stages",
        megatron=("--account-for-loss-in-pipeline-split",),
    )
    # Megatron-core's pipeline layout (parallel.core.pipeline_layout): every virtual stage's layers
    # written out. When set it is the truth: vpp, the first / last stage layers and the embedding /
    # loss placement are its summary, derived from it here (a contradicting one is refused)
    pp_layout: str = knob(
        "",
        "text",
        "layout",
        "pipeline layout: each virtual stage's layers, e.g. Et|(tt|)*30mL (E embedding, t layer, m MTP, L loss)",
        column="pp layout",
        token=lambda p: f"layout {p.pp_layout}" if p.pp_layout else "",
        group="stages",
        megatron=("--pipeline-model-parallel-layout",),
        torchtitan=("parallelism.module_fqns_per_model_part",),
    )
    # The attention kernel (parallel.core.compute times each; parallel.core.memory: only "unfused"
    # keeps the s x s scores): fused = cuDNN / Transformer Engine / FlashAttention-3; fa2 =
    # FlashAttention-2 (PyTorch SDPA's flash back end); unfused = scores materialised (Megatron-LM
    # before flash attention, Korthikanti et al.'s Table 2).
    attention: str = knob(
        "fused",
        "choice",
        "attn",
        "attention kernel: fused (cuDNN/TE/FA3), fa2 (FlashAttention-2) or unfused (s x s scores kept)",
        choices=ATTENTIONS,
        column="attention",
        token=lambda p: f"attn-{p.attention}" if p.attention != "fused" else "",
        megatron=("--attention-backend", "--use-flash-attn", "--transformer-impl"),
        torchtitan=("(SDPA: fa2)",),
    )
    # dropout after softmax and on both residual branches; None = the model's (Model.dropout)
    dropout: bool | None = knob(
        None,
        "opt_bool",
        "dropout",
        "dropout masks kept for backward (default: the model's)",
        column="dropout",
        token=lambda p: "" if p.dropout is None else "dropout" if p.dropout else "no-dropout",
        megatron=("--attention-dropout", "--hidden-dropout"),
        torchtitan=("(none)",),
    )

    def __post_init__(self):
        for spec in PLAN_FIELDS:  # each field's kind, choices and bounds, as declared
            problem = value_error(spec, getattr(self, spec.name))
            if problem:
                raise SpecError(f"Plan.{spec.name} {problem}, got {getattr(self, spec.name)!r}")
        if self.world_size > MAX_WORLD_SIZE:  # the rank layout is an array of this many ints
            raise SpecError(
                f"dp×tp×pp×cp = {self.dp}×{self.tp}×{self.pp}×{self.cp} = {self.world_size:,} GPUs; "
                f"plans are limited to {MAX_WORLD_SIZE:,}"
            )
        if self.capacity_pad and self.capacity_factor is None:  # Megatron-core asserts the same
            raise SpecError("Plan.capacity_pad needs a capacity_factor (--moe-expert-capacity-factor)")
        if self.expert_imbalance is not None and self.expert_imbalance < 1:
            raise SpecError(
                f"Plan.expert_imbalance is the busiest rank's share over the mean, at least 1, got {self.expert_imbalance!r}"
            )
        if self.expert_imbalance == 1:  # balanced: one spelling of the plan
            object.__setattr__(self, "expert_imbalance", None)
        if self.cp == 1 and self.cp_kind != CP_KINDS[0]:  # no exchange at cp 1: one spelling of the plan
            object.__setattr__(self, "cp_kind", CP_KINDS[0])
        if self.recompute_layers is not None and self.recompute != "full":
            raise SpecError(f"Plan.recompute_layers needs recompute 'full', got {self.recompute!r}")
        try:  # kept whatever the mode (a search's base plan carries them to its selective rows)
            object.__setattr__(self, "recompute_modules", parse_modules(self.recompute_modules))
        except SpecError as err:
            raise SpecError(f"Plan.recompute_modules {self.recompute_modules!r}: {err}") from None
        try:
            object.__setattr__(
                self, "offload_modules", parse_modules(self.offload_modules, OFFLOAD_MODULES, what="offload")
            )
        except SpecError as err:
            raise SpecError(f"Plan.offload_modules {self.offload_modules!r}: {err}") from None
        if "attn_proj" in self.offload_modules and "core_attn" not in self.offload_modules:  # Megatron-core's check
            raise SpecError("offload module attn_proj needs core_attn (they share the attention output)")
        if "moe_act" in self.recompute_modules.split("+") and not self.grouped_gemm:  # as Megatron-core checks
            raise SpecError("recompute module moe_act needs grouped_gemm (--moe-grouped-gemm), as in Megatron-core")
        try:
            parse_order(self.order)
        except TopologyError as err:
            raise SpecError(str(err)) from None
        if self.pp_layout:
            self._take_layout_summary()

    def _take_layout_summary(self) -> None:
        """Set vpp, the first / last stage layers and the embedding / loss placement from pp_layout
        (parallel.core.pipeline_layout.plan_split; its layer total is validate's to check against the
        model). SpecError where the layout is malformed or a field set apart from its default says
        otherwise: vpp, first_stage_layers and last_stage_layers against the layout's vpp and first /
        last rank's layers, the embedding / loss in the split (the layout places them itself)."""
        layout = parse_layout(self.pp_layout, self.pp)
        summary, _ = plan_split(layout)
        ranks = layout.rank_layers()
        said = {
            "vpp": (self.vpp, layout.vpp, self.vpp != 1),
            "first_stage_layers": (self.first_stage_layers, ranks[0], self.first_stage_layers is not None),
            "last_stage_layers": (self.last_stage_layers, ranks[-1], self.last_stage_layers is not None),
            "embedding_in_split": (self.embedding_in_split, False, self.embedding_in_split),
            "loss_in_split": (self.loss_in_split, False, self.loss_in_split),
        }
        for name, (given, truth, set_apart) in said.items():
            if set_apart and given != truth:
                raise SpecError(
                    f"Plan.{name} {given!r} contradicts pp_layout {self.pp_layout!r}, which gives {truth!r} at pp {self.pp}"
                )
        for name, value in summary.items():
            object.__setattr__(self, name, value)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> int:
        """Microbatches per optimizer step on each pipeline: global_batch / (dp * micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def cp_exchange(self) -> str:
        """The CP exchange in effect: cp_kind, or the default at cp 1 (where nothing is exchanged)."""
        return self.cp_kind if self.cp > 1 else CP_KINDS[0]

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: etp, else tp."""
        return self.tp if self.etp is None else self.etp

    def topology(self, gpus_per_node: int) -> Topology:
        return Topology(
            dp=self.dp,
            pp=self.pp,
            cp=self.cp,
            tp=self.tp,
            gpus_per_node=gpus_per_node,
            order=self.order,
            ep=self.ep,
            etp=self.expert_tp,
        )

    def label(self) -> str:
        """A short human name: every setting that differs from the default, e.g. 'DP16 TP4+SP ZeRO-3 ovl:tp,dp,ag'."""
        words: dict[str, list[str]] = {"overlap": [], "batch": []}
        for spec in PLAN_FIELDS:
            word = spec.knob.token(self) if spec.knob.token else ""
            if word:
                words.setdefault(spec.knob.group, []).append(word)
        overlaps, batch = words.pop("overlap"), words.pop("batch")  # the batch, then the overlaps, last
        text = (
            [w for group in words.values() for w in group] + batch + (["ovl:" + ",".join(overlaps)] if overlaps else [])
        )
        return " ".join(text)

    @property
    def uneven(self) -> bool:
        """Whether the pipeline's first or last stage holds another number of layers than the rest."""
        return (
            self.first_stage_layers is not None
            or self.last_stage_layers is not None
            or self.embedding_in_split
            or self.loss_in_split
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        """A plan from its JSON object (plan_from_values: unknown keys named, missing ones defaulted)."""
        if not isinstance(data, dict):
            raise SpecError(f"a plan must be a JSON object, got {type(data).__name__}")
        return plan_from_values(data, style="json")

    @property
    def flash(self) -> bool:
        """Whether attention keeps no s x s scores (every kernel but 'unfused')."""
        return self.attention != "unfused"


PLAN_FIELDS = field_specs(Plan)  # the schema: every cost-changing field of a plan, in declaration order
PLAN_DEFAULTS = {spec.name: spec.default for spec in PLAN_FIELDS}
_BY_NAME = {spec.name: spec for spec in PLAN_FIELDS}
_BY_URL = {spec.knob.url: spec for spec in PLAN_FIELDS}
STYLES = ("json", "url", "flag")  # how the caller names fields: Plan's names, URL keys, CLI flags


def _where(spec: FieldSpec, style: str, text: Any) -> str:
    if style == "url":
        return f"URL parameter {spec.knob.url}={text!r}"
    if style == "flag":
        return f"{spec.knob.flag} {text!r}"
    return f"plan.{spec.name} {text!r}"


def parse_value(spec: FieldSpec, text: Any, style: str = "json") -> Any:
    """A field's value from JSON (typed) or from text (a URL, a CLI flag, an editor cell): '0'/'1'/'true'/
    'false' for flags, '' (or 'null'/'none' where the field may be unset) for None, digits for ints.
    SpecError naming the key as the caller spells it."""
    kind = spec.knob.kind
    if isinstance(text, str):
        t = text.strip()
        if kind in OPTIONAL_KINDS and t.lower() in ("", "null", "none"):
            return None
        if kind == "opt_float":
            try:
                return float(t)
            except ValueError:
                raise SpecError(f"{_where(spec, style, text)} must be a number") from None
        if kind in ("bool", "opt_bool"):
            if t.lower() not in ("0", "1", "true", "false"):
                raise SpecError(f"{_where(spec, style, text)} must be 0 or 1")
            return t.lower() in ("1", "true")
        if kind in ("int", "opt_int") or (kind == "choice" and isinstance(spec.knob.choices[0], int)):
            try:
                return int(t)
            except ValueError:
                raise SpecError(f"{_where(spec, style, text)} must be an integer") from None
        return t
    if isinstance(text, float) and text.is_integer() and kind in ("int", "opt_int"):  # a numeric editor cell
        return int(text)
    if isinstance(text, int) and not isinstance(text, bool) and kind in ("bool", "opt_bool") and text in (0, 1):
        return bool(text)
    return text


def plan_from_values(values: Mapping[str, Any], style: str = "json") -> Plan:
    """The one constructor of a Plan from named values (JSON, a URL, an editor row, importers): each
    key as `style` names it (STYLES), each value typed or text; fields not given take their declared
    default, except global_batch, which then is dp x micro_batch x pp (one microbatch per stage).
    SpecError naming an unknown key or a bad value as the caller spells it."""
    by = _BY_URL if style == "url" else _BY_NAME
    unknown = sorted(set(values) - set(by))
    if unknown:
        raise SpecError(f"unknown plan field(s): {', '.join(map(str, unknown))}")
    fields = {}
    for key, text in values.items():
        spec = by[key]
        value = parse_value(spec, text, style)
        problem = value_error(spec, value)
        if problem:
            raise SpecError(f"{_where(spec, style, text)} {problem}")
        fields[spec.name] = value
    if "global_batch" not in fields:
        fields["global_batch"] = fields.get("dp", 1) * fields.get("micro_batch", 1) * fields.get("pp", 1)
    return Plan(**fields)


def plan_values(plan: Plan, style: str = "json", *, changed_only: bool = False) -> dict[str, Any]:
    """A plan's fields keyed as `style` names them (typed values); `changed_only`: only those that
    differ from the declared defaults (global_batch: from dp x micro_batch x pp)."""
    out = {}
    for spec in PLAN_FIELDS:
        value = getattr(plan, spec.name)
        default = plan.dp * plan.micro_batch * plan.pp if spec.name == "global_batch" else spec.default
        if changed_only and value == default and type(value) is type(default):
            continue
        out[spec.knob.url if style == "url" else spec.name] = value
    return out


# The fields a PlanColumns always holds one value a row of (arrays); every other plan field is one
# value shared by all rows or an array, defaulting as Plan declares it (PLAN_FIELDS).
COLUMN_ARRAYS = ("dp", "tp", "pp", "cp", "sp", "micro_batch", "vpp", "zero", "recompute")


class _PlanColumnsMethods:
    """What PlanColumns computes from its fields (its fields come from the schema, below)."""

    @property
    def flash(self) -> bool:
        return self.attention != "unfused"

    @property
    def expert_tp(self) -> Any:
        return self.tp if self.etp is None else self.etp

    @property
    def world_size(self) -> np.ndarray:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> np.ndarray:
        return self.global_batch // (self.dp * self.micro_batch)

    def __len__(self) -> int:
        return len(self.dp)

    @cached_property
    def memo(self) -> dict:
        """Results that depend on these plans and hashable arguments alone (e.g. which groups cross
        nodes on a cluster), kept for the other formulas of the same evaluation."""
        return {}

    def distinct(self, keys: tuple[str, ...]) -> tuple["PlanColumns", np.ndarray]:
        """(the plans of the distinct rows over the fields `keys` -- the other per-row fields taken from
        each one's first row --, each plan's index into them): what depends on those fields alone is
        computed once per distinct row and spread back with the index."""
        memo = self.memo.setdefault(("distinct", keys), {})
        if "rows" not in memo:
            n = len(self)
            key = np.zeros(n, dtype=np.int64)
            for name in keys:
                if getattr(self, name) is None:  # a field no row sets (first / last stage layers)
                    continue
                values = np.broadcast_to(np.asarray(getattr(self, name)), (n,))
                if ("codes", name) in self.memo:  # the integer codes its maker kept beside the names
                    values = self.memo[("codes", name)]
                elif values.dtype.kind not in "iub":  # a name: its index among the known ones (no string sort)
                    names = CODED_FIELDS.get(name) or tuple(np.unique(values))
                    codes = np.zeros(n, dtype=np.int64)
                    for i, known in enumerate(names):
                        codes[values == known] = i
                    values = codes
                values = values.astype(np.int64)
                key = key * (int(values.max(initial=0)) + 1) + values
            first, inverse = first_and_inverse(key)
            fields = {}
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                fields[f.name] = value[first] if isinstance(value, np.ndarray) and value.shape == (n,) else value
            memo["rows"] = (PlanColumns(**fields), inverse.reshape(-1))
        return memo["rows"]

    def distinct_degrees(self, *, with_ep: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct (dp, tp, pp, cp[, ep, etp]) rows, each plan's index into them): what depends on
        the degrees alone (the rank layout; the expert layout also on ep and etp) is computed once per
        distinct row, not once per plan."""
        memo = self.memo.setdefault(("distinct_degrees", with_ep), {})
        if "rows" not in memo:
            cols = [np.asarray(x, dtype=np.int64) for x in (self.dp, self.tp, self.pp, self.cp)]
            if with_ep:
                cols.append(np.broadcast_to(np.asarray(self.ep, dtype=np.int64), cols[0].shape))
                cols.append(np.broadcast_to(np.asarray(self.expert_tp, dtype=np.int64), cols[0].shape))
            key = cols[0]
            for c in cols[1:]:  # one int64 key per row: a 1-D unique is far faster than unique(axis=0)
                key = key * (int(c.max()) + 1) + c
            first, inverse = first_and_inverse(key)
            memo["rows"] = (np.stack(cols, axis=1)[first], inverse.reshape(-1))
        return memo["rows"]


def first_and_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the index of each distinct value's first row, each row's index into them) of an int key:
    np.unique's return_index and return_inverse in first-seen order, by hashing (pandas.factorize)
    rather than sorting -- three times faster on a search's 400,000 rows."""
    inverse, _ = pd.factorize(key)
    if not len(inverse):
        return inverse, inverse
    seen = np.maximum.accumulate(inverse)  # codes are numbered as first seen: a new one lifts the running max
    return np.flatnonzero(np.r_[True, seen[1:] > seen[:-1]]), inverse


PlanColumns = dataclasses.make_dataclass(
    "PlanColumns",
    [(name, np.ndarray) for name in COLUMN_ARRAYS]
    + [(f.name, Any, dataclasses.field(default=f.default)) for f in PLAN_FIELDS if f.name not in COLUMN_ARRAYS],
    bases=(_PlanColumnsMethods,),
    frozen=True,
)
PlanColumns.__module__ = __name__  # make_dataclass names it in `types` before Python 3.12
PlanColumns.__doc__ = """Many plans at once, one numpy array per field (the same names and defaults as Plan: generated
from PLAN_FIELDS), so the plan model's formulas (parallel.core.memory / comm / perf, written with
parallel.core.vector) evaluate every candidate of a search in one call. COLUMN_ARRAYS hold one value a
row; every other field is one value shared by all rows (ep, etp, cp_kind, moe_dispatcher and the
first / last stage layers may also be arrays; first / last: -1 where a row splits evenly)."""


def equals(plan: Plan | PlanColumns, name: str, value: str) -> Any:
    """plan.<name> == value for a field of CODED_FIELDS: a bool for a Plan, one per row for a
    PlanColumns -- from the integer codes its maker kept beside the names where it did, once per
    evaluation (comparing 400,000 strings costs 8 ms, and the formulas ask a dozen times)."""
    field = getattr(plan, name)
    if not isinstance(plan, PlanColumns) or np.ndim(field) == 0:  # a Plan, or one name shared by every row
        return field == value

    def compute():
        codes = plan.memo.get(("codes", name))
        if codes is None or value not in CODED_FIELDS[name]:
            return np.asarray(field) == value
        return codes == CODED_FIELDS[name].index(value)

    return memoized(plan, ("equals", name, value), compute)


def memoized(plan: Plan | PlanColumns, key: Any, compute: Any) -> Any:
    """compute(), kept in a PlanColumns' memo under `key` for the other formulas of the same evaluation
    (a Plan computes it each time: it costs nothing there)."""
    if not isinstance(plan, PlanColumns):
        return compute()
    if key not in plan.memo:
        plan.memo[key] = compute()
    return plan.memo[key]


def stage_layer_counts(layers: int, plan: Plan | PlanColumns) -> tuple[Any, Any, Any]:
    """(first, every middle, last) stage's transformer layers: see _stage_layer_counts."""
    return memoized(plan, ("stage_layer_counts", layers), lambda: _stage_layer_counts(layers, plan))


def _stage_layer_counts(layers: int, plan: Plan | PlanColumns) -> tuple[Any, Any, Any]:
    """Transformer layers on the (first, every middle, last) pipeline stage, as Megatron-LM builds
    them (megatron/core/transformer/transformer_block.py, get_num_layers_to_build): the given first /
    last counts and the rest split evenly over the other stages; with the embedding / loss in the
    split, (layers + those) / pp slots a stage, one of them not a layer on the first / last stage;
    else layers / pp each. At pp 1 the one stage holds every layer. Arrays for a PlanColumns (rows
    a count cannot split evenly get a fractional middle: validate refuses them)."""
    p = plan.pp
    first_set, last_set = plan.first_stage_layers, plan.last_stage_layers
    if isinstance(plan, PlanColumns):
        f = np.asarray(-1 if first_set is None else first_set)
        lst = np.asarray(-1 if last_set is None else last_set)
        has_f, has_l = f >= 0, lst >= 0
    else:
        f, lst = (first_set if first_set is not None else -1), (last_set if last_set is not None else -1)
        has_f, has_l = first_set is not None, last_set is not None
    e, ls = int(plan.embedding_in_split), int(plan.loss_in_split)
    even = layers / p if isinstance(plan, PlanColumns) else layers // p if layers % p == 0 else layers / p
    slots = (layers + e + ls) / p
    rest = layers - np.where(has_f, f, 0) - np.where(has_l, lst, 0)
    left = p - np.asarray(has_f, dtype=np.int64) - np.asarray(has_l, dtype=np.int64)
    uneven_mid = np.where(left > 0, rest / np.maximum(left, 1), 0.0)
    explicit = np.asarray(has_f) | np.asarray(has_l)
    middle = np.where(explicit, uneven_mid, slots if (e or ls) else even)
    first = np.where(has_f, f, np.where(explicit, uneven_mid, slots - e if (e or ls) else even))
    last = np.where(has_l, lst, np.where(explicit, uneven_mid, slots - ls if (e or ls) else even))
    one = p == 1
    first = np.where(one, layers, first)
    last = np.where(one, layers, last)
    if not isinstance(plan, PlanColumns):
        return _num(first), _num(middle), _num(last)
    return first.astype(np.float64), middle.astype(np.float64), last.astype(np.float64)


def _num(x: Any) -> int | float:
    """A 0-d result as a Python int when whole, else a float."""
    x = float(x)
    return int(x) if x.is_integer() else x


def layers_on_stage(layers: int, plan: Plan | PlanColumns, stage: Any) -> Any:
    """Transformer layers on pipeline stage `stage` (an int, or one per row): stage_layer_counts'."""
    first, middle, last = stage_layer_counts(layers, plan)
    if isinstance(plan, PlanColumns) or np.ndim(stage):
        return np.where(stage == 0, first, np.where(stage == plan.pp - 1, last, middle))
    return first if stage == 0 else last if stage == plan.pp - 1 else middle


def recomputes(plan: Plan | PlanColumns, module: str) -> Any:
    """Whether selective recomputation recomputes `module` (RECOMPUTE_MODULES): recompute "selective"
    with the module among plan.recompute_modules (one bool per row for a PlanColumns)."""
    if module not in RECOMPUTE_MODULES:
        raise ValueError(f"recompute module must be one of {', '.join(RECOMPUTE_MODULES)}, got {module!r}")
    return equals(plan, "recompute", "selective") & (module in plan.recompute_modules.split("+"))


def offloaded_modules(plan: Plan | PlanColumns) -> list[str]:
    """The modules whose saved activations the plan offloads to host memory (OFFLOAD_MODULES' names)."""
    return [] if plan.offload_modules == NO_OFFLOAD else plan.offload_modules.split("+")


def recomputed_share(layers: int, plan: Plan | PlanColumns) -> Any:
    """The share of layers whose forward is recomputed: 1 under recompute "full" (every layer, or
    recompute_layers of each virtual stage chunk of layers / (pp x vpp)), 0 otherwise."""
    full = equals(plan, "recompute", "full")
    if plan.recompute_layers is None:
        return np.where(full, 1.0, 0.0) if isinstance(plan, PlanColumns) else float(full)
    chunk = np.maximum(layers / (plan.pp * plan.vpp), 1.0)
    share = np.minimum(plan.recompute_layers, chunk) / chunk
    return np.where(full, share, 0.0) if isinstance(plan, PlanColumns) else float(share) * full
