"""The step-time model calibrated from measured runs: compute, collectives and contention of *this*
machine, fitted by `python -m profiler calibrate` (profiler.analyzers.calibrate) and used by
`python -m parallel plan --calibration calib.json`.

Terms, each with what it assumes (Calibration.ASSUMPTIONS repeats them in the JSON):

    work per microbatch on stage s   layers_s x (a + [tp>1] a_tp + [sp] a_sp + [cp>1] a_cp + passes x F_layer x k
                                                 + B_layer x e)
                                     + [last stage] (a_head + 3 F_head k) + a_mb
        F_layer: one layer's forward FLOPs of one microbatch on one rank (GEMMs / tp; attention
        b (s/cp) s q-wide / tp), F_head: the output layer's 2 b (s/cp) h V / tp (Narayanan et al. 2021,
        Eq. 3's terms); passes = 3 (forward, backward 2x), +1 forward under full recomputation, +the
        attention core under selective. `a` is a layer's fixed cost (operator dispatch: on a CPU and for
        small layers it dominates), `k` seconds per FLOP -- both fitted, not peak-derived. a_mb: a
        microbatch's host work outside its forward and backward on every stage (slicing it, scaling
        its loss, the pipeline's buffers): measured, not fitted. e: seconds per byte of the layer's
        element-wise work (LayerNorm, softmax, GeLU, dropout, residual adds, copies: memory-bound, so
        it grows with the tensors, not with FLOPs or layers); B_layer the bytes the layer's forward
        writes for its backward, Korthikanti et al. 2022 Table 2's activations
        (parallel.core.memory, without recomputation; ring CP's blockwise scores and recomputed tensors
        added, as they are written again), fitted to the traces' non-GEMM leaf operators (their time
        less a cost per operator, the dispatch a's terms carry).
    collective                       s_op x (c + alpha x hops + bytes x bus_factor x beta), hops the ring's latency terms
        (all-reduce 2(n-1), all-gather / reduce-scatter / all-to-all n-1, send/recv 1) -- Thakur et al.
        2005 as parallel.core.comm, with c (per call), alpha, beta per link tier (intra; inter when a
        calibration run had groups across nodes) fitted from the traces' collectives
        (a p2p op's transfer after both sides arrived, or its whole time when it ended before its peer
        came -- an eager send's issue, host time that waited on no one; a collective's whole time, its
        peers' jitter included, since lock-step ranks pay it every call), not the link's datasheet; s_op,
        per collective, its measured cost over the shared fit's (1 for one never measured): a backend's
        own algorithm (gloo reduce-scatters by a full all-reduce, twice the ring's bytes).
    exchange                         ring CP's K/V shift: every rank sends its block to the next and
        receives the previous one's at once -- one step of a ring all-gather (Thakur et al. 2005), and
        priced as one, with the all-gather's s_op, unless a calibration run measured exchanges (its CP
        sends and receives: s_exchange), which then price it: two ops on a CPU, where the host issues
        the send and waits for the receive, one on a GPU (NCCL runs the pair as one kernel). A
        pipeline's one-way sends, where the receiver waits, are not that pattern (priced from them,
        ring CP came out 15-30% low on this machine).
    step                             D x [ (m + (p-1)/v) x max_s(work_mb + comm_mb)  +  step comm  +  w0 ]
        the pipeline fill/drain as (p-1)/v extra microbatch slots of the slowest stage (GPipe/1F1B,
        Narayanan et al. 2021 Sec. 2.2), comm_mb that stage's collectives (its layers', and the
        embedding's on the first stage, the output layer's and the loss's on the last); the once-per-
        step collectives (DP gradients, SP's and the tied embedding's partial sums) after the last
        backward, not overlapped (the engine's buckets reduce after backward); w0 the per-step fixed
        cost: the optimizer step (the rest of the work outside forward and backward is a_mb's: on
        the calibration runs it grew with the microbatches, 0.9 ms at 1 to 3-4 ms at 4).
    contention                       D = max(1, ranks x (work + gamma x comm) / step / (cores x eta)): ranks
        that share cores share their time, but a rank blocked on a peer frees its core; gamma, the busy
        share of communication time, is measured by the engine's CPU clocks on a calibration run with
        more ranks than cores (else fitted to its step; 0.5 without one); eta, the share of the cores
        such ranks keep busy (a rank woken by a peer can find its core taken while another idles),
        fitted to that run's step (1 without one).
        On GPUs (a rank per device) D = 1.

Pure: stdlib and numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from parallel.core.comm import ENGINE_BUCKET_BYTES, RING_STEPS, CommOptions, bus_factor, comm_terms, crosses_nodes
from parallel.core.engine_plan import engine_plan
from parallel.core.files import NotARegularFile, TooLarge, read_bounded
from parallel.core.memory import activation_components_bytes, has_dropout
from parallel.core.perf import layer_forward_flops
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, Model

ASSUMPTIONS = (
    "work: a fixed cost per layer and microbatch plus a cost per FLOP, both fitted; the output layer has its own fixed cost",
    "element-wise work: a cost per byte of the activations a layer writes (Korthikanti et al. 2022 Table 2, "
    "recomputed tensors twice), fitted to the traces' non-GEMM leaf operators less a cost per operator",
    "collectives: alpha per ring latency step plus beta per bus byte, fitted from transfer times (after the last "
    "arrival) plus lock-step jitter; a wait the schedule puts on the same rank every step is the bubble's, not the link's",
    "collectives: each op scaled by its measured cost over the shared fit (op_scale; 1 for an op never measured)",
    "exchange (ring CP's shift: every rank sends and receives at once): one ring all-gather step, unless a calibration "
    "run measured exchanges (then as measured: two p2p ops on a CPU, one on a GPU)",
    "work outside forward/backward: the optimizer once per step, the rest once per microbatch on every stage",
    "pipeline: (p-1)/v extra microbatch slots of the slowest stage; stages otherwise balanced",
    "data parallel: communication after the last backward, not overlapped",
    "contention: ranks share the cores by the time they keep them busy: work and gamma of their communication; "
    "ranks that outnumber the cores keep a share eta of them busy, the same for every plan; "
    "a calibration run's work is divided by its measured stretch (wall over CPU time) where the engine timed it",
    "the prediction is of an unprofiled step: tracing overhead is removed from the calibration runs, from work and "
    "from transfers each by its own measure (the engine times its communication calls in every step)",
    "latency: per ring step (alpha x hops) unless the calibration measured one op at two group sizes (then also per call)",
)


SCORE_PARTS = ("attention.scores", "attention.dropout_mask", "attention.dropout_output")  # s x s, per head


class CalibrationError(ValueError):
    pass


MAX_CALIBRATION_BYTES = 1 << 22  # 4 MiB: a calibration is a few KiB (its sources grow with the runs fitted)


def read_calibration(path: Any) -> Calibration:
    """The calibration in the JSON file at `path` (`python -m profiler calibrate ... --out`), read
    bounded (MAX_CALIBRATION_BYTES); CalibrationError saying what is wrong: unreadable, too large,
    not JSON, a field out of range."""
    try:
        data = read_bounded(path, MAX_CALIBRATION_BYTES)
    except NotARegularFile:
        raise CalibrationError("not a regular file") from None
    except OSError as err:
        raise CalibrationError(f"cannot read it ({err.strerror or err})") from None
    except TooLarge:
        raise CalibrationError(
            f"larger than {MAX_CALIBRATION_BYTES >> 20} MiB: not a calibration (those are a few KiB)"
        ) from None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CalibrationError(f"not valid JSON ({err})") from None
    return Calibration.from_dict(doc)


@dataclass(frozen=True)
class Calibration:
    layer_fixed_s: float  # a: per layer per microbatch (forward + backward)
    flop_s: float  # k: seconds per FLOP
    head_fixed_s: float  # a_head: the output layer and loss per microbatch
    step_fixed_s: float  # w0: per step
    alpha_s: float  # per latency step of a collective
    beta_s_per_byte: float  # per bus byte
    tp_layer_s: float = 0.0  # extra per layer per microbatch when tp > 1 (the f/g operators, copies)
    sp_layer_s: float = 0.0  # ... and more under sequence parallelism (gathers, scatters, their copies)
    cp_layer_s: float = 0.0  # ... and under context parallelism (the K/V exchange's concatenations, masks)
    microbatch_fixed_s: float = 0.0  # a_mb: per microbatch on every stage, outside its forward/backward
    elementwise_byte_s: float = 0.0  # e: per byte a layer's element-wise operators write (B_layer)
    call_s: float = 0.0  # per collective call, whatever its size (the host's part of issuing one)
    # the inter-node link, when a calibration run crossed nodes (else the same as the intra link's)
    inter_call_s: float | None = None
    inter_alpha_s: float | None = None
    inter_beta_s_per_byte: float | None = None
    inter_source: str | None = None  # "traces" (a run crossed nodes), "commbench" (calibrate --links), None
    # per collective (all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, exchange): its measured cost
    # over the ring model's (a backend's own implementation: gloo reduce-scatters by an all-reduce)
    op_scale: dict = field(default_factory=dict)
    gamma: float = 0.5  # share of communication time a rank's host is busy (contention), 0..1
    core_efficiency: float = 1.0  # eta: the share of the cores ranks that outnumber them keep busy, 0..1
    overlaps: bool = False  # whether the ranks overlap what the plan model marks overlapped (GPU Megatron)
    cores: int = 1  # cores (CPU) of the machine calibrated; 0 = a device per rank (no sharing)
    device: str = "cpu"
    sources: list = field(default_factory=list)  # [{path, plan, ranks, overhead_factor, ...}]
    assumptions: tuple = ASSUMPTIONS

    def to_dict(self) -> dict:
        out = asdict(self)
        out["assumptions"] = list(self.assumptions)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        if not isinstance(data, dict):
            raise CalibrationError("a calibration is a JSON object (python -m profiler calibrate ... --out calib.json)")
        need = ("layer_fixed_s", "flop_s", "head_fixed_s", "step_fixed_s", "alpha_s", "beta_s_per_byte")
        missing = [k for k in need if k not in data]
        if missing:
            raise CalibrationError(f"the calibration lacks {', '.join(missing)}")
        values = {}
        for k in (
            *need,
            "tp_layer_s",
            "sp_layer_s",
            "cp_layer_s",
            "microbatch_fixed_s",
            "elementwise_byte_s",
            "call_s",
            "gamma",
        ):
            if k in data:
                v = data[k]
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                    raise CalibrationError(f"calibration {k} must be a finite number >= 0, got {v!r}")
                values[k] = float(v)
        for k in ("inter_call_s", "inter_alpha_s", "inter_beta_s_per_byte"):
            v = data.get(k)
            if v is not None:
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                    raise CalibrationError(f"calibration {k} must be a finite number >= 0 or null, got {v!r}")
                values[k] = float(v)
        source = data.get("inter_source")
        if source not in (None, "traces", "commbench"):
            raise CalibrationError(f"calibration inter_source must be traces, commbench or null, got {source!r}")
        values["inter_source"] = source
        op_scale = data.get("op_scale") or {}
        if not isinstance(op_scale, dict) or not all(
            isinstance(k, str)
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and v > 0
            for k, v in op_scale.items()
        ):
            raise CalibrationError(f"calibration op_scale must map collective names to numbers > 0, got {op_scale!r}")
        values["op_scale"] = {k: float(v) for k, v in op_scale.items()}
        cores = data.get("cores", 1)
        if not isinstance(cores, int) or isinstance(cores, bool) or cores < 0:
            raise CalibrationError(f"calibration cores must be an integer >= 0, got {cores!r}")
        if "core_efficiency" in data:
            eta = data["core_efficiency"]
            if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not 0 < eta <= 1:
                raise CalibrationError(f"calibration core_efficiency must be a number in (0, 1], got {eta!r}")
            values["core_efficiency"] = float(eta)
        return cls(
            **values,
            overlaps=bool(data.get("overlaps", False)),
            cores=cores,
            device=str(data.get("device", "cpu")),
            sources=list(data.get("sources") or []),
            assumptions=tuple(data.get("assumptions") or ASSUMPTIONS),
        )


P2P = ("send", "recv", "send_recv", "exchange")  # one hop, the bytes sent (exchange: a ring CP shift's send or receive)


def hops(op: str, n: int) -> float:
    """Latency steps of one collective over n ranks (send/recv: 1)."""
    if op in P2P:
        return 1.0
    return RING_STEPS.get(op, 1) * max(n - 1, 0)


def collective_s(op: str, n: int, nbytes: float, cal: Calibration, *, inter: bool = False) -> float:
    """One collective's uncontended seconds under the calibration, on the intra- or inter-node link."""
    if n <= 1 and op not in P2P:
        return 0.0
    p2p = op in P2P
    bus = 1.0 if p2p else float(bus_factor(op, n))
    call, alpha, beta = cal.call_s, cal.alpha_s, cal.beta_s_per_byte
    if inter and cal.inter_alpha_s is not None:
        call, alpha, beta = cal.inter_call_s or 0.0, cal.inter_alpha_s, cal.inter_beta_s_per_byte or 0.0
    scale = cal.op_scale.get("send_recv" if op in ("send", "recv") else op, 1.0)
    return scale * (call + alpha * hops(op, n) + nbytes * bus * beta)


