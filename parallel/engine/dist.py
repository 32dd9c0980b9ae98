"""Start torch.distributed for one rank of a plan, and build every process group from parallel.core.topology.

The rank layout is the plan model's (`Plan.topology`, Megatron-LM's order by default), so the job,
the trace analyzers and the rank-grid page agree on which rank is which. Every rank creates every
group of every dimension in the same order (torch.distributed.new_group's contract), keeping the
ones it belongs to:

    tp    ranks that differ only in tp: tensor (and sequence) parallel collectives
    cp    context parallel: K/V all-gather and its reduce-scatter
    pp    pipeline peers: point-to-point boundary activations and gradients
    dp    data parallel replicas: the loss reported per step
    dpcp  dp x cp ranks holding the same weights: gradient reduction (as Megatron-LM, whose
          data-parallel group "with context parallel" reduces gradients, since CP ranks see
          different tokens of the same sequences)
    emb   first and last stage of one pipeline: the tied embedding's gradient (Megatron-LM's
          embedding group; only when pp > 1)
    kv    consecutive TP ranks that share one K/V head when tp > kv_heads (GQA): their K/V weight
          gradients are summed (`kv_replicas` ranks each; one rank alone otherwise)

Backend: NCCL with one GPU per rank when CUDA is present, else gloo on CPU. Every collective is
bounded by the process-group timeout, so a rank that dies cannot hang the others forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from parallel.core.plan import Plan
from parallel.core.topology import Topology
from parallel.engine.collectives import Group


@dataclass
class ParallelContext:
    """Who this rank is in the plan, and its groups."""

    plan: Plan
    topo: Topology
    rank: int
    world_size: int
    device: torch.device
    backend: str
    tp: Group
    cp: Group
    pp: Group
    dp: Group
    dpcp: Group
    emb: Group
    kv: Group

    @property
    def coords(self) -> dict[str, int]:
        return self.topo.coords_of(self.rank)

    @property
    def stage(self) -> int:
        return self.pp.index

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.plan.pp - 1

    @property
    def prev_rank(self) -> int | None:
        return None if self.is_first else self.pp.ranks[self.stage - 1]

    @property
    def next_rank(self) -> int | None:
        return None if self.is_last else self.pp.ranks[self.stage + 1]


def backend_for_device() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _dpcp_rows(topo: Topology) -> list[list[int]]:
    """Ranks that share (pp, tp): the dp x cp replicas of the same weights, ordered by first rank."""
    g = topo.grid  # [dp, pp, cp, tp]
    rows = [sorted(int(r) for r in g[:, p, :, t].reshape(-1)) for p in range(topo.pp) for t in range(topo.tp)]
    return sorted(rows)


def _emb_rows(topo: Topology) -> list[list[int]]:
    """First and last rank of every pipeline (only meaningful when pp > 1)."""
    return [[int(row[0]), int(row[-1])] for row in topo.group_ranks("pp")] if topo.pp > 1 else []


def _kv_rows(topo: Topology, replicas: int) -> list[list[int]]:
    """Each TP group cut into runs of `replicas` consecutive ranks (the ranks sharing a K/V head)."""
    if replicas <= 1:
        return []
    return [
        list(map(int, row[i : i + replicas])) for row in topo.group_ranks("tp") for i in range(0, len(row), replicas)
    ]


def build_groups(
    topo: Topology, rank: int, backend: str, timeout: timedelta, *, kv_replicas: int = 1
) -> dict[str, Group]:
    """Every group of every dimension, created in the same order on all ranks; returns this rank's.
    Dimensions with the same ranks share one Group; each collective names its dimension itself."""
    layouts = {dim: [list(map(int, row)) for row in topo.group_ranks(dim)] for dim in ("tp", "cp", "pp", "dp")}
    layouts["dpcp"] = _dpcp_rows(topo)
    layouts["emb"] = _emb_rows(topo)
    layouts["kv"] = _kv_rows(topo, kv_replicas)
    label = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "dpcp": "dp", "emb": "pp", "kv": "tp"}
    made: dict[tuple[int, ...], Group] = {}
    mine: dict[str, Group] = {}
    for name, rows in layouts.items():
        for ranks in rows:
            key = tuple(ranks)
            if key not in made:  # one process group (and one sequence counter) per set of ranks:
                # dp×cp equals cp when dp = 1, emb equals pp when pp = 2; a trace names groups by ranks
                pg = (  # the dimension as the group's description: Flight Recorder dumps carry it
                    dist.new_group(ranks, backend=backend, timeout=timeout, group_desc=label[name])
                    if len(ranks) > 1
                    else None
                )
                made[key] = Group(dim=label[name], ranks=ranks, pg=pg, rank=rank)
            if rank in ranks:
                mine[name] = made[key]
        mine.setdefault(name, Group(dim=label[name], ranks=(rank,), pg=None, rank=rank))
    return mine


def init(
    *,
    plan: Plan,
    rank: int,
    world_size: int,
    local_rank: int,
    gpus_per_node: int,
    init_method: str = "env://",
    timeout_s: float = 60.0,
    kv_replicas: int = 1,
) -> ParallelContext:
    """init_process_group for this rank and all groups of `plan`; returns the rank's context.
    `kv_replicas`: TP ranks sharing one K/V head (tp / kv_heads when tp > kv_heads, else 1)."""
    if plan.world_size != world_size:
        raise ValueError(
            f"dp×tp×pp×cp = {plan.dp}×{plan.tp}×{plan.pp}×{plan.cp} = {plan.world_size}, "
            f"but {world_size} processes were started"
        )
    backend = backend_for_device()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)  # new_group does not inherit it: pass it to every group
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    if backend == "nccl":  # batch_isend_irecv needs the world group's first collective to involve every rank
        dist.barrier(device_ids=[local_rank])
    topo = plan.topology(gpus_per_node)
    g = build_groups(topo, rank, backend, timeout, kv_replicas=kv_replicas)
    return ParallelContext(plan=plan, topo=topo, rank=rank, world_size=world_size, device=device, backend=backend, **g)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def local_context(plan: Plan | None = None, *, device: str = "cpu") -> ParallelContext:
    """A one-rank plan's context without torch.distributed (every group is this rank alone): the
    serial model in-process, for tests and notebooks."""
    plan = plan or Plan()
    if plan.world_size != 1:
        raise ValueError(f"local_context is for one rank; the plan has {plan.world_size}")
    one = {
        name: Group(dim=label, ranks=(0,), pg=None, rank=0)
        for name, label in (
            ("tp", "tp"),
            ("cp", "cp"),
            ("pp", "pp"),
            ("dp", "dp"),
            ("dpcp", "dp"),
            ("emb", "pp"),
            ("kv", "tp"),
        )
    }
    return ParallelContext(
        plan=plan, topo=plan.topology(1), rank=0, world_size=1, device=torch.device(device), backend="none", **one
    )
