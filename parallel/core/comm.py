"""Communication per training step, per parallel dimension, by the alpha-beta ring model.

Time of one collective over n ranks of a buffer of S bytes on a link of bandwidth B (per GPU per
direction) and latency alpha (Thakur et al. 2005, ring algorithms; the nccl-tests bus-bandwidth
factors are the same (n-1)/n terms):

    all-reduce                     2(n-1)/n * S/B + 2(n-1) alpha
    all-gather, reduce-scatter     (n-1)/n * S/B + (n-1) alpha     (S = the full, gathered buffer)
    all-to-all                     (n-1)/n * S/B + (n-1) alpha
    send/recv                      S/B + alpha

A group whose ranks span NVLink domains is bound by the inter-domain link (a domain is a host on a
DGX/HGX, a rack of 72 GPUs on a GB200/GB300 NVL72: parallel.core.topology.Topology.domain_of). Volumes per step with m microbatches
of b sequences; each term has a `scope`: per layer of a stage, per microbatch of every stage, of the
first or the last stage only, or once per step. The analytic step (comm_per_step, perf.step_time)
is of the last stage -- it has the most work: its layers, the output layer and the loss -- so the
first stage's terms count only when there is one stage; the calibrated model sums them per stage.

    TP, no SP   4 all-reduces per layer per microbatch of b*s*h elements (2 forward: after attention
                and MLP; 2 backward: the conjugate f operators) — Shoeybi et al. 2019, Sec. 3.
    TP + SP     forward 2 all-gathers + 2 reduce-scatters, backward 2 + 2, of the same b*s*h buffer:
                the same volume as the all-reduces (Korthikanti et al. 2022, Sec. 4.2.2). Multi-latent
                attention gathers its latents instead of h on the attention's input side
                (Model.mla_latent_width: q_l + kv_l + d_r, 2,112 for DeepSeek-V3's 7,168). Megatron-LM
                also re-gathers each column-parallel GEMM's sequence-sharded input in backward for
                the weight gradient (2 more all-gathers per layer), overlapped with the input-gradient
                GEMM: listed as its own row, marked overlapped.
    full recompute repeats the forward collectives once more; selective recompute of a dense layer's
                MLP ("mlp") its all-gather and reduce-scatter (all-reduce without SP), of a MoE block
                ("moe") its dispatch and combine.
    The ends of the model, per microbatch (Megatron-LM's VocabParallelEmbedding, output layer and
    vocab-parallel cross entropy; Shoeybi et al. 2019, Sec. 3): the first stage's embedding output is
    all-reduced over TP (reduce-scattered under SP, all-gathered back in backward); the last stage's
    output-layer input gradient is all-reduced (under SP its input is all-gathered forward -- and
    re-gathered in backward, overlapped as above -- and its gradient reduce-scattered); the loss takes
    two all-reduces of b*s fp32 values: the row max, then the target logit and the sum of exponentials
    together (Megatron-core's fused cross entropy, megatron/core/fusions/fused_cross_entropy.py; the
    unfused one makes the last two separate calls).
    Once per step: under SP, the gradients of the weights applied to s/t tokens (norms, the row-
    parallel biases, GPT's positions) summed over TP in one all-reduce (Korthikanti et al. 2022,
    Sec. 4.2.2); with GQA and t > kv heads, the K/V projection gradients of the TP ranks sharing a
    head; with pp > 1 and tied embeddings, the two copies' gradients (first and last stage, Megatron's
    embedding group); the loss all-reduced over the dp*cp ranks of the last stage.
    PP          one send of the boundary activation b*s*h (/t under SP) forward and one of its
                gradient backward per microbatch and virtual stage (Narayanan et al. 2021).
    DP          the gradients of this GPU's parameters, in the main-grads buffer's dtype (fp32 unless
                plan.main_grads is bf16: Megatron-LM reduces its fp32 main grads unless
                --grad-reduce-in-bf16), reduced over the dp*cp ranks that hold the same weights: all-reduce for ZeRO 0; reduce-scatter + all-gather of the updated
                weights for ZeRO 1/2; ZeRO 3 also all-gathers the weights for forward and again for
                backward (Rajbhandari et al. 2020, Sec. 7). ZeRO 2/3 keep only a shard of the
                gradients, so with m microbatches they reduce-scatter after every microbatch's
                backward, and ZeRO 3 gathers the weights for every microbatch (as DeepSpeed does);
                ZeRO 0/1 accumulate full gradients and reduce once. Issued in buckets of `bucket_bytes`.
    CP          by plan.cp_kind, per layer per microbatch (k_t = k/min(t, kv_heads) the K/V width of
                one TP rank, s_q = s/cp):
                allgather  an all-gather of K and one of V (b*s*k_t elements each, gathered) forward,
                           a reduce-scatter of each of their gradients backward (Dubey et al. 2024,
                           Sec. 3.3.2; two calls, as TransformerEngine's AttnFuncWithCPAndKVAllGather);
                           a flash kernel keeps only the local K/V and gathers them again in
                           backward (two more all-gathers: parallel.core.memory);
                ring       cp-1 sends of the rank's K/V block (2*b*s_q*k_t) forward; backward the
                           blocks go round again (cp-1) and their dK/dV partial sums travel with
                           them back to their owners (cp sends) -- Liu et al. 2023, Ring Attention;
                           each transfer overlaps the attention of the block in hand, so only what
                           the attention core's compute cannot hide is exposed (`hidden_by`);
                ulysses    four all-to-alls forward (Q, K, V to head shards, the output back to
                           sequence shards) and their four conjugates backward, of b*s_q*q/t (Q,
                           output) and b*s_q*k/t (K, V) elements -- Jacobs et al. 2023, DeepSpeed-
                           Ulysses; the heads bound cp*t (validate).
                Full recompute repeats the forward exchange.
    EP          per MoE layer per microbatch, a token dispatch and a combine forward and their two
                conjugates backward (Lepikhin et al. 2021, GShard), by plan.moe_dispatcher as
                Megatron-core's token_dispatcher.py runs them (_ep_terms): alltoall and flex move the
                rank's routed copies (b*s/cp tokens /t under SP, x top_k, or the padded capacity:
                memory.routed_copies) over the EP group of Megatron's expert layout
                (Topology.group_ranks("ep")), then all-gather them over the expert-TP group (etp > 1);
                allgather gathers every token over the ETP x EP group and reduce-scatters the
                experts' output. An all-to-all's off-domain share goes through each rank's NIC
                (inter_bandwidth); flex (DeepEP, HybridEP) crosses to a domain once per token and
                fans out over NVLink there, and group-limited routing bounds the domains a token
                reaches (flex_inter_share; DeepSeek-V3 report Sec. 3.2.2).

Pure: stdlib and numpy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from parallel.core.memory import AnyPlan, cp_kind_flags, expert_load, max_params_per_stage, routed_copies
from parallel.core.plan import Plan, PlanColumns, layers_on_stage, recomputed_share, recomputes
from parallel.core.specs import Cluster, Link, Model
from parallel.core.topology import spanning
from parallel.core.vector import ceil, is_array, maximum, minimum, where

MiB = 2**20
DIMS = ("tp", "sp", "cp", "ep", "pp", "dp")  # the rows of a step, in the order reports list them


ENGINE_BUCKET_BYTES = 25 * MiB  # this project's engine: PyTorch DDP's default bucket_cap_mb = 25


@dataclass(frozen=True)
class CommOptions:
    # gradient bucket; None = Megatron-core's default of max(40M, 1M x dp) parameters per bucket
    # (megatron/core/distributed/distributed_data_parallel.py)
    bucket_bytes: int | None = None
    sp_regather: bool = True  # Megatron's backward re-gather of SP inputs (overlapped)

    def bucket_for(self, nd: Any, grad_bytes_per_param: int) -> Any:
        """Bytes per gradient bucket for a data-parallel group of `nd` ranks."""
        if self.bucket_bytes is not None:
            return self.bucket_bytes
        return maximum(40_000_000, 1_000_000 * nd) * grad_bytes_per_param


# Ring steps of each collective: all-reduce is a reduce-scatter then an all-gather (Thakur et al. 2005).
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}
UNIT_FACTOR_OPS = frozenset({"send", "recv", "send_recv", "broadcast", "reduce"})


def bus_factor(op: str, n: Any) -> Any:
    """nccl-tests' busbw/algbw factor (PERFORMANCE.md), which is also the ring model's bandwidth term:
    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; send/recv, broadcast, reduce 1.
    NaN for an unknown op or group size (None, NaN or < 1). `n` may be a numpy array."""
    if op in UNIT_FACTOR_OPS:
        return 1.0
    steps = RING_STEPS.get(op)
    if steps is None or n is None:
        return float("nan")
    if is_array(n):
        n = np.asarray(n, dtype=np.float64)
        return np.where(n >= 1, steps * (n - 1) / np.maximum(n, 1), np.nan)
    return steps * (n - 1) / n if n >= 1 else float("nan")  # NaN >= 1 is False


def ring_seconds(op: str, n: Any, nbytes: Any, bandwidth: Any, latency: Any) -> Any:
    """Seconds for one collective of `nbytes` over `n` ranks, ring alpha-beta model:
    bus_factor(op, n) * S/B + steps (n-1) alpha; 0 for a group of one (but send/recv: S/B + alpha).
    Every argument may be a numpy array (one value per plan)."""
    if op == "send_recv":
        return nbytes / bandwidth + latency
    if op not in RING_STEPS:
        raise ValueError(f"unknown collective {op!r}")
    t = bus_factor(op, n) * nbytes / bandwidth + RING_STEPS[op] * (n - 1) * latency
    return where(n > 1, t, 0.0)


def collective_seconds(op: str, n: int, nbytes: float, link: Link) -> float:
    """Seconds for one collective of `nbytes` over `n` ranks on `link` (ring alpha-beta model)."""
    if n <= 1 and op != "send_recv":
        return 0.0
    return ring_seconds(op, n, nbytes, link.bandwidth_bytes_per_s, link.latency_s)


def _layout_of(plan: Plan, cluster: Cluster, dims: tuple[str, ...]) -> tuple[bool, int]:
    """(whether any group over `dims` -- ranks that differ only in those coordinates -- spans NVLink
    domains, the fewest ranks such a group has in one domain: the NICs it crosses domains through at
    once). The domain of a rank is Topology.domain_of's (a host on a DGX, a rack on an NVL72)."""
    p = plan
    return _layout_cached(p.dp, p.tp, p.pp, p.cp, p.ep, p.expert_tp, p.order, cluster.domain_gpus, dims)


