"""Does a plan fit a model and a cluster? Every problem at once, each message with its numbers.

Errors make the plan impossible (or make it not fit in memory); warnings are legal but costly
layouts (a TP group on the slow link, a pipeline that cannot fill). Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from parallel.core.memory import ActivationOptions, memory_per_gpu_bytes
from parallel.core.pipeline_layout import LayoutError, parse_layout
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, GiB, Model
from parallel.core.topology import placed


@dataclass(frozen=True)
class Verdict:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # False when the model cannot be split this way at all (indivisible shapes): then no memory,
    # communication or time can be computed. A plan that only misses the cluster size or the
    # memory budget is still computable, and its numbers say by how much.
    computable: bool = True

    @property
    def valid(self) -> bool:
        return not self.errors


VOCAB_PADDED = "the embedding is padded"  # the warning's end, for callers that refuse padding instead


def _size_error(plan: Plan, cluster: Cluster) -> list[str]:
    p, world, gpus = plan, plan.world_size, cluster.gpus
    if world == gpus:
        return []
    return [
        f"dp×tp×pp×cp = {p.dp}×{p.tp}×{p.pp}×{p.cp} = {world}, but the cluster has "
        f"{cluster.nodes}×{cluster.gpus_per_node} = {gpus} GPUs"
    ]


def _shape_errors(plan: Plan, model: Model) -> list[str]:
    p, m = plan, model
    errors = []
    if m.heads % p.tp:
        errors.append(f"heads {m.heads} are not divisible by tp {p.tp}: each TP rank needs whole attention heads")
    if m.kv_heads % p.tp and p.tp % m.kv_heads:
        errors.append(
            f"kv_heads {m.kv_heads} and tp {p.tp}: neither divides the other, so K/V heads "
            f"can be neither split nor replicated evenly across TP ranks"
        )
    if m.ffn_hidden % p.tp:
        errors.append(f"ffn_hidden {m.ffn_hidden} is not divisible by tp {p.tp}")
    errors += _pipeline_split_errors(p, m)
    errors += _expert_layout_errors(p)
    if p.sp and p.tp == 1:
        errors.append("sequence parallelism (sp) needs tp > 1: it shards along the sequence across the TP group")
    if p.cp > 1 and m.seq_len % (2 * p.cp):
        errors.append(
            f"seq_len {m.seq_len} is not divisible by 2×cp = {2 * p.cp}: load-balanced causal "
            f"context parallelism splits the sequence into 2·cp chunks"
        )
    if p.cp > 1 and p.cp_kind == "ulysses":
        for name, n in (("heads", m.heads), ("kv_heads", m.kv_heads)):
            if n % (p.cp * p.tp):
                errors.append(
                    f"{name} {n} is not divisible by cp×tp = {p.cp}×{p.tp} = {p.cp * p.tp}: Ulysses context "
                    f"parallelism gives each rank {name}/(cp·tp) whole heads (use cp-kind ring or allgather)"
                )
    if p.sp and (m.seq_len // p.cp) % p.tp:
        errors.append(
            f"seq_len/cp = {m.seq_len}/{p.cp} = {m.seq_len // p.cp} is not divisible by tp {p.tp}: "
            f"sequence parallelism gives each TP rank s/tp tokens"
        )
    if p.global_batch % (p.dp * p.micro_batch):
        errors.append(
            f"global_batch {p.global_batch} is not divisible by dp×micro_batch = "
            f"{p.dp}×{p.micro_batch} = {p.dp * p.micro_batch}"
        )
    if p.vpp > 1:
        if p.pp == 1:
            errors.append(f"vpp {p.vpp} > 1 (interleaved schedule) needs pp > 1")
        elif p.microbatches % p.pp:
            errors.append(
                f"interleaved schedule: microbatches {p.microbatches} "
                f"(= global_batch/(dp×micro_batch)) must be divisible by pp {p.pp}"
            )
        if p.schedule == "gpipe":
            errors.append("vpp > 1 is an interleaved 1F1B schedule; it cannot be combined with gpipe")
    if p.ep > 1:
        if not m.experts:
            errors.append(f"ep {p.ep} > 1 needs a mixture-of-experts model; {m.name} is dense")
        elif m.experts % p.ep:
            errors.append(f"the {m.experts} experts are not divisible by ep {p.ep}: each EP rank holds experts/ep")
        if p.etp is None and (p.dp * p.cp) % p.ep:
            errors.append(
                f"dp×cp = {p.dp}×{p.cp} = {p.dp * p.cp} is not divisible by ep {p.ep}: expert parallelism "
                f"takes its ranks from the data-parallel × context ranks (Megatron-LM's expert layout)"
            )
    if p.etp is not None:
        if not m.experts:
            errors.append(f"etp {p.etp} needs a mixture-of-experts model; {m.name} is dense")
        elif (p.dp * p.cp * p.tp) % (p.etp * p.ep):
            errors.append(
                f"dp×cp×tp = {p.dp * p.cp * p.tp} is not divisible by etp×ep = {p.etp}×{p.ep}: the expert "
                f"layout is etp × ep × expert-dp × pp over the same ranks (Megatron-LM)"
            )
    return errors + _moe_errors(p, m)


def _moe_errors(p: Plan, m: Model) -> list[str]:
    """Megatron-core's rules for the MoE plan fields (transformer_config.py, __post_init__)."""
    errors = []
    if m.experts and m.expert_width % p.expert_tp:
        errors.append(f"the experts' width {m.expert_width} is not divisible by etp {p.expert_tp}")
    if m.experts and p.tp > 1 and not p.sp:
        errors.append("a MoE model with tp > 1 needs sequence parallelism (sp): Megatron-core's MoE layer refuses it")
    if p.ep_overlap and m.experts:
        why = [
            w
            for w, bad in (
                ("ep > 1", p.ep == 1),
                ("the alltoall or flex dispatcher", p.moe_dispatcher == "allgather"),
                ("no full recompute", p.recompute == "full"),
                ("vpp > 1 when pp > 1", p.pp > 1 and p.vpp == 1),
            )
            if bad
        ]
        if why:
            errors.append(
                f"EP overlap (--overlap-moe-expert-parallel-comm) needs {', '.join(why)}, as Megatron-core asserts"
            )
    if p.moe_dispatcher == "flex" and m.experts and p.capacity_pad:
        errors.append("the flex dispatcher (DeepEP) does not pad experts' inputs to capacity, as Megatron-core asserts")
    return errors


