"""Tables behind the Long-context page: how activation memory and communication grow with the sequence,
for TP alone, TP + SP and TP + SP + CP by each exchange (all-gather, ring, Ulysses), and the smallest
plan that fits at each length.

Every number is parallel.core's (memory.activation_bytes_per_stage / memory_per_gpu_bytes,
comm.comm_per_step, perf.step_time) for the model with its seq_len replaced; lengths a variant
cannot split (s not divisible by 2·cp, s/cp by tp under SP, heads by cp·tp for Ulysses) are left out.

Pure: numpy, pandas and parallel/ only (no streamlit).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from parallel.core import comm, memory, perf
from parallel.core.memory import ActivationOptions
from parallel.core.plan import CP_KINDS, Plan, PlanColumns
from parallel.core.specs import Cluster, Model
from parallel.core.validate import _shape_errors

LENGTHS = tuple(2**k for k in range(12, 21))  # 4K ... 1M tokens
KIND_NAMES = {"allgather": "all-gather", "ring": "ring", "ulysses": "Ulysses"}
HEADROOM = 0.1  # fraction of GPU memory kept free, as the plan search's default
CP_DEGREES = (2, 4, 8, 16, 32, 64, 128, 256)


def variants(plan: Plan, cp: int) -> dict[str, Plan]:
    """{label: plan}: the plan's TP alone, with SP, and with SP and `cp`-way CP by each exchange (no
    pipeline or data parallelism: one microbatch of the plan's size on one model replica)."""
    base = dataclasses.replace(
        plan, dp=1, pp=1, vpp=1, pp_layout="", cp=1, sp=False, global_batch=plan.micro_batch, zero=0
    )
    tp = f"TP{plan.tp}"
    out = {tp: base}
    if plan.tp > 1:
        out[f"{tp}+SP"] = dataclasses.replace(base, sp=True)
    sp = plan.tp > 1
    for kind in CP_KINDS:
        name = f"{tp}{'+SP' if sp else ''}+CP{cp} {KIND_NAMES[kind]}"
        out[name] = dataclasses.replace(base, sp=sp, cp=cp, cp_kind=kind)
    return out


def at_length(model: Model, seq_len: int) -> Model:
    return dataclasses.replace(model, seq_len=seq_len)


def memory_curves(
    model: Model, plan: Plan, cp: int, opts: ActivationOptions, lengths: tuple[int, ...] = LENGTHS
) -> pd.DataFrame:
    """One row per (variant, length): activation bytes saved by one microbatch on one GPU (all the
    model's layers, the embedding and output terms), at the lengths each variant can split."""
    rows = []
    for label, p in variants(plan, cp).items():
        for s in lengths:
            m = at_length(model, s)
            if _shape_errors(p, m):
                continue
            per_mb = memory.activation_bytes_per_stage(m, p, 0, opts)  # pp 1, one microbatch: all of it
            rows.append(
                {
                    "variant": label,
                    "cp_kind": p.cp_kind if p.cp > 1 else "",
                    "seq_len": s,
                    "bytes": float(per_mb),
                    "GiB": float(per_mb) / 2**30,
                }
            )
    return pd.DataFrame(rows, columns=["variant", "cp_kind", "seq_len", "bytes", "GiB"])


def coinciding(curves: pd.DataFrame) -> dict[str, str]:
    """{variant: the earlier variant it lies on}: memory curves (memory_curves' frame) with the same bytes
    at every length both are drawn at, so one line hides the other (all-gather and ring CP under a flash
    kernel: each keeps only its own K/V)."""
    out: dict[str, str] = {}
    by_variant = {v: g.set_index("seq_len")["bytes"] for v, g in curves.groupby("variant", sort=False)}
    names = list(by_variant)
    for i, later in enumerate(names):
        for earlier in names[:i]:
            a, b = by_variant[earlier], by_variant[later]
            if earlier not in out and a.index.equals(b.index) and np.allclose(a, b, rtol=1e-9, atol=0):
                out[later] = earlier
                break
    return out


def link_name(cluster: Cluster, link: str) -> str:
    """The cluster's own name for a link tier ('intra' / 'inter'), e.g. NVLink / InfiniBand, loopback."""
    chosen = cluster.intra if link == "intra" else cluster.inter
    return chosen.name or ("inside a node" if link == "intra" else "between nodes")