@functools.lru_cache(maxsize=1024)
def _topology_cached(dp: int, tp: int, pp: int, cp: int, ep: int, etp: int, order: str, domain: int):
    """(the Plan of these degrees, its Topology with NVLink domains of `domain` GPUs): built once for the
    several groups _layout_cached asks about (a Plan validates its 38 fields on construction)."""
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, order=order)
    return plan, replace(plan.topology(domain), nvlink_domain=domain)  # only the domains matter here


@functools.lru_cache(maxsize=4096)
def _layout_cached(
    dp: int, tp: int, pp: int, cp: int, ep: int, etp: int, order: str, domain: int, dims: tuple[str, ...]
) -> tuple[bool, int]:
    """_layout_of's answer, laid out once per degrees, order and domain size (searches ask again and again)."""
    if dims not in (("ep",), ("ep", "tp")):  # the dense layout's groups: from the strides (topology.spanning)
        return spanning({"dp": dp, "pp": pp, "cp": cp, "tp": tp}, order, domain, dims)
    # the MoE layers' own layout: EP groups, or ETP x EP groups
    plan, topo = _topology_cached(dp, tp, pp, cp, ep, etp, order, domain)
    n = plan.ep * (plan.expert_tp if dims == ("ep", "tp") else 1)
    laid_out = n > 1 and plan.world_size % (plan.expert_tp * plan.ep * plan.pp) == 0
    if not laid_out:
        return False, 1
    groups = topo.group_ranks("ep")
    if dims == ("ep", "tp"):  # the expert layout's tp is its fastest axis: each EP rank's etp neighbours
        etp = plan.expert_tp
        groups = groups[groups[:, 0] % etp == 0]
        groups = (groups[:, :, None] + np.arange(etp)[None, None, :]).reshape(len(groups), -1)
    domains = topo.domain_of(groups)
    crossing = domains.max(axis=1) != domains.min(axis=1)
    if not crossing.any():  # most groups of a search stay inside a domain: no sort needed
        return False, groups.shape[1]
    spans = 1 + (np.diff(np.sort(domains[crossing], axis=1), axis=1) != 0).sum(axis=1)
    return True, int((groups.shape[1] // spans).min())


def _layouts(plan: AnyPlan, cluster: Cluster, dims: tuple[str, ...]) -> tuple[Any, Any]:
    """_layout_of for one plan, or per row of a PlanColumns (each distinct (dp, tp, pp, cp) -- with ep
    for the EP groups -- laid out once)."""
    if not isinstance(plan, PlanColumns):
        return _layout_of(plan, cluster, dims)
    memo = plan.memo.setdefault(("layouts", cluster, dims), {})
    if "flags" not in memo:
        uniq, inverse = plan.distinct_degrees(with_ep=dims[0] == "ep")
        found = [  # laid out by the degrees alone (no Plan built: a search asks for thousands)
            _layout_cached(
                int(d),
                int(t),
                int(p),
                int(c),
                int(e[0]) if e else 1,
                int(e[1]) if e else int(t),
                plan.order,
                cluster.domain_gpus,
                dims,
            )
            for d, t, p, c, *e in uniq
        ]
        memo["flags"] = np.array([f for f, _ in found], dtype=bool)[inverse]
        memo["per_node"] = np.array([k for _, k in found], dtype=np.int64)[inverse]
    return memo["flags"], memo["per_node"]


def crosses_nodes(plan: AnyPlan, cluster: Cluster, dims: tuple[str, ...]) -> Any:
    """True where the groups over `dims` span NVLink domains (the scale-out link: nodes on a DGX,
    racks on an NVL72); for a PlanColumns one flag per plan."""
    return _layouts(plan, cluster, dims)[0]


def ranks_per_node(plan: AnyPlan, cluster: Cluster, dims: tuple[str, ...]) -> Any:
    """The fewest ranks a domain-spanning group over `dims` has in one domain (its NICs in use at once)."""
    return _layouts(plan, cluster, dims)[1]


@dataclass(frozen=True)
class CommTerm:
    """One kind of collective of a step: `calls` of `bytes_per_call` over the `n` ranks of the groups
    over `group` (values are arrays for a PlanColumns; calls 0 where the term does not apply)."""

    dim: str
    collective: str
    calls: Any
    bytes_per_call: Any
    group: tuple[str, ...]
    n: Any
    overlapped: bool = False
    # computation this term runs beside ("attention": the attention core of the same layers, ring CP):
    # exposed is what that computation cannot hide (perf.step_time)
    hidden_by: str = ""
    # where the calls are (SCOPES): "layer" every layer of a stage, "microbatch" every stage once per
    # microbatch, "first" / "last" that stage only (per microbatch), "step" once per step
    scope: str = "layer"
    what: str = ""  # what the calls carry when not the layers' own: "embedding", "loss", ...
    # each call both sends and receives on every rank (ring CP's K/V shift): bytes count the send, a
    # host-driven transport (gloo) pays the issue and the wait of two ops; NCCL runs the pair as one kernel
    exchange: bool = False
    # calls per unit of the scope: per layer and microbatch ("layer"), per microbatch ("microbatch",
    # "first", "last"), per step ("step"); `calls` is it times the last stage's units
    unit_calls: Any = None
    # a MoE dispatch that crosses to another NVLink domain once per domain a token has experts in
    # (the flex dispatcher): (where it applies, top_k, router groups, groups a token may use); its
    # off-domain bytes are flex_inter_share of the plain all-to-all's (term_seconds)
    fanout: Any = None


SCOPES = ("layer", "microbatch", "first", "last", "step")


def comm_terms(
    model: Model, plan: AnyPlan, opts: CommOptions = CommOptions(), *, dp: bool | None = None
) -> list[CommTerm]:
    """The volumes of the module docstring, per dimension, for the GPU with the most work: the last
    pipeline stage's (its layers: parallel.core.plan.layers_on_stage). `dp`: only the DP terms
    (True), all but them (False), or all (None)."""
    if dp:
        return _dp_terms(model, plan, opts)
    p, act = plan, model.dtype_bytes
    m, v = maximum(p.microbatches, 1), p.vpp
    layers = layers_on_stage(model.layers, p, p.pp - 1)  # layers on one GPU (all its virtual chunks)

    def per_layer(dim, op, unit, nbytes, group, n, **kw):  # `unit` calls per layer and microbatch
        return CommTerm(dim, op, unit * layers * m, nbytes, group, n, unit_calls=unit, **kw)

    s_q = model.seq_len // p.cp
    fwd_passes = 1 + recomputed_share(model.layers, p)  # recomputed layers run their forward again
    tp_bytes = p.micro_batch * s_q * model.hidden * act
    # a dense MLP recomputed (selective "mlp") runs its input's gather and output's reduction again
    tp_unit = 2 * fwd_passes + 2 + where(recomputes(p, "mlp"), 1 - model.moe_share, 0.0)
    # MLA: the attention's column-parallel GEMMs (its up projections) read the latents, not the
    # hidden state, so the collective on the attention's input side -- the forward all-gather under
    # SP and its backward reduce-scatter; without SP the backward all-reduce of the input gradient --
    # carries model.mla_latent_width elements a token (multi_latent_attention.py gathers q, kv and
    # the RoPE key after the replicated down projections)
    latent = model.mla_latent_width
    latent_bytes = p.micro_batch * s_q * latent * act
    mla = 1 if latent else 0  # the input side's collectives that carry latents instead of h
    terms = [
        per_layer("tp", "all_reduce", where(p.sp, 0, tp_unit - mla), tp_bytes, ("tp",), p.tp),
        per_layer("sp", "all_gather", where(p.sp, tp_unit - mla * fwd_passes, 0), tp_bytes, ("tp",), p.tp),
        per_layer("sp", "reduce_scatter", where(p.sp, tp_unit - mla, 0), tp_bytes, ("tp",), p.tp),
    ]
    if latent:
        terms += [
            per_layer("tp", "all_reduce", where(p.sp, 0, 1), latent_bytes, ("tp",), p.tp, what="MLA latents"),
            per_layer("sp", "all_gather", where(p.sp, fwd_passes, 0), latent_bytes, ("tp",), p.tp, what="MLA latents"),
            per_layer("sp", "reduce_scatter", where(p.sp, 1, 0), latent_bytes, ("tp",), p.tp, what="MLA latents"),
        ]
    if opts.sp_regather:  # the attention's (latents under MLA) and the MLP's inputs
        regather = [(tp_bytes, 1 if latent else 2, "")] + ([(latent_bytes, 1, "MLA latents")] if latent else [])
        for nbytes, unit, what in regather:
            terms.append(
                per_layer("sp", "all_gather", where(p.sp, unit, 0), nbytes, ("tp",), p.tp, overlapped=True, what=what)
            )
    terms += _end_terms(model, p, opts, tp_bytes=tp_bytes, m=m, layers=layers, s_q=s_q)
    # K and V of one TP rank's heads (k/min(t, kv heads) each; MLA: heads (d + d_r)/t and heads d_v/t)
    kv_t = (model.k_hidden + model.v_hidden) / minimum(p.tp, model.kv_heads)
    kv_bytes = p.micro_batch * model.seq_len * kv_t * act
    gathered, ring, ulysses = cp_kind_flags(p)
    # Ulysses: per call, Q and the output (q, o wide) and K and V, as their mean width
    a2a_q = p.micro_batch * s_q * (model.q_hidden + model.o_hidden) / 2 / p.tp * act
    a2a_k = p.micro_batch * s_q * (model.k_hidden + model.v_hidden) / 2 / p.tp * act
    terms += [  # all-gather CP: K and V in a call each, their gradients likewise
        per_layer(
            "cp", "all_gather", where(gathered, 2 * fwd_passes + where(p.flash, 2, 0), 0), kv_bytes / 2, ("cp",), p.cp
        ),
        per_layer("cp", "reduce_scatter", where(gathered, 2, 0), kv_bytes / 2, ("cp",), p.cp),
        per_layer(
            "cp",
            "send_recv",
            where(ring, fwd_passes * (p.cp - 1) + 2 * p.cp - 1, 0),
            kv_bytes / p.cp,
            ("cp",),
            p.cp,
            hidden_by="attention",
            exchange=True,
        ),
        per_layer("cp", "all_to_all", where(ulysses, 2 * (fwd_passes + 1), 0), a2a_q, ("cp",), p.cp),
        per_layer("cp", "all_to_all", where(ulysses, 2 * (fwd_passes + 1), 0), a2a_k, ("cp",), p.cp),
        CommTerm(
            "pp",
            "send_recv",
            2 * m * v,
            tp_bytes / where(p.sp, p.tp, 1),
            ("pp",),
            p.pp,
            scope="microbatch",
            unit_calls=2 * v,
        ),
    ]
    if model.experts:
        # a MoE block recomputed (selective "moe") dispatches and combines its tokens again
        terms += _ep_terms(model, p, per_layer, fwd_passes + where(recomputes(p, "moe"), 1.0, 0.0))
    if dp is None:
        terms += _dp_terms(model, p, opts)
    return [
        t if t.unit_calls is not None else replace(t, unit_calls=t.calls / (1 if t.scope == "step" else m))
        for t in terms
    ]


def dispatcher_flags(plan: AnyPlan) -> tuple[Any, Any, Any]:
    """(alltoall, allgather, flex): where the plan's MoE layers use each token dispatcher (per row
    for a PlanColumns)."""
    d = plan.moe_dispatcher
    if isinstance(d, str):
        return d == "alltoall", d == "allgather", d == "flex"
    d = np.asarray(d)
    return d == "alltoall", d == "allgather", d == "flex"


def _ep_terms(model: Model, p: AnyPlan, per_layer: Any, fwd_passes: Any) -> list[CommTerm]:
    """A MoE layer's token dispatch and combine, forward (again under full recompute or a recomputed MoE
    block) and their conjugates backward, per microbatch, as Megatron-core's dispatchers
    (token_dispatcher.py) run them:

    alltoall / flex  the rank's routed copies (routed_copies: b s_q / t tokens x top_k, or the padded
                     capacity) all-to-all over the EP group; with etp > 1 the received copies are then
                     all-gathered over the expert-TP group (gather_from_sequence_parallel_region on
                     tp_group) and reduce-scattered at the combine. flex sends a token to another
                     domain once per domain (CommTerm.fanout).
    allgather        every rank's b s_q / t tokens all-gathered over the ETP x EP group
                     ([S/TP*B, H] -> [S*B*EP, H]: MoEAllGatherTokenDispatcher) and the experts' output
                     reduce-scattered back; backward the reverse."""
    a2a, gathered, flex = dispatcher_flags(p)
    act, h, share = model.dtype_bytes, model.hidden, model.moe_share
    etp = p.expert_tp
    copies_bytes = routed_copies(model, p) * h * act
    # the busiest rank receives expert_load x its share: the exchange ends when its link has taken them
    received_bytes = copies_bytes * expert_load(model, p)
    tokens_bytes = p.micro_batch * (model.seq_len // p.cp) / p.tp * h * act
    exchange = 2 * fwd_passes + 2  # dispatch + combine forward, both conjugates backward
    sends = ~np.asarray(gathered) if is_array(gathered) else not gathered
    fanout = (flex, model.top_k, model.router_groups, model.router_group_topk)

    def gathered_and_scattered(calls: Any, nbytes: Any, group: tuple[str, ...], n: Any, **kw: Any) -> list[CommTerm]:
        """An all-gather before the experts and its reduce-scatter after, each `calls` times."""
        return [per_layer("ep", c, calls, nbytes, group, n, **kw) for c in ("all_gather", "reduce_scatter")]

    return [
        per_layer("ep", "all_to_all", where(sends, exchange, 0) * share, received_bytes, ("ep",), p.ep, fanout=fanout),
        *gathered_and_scattered(
            where(sends, fwd_passes + 1, 0) * share, received_bytes * etp, ("tp",), etp, what="ETP"
        ),
        *gathered_and_scattered(
            where(gathered, fwd_passes + 1, 0) * share, tokens_bytes * p.ep * etp, ("ep", "tp"), p.ep * etp
        ),
    ]


def flex_inter_share(top_k: Any, n: Any, per_domain: Any, groups: int = 0, group_topk: int = 0) -> Any:
    """The share of a plain all-to-all's off-domain bytes a flex dispatch sends, for an EP group of `n`
    ranks, `per_domain` of them in each of its D = n / per_domain NVLink domains, routing balanced.

    DeepEP (DeepSeek-V3 report, Sec. 3.2.2; Megatron-core fused_a2a.py, MoEFlexTokenDispatcher) sends
    a token over InfiniBand once to each other domain holding one of its top_k experts and forwards
    it over NVLink to the experts' GPUs there; an all-to-all sends each copy. A token's copies fall on
    R of the domains: R = D, or with group-limited routing (router `groups` of consecutive experts,
    `group_topk` of them per token; each group on max(1, n / (groups x per_domain)) domains) at most
    group_topk x that (DeepSeek-V3: 8 groups on 8 nodes, top-4 groups: 4 nodes). Uniform over the R,
    the expected domains reached are R (1 - (1 - 1/R)^top_k) (3.6 for top-8 on 4; 5.25 on 8), each
    off the sender's domain with the plain all-to-all's odds, so the share is that over top_k."""
    n = np.asarray(n, dtype=np.float64)
    k = np.maximum(np.asarray(per_domain, dtype=np.float64), 1.0)
    domains = np.maximum(n / k, 1.0)
    reach = domains
    if groups and group_topk:
        per_group = np.maximum(n / (groups * k), 1.0)  # domains one group's experts span
        reach = np.minimum(domains, group_topk * per_group)
    reached = reach * (1.0 - (1.0 - 1.0 / reach) ** top_k)
    return np.minimum(reached / top_k, 1.0)


def _dp_terms(model: Model, p: AnyPlan, opts: CommOptions) -> list[CommTerm]:
    """The data-parallel gradients' reduction and ZeRO's weight gathers, and the loss's all-reduce."""
    m = maximum(p.microbatches, 1)
    layers = layers_on_stage(model.layers, p, p.pp - 1)
    nd = p.dp * p.cp
    grad_dtype = 4 if model.dtype_bytes == 4 or p.main_grads == "fp32" else 2  # the main-grads buffer reduced
    grad_bytes = max_params_per_stage(model, p) * grad_dtype
    weight_bytes = max_params_per_stage(model, p) * model.dtype_bytes
    g_calls = maximum(1, ceil(grad_bytes / opts.bucket_for(nd, grad_dtype)))  # buckets
    # ZeRO-3 gathers weights module by module (a transformer block each: FSDP2, Megatron FSDP)
    w_calls = where(p.zero == 3, maximum(layers, 1), maximum(1, ceil(weight_bytes / opts.bucket_for(nd, grad_dtype))))
    zero = p.zero
    terms = [
        CommTerm(
            "dp", "all_reduce", where(zero == 0, g_calls, 0), grad_bytes / g_calls, ("dp", "cp"), nd, scope="step"
        ),
        CommTerm(
            "dp",
            "reduce_scatter",
            where(zero == 0, 0, g_calls * where(zero >= 2, m, 1)),
            grad_bytes / g_calls,
            ("dp", "cp"),
            nd,
            scope="step",
        ),
        CommTerm(
            "dp",
            "all_gather",
            where(zero == 0, 0, w_calls * where(zero == 3, 2 * m, 1)),
            weight_bytes / w_calls,
            ("dp", "cp"),
            nd,
            scope="step",
        ),
        CommTerm("dp", "all_reduce", where(nd > 1, 1, 0), 4, ("dp", "cp"), nd, scope="step", what="loss"),  # fp32
    ]
    return [replace(t, unit_calls=t.calls) for t in terms]


def _end_terms(model: Model, p: AnyPlan, opts: CommOptions, *, tp_bytes, m, layers, s_q) -> list[CommTerm]:
    """The embedding's, the output layer's and the loss's TP collectives, and the once-per-step partial
    gradient sums (module docstring)."""
    sp, tp = p.sp, p.tp
    ce_bytes = p.micro_batch * s_q * 4  # one fp32 value per token
    terms = [
        CommTerm("tp", "all_reduce", where(sp, 0, m), tp_bytes, ("tp",), tp, scope="first", what="embedding"),
        CommTerm("sp", "reduce_scatter", where(sp, m, 0), tp_bytes, ("tp",), tp, scope="first", what="embedding"),
        CommTerm("sp", "all_gather", where(sp, m, 0), tp_bytes, ("tp",), tp, scope="first", what="embedding"),
        CommTerm("tp", "all_reduce", where(sp, 0, m), tp_bytes, ("tp",), tp, scope="last", what="output layer"),
        CommTerm("sp", "all_gather", where(sp, m, 0), tp_bytes, ("tp",), tp, scope="last", what="output layer"),
        CommTerm("sp", "reduce_scatter", where(sp, m, 0), tp_bytes, ("tp",), tp, scope="last", what="output layer"),
        CommTerm("tp", "all_reduce", m, ce_bytes, ("tp",), tp, scope="last", what="loss"),  # the row max
        CommTerm("tp", "all_reduce", m, 2 * ce_bytes, ("tp",), tp, scope="last", what="loss"),  # target, sum exp
    ]
    if opts.sp_regather:
        terms.append(
            CommTerm(
                "sp",
                "all_gather",
                where(sp, m, 0),
                tp_bytes,
                ("tp",),
                tp,
                overlapped=True,
                scope="last",
                what="output layer",
            )
        )
    h, act = model.hidden, model.dtype_bytes
    gpt = model.arch == "gpt"
    per_layer = 6 * h if gpt else 2 * h  # norms' gains (and biases), the row-parallel biases
    final_norm = 2 * h if gpt else h
    positions = model.seq_len * h if gpt else 0  # on the first stage: counted when it is also the last
    sp_params = layers * per_layer + final_norm + where(p.pp == 1, positions, 0)
    kv = model.kv_heads
    sharing = where(tp > kv, tp // kv, 1)  # TP ranks holding the same K/V head
    kv_grads = layers * 2 * h * model.kv_hidden / kv
    terms += [
        CommTerm(
            "sp",
            "all_reduce",
            where(sp & (tp > 1), 1, 0),
            sp_params * act,
            ("tp",),
            tp,
            scope="step",
            what="sp weights",
        ),
        CommTerm(
            "tp",
            "all_reduce",
            where(tp > kv, 1, 0),
            kv_grads * act,
            ("tp",),
            sharing,
            scope="step",
            what="shared K/V heads",
        ),
        CommTerm(
            "pp",
            "all_reduce",
            where(p.pp > 1, 1 if model.tied_embeddings else 0, 0),
            model.padded_vocab(tp) / tp * h * act,
            ("pp",),
            2,
            scope="step",
            what="tied embedding",
        ),
    ]
    return terms


def on_last_stage(term: CommTerm, plan: AnyPlan) -> Any:
    """The term's calls on the last pipeline stage (the analytic model's GPU): the first stage's
    terms only when it is the last too."""
    return where(plan.pp == 1, term.calls, 0) if term.scope == "first" else term.calls


def term_seconds(term: CommTerm, cluster: Cluster, inter: Any, calls: Any = None, per_node: Any = 1) -> Any:
    """Seconds of all of a term's calls (or of `calls` of them) on the link its group uses (inter-node
    where `inter`; `per_node`: the group's ranks on one node, ranks_per_node)."""
    calls = term.calls if calls is None else calls
    intra = cluster.intra.bandwidth_bytes_per_s
    inter_bw = inter_bandwidth(term.collective, term.n, per_node, cluster)
    if term.fanout is not None:  # flex dispatch: fewer bytes leave the domain, at the same NIC rate
        flex, top_k, groups, group_topk = term.fanout
        share = where(flex, flex_inter_share(top_k, term.n, per_node, groups, group_topk), 1.0)
        inter_bw = np.minimum(intra, inter_bw / share)
    bw = where(inter, inter_bw, intra)
    lat = where(inter, cluster.inter.latency_s, cluster.intra.latency_s)
    each = ring_seconds(term.collective, term.n, term.bytes_per_call, bw, lat)
    return where((term.n > 1) & (calls > 0), calls * each, 0.0)


def inter_bandwidth(op: str, n: Any, per_node: Any, cluster: Cluster) -> Any:
    """The bandwidth per rank a collective over a node-spanning group of `n` ranks, `per_node` of them
    on each node, reaches. NCCL stripes a ring's channels over the node's NICs (Jeaugey 2019, "Massively
    Scale Your Deep Learning Training with NCCL 2.4"; nccl-tests' multi-node busbw), so a ring of k
    ranks per node crosses nodes through k NICs at once: min(intra, k x inter per GPU). In an all-to-all
    every rank pushes its own off-node share, (n - k)/n of its bytes, through its own NIC: the per-rank
    rate over all its bytes is inter x (n - 1)/(n - k). A point-to-point send uses one NIC."""
    intra, inter = cluster.intra.bandwidth_bytes_per_s, cluster.inter.bandwidth_bytes_per_s
    k = np.maximum(np.asarray(per_node, dtype=np.float64), 1.0)
    if op in UNIT_FACTOR_OPS:
        return inter
    if op == "all_to_all":
        return np.minimum(intra, inter * np.maximum(n - 1, 1) / np.maximum(n - k, 1))
    return np.minimum(intra, k * inter)


def comm_per_step(model: Model, plan: Plan, cluster: Cluster, opts: CommOptions = CommOptions()) -> list[dict]:
    """Rows {dim, collective, calls, bytes_per_call, link, seconds, overlapped, hidden_by, scope} for
    the step of the last pipeline stage's GPU (on_last_stage)."""
    rows: list[dict] = []
    for t in comm_terms(model, plan, opts):
        calls = on_last_stage(t, plan)
        if calls <= 0 or t.n <= 1:
            continue
        crosses, per_node = _layout_of(plan, cluster, t.group)
        link = "inter" if crosses else "intra"
        rows.append(
            {
                "dim": t.dim,
                "collective": t.collective,
                "calls": int(calls),
                "bytes_per_call": int(t.bytes_per_call),
                "link": link,
                "seconds": term_seconds(t, cluster, crosses, calls, per_node),
                "overlapped": t.overlapped,
                "hidden_by": t.hidden_by,
                "scope": t.scope,
                "what": t.what,
            }
        )
    return rows


def bytes_per_step(rows: list[dict], dim: str) -> float:
    """Bytes one GPU moves per step in `dim`'s collectives (comm_per_step's rows: calls x bytes per call)."""
    return float(sum(r["calls"] * r["bytes_per_call"] for r in rows if r["dim"] == dim))