def _expert_layout_errors(p: Plan) -> list[str]:
    """Megatron-LM builds the MoE layers' ranks (tp=etp, ep, dp = world/(etp·ep·pp), pp) in the same
    order as the rest and refuses a layout whose two data-parallel sizes differ unless pp is the
    slowest axis (megatron/core/parallel_state.py, right after the expert RankGenerator): it applies to
    dense models too, where the expert-data-parallel size is dp·cp."""
    if p.pp == 1 or p.order.strip().lower().endswith("pp"):
        return []
    expert_dp = p.world_size // (p.expert_tp * p.ep * p.pp)
    if expert_dp == p.dp:
        return []
    why = ", ".join(w for w, on in (("cp > 1", p.cp > 1), ("ep > 1", p.ep > 1), ("etp < tp", p.expert_tp < p.tp)) if on)
    return [
        f"rank order {p.order} does not end with pp and pp = {p.pp} > 1, so Megatron-LM needs the expert layout's "
        f"data-parallel size world/(etp×ep×pp) = {p.world_size}/({p.expert_tp}×{p.ep}×{p.pp}) = {expert_dp} to equal "
        f'dp {p.dp} ({why}): it refuses this layout ("When not using pp-last rank ordering, the data parallel '
        f'size of the attention and moe layers must be the same"); use a pp-last order such as tp-cp-ep-dp-pp'
    ]