def exchange_s(nbytes: float, cal: Calibration, *, inter: bool = False) -> float:
    """One ring shift of `nbytes` a rank (module docstring, exchange): as the calibration runs measured
    exchanges (op_scale's "exchange"; on a CPU a send and a receive, each issued or waited by the
    host), else one step of a ring all-gather of the same blocks -- an all-gather of two ranks."""
    if "exchange" in cal.op_scale:
        each = collective_s("exchange", 2, nbytes, cal, inter=inter)
        return 2 * each if cal.device == "cpu" else each
    return collective_s("all_gather", 2, 2 * nbytes, cal, inter=inter)


def layer_flops(model: Model, plan: Plan) -> dict[str, float]:
    """Forward FLOPs of one microbatch on one rank: per layer (GEMMs + attention core) and the head."""
    s_q = model.seq_len // plan.cp
    f = layer_forward_flops(model, s_q, plan.micro_batch)
    attention = f["attention"] * plan.cp  # queries s/cp against all s keys
    passes = 3.0 + (1.0 if plan.recompute == "full" else 0.0)
    extra_attention = attention if plan.recompute == "selective" else 0.0
    head = 2.0 * plan.micro_batch * s_q * model.hidden * model.vocab
    return {
        "layer": (passes * (f["gemm"] + attention) + extra_attention) / plan.tp,
        "head": 3.0 * head / plan.tp,
    }