def comm_curves(model: Model, plan: Plan, cp: int, cluster: Cluster) -> pd.DataFrame:
    """One row per (variant, length, link): seconds of TP/SP/CP communication per layer per
    microbatch on the link each group crosses (the cluster sized for the variant's GPUs, TP inside a
    node first), and the attention core's compute per layer beside it (what ring attention hides
    its transfers behind)."""
    rows = []
    for label, p in variants(plan, cp).items():
        c = cluster.sized_for(p.world_size)
        for s in LENGTHS:
            m = at_length(model, s)
            if _shape_errors(p, m):
                continue
            per = m.layers * max(p.microbatches, 1)  # the rows count every layer of every microbatch
            by_link: dict[str, float] = {}
            for r in comm.comm_per_step(m, p, c):
                if r["dim"] in ("tp", "sp", "cp") and r["scope"] == "layer" and not r["overlapped"]:
                    by_link[r["link"]] = by_link.get(r["link"], 0.0) + r["seconds"] / per
            attention = perf.attention_seconds_per_step(m, p, c) / per
            for link, seconds in by_link.items():
                rows.append(
                    {
                        "variant": label,
                        "seq_len": s,
                        "link": link_name(c, link),
                        "tier": link,
                        "ms": seconds * 1e3,
                        "attention_ms": attention * 1e3,
                    }
                )
    return pd.DataFrame(rows, columns=["variant", "seq_len", "link", "tier", "ms", "attention_ms"])


# The plan's fields that set what a GPU saves for backward beside its recompute mode: the curves take them
# from the plan (variants), and so does every candidate of the smallest plan that fits.
SAVED_FIELDS = ("recompute_modules", "offload_modules", "attention", "dropout")


def _saved(plan: Plan) -> dict:
    return {name: getattr(plan, name) for name in SAVED_FIELDS}


def _candidates(model: Model, plan: Plan, cluster: Cluster, kinds: tuple[str, ...]) -> PlanColumns:
    """dp = 1 plans: TP inside a node (with SP), CP in powers of two, PP over the layers with one
    microbatch per stage, ZeRO-1 over the CP ranks, the plan's micro batch, recompute mode and what
    else shapes its saved activations (SAVED_FIELDS)."""
    tps = [t for t in (1, 2, 4, 8, 16) if t <= cluster.gpus_per_node and model.heads % t == 0]
    pps = [p for p in (1, 2, 4, 8, 16, 32, 64) if model.layers % p == 0]
    cps = [1, *CP_DEGREES, 512, 1024]
    rows = [
        (t, c, p, k)
        for t in tps
        for c in cps
        for p in pps
        for k in (kinds if c > 1 else ("allgather",))
        if k != "ulysses" or (model.heads % (c * t) == 0 and model.kv_heads % (c * t) == 0)
    ]
    n = len(rows)
    t, c, p, k = (np.array(x) for x in zip(*rows))
    return PlanColumns(
        dp=np.ones(n, np.int64),
        tp=t.astype(np.int64),
        pp=p.astype(np.int64),
        cp=c.astype(np.int64),
        sp=t > 1,
        micro_batch=np.full(n, plan.micro_batch, np.int64),
        vpp=np.ones(n, np.int64),
        zero=np.ones(n, np.int64),
        recompute=np.full(n, plan.recompute),
        global_batch=plan.micro_batch,  # smallest_fits sets m = pp microbatches per pp
        cp_kind=k,
        **_saved(plan),
    )


def _subset(cols: PlanColumns, keep: np.ndarray, *, global_batch: int) -> PlanColumns:
    fields = {f.name: getattr(cols, f.name) for f in dataclasses.fields(PlanColumns)}
    rows = {k: (v[keep] if np.ndim(v) else v) for k, v in fields.items() if k != "global_batch"}
    return PlanColumns(**rows, global_batch=global_batch)