def _pipeline_split_errors(p: Plan, m: Model) -> list[str]:
    """How the layers split over the stages, Megatron-LM's rules. With a pipeline layout, the layout's
    own (pipeline_parallel_layer_layout.py, validate_layer_layout: its t's are the model's layers; a
    virtual stage may hold any number); without, the flags' (get_num_layers_to_build, and
    TransformerConfig's check that each stage's layers divide by vpp)."""
    if p.pp_layout:
        try:
            parse_layout(p.pp_layout, p.pp, m.layers)
        except LayoutError as err:
            return [str(err)]
        return []
    explicit = p.first_stage_layers is not None or p.last_stage_layers is not None
    if not p.uneven:
        if m.layers % (p.pp * p.vpp):
            hint = " (or give uneven first/last stages)" if p.pp > 1 else ""
            return [
                f"layers {m.layers} are not divisible by pp×vpp = {p.pp}×{p.vpp} = {p.pp * p.vpp}: "
                f"every (virtual) pipeline stage needs the same number of layers{hint}"
            ]
        return []
    if p.pp == 1:
        return ["uneven pipeline stages (first/last stage layers, embedding or loss in the split) need pp > 1"]
    if explicit and (p.embedding_in_split or p.loss_in_split):
        return [
            "first/last stage layers cannot be combined with the embedding or loss in the pipeline split "
            "(Megatron-LM refuses the two together)"
        ]
    if explicit:
        given = {"first": p.first_stage_layers, "last": p.last_stage_layers}
        given = {k: v for k, v in given.items() if v is not None}
        rest, left = m.layers - sum(given.values()), p.pp - len(given)
        if rest < 0:
            return [
                f"first/last stage layers {' + '.join(map(str, given.values()))} exceed the model's {m.layers} layers"
            ]
        if left and rest % left:
            return [
                f"layers {m.layers} less the {' and '.join(f'{k} stage’s {v}' for k, v in given.items())} leave "
                f"{rest} for the other {left} stages: not divisible"
            ]
        if not left and rest:  # TransformerConfig: with no middle stage the two ends hold every layer
            return [
                f"first/last stage layers {' + '.join(map(str, given.values()))} = {m.layers - rest} leave {rest} of "
                f"the model's {m.layers} layers on no stage: with pp {p.pp} there is no middle stage, so they must "
                f"add up to {m.layers}"
            ]
        counts = {**given, **({"middle": rest // left} if left else {})}
    else:
        slots = m.layers + int(p.embedding_in_split) + int(p.loss_in_split)
        if slots % p.pp:
            return [
                f"layers {m.layers} + {slots - m.layers} (embedding/loss in the split) = {slots} are not divisible "
                f"by pp {p.pp}"
            ]
        counts = {"every": slots // p.pp}
    bad = {k: v for k, v in counts.items() if v % p.vpp}
    if bad:
        return [
            f"vpp {p.vpp}: the {', '.join(f'{k} stage’s {v} layers' for k, v in bad.items())} are not divisible "
            f"by vpp (each virtual stage needs the same number of layers)"
        ]
    return []


def _layout_warnings(plan: Plan, model: Model, cluster: Cluster) -> list[str]:
    p = plan
    warnings = []
    topo = placed(p, cluster)
    fast, slow = cluster.intra, cluster.inter
    ratio = fast.bandwidth_bytes_per_s / slow.bandwidth_bytes_per_s
    unit = "node" if cluster.domain_gpus == cluster.gpus_per_node else "NVLink domain"
    for dim, why in (("tp", "TP all-reduces every layer"), ("cp", "CP exchanges K/V every layer")):
        n = topo.crossing(dim)
        if n and getattr(p, dim) > 1:
            total = len(topo.group_ranks(dim))
            warnings.append(
                f"{n} of {total} {dim.upper()} groups cross {unit}s ({dim}={getattr(p, dim)}, "
                f"{cluster.domain_gpus} GPUs per {unit}): {why} over {slow.name or 'the inter-node link'}, "
                f"{ratio:.0f}× slower than {fast.name or 'the intra-node link'}"
            )
    if p.pp > 1 and p.microbatches < p.pp:
        warnings.append(
            f"{p.microbatches} microbatches for {p.pp} pipeline stages: the pipeline never fills "
            f"(bubble {(p.pp - 1) / (p.vpp * max(p.microbatches, 1)):.0%} of ideal)"
        )
    elif p.pp > 1 and p.microbatches < 4 * p.pp:
        warnings.append(
            f"bubble (pp−1)/(vpp·m) = ({p.pp}−1)/({p.vpp}·{p.microbatches}) = "
            f"{(p.pp - 1) / (p.vpp * p.microbatches):.0%}: more microbatches (m ≥ 4·pp) would hide it"
        )
    if p.tp > 1 and model.kv_heads % p.tp and p.tp % model.kv_heads == 0:
        warnings.append(
            f"tp {p.tp} > kv_heads {model.kv_heads}: each K/V head is replicated on {p.tp // model.kv_heads} TP ranks"
        )
    if model.vocab % p.tp:
        warnings.append(f"vocab {model.vocab} is not divisible by tp {p.tp}: {VOCAB_PADDED}")
    if p.tp_overlap and not p.sp and p.tp > 1:
        warnings.append(
            "tp_overlap needs sequence parallelism (it overlaps SP's all-gathers and reduce-scatters): not applied"
        )
    if p.zero >= 1 and p.dp * p.cp == 1:
        warnings.append(f"ZeRO-{p.zero} with dp×cp = 1 shards nothing")
    return warnings


def check(plan: Plan, model: Model, cluster: Cluster, opts: ActivationOptions | None = None) -> Verdict:
    """All errors and warnings of `plan` for `model` on `cluster` (memory checked once shapes are sound)."""
    shape = _shape_errors(plan, model)
    errors = _size_error(plan, cluster) + shape
    warnings = _layout_warnings(plan, model, cluster)
    if plan.cp > 1 and plan.cp_kind != "ulysses" and not plan.flash:
        warnings.append(
            f"{plan.cp_kind} context parallelism without flash attention: Megatron-Core runs ring and all-gather "
            "CP inside Transformer Engine's flash/fused attention (Ulysses works with any attention kernel)"
        )
    if not shape:
        mem = memory_per_gpu_bytes(model, plan, opts or ActivationOptions())
        cap = cluster.gpu_memory_bytes
        parts = ", ".join(f"{k} {mem[k] / GiB:.1f}" for k in ("params", "grads", "optimizer", "activations"))
        if mem["total"] > cap:
            errors.append(
                f"memory per GPU {mem['total'] / GiB:.1f} GiB ({parts} GiB) exceeds the GPU's {cap / GiB:.1f} GiB"
            )
        elif mem["total"] > 0.9 * cap:
            warnings.append(
                f"memory per GPU {mem['total'] / GiB:.1f} GiB is over 90% of the GPU's "
                f"{cap / GiB:.1f} GiB; allocator fragmentation and buffers may not fit"
            )
    return Verdict(errors, warnings, computable=not shape)


# The plan fields a one-change fix may touch, those that keep the GPU count first; each with the
# values tried (nearest the plan's first).
_FIX_FIELDS = ("vpp", "micro_batch", "global_batch", "sp", "cp_kind", "tp", "pp", "cp", "dp", "ep")
_FIX_TRIES = 64


def _nearby(field_name: str, value) -> list:
    if field_name == "sp":
        return [not value]
    if field_name == "cp_kind":
        return [k for k in ("ring", "allgather", "ulysses") if k != value]
    top = max(2 * value, value + _FIX_TRIES) if field_name != "global_batch" else 2 * value
    values = [v for v in range(1, top + 1) if v != value]
    return sorted(values, key=lambda v: (abs(math.log(v / value)), v))[: _FIX_TRIES * 4]


def nearest_computable(plan: Plan, model: Model, *, limit: int = 3) -> list[tuple[str, object, Plan]]:
    """One-field changes that make a plan the model cannot be split by computable: (field, value,
    plan), those that keep the GPU count first, then the smallest change (log ratio); at most `limit`,
    per field the nearest value below and the nearest above. Empty when the plan is computable already
    or no single change helps."""
    if not _shape_errors(plan, model):
        return []
    found = []
    for rank, name in enumerate(_FIX_FIELDS):
        current = getattr(plan, name)
        sides: set = set()
        for value in _nearby(name, current):
            side = value > current if isinstance(current, int) and not isinstance(current, bool) else None
            if side in sides:
                continue
            try:
                candidate = dataclasses.replace(plan, **{name: value})
            except (ValueError, TypeError):
                continue
            if _shape_errors(candidate, model):
                continue
            moved = candidate.world_size != plan.world_size
            size = abs(math.log(value / current)) if side is not None else 0.0
            found.append(((moved, size, rank), name, value, candidate))
            sides.add(side)
            if side is None or len(sides) == 2:
                break
    return [(name, value, p) for _, name, value, p in sorted(found, key=lambda x: x[0])[:limit]]