def elementwise_bytes(model: Model, plan: Plan) -> float:
    """B_layer: bytes one layer's element-wise operators write for one microbatch on one rank -- the
    activations its forward keeps for backward as if nothing were recomputed (Korthikanti et al. 2022,
    Table 2; parallel.core.memory), plus what is written again: ring CP's block scores (an online
    softmax keeps none, and its backward recomputes each block's), selective recomputation's attention
    scores, full recomputation's whole forward."""
    plan = engine_plan(plan, dropout=1.0 if has_dropout(model, plan) else 0.0)  # the engine's attention keeps scores
    parts = activation_components_bytes(model, replace(plan, recompute="none"))
    once = float(sum(parts.values()))
    if plan.cp > 1 and plan.cp_kind == "ring":  # the s/cp x s scores an all-gather CP would keep
        gathered = activation_components_bytes(model, replace(plan, cp_kind="allgather", recompute="none"))
        return once + 2 * float(gathered["attention.scores"])
    if plan.recompute == "selective":
        return once + sum(v for k, v in parts.items() if k in SCORE_PARTS)
    if plan.recompute == "full":
        return 2 * once
    return once


def stage_layers(model: Model, plan: Plan) -> list[float]:
    """Layers per pipeline stage (all virtual chunks of a rank together)."""
    base, extra = divmod(model.layers, plan.pp)
    return [base + (1 if s < extra else 0) for s in range(plan.pp)]


