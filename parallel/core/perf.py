"""Step-time estimate: model FLOPs, the pipeline bubble and exposed communication.

FLOPs — Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", Sec. 5.1 / Eq. (3): a forward pass of one layer costs 24Bsh^2 + 4Bs^2h
(GEMMs with 12h^2 weights, and the QK^T and scores@V products), the logit layer 2BshV, a backward
pass twice the forward, so without recomputation

    F = 72 B s L h^2 (1 + s/(6h) + V/(12 L h))

and with full recomputation (one more forward of every layer) Eq. (3)'s
96 B s L h^2 (1 + s/(6h) + V/(16 L h)). We compute the same sum term by term so that GQA and
SwiGLU (other GEMM widths) and selective recomputation (one more forward of the attention core
only, 4Bs^2h per layer; Korthikanti et al. 2022, Sec. 5) fall out of it. MFU counts model FLOPs
(no recomputation); the GPU executes hardware FLOPs (with it).

Time — the GPU computes its share of hardware FLOPs at `mfu` of peak; TP, CP and PP traffic sits
on the critical path of every microbatch, so the pipeline stretches compute and that traffic
together by the bubble (p - 1)/(v m) (Narayanan et al. 2021, Sec. 2.2); DP traffic follows the
last backward, with `dp_overlap` of it hidden (an explicit assumption: 0 = none hidden, Megatron-LM's
default without --overlap-grad-reduce); rows the comm model marks overlapped cost nothing, and ring
attention's K/V transfers cost only what the attention core's compute does not hide (Liu et al. 2023,
Sec. 3: each block's transfer runs while the block in hand is attended).

Every function takes one Plan or a PlanColumns (the search).

Pure: stdlib and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallel.core.comm import DIMS, CommOptions, exposed_seconds_by_dim, seconds_by_dim
from parallel.core.memory import AnyPlan
from parallel.core.specs import Cluster, Model
from parallel.core.vector import maximum, where


@dataclass(frozen=True)
class PerfOptions:
    mfu: float = 0.5  # fraction of peak FLOP/s the GPU's compute reaches (GEMM efficiency)
    dp_overlap: float = 0.0  # fraction of DP communication hidden behind backward


def layer_forward_flops(model: Model, tokens_per_seq: int, batch: int) -> dict[str, float]:
    """Forward FLOPs of one (average) layer for `batch` sequences: GEMMs and the attention core (2 FLOPs
    per MAC). A MoE model's MLP counts the weights a token passes through (the active parameters)."""
    h, f, k, s = model.hidden, model.ffn_hidden, model.kv_hidden, tokens_per_seq
    mlp = model.mlp_matrix_params(f)  # 8h^2 for GPT
    if model.experts:  # a token passes top_k routed experts and the shared ones, on the MoE layers
        share = model.moe_share
        routed = model.top_k * model.mlp_matrix_params(model.expert_width) + model.mlp_matrix_params(
            model.shared_expert_ffn
        )
        mlp = mlp * (1 - share) + (routed + h * model.experts) * share  # + the router
    q = model.q_hidden
    gemm_weights = h * (q + 2 * k) + q * h + mlp  # 12h^2 for GPT
    return {"gemm": 2 * batch * s * gemm_weights, "attention": 4 * batch * s * s * q}


def flops_per_step(model: Model, plan: AnyPlan) -> dict[str, Any]:
    """Model FLOPs (for MFU) and hardware FLOPs (with recomputation) of one step over all GPUs, and
    the attention core's share of the hardware FLOPs (what ring attention's transfers overlap)."""
    B, s, L = plan.global_batch, model.seq_len, model.layers
    layer = layer_forward_flops(model, s, B)
    fwd = L * (layer["gemm"] + layer["attention"]) + 2 * B * s * model.hidden * model.vocab
    model_flops = 3 * fwd
    extra = where(
        plan.recompute == "selective",
        L * layer["attention"],
        where(plan.recompute == "full", L * (layer["gemm"] + layer["attention"]), 0.0),
    )
    passes = 3.0 + where(plan.recompute == "none", 0.0, 1.0)  # forward, backward (2x), a recomputed forward
    return {
        "model_flops": model_flops,
        "hardware_flops": model_flops + extra,
        "attention_flops": L * layer["attention"] * passes,
    }


def attention_seconds(
    model: Model, plan: AnyPlan, cluster: Cluster, perf: PerfOptions = PerfOptions(), flops: dict | None = None
) -> Any:
    """Seconds of the attention core's compute on one GPU per step, at `perf.mfu` of peak: what ring
    attention's K/V transfers run beside (comm.CommTerm.hidden_by). `flops`: flops_per_step's, if at hand."""
    flops = flops or flops_per_step(model, plan)
    return flops["attention_flops"] / plan.world_size / (cluster.peak_flops * perf.mfu)


def bubble_fraction(plan: AnyPlan) -> Any:
    """(p - 1)/(v m): idle time of the pipeline relative to its ideal time."""
    return where(plan.pp == 1, 0.0, (plan.pp - 1) / (plan.vpp * maximum(plan.microbatches, 1)))


def step_time(
    model: Model,
    plan: AnyPlan,
    cluster: Cluster,
    perf: PerfOptions = PerfOptions(),
    comm: CommOptions = CommOptions(),
    comm_rows: list[dict] | None = None,
) -> dict[str, Any]:
    """Seconds per step and its parts: compute, bubble, exposed comm per dim; plus achieved MFU.
    `plan` may be a PlanColumns (every value is then an array); `comm_rows`: comm_per_step's rows
    when the caller has them already."""
    flops = flops_per_step(model, plan)
    compute = flops["hardware_flops"] / plan.world_size / (cluster.peak_flops * perf.mfu)
    hide = {"attention": attention_seconds(model, plan, cluster, perf, flops)}  # what ring CP hides behind
    if comm_rows is not None:
        exposed = {d: 0.0 for d in DIMS} | seconds_by_dim(comm_rows, exposed_only=True, hide=hide)
    else:
        exposed = exposed_seconds_by_dim(model, plan, cluster, comm, hide=hide)
    exposed["dp"] = exposed["dp"] * (1.0 - perf.dp_overlap)
    critical = compute + exposed["tp"] + exposed["sp"] + exposed["cp"] + exposed["ep"] + exposed["pp"]
    bubble = critical * bubble_fraction(plan)
    total = critical + bubble + exposed["dp"]
    return {
        "step_time_s": total,
        "compute_s": compute,
        "bubble_s": bubble,
        **{f"exposed_{d}_s": t for d, t in exposed.items()},
        "model_flops": flops["model_flops"],
        "hardware_flops": flops["hardware_flops"],
        "mfu": flops["model_flops"] / (total * plan.world_size * cluster.peak_flops),
    }