def smallest_fits(
    model: Model, plan: Plan, cluster: Cluster, opts: ActivationOptions, kinds: tuple[str, ...] = CP_KINDS
) -> pd.DataFrame:
    """For each length, the plan with the fewest GPUs whose most loaded GPU fits in memory (less
    HEADROOM), fastest among those: dp 1, TP ≤ GPUs per node with SP, CP of any exchange in `kinds`,
    PP with as many microbatches as stages, ZeRO-1. "nothing fits" where no candidate does, and then
    `why`: the least loaded candidate's memory by term against the budget, and what would make room."""
    out = []
    budget = cluster.gpu_memory_bytes * (1 - HEADROOM)
    for s in LENGTHS:
        m = at_length(model, s)
        cols = _candidates(m, plan, cluster, kinds)
        valid = (s % (2 * cols.cp) == 0) | (cols.cp == 1)
        valid &= ~cols.sp | ((s // cols.cp) % cols.tp == 0)
        best = closest = None
        for pp in np.unique(cols.pp):
            keep = valid & (cols.pp == pp)
            if not keep.any():
                continue
            sub = _subset(cols, keep, global_batch=plan.micro_batch * int(pp))
            parts = memory.memory_per_gpu_bytes(m, sub, opts)
            mem = parts["total"]
            gpus = sub.tp * sub.cp * sub.pp
            time = perf.step_time(m, sub, cluster, acts=opts)["step_time_s"]
            for i in np.flatnonzero(mem <= budget):
                key = (int(gpus[i]), float(time[i]))
                if best is None or key < best[0]:
                    best = (key, sub, i, float(mem[i]))
            i = int(np.argmin(mem))
            if closest is None or mem[i] < closest[0]:
                closest = (float(mem[i]), _plan_of(sub, i, plan), {k: float(parts[k][i]) for k in parts})
        if best is None:
            why = _why_nothing_fits(model, m, closest, budget) if closest else "no plan can split this length"
            out.append(
                {"seq_len": s, "plan": "nothing fits", "gpus": None, "memory_GiB": None, "fits": False, "why": why}
            )
            continue
        (gpus, _), sub, i, mem = best
        p = _plan_of(sub, i, plan)
        out.append({"seq_len": s, "plan": p.label(), "gpus": gpus, "memory_GiB": mem / 2**30, "fits": True, "why": ""})
    return pd.DataFrame(out, columns=["seq_len", "plan", "gpus", "memory_GiB", "fits", "why"])


def _plan_of(sub: PlanColumns, i: int, plan: Plan) -> Plan:
    return Plan(
        tp=int(sub.tp[i]),
        cp=int(sub.cp[i]),
        pp=int(sub.pp[i]),
        sp=bool(sub.sp[i]),
        micro_batch=plan.micro_batch,
        global_batch=sub.global_batch,
        zero=1,
        recompute=plan.recompute,
        cp_kind=str(sub.cp_kind[i]),  # "allgather" for the cp-1 candidates
        **_saved(plan),
    )


def _why_nothing_fits(base: Model, model: Model, closest: tuple, budget: float) -> str:
    """Which term keeps the least loaded candidate over the budget, and what would make room."""
    total, p, parts = closest
    gib = 2**30
    states = parts["params"] + parts["grads"] + parts["optimizer"]
    held = (
        f"{parts['params'] / gib:,.1f} GiB parameters, {parts['grads'] / gib:,.1f} GiB gradients, "
        f"{parts['optimizer'] / gib:,.1f} GiB optimizer states, {parts['activations'] / gib:,.1f} GiB activations"
    )
    head = (
        f"the least loaded plan, {p.label()}, needs {total / gib:,.1f} GiB on its most loaded GPU ({held}); "
        f"the budget is {budget / gib:,.1f} GiB"
    )
    grown = model.embedding_params() - base.embedding_params()
    if states > budget:
        if grown > 0:
            return (
                f"{head}. Its model states alone exceed it: the learned position table grows with the length "
                f"({grown * model.dtype_bytes / gib:,.1f} GiB more parameters than at {base.seq_len:,} tokens, all on "
                "the first stage, with their gradients and optimizer states); a model with rotary positions, "
                "ZeRO-3 or a GPU with more memory would make room"
            )
        return f"{head}. Its model states alone exceed it: ZeRO-3 over more ranks or a GPU with more memory would make room"
    return (
        f"{head}. The activations do not fit: more CP than {p.cp} (or a larger CP group), full recompute or a GPU "
        "with more memory would make room"
    )


def measured_points(model: Model, plan: Plan, cp: int, runs: list[tuple[dict, Plan, str]]) -> pd.DataFrame:
    """This project's runs on the curves: (metrics.json, its plan, run name) of the page's model whose
    plan is one of the variants (same TP, micro batch and recompute mode; cp 1 or the page's cp),
    with the activation bytes measured on the rank holding every layer's first microbatch (pp 1)."""
    rows = []
    names = {(p.tp, p.sp, p.cp, p.cp_exchange): n for n, p in variants(plan, cp).items()}
    for metrics, p, name in runs:
        spec = metrics.get("model") or {}
        if spec.get("name") != model.name or p.pp != 1 or p.micro_batch != plan.micro_batch:
            continue
        if p.recompute != plan.recompute:
            continue
        key = (p.tp, p.sp, p.cp, p.cp_exchange)
        if key not in names or not metrics.get("activation_bytes"):
            continue
        rows.append(
            {
                "variant": names[key],
                "seq_len": int(spec.get("seq_len", model.seq_len)),
                "bytes": float(max(metrics["activation_bytes"].values())),
                "GiB": float(max(metrics["activation_bytes"].values())) / 2**30,
                "run": name,
            }
        )
    return pd.DataFrame(rows, columns=["variant", "seq_len", "bytes", "GiB", "run"])


SP_VS_CP = (
    "**SP is not CP.** Sequence parallelism splits, along the sequence, only what plain TP keeps whole on "
    "every TP rank — the LayerNorm inputs, dropout masks and residuals — inside the TP group (a node), "
    "turning each all-reduce into a reduce-scatter plus an all-gather of the same volume; the attention "
    "itself still sees every token of the sequence on each rank. Context parallelism splits the whole "
    "sequence, attention included, over any number of ranks and nodes; each rank then needs the keys "
    "and values of the other ranks' tokens: all-gathered (a flash kernel keeps only its own and gathers "
    "again in backward; materialised attention keeps all s tokens' K/V), passed round a "
    "ring one block at a time (only its own block kept, transfers hidden behind attention), or "
    "exchanged for whole heads by all-to-all (Ulysses: cp·tp must divide the K/V heads)."
)