def features(model: Model, plan: Plan) -> dict[str, Any]:
    """Per stage, the regressors of the work model: layers, layers x passes x F_layer, head, head FLOPs."""
    fl = layer_flops(model, plan)
    layers = stage_layers(model, plan)
    last = [1.0 if s == plan.pp - 1 else 0.0 for s in range(plan.pp)]
    ew = elementwise_bytes(model, plan)
    return {
        "layers": layers,
        "layer_flops": [n * fl["layer"] for n in layers],
        "elementwise_bytes": [n * ew for n in layers],
        "head": last,
        "head_flops": [x * fl["head"] for x in last],
        "microbatches": plan.microbatches,
    }


def comm_calls(model: Model, plan: Plan, *, overlaps: bool = True, cluster: Cluster | None = None) -> list[dict]:
    """The plan's blocking collectives per step on the busiest rank: dim, op, n, bytes, calls, inter
    (its groups span nodes of `cluster`; False without one)."""
    rows = []
    for t in comm_terms(model, plan, CommOptions(bucket_bytes=ENGINE_BUCKET_BYTES)):  # the engine's buckets
        # rows the plan model marks overlapped (Megatron-LM's backward re-gather under SP) block on
        # an engine that issues collectives synchronously (ours on gloo): Calibration.overlaps
        if (t.overlapped and overlaps) or not t.calls or (t.n <= 1 and t.collective != "send_recv"):
            continue
        if t.collective == "send_recv" and plan.pp == 1 and t.dim == "pp":
            continue
        inter = bool(crosses_nodes(plan, cluster, t.group)) if cluster is not None else False
        rows.append(
            {
                "dim": t.dim,
                "op": t.collective,
                "n": int(t.n),
                "bytes": float(t.bytes_per_call),
                "calls": float(t.calls),
                "inter": inter,
                "scope": t.scope,
                "exchange": bool(t.exchange),
            }
        )
    return rows


