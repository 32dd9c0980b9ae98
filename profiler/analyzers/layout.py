"""The parallel layout of a trace set that came without a plan, inferred from its process groups.

    guess = infer_layout(traces, table)      # table: the collectives table
    guess.plan, guess.inferred, guess.evidence

Evidence: the rank sets the job communicated over -- each collective's group (recorded, or completed
from the instances), each send/recv pair, and the process groups of the trace's `pg_config` (every
group the job created, used in the traced steps or not) -- with the dimension their description or
our own annotation names (Megatron-LM's TENSOR_MODEL_PARALLEL_GROUP, a DeviceMesh's mesh_tp, ...).

Method: every factorisation world = dp × tp × pp × cp (cp only when a group says cp) and every rank
order of parallel.core.topology is a candidate; its score is how many observed groups are exactly
one of its groups (a send/recv pair: inside one of its pp groups, or any dimension's), then how many
named groups it puts in the named dimension, then how many send/recv pairs fall inside its pipeline
groups (p2p is the pipeline's exchange in every common framework), then how few of its dimensions > 1 nothing observed
supports (data parallelism is the default: an unsupported dp costs nothing), then the larger TP
(groups of consecutive ranks are tensor parallel in Megatron-LM, torchtitan and DeepSpeed's
layouts alike) and the fewer pipeline stages. The best candidate that
explains every observed group is the layout, `inferred=True`; without evidence, or when no candidate
explains it all, `plan` is data parallelism over the world and `inferred=False` (say it is a guess).

Pure: numpy, pandas, parallel.core.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import pandas as pd

from parallel.core.plan import Plan
from parallel.core.topology import ORDERS, Topology
from profiler.analyzers.labels import P2P_OPS
from profiler.traces.group_names import dim_from_group_desc
from profiler.traces.model import Traces

LAYOUT_DIMS = ("tp", "cp", "pp", "dp")


@dataclass(frozen=True)
class LayoutGuess:
    plan: Plan
    inferred: bool  # True: every observed group is one of the plan's; False: a guess
    evidence: str  # what the layout rests on, for the page to say
    groups: int  # distinct multi-rank groups observed


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _observed(traces: Traces, table: pd.DataFrame) -> tuple[dict[frozenset, str | None], set[frozenset]]:
    """({collective group: the dimension its description/annotation names, or None}, {send/recv pairs})."""
    groups: dict[frozenset, str | None] = {}
    pairs: set[frozenset] = set()
    if len(table):
        rows = table[table["group"].astype(str) != ""]
        named = rows["dim_source"].astype(str).isin(("annotation", "group_desc"))
        keys = pd.DataFrame(
            {
                "group": rows["group"].astype(str),
                "p2p": rows["op"].isin(P2P_OPS),
                "dim": rows["dim"].astype(str).where(named, ""),
            }
        ).drop_duplicates()
        for group, p2p, dim in keys.itertuples(index=False):
            ranks = frozenset(int(r) for r in group.split(",") if r.strip().lstrip("-").isdigit())
            if len(ranks) < 2:
                continue
            if p2p:
                pairs.add(ranks)
            elif groups.get(ranks) is None:
                groups[ranks] = dim or None
    pg = traces.pg_config
    if len(pg) and "ranks" in pg:
        descs = pg["pg_desc"].astype(str) if "pg_desc" in pg else pd.Series([""] * len(pg))
        for ranks_text, desc in zip(pg["ranks"].astype(str), descs):
            ranks = frozenset(int(r) for r in ranks_text.strip("[]() ").replace(" ", "").split(",") if r.isdigit())
            if len(ranks) >= 2 and groups.get(ranks) is None:
                groups[ranks] = dim_from_group_desc(desc) or None
    world = frozenset(range(traces.world_size))
    groups.pop(world, None)  # the world is every layout's group of all ranks: it tells nothing
    return groups, pairs


def infer_layout(traces: Traces, table: pd.DataFrame) -> LayoutGuess:
    """The layout of the set (see the module docstring)."""
    world = traces.world_size
    groups, pairs = _observed(traces, table)
    fallback = Plan(dp=max(world, 1), global_batch=max(world, 1))
    if world < 2 or not (groups or pairs):
        return LayoutGuess(fallback, False, "no process group of the trace tells the layout", 0)
    with_cp = any(dim == "cp" for dim in groups.values())
    best, best_score = None, None
    for tp, pp, cp in product(_divisors(world), _divisors(world), _divisors(world) if with_cp else [1]):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        for order in ORDERS:
            topo = Topology(dp=dp, pp=pp, cp=cp, tp=tp, gpus_per_node=1, order=order)
            mine: dict[frozenset, str] = {}
            for dim in LAYOUT_DIMS:
                if topo.sizes[dim] > 1:
                    for row in topo.group_ranks(dim):
                        mine.setdefault(frozenset(int(r) for r in row), dim)
            pp_groups = [s for s, d in mine.items() if d == "pp"]
            in_pp = sum(any(p <= s for s in pp_groups) for p in pairs)
            explained = sum(g in mine for g in groups) + sum(any(p <= s for s in pp_groups) or p in mine for p in pairs)
            agree = sum(mine.get(g) == d for g, d in groups.items() if d)
            seen = {mine[g] for g in groups if g in mine} | {"pp" for p in pairs if any(p <= s for s in pp_groups)}
            unsupported = sum(1 for d in ("tp", "pp", "cp") if topo.sizes[d] > 1 and d not in seen)
            # ties: contiguous groups are tensor parallel (every common launcher keeps TP innermost,
            # inside a node), and fewer pipeline stages
            # send/recv between ranks is the pipeline's exchange far more often than anything else
            score = (explained, agree, in_pp, -unsupported, tp, -pp)
            if best_score is None or score > best_score:
                best, best_score = (dp, tp, pp, cp, order), score
    n = len(groups) + len(pairs)
    dp, tp, pp, cp = best[:4]
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, order=best[4], global_batch=dp * pp)
    named = sum(1 for d in groups.values() if d)
    what = f"{len(groups)} collective group{'s' * (len(groups) != 1)}" + (
        f" and {len(pairs)} send/recv pair{'s' * (len(pairs) != 1)}" if pairs else ""
    )
    if best_score[0] < n:
        return LayoutGuess(fallback, False, f"no DP×TP×PP×CP layout has all {what} of the trace", n)
    return LayoutGuess(
        plan, True, f"{what} of the trace" + (f" ({named} named by their description)" if named else ""), n
    )
