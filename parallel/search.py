"""Search the plan space: every valid (dp, tp, pp, cp, sp, vpp, micro_batch, zero, recompute) for a
model, a cluster and a global batch; keep those that fit in memory; rank by estimated step time.

    python -m parallel search --model gpt3-175b --cluster dgx-h100 --gpus 512 --global-batch 1536 \\
        [--top N] [--json] [--headroom 0.1] [--max-tp 8] [--require-sp] [--zero 0,1] [--recompute none,selective]

How: the candidates are built degree by degree, each structural rule of `parallel.validate` applied
as a named filter (the *funnel*), so an empty space says which constraint emptied it. The survivors
(~3e5 rows for GPT-3 175B on 4096 GPUs) are then evaluated as numpy columns by `evaluate`, which
writes the formulas of `parallel.memory`, `parallel.comm` and `parallel.perf` out over arrays —
`search_naive` is the same search as a plain loop over `parallel.report.plan_report`, and a test
checks that both agree on a small space. The most loaded GPU is always the first or the last
pipeline stage (interior stages hold no embedding and fewer in-flight microbatches than stage 0),
so only those two stages are evaluated.

Pure: numpy and pandas.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .comm import _link_of
from .plan import RECOMPUTE, Plan
from .report import Options, plan_report
from .specs import GiB, Cluster, Model, SpecError
from .topology import DEFAULT_ORDER

PLAN_KEYS = ("dp", "tp", "pp", "cp", "sp", "vpp", "micro_batch", "zero", "recompute")


class SearchEmpty(SpecError):
    """No plan survives the constraints; the message names the one that removed the last candidates."""

    def __init__(self, message: str, funnel: list[dict] | None = None):
        super().__init__(message)
        self.funnel = funnel or []  # how many candidates each constraint left


@dataclass(frozen=True)
class Constraints:
    headroom: float = 0.1  # fraction of GPU memory kept free (allocator, NCCL buffers); validate warns above 90%
    max_tp: int | None = None  # e.g. gpus_per_node to keep TP on NVLink
    max_pp: int | None = None
    max_cp: int | None = None
    max_micro_batch: int | None = None
    require_sp: bool = False  # every plan with tp > 1 uses sequence parallelism
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    order: str = DEFAULT_ORDER

    def __post_init__(self):
        if not 0 <= self.headroom < 1:
            raise SpecError(f"headroom must be in [0, 1), got {self.headroom}")
        for name in ("max_tp", "max_pp", "max_cp", "max_micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecError(f"{name} must be at least 1, got {value}")
        if not self.zero or set(self.zero) - {0, 1, 2, 3}:
            raise SpecError(f"zero stages must be among 0, 1, 2, 3, got {self.zero}")
        if not self.recompute or set(self.recompute) - set(RECOMPUTE):
            raise SpecError(f"recompute modes must be among {', '.join(RECOMPUTE)}, got {self.recompute}")


@dataclass
class SearchResult:
    table: pd.DataFrame  # one row per plan that fits, best (fastest) first
    funnel: list[dict] = field(default_factory=list)  # [{constraint, remaining}] in the order applied
    evaluated: int = 0  # plans whose memory and time were computed
    seconds: float = 0.0

    def plans(self, global_batch: int, order: str = DEFAULT_ORDER) -> list[Plan]:
        return [plan_of(row, global_batch, order) for row in self.table.to_dict("records")]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_of(row: dict, global_batch: int, order: str = DEFAULT_ORDER) -> Plan:
    """The Plan of one row of a search table."""
    return Plan(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]), sp=bool(row["sp"]),
                vpp=int(row["vpp"]), micro_batch=int(row["micro_batch"]), zero=int(row["zero"]),
                recompute=str(row["recompute"]), global_batch=global_batch, order=order)


# ---------------------------------------------------------------- candidates, rule by rule

def _degrees(model: Model, world: int, gb: int, c: Constraints, funnel: list[dict]) -> list[tuple[int, int, int, int]]:
    m = model
    combos = [(tp, pp, cp, world // (tp * pp * cp)) for tp in divisors(world) for pp in divisors(world // tp)
              for cp in divisors(world // (tp * pp))]
    rules = [
        (f"dp×tp×pp×cp = {world} GPUs", lambda tp, pp, cp, dp: True),
        (f"max TP {c.max_tp}", lambda tp, pp, cp, dp: c.max_tp is None or tp <= c.max_tp),
        (f"max PP {c.max_pp}", lambda tp, pp, cp, dp: c.max_pp is None or pp <= c.max_pp),
        (f"max CP {c.max_cp}", lambda tp, pp, cp, dp: c.max_cp is None or cp <= c.max_cp),
        (f"tp divides heads {m.heads} and ffn_hidden {m.ffn_hidden}; tp and kv_heads {m.kv_heads} divide one another",
         lambda tp, pp, cp, dp: m.heads % tp == 0 and m.ffn_hidden % tp == 0 and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)),
        (f"pp divides layers {m.layers}", lambda tp, pp, cp, dp: m.layers % pp == 0),
        (f"seq_len {m.seq_len} divisible by 2·cp (load-balanced CP)", lambda tp, pp, cp, dp: cp == 1 or m.seq_len % (2 * cp) == 0),
        (f"global batch {gb} divisible by dp", lambda tp, pp, cp, dp: gb % dp == 0),
    ]
    for name, keep in rules:
        if "None" in name:
            continue
        combos = [t for t in combos if keep(*t)]
        funnel.append({"constraint": name, "remaining": len(combos)})
    return combos


def candidates(model: Model, world: int, global_batch: int, c: Constraints = Constraints()) -> tuple[pd.DataFrame, list[dict]]:
    """Every structurally valid plan (all of validate's shape rules hold) and the funnel that built it."""
    funnel: list[dict] = []
    base = []  # (dp, tp, pp, cp, mb, vpp)
    n_mb = 0
    for tp, pp, cp, dp in _degrees(model, world, global_batch, c, funnel):
        for mb in divisors(global_batch // dp):
            if c.max_micro_batch is not None and mb > c.max_micro_batch:
                continue
            n_mb += 1
            m = global_batch // (dp * mb)
            for v in divisors(model.layers // pp):
                if v == 1 or (pp > 1 and m % pp == 0):
                    base.append((dp, tp, pp, cp, mb, v))
    if c.max_micro_batch is not None:
        funnel.append({"constraint": f"max micro batch {c.max_micro_batch}", "remaining": n_mb})
    funnel.append({"constraint": "vpp divides layers/pp; vpp > 1 needs pp > 1 and microbatches divisible by pp",
                   "remaining": len(base)})
    cols = ["dp", "tp", "pp", "cp", "micro_batch", "vpp"]
    b = np.array(base, dtype=np.int64).reshape(-1, len(cols))
    zero = np.array(c.zero, dtype=np.int64)
    rc = np.array([RECOMPUTE.index(r) for r in c.recompute], dtype=np.int64)
    n_cat = 2 * len(zero) * len(rc)
    rows = {k: np.repeat(b[:, i], n_cat) for i, k in enumerate(cols)}
    cat = np.array(list(itertools.product((False, True), zero, rc)), dtype=np.int64).reshape(-1, 3)
    rows["sp"] = np.tile(cat[:, 0].astype(bool), len(b))
    rows["zero"] = np.tile(cat[:, 1], len(b))
    rows["rc"] = np.tile(cat[:, 2], len(b))
    tp, cp, sp = rows["tp"], rows["cp"], rows["sp"]
    ok = ~sp | ((tp > 1) & ((model.seq_len // cp) % tp == 0))
    rows = {k: v[ok] for k, v in rows.items()}
    funnel.append({"constraint": f"× sp, ZeRO {list(c.zero)}, recompute {list(c.recompute)}; SP needs tp > 1 and "
                                 f"tp dividing seq_len/cp", "remaining": len(rows["dp"])})
    if c.require_sp:
        keep = rows["sp"] | (rows["tp"] == 1)
        rows = {k: v[keep] for k, v in rows.items()}
        funnel.append({"constraint": "SP required whenever tp > 1", "remaining": len(rows["dp"])})
    return pd.DataFrame(rows), funnel


# ---------------------------------------------------------------- vectorised plan model

def _coll(op: str, n, nbytes, bw, lat):
    """parallel.comm.collective_seconds over arrays (0 where the group has one rank)."""
    n = np.asarray(n, dtype=np.float64)
    if op == "all_reduce":
        t = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat
    else:  # all_gather, reduce_scatter
        t = (n - 1) / n * nbytes / bw + (n - 1) * lat
    return np.where(n > 1, t, 0.0)


def _links(cands: pd.DataFrame, cluster: Cluster, order: str) -> dict[str, np.ndarray]:
    """Per row, True where the groups of tp / cp / pp / dp×cp cross nodes (parallel.comm's _link_of)."""
    keys = cands[["dp", "tp", "pp", "cp"]].drop_duplicates()
    table = {}
    for dp, tp, pp, cp in keys.itertuples(index=False):
        p = Plan(dp=int(dp), tp=int(tp), pp=int(pp), cp=int(cp), order=order)
        table[(dp, tp, pp, cp)] = [_link_of(p, cluster, d) == "inter" for d in (("tp",), ("cp",), ("pp",), ("dp", "cp"))]
    flags = np.array([table[k] for k in zip(cands["dp"], cands["tp"], cands["pp"], cands["cp"])], dtype=bool).reshape(-1, 4)
    return dict(zip(("tp", "cp", "pp", "dp"), flags.T))


def evaluate(model: Model, cluster: Cluster, global_batch: int, cands: pd.DataFrame, options: Options = Options(),
             order: str = DEFAULT_ORDER) -> pd.DataFrame:
    """Memory of the most loaded GPU and step time of every candidate row, as parallel.report computes them."""
    m_, ao, co, po = model, options.activations, options.comm, options.perf
    dp, tp, pp, cp = (cands[k].to_numpy(np.int64) for k in ("dp", "tp", "pp", "cp"))
    mb, v, zero, rc = (cands[k].to_numpy(np.int64) for k in ("micro_batch", "vpp", "zero", "rc"))
    sp = cands["sp"].to_numpy(bool)
    full, sel = rc == 2, rc == 1
    L, h, a, f, V, S = m_.layers, m_.hidden, m_.heads, m_.ffn_hidden, m_.vocab, m_.seq_len
    m = np.maximum(global_batch // (dp * mb), 1)  # microbatches per pipeline

    # activations of one layer, one microbatch (parallel.memory.activation_components_bytes)
    A = ao.act_bytes or m_.dtype_bytes
    M = ao.mask_bytes if ao.dropout else 0
    s_q = S // cp
    s_kv = np.where(cp > 1, S, s_q)
    k_local = m_.kv_hidden / np.minimum(tp, m_.kv_heads)
    r = np.where(sp, 1 / tp, 1.0)
    b = mb
    scores = A * a * b * s_q * s_kv / tp
    keep = (not ao.flash_attention) & ~sel
    parts = [2 * A * b * s_q * h * r, A * b * s_q * h * r, A * b * (s_q * h / tp + s_kv * k_local),
             np.where(keep, scores, 0.0), np.where(keep, M * a * b * s_q * s_kv / tp, 0.0),
             np.where(keep & ao.dropout, scores, 0.0), (4 * a * b * s_q / tp) if ao.flash_attention else 0.0,
             A * b * s_kv * k_local, A * b * s_q * h / tp, A * b * s_q * h * r]
    gate = 2 if m_.gated_mlp else 1
    parts += [gate * A * b * s_q * f / tp, gate * A * b * s_q * f / tp, 2 * M * b * s_q * h * r]
    act_layer = 0
    for p_ in parts:
        act_layer = act_layer + p_
    act_layer = np.where(full, A * b * s_q * h * r, act_layer)

    # in-flight chunks on the first and last stage (parallel.memory.inflight_chunks, 1F1B / interleaved)
    chunks0 = np.where(v == 1, np.minimum(pp, m), np.minimum(2 * (pp - 1) + (v - 1) * pp + 1, m * v))
    chunks_l = np.where(v == 1, np.minimum(1, m), np.minimum((v - 1) * pp + 1, m * v))
    per_chunk = act_layer * (L / (pp * v))
    first_extra = M * b * s_q * h * r
    last_extra = 2 * A * b * s_q * h * r + 4 * b * s_q * V / tp
    single = pp == 1
    act0 = per_chunk * chunks0 + first_extra * np.minimum(chunks0, m) + np.where(single, last_extra, 0.0)
    act_l = per_chunk * chunks_l + last_extra

    # parameters on the first and last stage (parallel.memory.params_per_stage)
    rep = 2 * h if m_.arch == "llama" else 6 * h
    layer = (m_.params_per_layer() - rep) / tp + rep
    base = layer * L / pp
    pos = S * h if m_.arch == "gpt" else 0
    out_norm = m_.output_params() - (0 if m_.tied_embeddings else V * h)
    n0 = base + (V * h / tp + pos)
    n0 = np.where(single, n0 + out_norm + (0.0 if m_.tied_embeddings else V * h / tp), n0)
    n_l = base + out_norm + V * h / tp
    nd = dp * cp
    w = m_.dtype_bytes
    kb = 12 if w == 2 else 8

    def states(n):
        return (n * w / np.where(zero >= 3, nd, 1), n * w / np.where(zero >= 2, nd, 1), n * kb / np.where(zero >= 1, nd, 1))

    p0, g0, o0 = states(n0)
    pl, gl, ol = states(n_l)
    tot0 = p0 + g0 + o0 + act0
    tot_l = np.where(single, -np.inf, pl + gl + ol + act_l)
    first = tot0 >= tot_l
    out = {k: cands[k].to_numpy() for k in ("dp", "tp", "pp", "cp", "sp", "vpp", "micro_batch", "zero")}
    out["recompute"] = np.array(RECOMPUTE, dtype=object)[rc]
    out["microbatches"] = m
    for name, x0, xl in (("params", p0, pl), ("grads", g0, gl), ("optimizer", o0, ol), ("activations", act0, act_l)):
        out[f"{name}_bytes"] = np.where(first, x0, xl)
    out["memory_per_gpu_bytes"] = np.where(first, tot0, tot_l)
    out["activation_bytes_per_layer"] = act_layer

    # communication per step (parallel.comm.comm_per_step) on each dimension's link
    inter = _links(cands, cluster, order)
    bw = {d: np.where(inter[d], cluster.inter.bandwidth_bytes_per_s, cluster.intra.bandwidth_bytes_per_s) for d in inter}
    lat = {d: np.where(inter[d], cluster.inter.latency_s, cluster.intra.latency_s) for d in inter}
    layers = L // pp
    fwd = np.where(full, 2, 1)
    act = m_.dtype_bytes
    tp_bytes = mb * s_q * h * act
    calls = (2 * fwd + 2) * layers * m
    ar = calls * _coll("all_reduce", tp, tp_bytes, bw["tp"], lat["tp"])
    ag = calls * _coll("all_gather", tp, tp_bytes, bw["tp"], lat["tp"])
    exp_tp = np.where(sp, 0.0, ar)
    exp_sp = np.where(sp, ag + ag, 0.0)  # all-gathers + reduce-scatters (same cost); the re-gather overlaps
    kv_bytes = 2 * mb * S * m_.kv_hidden / np.minimum(tp, m_.kv_heads) * act
    cp_ag = fwd * layers * m * _coll("all_gather", cp, kv_bytes, bw["cp"], lat["cp"])
    cp_rs = layers * m * _coll("reduce_scatter", cp, kv_bytes, bw["cp"], lat["cp"])
    exp_cp = cp_ag + cp_rs
    pp_bytes = tp_bytes / np.where(sp, tp, 1)
    exp_pp = np.where(pp > 1, 2 * m * v * (pp_bytes / bw["pp"] + lat["pp"]), 0.0)
    grad = np.maximum(n0, np.where(single, n0, n_l)) * act
    dcalls = np.maximum(1, np.ceil(grad / co.bucket_bytes))
    dp_ar = dcalls * _coll("all_reduce", nd, grad / dcalls, bw["dp"], lat["dp"])
    dp_rs = dcalls * np.where(zero >= 2, m, 1) * _coll("reduce_scatter", nd, grad / dcalls, bw["dp"], lat["dp"])
    dp_ag = dcalls * np.where(zero == 3, 2 * m, 1) * _coll("all_gather", nd, grad / dcalls, bw["dp"], lat["dp"])
    exp_dp = np.where(zero == 0, dp_ar, dp_rs + dp_ag) * (1.0 - po.dp_overlap)

    # step time (parallel.perf.step_time): FLOPs depend only on the recompute mode
    hw = np.array([flops_hw(m_, global_batch, r_) for r_ in RECOMPUTE])[rc]
    model_flops = flops_hw(m_, global_batch, "none")
    world = dp * tp * pp * cp
    compute = hw / world / (cluster.peak_flops * po.mfu)
    critical = compute + exp_tp + exp_sp + exp_cp + exp_pp
    bubble_frac = np.where(single, 0.0, (pp - 1) / (v * m))
    total = critical + critical * bubble_frac + exp_dp
    out.update({"step_time_s": total, "bubble_fraction": bubble_frac, "mfu": model_flops / (total * world * cluster.peak_flops),
                "compute_s": compute, "bubble_s": critical * bubble_frac, "exposed_tp_s": exp_tp, "exposed_sp_s": exp_sp,
                "exposed_cp_s": exp_cp, "exposed_pp_s": exp_pp, "exposed_dp_s": exp_dp,
                "tp_link": np.where(inter["tp"], "inter", "intra"), "dp_link": np.where(inter["dp"], "inter", "intra")})
    return pd.DataFrame(out)


def flops_hw(model: Model, global_batch: int, recompute: str) -> float:
    from .perf import flops_per_step  # the one formula; a Plan only carries the batch and the mode here

    return flops_per_step(model, Plan(global_batch=global_batch, recompute=recompute))["hardware_flops"]


# ---------------------------------------------------------------- the search

def _rank(table: pd.DataFrame) -> pd.DataFrame:
    """Fastest first; ties (e.g. ZeRO 0 vs 1 cost the same traffic) broken by memory, then simpler plans."""
    key = table.assign(_t=table["step_time_s"].round(9), _rc=table["recompute"].map(RECOMPUTE.index))
    key = key.sort_values(["_t", "memory_per_gpu_bytes", "_rc", "zero", "vpp", "cp", "pp", "tp", "micro_batch"],
                          kind="stable")
    return key.drop(columns=["_t", "_rc"]).reset_index(drop=True)


def pareto_front(table: pd.DataFrame) -> np.ndarray:
    """True for plans no other plan beats on both memory and step time (lower is better on both)."""
    order = np.lexsort((table["memory_per_gpu_bytes"].to_numpy(), table["step_time_s"].to_numpy()))
    mem = table["memory_per_gpu_bytes"].to_numpy()[order]
    best = np.minimum.accumulate(mem)
    keep = np.ones(len(mem), dtype=bool)
    keep[1:] = mem[1:] < best[:-1]
    out = np.zeros(len(mem), dtype=bool)
    out[order] = keep
    return out


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def search(model: Model, cluster: Cluster, global_batch: int, constraints: Constraints = Constraints(),
           options: Options = Options()) -> SearchResult:
    """Every plan for `model` on all of `cluster`'s GPUs that fits in memory, fastest first.

    Raises SearchEmpty naming the constraint that removed the last candidates."""
    t0 = time.perf_counter()
    world = cluster.gpus
    cands, funnel = candidates(model, world, global_batch, constraints)
    for step in funnel:
        if step["remaining"] == 0:
            raise SearchEmpty(_empty_message(model, cluster, global_batch, funnel, step), funnel)
    table = evaluate(model, cluster, global_batch, cands, options, constraints.order)
    budget = cluster.gpu_memory_bytes * (1 - constraints.headroom)
    fits = table["memory_per_gpu_bytes"].to_numpy() <= budget
    name = (f"memory per GPU ≤ {_gib(budget)} ({_gib(cluster.gpu_memory_bytes)} less {constraints.headroom:.0%} headroom)"
            if constraints.headroom else f"memory per GPU ≤ {_gib(budget)}")
    funnel.append({"constraint": name, "remaining": int(fits.sum())})
    if not fits.any():
        least = table.loc[table["memory_per_gpu_bytes"].idxmin()]
        raise SearchEmpty(f"no plan fits: all {len(table):,} valid plans of {model.name} on {world} GPUs need more than "
                          f"{_gib(budget)} per GPU ({_gib(cluster.gpu_memory_bytes)} less {constraints.headroom:.0%} "
                          f"headroom); the leanest, {plan_of(least, global_batch).label()}, needs "
                          f"{_gib(least['memory_per_gpu_bytes'])}; try {_memory_hints(constraints)}", funnel)
    ranked = _rank(table[fits])
    ranked["pareto"] = pareto_front(ranked)
    return SearchResult(ranked, funnel, evaluated=len(table), seconds=time.perf_counter() - t0)


def _memory_hints(c: Constraints) -> str:
    hints = ["more GPUs"]
    if "full" not in c.recompute:
        hints.append("allowing full recompute")
    if 3 not in c.zero:
        hints.append("allowing ZeRO-3")
    hints += [f"a --max-{d} above {getattr(c, 'max_' + d)}" for d in ("tp", "pp", "cp") if getattr(c, "max_" + d)]
    if c.headroom:
        hints.append("less headroom")
    return ", ".join(hints[:-1]) + " or " + hints[-1] if len(hints) > 1 else hints[0]


def _empty_message(model: Model, cluster: Cluster, gb: int, funnel: list[dict], step: dict) -> str:
    i = funnel.index(step)
    if i == 0:
        return f"no plan: {cluster.gpus} GPUs cannot be split into dp×tp×pp×cp"
    return (f"no plan for {model.name} on {cluster.gpus} GPUs (global batch {gb}): the constraint "
            f"'{step['constraint']}' removed the last {funnel[i - 1]['remaining']:,} candidates")


def search_naive(model: Model, cluster: Cluster, global_batch: int, constraints: Constraints = Constraints(),
                 options: Options = Options()) -> pd.DataFrame:
    """The same search as a plain loop over every degree combination through parallel.report.plan_report:
    the reference `search` is tested against (slow: ~1 ms a plan)."""
    c, world = constraints, cluster.gpus
    budget = cluster.gpu_memory_bytes * (1 - c.headroom)
    rows = []
    for tp, pp, cp in itertools.product(divisors(world), repeat=3):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        if any(lim is not None and x > lim for x, lim in ((tp, c.max_tp), (pp, c.max_pp), (cp, c.max_cp))):
            continue
        for mb, v, sp, zero, rc in itertools.product(divisors(global_batch), divisors(model.layers), (False, True),
                                                     c.zero, c.recompute):
            if (c.max_micro_batch and mb > c.max_micro_batch) or (c.require_sp and tp > 1 and not sp):
                continue
            plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, sp=sp, vpp=v, micro_batch=mb, zero=zero, recompute=rc,
                        global_batch=global_batch, order=c.order)
            rep = plan_report(plan, model, cluster, options)
            if rep["memory_per_gpu_bytes"] is None:
                continue
            shape_ok = not [e for e in rep["errors"] if not e.startswith("memory per GPU")]
            if shape_ok and rep["memory_per_gpu_bytes"]["total"] <= budget:
                rows.append({**{k: getattr(plan, k) for k in PLAN_KEYS}, "memory_per_gpu_bytes": rep["memory_per_gpu_bytes"]["total"],
                             "step_time_s": rep["step_time_s"], "bubble_fraction": rep["bubble_fraction"],
                             "mfu": rep["step_time"]["mfu"]})
    return pd.DataFrame(rows)


def result_json(result: SearchResult, top: int | None = None) -> list[dict]:
    """The `--json` list: {plan, memory_per_gpu_bytes, step_time_s, bubble_fraction, ...}, best first."""
    table = result.table if not top else result.table.head(top)
    out = []
    for i, row in enumerate(table.to_dict("records")):
        plan = {k: (bool(row[k]) if k == "sp" else str(row[k]) if k == "recompute" else int(row[k])) for k in PLAN_KEYS}
        out.append({"rank": i + 1, "plan": plan, "memory_per_gpu_bytes": float(row["memory_per_gpu_bytes"]),
                    "step_time_s": float(row["step_time_s"]), "bubble_fraction": float(row["bubble_fraction"]),
                    "mfu": float(row["mfu"]), "pareto": bool(row["pareto"]),
                    "memory_by_component_bytes": {k: float(row[f"{k}_bytes"]) for k in ("params", "grads", "optimizer", "activations")},
                    "exposed_comm_s": {d: float(row[f"exposed_{d}_s"]) for d in ("tp", "sp", "cp", "pp", "dp")}})
    return out


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    from .cli_args import add_cluster_args, add_model_args
    from .plan_cli import add_option_args

    parser = argparse.ArgumentParser(prog="python -m parallel search", description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    add_cluster_args(parser)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to plan for (default: --nodes × GPUs per node)")
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    g = parser.add_argument_group("constraints")
    g.add_argument("--headroom", type=float, default=Constraints.headroom, help="fraction of GPU memory kept free")
    for name in ("tp", "pp", "cp", "micro-batch"):
        g.add_argument(f"--max-{name}", type=int, default=None)
    g.add_argument("--require-sp", action="store_true", help="every plan with tp > 1 uses sequence parallelism")
    g.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to consider, e.g. 0,1")
    g.add_argument("--recompute", default=",".join(RECOMPUTE), help="recompute modes to consider, e.g. none,selective")
    g.add_argument("--order", default=DEFAULT_ORDER, help="rank order, fastest first")
    add_option_args(parser)
    parser.add_argument("--top", type=int, default=10, help="plans to print (0: all)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, best first")
    return parser


def constraints_from_args(args: argparse.Namespace) -> Constraints:
    try:
        zero = tuple(int(z) for z in args.zero.split(",") if z.strip())
    except ValueError:
        raise SpecError(f"--zero must list stages like 0,1,2,3, got {args.zero!r}") from None
    return Constraints(headroom=args.headroom, max_tp=args.max_tp, max_pp=args.max_pp, max_cp=args.max_cp,
                       max_micro_batch=args.max_micro_batch, require_sp=args.require_sp, zero=zero,
                       recompute=tuple(r.strip() for r in args.recompute.split(",") if r.strip()), order=args.order)


def cluster_for_gpus(args: argparse.Namespace) -> Cluster:
    from .cli_args import cluster_from_args

    if args.gpus is None and args.nodes is None:
        raise SpecError("give the GPUs to plan for: --gpus N (or --nodes N)")
    if args.gpus is not None and args.gpus < 1:
        raise SpecError(f"--gpus must be at least 1, got {args.gpus}")
    cluster = cluster_from_args(args, args.gpus or 1)
    if args.gpus is not None and cluster.gpus != args.gpus:
        raise SpecError(f"--gpus {args.gpus} is not a whole number of {cluster.gpus_per_node}-GPU nodes"
                        + (f" (--nodes {args.nodes} gives {cluster.gpus})" if args.nodes else ""))
    return cluster


def render_text(result: SearchResult, model: Model, cluster: Cluster, gb: int, top: int) -> str:
    lines = [f"{model.name} on {cluster.nodes}×{cluster.gpus_per_node} {cluster.name} GPUs, global batch {gb}: "
             f"{len(result.table):,} plans fit ({result.evaluated:,} evaluated in {result.seconds:.2f} s)", "", "funnel:"]
    lines += [f"  {s['remaining']:>9,}  {s['constraint']}" for s in result.funnel]
    table = result.table if not top else result.table.head(top)
    labels = [plan_of(row, gb).label() for row in table.to_dict("records")]
    w = max([len(x) for x in labels] + [4])
    lines += ["", f"{'#':>4}  {'plan':<{w}} {'memory/GPU':>11} {'step s':>8} {'bubble':>7} {'MFU':>6}  pareto"]
    for i, (label, row) in enumerate(zip(labels, table.to_dict("records"))):
        lines.append(f"{i + 1:>4}  {label:<{w}} {row['memory_per_gpu_bytes'] / GiB:>7.1f} GiB "
                     f"{row['step_time_s']:>8.3f} {row['bubble_fraction']:>7.3f} {row['mfu']:>6.1%}  "
                     f"{'*' if row['pareto'] else ''}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from .cli_args import model_from_args
    from .plan_cli import options_from_args

    args = build_parser().parse_args(argv)
    try:
        model = model_from_args(args)
        cluster = cluster_for_gpus(args)
        constraints = constraints_from_args(args)
        options = options_from_args(args)
        if args.global_batch < 1:
            raise SpecError(f"--global-batch must be at least 1, got {args.global_batch}")
        result = search(model, cluster, args.global_batch, constraints, options)
    except SpecError as err:
        if args.json:
            print("[]")
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result_json(result, args.top), ensure_ascii=False))
    else:
        print(render_text(result, model, cluster, args.global_batch, args.top))
    return 0