def _on_stage(scope: str, stage: int, pp: int) -> bool:
    return scope not in ("first", "last") or stage == (0 if scope == "first" else pp - 1)


def contention(ranks: int, cal: Calibration, *, busy_s: float, step_s: float) -> float:
    """D = max(1, U): U the cores the ranks would keep busy -- ranks x (work + gamma x communication
    time) / uncontended step / (cores x eta). A rank blocked on a peer frees its core; gamma is the
    share of communication time its host is busy (copies, the transport's threads), measured or 0.5;
    eta the share of the cores that ranks outnumbering them keep busy (a rank woken by a peer can
    find its core taken while another idles), fitted or 1."""
    if cal.cores <= 0 or ranks <= cal.cores or step_s <= 0:
        return 1.0
    return max(1.0, ranks * busy_s / step_s / (cal.cores * cal.core_efficiency))


def contention_line(cal: Calibration) -> str | None:
    """What the fit found about ranks that outnumber the cores (gamma, eta), and where it came from;
    None when no calibration run had more ranks than cores (sources as read: a hand-edited file's
    entries may lack fields)."""
    shared = [
        s for s in cal.sources if isinstance(s, dict) and isinstance(s.get("ranks"), int) and s["ranks"] > cal.cores > 0
    ]
    if not shared:
        return None
    measured = any(s.get("comm_cpu_s") is not None for s in shared)
    how = "measured by the engine's CPU clocks" if measured else "fitted to the step (no CPU clocks)"
    return (
        f"contention on {cal.cores} cores: communication keeps a rank's host busy {cal.gamma:.0%} of its time "
        f"({how}); ranks that outnumber the cores keep {cal.core_efficiency:.0%} of them busy"
    )


