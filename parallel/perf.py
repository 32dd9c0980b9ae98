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
default without --overlap-grad-reduce); rows the comm model marks overlapped cost nothing.

Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import CommOptions, comm_per_step
from .plan import Plan
from .specs import Cluster, Model


@dataclass(frozen=True)
class PerfOptions:
    mfu: float = 0.5  # fraction of peak FLOP/s the GPU's compute reaches (GEMM efficiency)
    dp_overlap: float = 0.0  # fraction of DP communication hidden behind backward


def layer_forward_flops(model: Model, tokens_per_seq: int, batch: int) -> dict[str, float]:
    """Forward FLOPs of one layer for `batch` sequences: GEMMs and the attention core (2 FLOPs per MAC)."""
    h, f, k, s = model.hidden, model.ffn_hidden, model.kv_hidden, tokens_per_seq
    gemm_weights = h * (h + 2 * k) + h * h + (3 if model.gated_mlp else 2) * h * f  # 12h^2 for GPT
    return {"gemm": 2 * batch * s * gemm_weights, "attention": 4 * batch * s * s * h}


def flops_per_step(model: Model, plan: Plan) -> dict[str, float]:
    """Model FLOPs (for MFU) and hardware FLOPs (with recomputation) of one step over all GPUs."""
    B, s, L = plan.global_batch, model.seq_len, model.layers
    layer = layer_forward_flops(model, s, B)
    fwd = L * (layer["gemm"] + layer["attention"]) + 2 * B * s * model.hidden * model.vocab
    model_flops = 3 * fwd
    extra = {"none": 0.0, "selective": L * layer["attention"],
             "full": L * (layer["gemm"] + layer["attention"])}[plan.recompute]
    return {"model_flops": model_flops, "hardware_flops": model_flops + extra}


def bubble_fraction(plan: Plan) -> float:
    """(p - 1)/(v m): idle time of the pipeline relative to its ideal time."""
    if plan.pp == 1:
        return 0.0
    return (plan.pp - 1) / (plan.vpp * max(plan.microbatches, 1))


def step_time(model: Model, plan: Plan, cluster: Cluster, perf: PerfOptions = PerfOptions(),
              comm: CommOptions = CommOptions(), comm_rows: list[dict] | None = None) -> dict[str, float]:
    """Seconds per step and its parts: compute, bubble, exposed comm per dim; plus achieved MFU."""
    rows = comm_rows if comm_rows is not None else comm_per_step(model, plan, cluster, comm)
    flops = flops_per_step(model, plan)
    compute = flops["hardware_flops"] / plan.world_size / (cluster.peak_flops * perf.mfu)
    exposed = {d: 0.0 for d in ("tp", "sp", "cp", "pp", "dp")}
    for row in rows:
        if not row["overlapped"]:
            exposed[row["dim"]] += row["seconds"]
    exposed["dp"] *= 1.0 - perf.dp_overlap
    critical = compute + exposed["tp"] + exposed["sp"] + exposed["cp"] + exposed["pp"]
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
