"""Communication per training step, per parallel dimension, by the alpha-beta ring model.

Time of one collective over n ranks of a buffer of S bytes on a link of bandwidth B (per GPU per
direction) and latency alpha (Thakur et al. 2005, ring algorithms; the nccl-tests bus-bandwidth
factors are the same (n-1)/n terms):

    all-reduce                     2(n-1)/n * S/B + 2(n-1) alpha
    all-gather, reduce-scatter     (n-1)/n * S/B + (n-1) alpha     (S = the full, gathered buffer)
    all-to-all                     (n-1)/n * S/B + (n-1) alpha
    send/recv                      S/B + alpha

A group whose ranks span nodes is bound by the inter-node link. Volumes per step, for the GPU with
the most layers of work (an interior pipeline stage), with m microbatches of b sequences:

    TP, no SP   4 all-reduces per layer per microbatch of b*s*h elements (2 forward: after attention
                and MLP; 2 backward: the conjugate f operators) — Shoeybi et al. 2019, Sec. 3.
    TP + SP     forward 2 all-gathers + 2 reduce-scatters, backward 2 + 2, of the same b*s*h buffer:
                the same volume as the all-reduces (Korthikanti et al. 2022, Sec. 4.2.2). Megatron-LM
                also re-gathers each column-parallel GEMM's sequence-sharded input in backward for
                the weight gradient (2 more all-gathers per layer), overlapped with the input-gradient
                GEMM: listed as its own row, marked overlapped.
    full recompute repeats the forward collectives once more.
    PP          one send of the boundary activation b*s*h (/t under SP) forward and one of its
                gradient backward per microbatch and virtual stage (Narayanan et al. 2021).
    DP          the gradients of this GPU's parameters, reduced over the dp*cp ranks that hold the
                same weights: all-reduce for ZeRO 0; reduce-scatter + all-gather of the updated
                weights for ZeRO 1/2; ZeRO 3 also all-gathers the weights for forward and again for
                backward (Rajbhandari et al. 2020, Sec. 7). ZeRO 2/3 keep only a shard of the
                gradients, so with m microbatches they reduce-scatter after every microbatch's
                backward, and ZeRO 3 gathers the weights for every microbatch (as DeepSpeed does);
                ZeRO 0/1 accumulate full gradients and reduce once. Issued in buckets of `bucket_bytes`.
    CP          all-gathered K/V: per layer per microbatch an all-gather of K and V (2*b*s*k
                elements, gathered) forward, a reduce-scatter of their gradients backward
                (Dubey et al. 2024, Sec. 3.3.2).

Pure: stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import params_per_stage
from .plan import Plan
from .specs import Cluster, Link, Model

MiB = 2**20


@dataclass(frozen=True)
class CommOptions:
    bucket_bytes: int = 25 * MiB  # gradient bucket (PyTorch DDP's default bucket_cap_mb = 25)
    sp_regather: bool = True  # Megatron's backward re-gather of SP inputs (overlapped)


def collective_seconds(op: str, n: int, nbytes: float, link: Link) -> float:
    """Seconds for one collective of `nbytes` over `n` ranks on `link` (ring alpha-beta model)."""
    if n <= 1 and op != "send_recv":
        return 0.0
    a, bw = link.latency_s, link.bandwidth_bytes_per_s
    if op == "all_reduce":
        return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * a
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes / bw + (n - 1) * a
    if op == "send_recv":
        return nbytes / bw + a
    raise ValueError(f"unknown collective {op!r}")


def _link_of(plan: Plan, cluster: Cluster, dims: tuple[str, ...]) -> str:
    """'inter' if any group over `dims` (ranks that differ only in those coordinates) spans nodes."""
    topo = plan.topology(cluster.gpus_per_node)
    grid = topo.grid  # [dp, pp, cp, tp]
    axes = [("dp", "pp", "cp", "tp").index(d) for d in dims]
    rest = [i for i in range(4) if i not in axes]
    groups = grid.transpose(rest + axes).reshape(-1, math.prod(grid.shape[i] for i in axes))
    nodes = groups // cluster.gpus_per_node
    return "inter" if (nodes.min(axis=1) != nodes.max(axis=1)).any() else "intra"


def comm_per_step(model: Model, plan: Plan, cluster: Cluster, opts: CommOptions = CommOptions()) -> list[dict]:
    """Rows {dim, collective, calls, bytes_per_call, link, seconds, overlapped} for one GPU's step."""
    p, act = plan, model.dtype_bytes
    m, v = max(p.microbatches, 1), p.vpp
    layers = model.layers // p.pp  # layers on one GPU (all its virtual chunks)
    s_q = model.seq_len // p.cp
    rows: list[dict] = []

    def add(dim, op, calls, nbytes, dims, n, overlapped=False):
        if calls <= 0 or n <= 1:
            return
        link = _link_of(p, cluster, dims)
        per_call = collective_seconds(op, n, nbytes, cluster.inter if link == "inter" else cluster.intra)
        rows.append({"dim": dim, "collective": op, "calls": int(calls), "bytes_per_call": int(nbytes),
                     "link": link, "seconds": calls * per_call, "overlapped": overlapped})

    fwd_passes = 2 if p.recompute == "full" else 1
    tp_bytes = p.micro_batch * s_q * model.hidden * act
    if not p.sp:
        add("tp", "all_reduce", (2 * fwd_passes + 2) * layers * m, tp_bytes, ("tp",), p.tp)
    else:
        add("sp", "all_gather", (2 * fwd_passes + 2) * layers * m, tp_bytes, ("tp",), p.tp)
        add("sp", "reduce_scatter", (2 * fwd_passes + 2) * layers * m, tp_bytes, ("tp",), p.tp)
        if opts.sp_regather:
            add("sp", "all_gather", 2 * layers * m, tp_bytes, ("tp",), p.tp, overlapped=True)

    if p.cp > 1:
        kv_bytes = 2 * p.micro_batch * model.seq_len * model.kv_hidden_per_tp_rank(p.tp) * act
        add("cp", "all_gather", fwd_passes * layers * m, kv_bytes, ("cp",), p.cp)
        add("cp", "reduce_scatter", layers * m, kv_bytes, ("cp",), p.cp)

    if p.pp > 1:
        pp_bytes = tp_bytes / (p.tp if p.sp else 1)
        add("pp", "send_recv", 2 * m * v, pp_bytes, ("pp",), p.pp)

    nd = p.dp * p.cp
    if nd > 1:
        params = max(params_per_stage(model, p, s) for s in range(p.pp))
        grad_bytes = params * act
        weight_bytes = params * model.dtype_bytes

        def bucketed(op, total, passes=1):
            calls = max(1, math.ceil(total / opts.bucket_bytes))
            add("dp", op, calls * passes, total / calls, ("dp", "cp"), nd)

        if p.zero == 0:
            bucketed("all_reduce", grad_bytes)
        else:
            bucketed("reduce_scatter", grad_bytes, passes=m if p.zero >= 2 else 1)
            bucketed("all_gather", weight_bytes, passes=2 * m if p.zero == 3 else 1)
    return rows


def seconds_by_dim(rows: list[dict], *, exposed_only: bool = False) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in rows:
        if exposed_only and row["overlapped"]:
            continue
        out[row["dim"]] = out.get(row["dim"], 0.0) + row["seconds"]
    return out