def predict(
    model: Model, plan: Plan, cal: Calibration, *, ranks_here: int | None = None, cluster: Cluster | None = None
) -> dict[str, Any]:
    """Seconds per step and its parts under the calibration (see the module docstring). `ranks_here`:
    ranks sharing one machine's cores (default: the whole world, as the local launcher runs it);
    `cluster`: where groups that span its nodes take the inter-node link's terms."""
    f = features(model, plan)
    m = max(plan.microbatches, 1)
    per_layer = (
        cal.layer_fixed_s
        + (cal.tp_layer_s if plan.tp > 1 else 0.0)
        + (cal.sp_layer_s if plan.sp else 0.0)
        + (cal.cp_layer_s if plan.cp > 1 else 0.0)
    )
    work_mb = [
        cal.microbatch_fixed_s
        + f["layers"][s] * per_layer
        + f["layer_flops"][s] * cal.flop_s
        + f["elementwise_bytes"][s] * cal.elementwise_byte_s
        + f["head"][s] * cal.head_fixed_s
        + f["head_flops"][s] * cal.flop_s
        for s in range(plan.pp)
    ]
    # per stage and dim, the seconds of one microbatch's collectives; once-per-step ones apart
    per_mb: list[dict[str, float]] = [{} for _ in range(plan.pp)]
    per_step: dict[str, float] = {}
    for row in comm_calls(model, plan, overlaps=cal.overlaps, cluster=cluster):
        if row["exchange"]:
            t = row["calls"] * exchange_s(row["bytes"], cal, inter=row["inter"])
        else:
            t = row["calls"] * collective_s(row["op"], row["n"], row["bytes"], cal, inter=row["inter"])
        if row["scope"] == "step":
            per_step[row["dim"]] = per_step.get(row["dim"], 0.0) + t
            continue
        for s in range(plan.pp):
            if _on_stage(row["scope"], s, plan.pp):
                per_mb[s][row["dim"]] = per_mb[s].get(row["dim"], 0.0) + t / m
    # the slowest stage sets the pace: its work and its collectives
    slowest = max(range(plan.pp), key=lambda s: work_mb[s] + sum(per_mb[s].values()))
    stage_comm = per_mb[slowest]
    slot = work_mb[slowest] + sum(stage_comm.values())
    bubble_slots = (plan.pp - 1) / plan.vpp if plan.pp > 1 else 0.0
    comm = m * sum(stage_comm.values()) + sum(per_step.values())
    work = m * work_mb[slowest] + cal.step_fixed_s
    plain = work + bubble_slots * slot + comm
    D = contention(ranks_here or plan.world_size, cal, busy_s=work + cal.gamma * comm, step_s=plain)
    exposed = {d: m * t for d, t in stage_comm.items()}
    for d, t in per_step.items():
        exposed[d] = exposed.get(d, 0.0) + t
    exposed.setdefault("dp", 0.0)
    parts = {
        "compute_s": D * m * work_mb[slowest],
        "bubble_s": D * bubble_slots * slot,
        **{f"exposed_{d}_s": D * t for d, t in sorted(exposed.items())},
        "fixed_s": D * cal.step_fixed_s,
    }
    return {"step_time_s": sum(parts.values()), **parts, "contention_factor": D}
