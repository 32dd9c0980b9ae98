"""Rank layout: global rank <-> (dp, pp, cp, tp) coordinates <-> (node, local GPU), and the groups.

One function family serves the engine's process groups, the trace analyzers and the rank-grid page.
An *order* names the axes from fastest-varying to slowest, Megatron-LM style:

    "tp-cp-ep-dp-pp"   Megatron-LM's default (RankGenerator order); TP innermost, PP outermost
    "tp-cp-pp-dp"      Megatron's --use-tp-pp-dp-mapping, and picotron's
                       torch.arange(world).view(dp, pp, cp, tp)

`ep` (expert parallelism) may appear in an order; it is 1 in the dense layout. Rank r sits on node
r // gpus_per_node as local GPU r % gpus_per_node, so the fastest axis stays inside a node, and in
NVLink domain r // nvlink_domain (a host on a DGX/HGX, a rack of 18 hosts on a GB200 NVL72). Which
link a group crosses is decided here, once: a group whose ranks span domains is bound by the
scale-out link (`domain_of`, `crossing`, `link`; parallel.core.comm asks the same function).

Expert groups (`group_ranks("ep")`): Megatron-LM lays the MoE layers' ranks out a second time with
the same order string, as RankGenerator(tp=etp, cp=1, ep=ep, dp=world/(etp·ep·pp), pp) (its
parallel_state.py, expert_decoder_rank_generator; etp defaults to tp, as in Megatron), so an EP group
is ranks that differ only in that layout's ep coordinate. An order without `ep` places it right after cp.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

DIMS = ("dp", "pp", "cp", "tp")  # the coordinate order of every (dp, pp, cp, tp) tuple
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ORDERS = {
    "tp-cp-ep-dp-pp": "Megatron-LM default",
    "tp-cp-ep-pp-dp": "Megatron-LM --use-tp-pp-dp-mapping (with ep)",
    "tp-cp-pp-dp": "picotron / Megatron-LM --use-tp-pp-dp-mapping",
    "tp-cp-dp-pp": "Megatron-LM default without ep",
    "tp-dp-cp-pp": "CP outside DP",
    "tp-pp-dp-cp": "TP, then PP (cp outermost)",
}


class TopologyError(ValueError):
    pass


def parse_order(order: str) -> tuple[str, ...]:
    """The axes of an order string, fastest first, with `ep` dropped; a clear error if malformed."""
    names = tuple(order.strip().lower().split("-"))
    bad = [n for n in names if n not in (*DIMS, "ep")]
    if bad or len(set(names)) != len(names) or set(DIMS) - set(names):
        raise TopologyError(
            f"rank order {order!r} must name each of tp, cp, dp, pp once (ep optional), "
            f"fastest first, joined by '-', e.g. {DEFAULT_ORDER!r}"
        )
    return tuple(n for n in names if n != "ep")


@dataclass(frozen=True)
class Group:
    dim: str
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]
    domains: tuple[int, ...] = ()  # the NVLink domains its ranks are in; () = its nodes

    @property
    def link(self) -> str:
        """'intra' when the group stays inside one NVLink domain, else 'inter' (bound by the slow link)."""
        return "intra" if len(self.domains or self.nodes) == 1 else "inter"


@dataclass(frozen=True)
class Topology:
    """The layout of dp x pp x cp x tp ranks in `order` on nodes of `gpus_per_node` GPUs."""

    dp: int
    pp: int
    cp: int
    tp: int
    gpus_per_node: int
    order: str = DEFAULT_ORDER
    ep: int = 1  # expert parallelism (MoE layers); its ranks come from dp x cp (x tp when etp < tp)
    etp: int | None = None  # the experts' tensor parallelism; None = tp
    nvlink_domain: int | None = None  # consecutive ranks sharing NVLink (Cluster.domain_gpus); None = a node

    def __post_init__(self):
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if self.nvlink_domain is None:
            object.__setattr__(self, "nvlink_domain", self.gpus_per_node)
        for name in (*DIMS, "gpus_per_node", "ep", "etp", "nvlink_domain"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise TopologyError(f"{name} must be a positive integer, got {value!r}")
        parse_order(self.order)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def sizes(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.pp, "cp": self.cp, "tp": self.tp}

    @cached_property
    def grid(self) -> np.ndarray:
        """grid[dp, pp, cp, tp] = global rank."""
        axes = parse_order(self.order)  # fastest first
        slow_first = axes[::-1]
        shape = [self.sizes[a] for a in slow_first]
        ranks = np.arange(self.world_size, dtype=np.int64).reshape(shape)  # C order: last axis fastest
        return ranks.transpose([slow_first.index(d) for d in DIMS])

    @cached_property
    def coords(self) -> np.ndarray:
        """coords[rank] = (dp, pp, cp, tp), an int array of shape (world, 4)."""
        out = np.empty((self.world_size, 4), dtype=np.int64)
        idx = np.indices(self.grid.shape).reshape(4, -1).T
        out[self.grid.reshape(-1)] = idx
        return out

    def rank_of(self, *, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return int(self.grid[dp, pp, cp, tp])

    def coords_of(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} is outside 0..{self.world_size - 1}")
        return dict(zip(DIMS, (int(c) for c in self.coords[rank])))

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def domain_of(self, ranks: Any) -> Any:
        """The NVLink domain of each rank (an int, or an array of them): the one function that says
        which ranks share the fast link."""
        return domain_index(ranks, self.nvlink_domain)

    def _expert_groups(self) -> np.ndarray:
        """The EP groups of Megatron-LM's expert layout (module docstring), first rank first."""
        if self.world_size % (self.etp * self.ep * self.pp):
            raise TopologyError(
                f"the world {self.world_size} is not divisible by etp×ep×pp = {self.etp}×{self.ep}×{self.pp}"
            )
        names = list(self.order.strip().lower().split("-"))
        if "ep" not in names:
            names.insert(names.index("cp") + 1, "ep")
        sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.world_size // (self.etp * self.ep * self.pp)}
        sizes["pp"] = self.pp
        slow_first = names[::-1]
        grid = np.arange(self.world_size, dtype=np.int64).reshape([sizes[n] for n in slow_first])
        g = np.moveaxis(grid, slow_first.index("ep"), -1).reshape(-1, self.ep)
        return g[np.argsort(g[:, 0], kind="stable")]

    def group_ranks(self, dim: str) -> np.ndarray:
        """All groups of `dim` as an int array (n_groups, size): ranks that differ only in `dim`.
        Groups are ordered by their first rank; ranks inside a group by their `dim` coordinate.
        `ep`: the expert-parallel groups of the MoE layers (module docstring)."""
        if dim not in (*DIMS, "ep"):
            raise TopologyError(f"dimension must be one of {(*DIMS, 'ep')}, got {dim!r}")
        if dim == "ep":
            if "ep" not in self._groups:
                self._groups["ep"] = self._expert_groups()
            return self._groups["ep"]
        if dim not in self._groups:  # laid out once per dimension (reports ask several times)
            g = np.moveaxis(self.grid, DIMS.index(dim), -1).reshape(-1, self.sizes[dim])
            self._groups[dim] = g[np.argsort(g[:, 0], kind="stable")]
        return self._groups[dim]

    @cached_property
    def _groups(self) -> dict[str, np.ndarray]:
        return {}

    def groups(self, dim: str, limit: int | None = None) -> list[Group]:
        """The groups of `dim` (the first `limit` of them when given), first rank first."""
        rows = self.group_ranks(dim)[:limit]
        nodes, domains = rows // self.gpus_per_node, self.domain_of(rows)
        return [
            Group(dim, tuple(row.tolist()), tuple(np.unique(n).tolist()), tuple(np.unique(d).tolist()))
            for row, n, d in zip(rows, nodes, domains)
        ]

    def group_count(self, dim: str) -> int:
        return self.world_size // (self.ep if dim == "ep" else self.sizes[dim])

    def group_of(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks of `dim`'s group that holds `rank`."""
        c = self.coords_of(rank)
        index = [c[d] if d != dim else slice(None) for d in DIMS]
        return tuple(int(r) for r in self.grid[tuple(index)])

    def rank_table(self, limit: int | None = None) -> list[dict]:
        """One row per rank (the first `limit` ranks when given): rank, node, local_rank, domain (its
        NVLink domain), dp, pp, cp, tp."""
        ranks = np.arange(self.world_size if limit is None else min(limit, self.world_size), dtype=np.int64)
        cols = [ranks, ranks // self.gpus_per_node, ranks % self.gpus_per_node, self.domain_of(ranks)]
        cols += list(self._coords_of(ranks).T)
        keys = ("rank", "node", "local_rank", "domain", *DIMS)
        return [dict(zip(keys, row)) for row in np.stack(cols, axis=1).tolist()]

    def _coords_of(self, ranks: np.ndarray) -> np.ndarray:
        """(dp, pp, cp, tp) of each rank, from the order alone: rank = mixed-radix number, fastest axis first."""
        out = np.empty((len(ranks), 4), dtype=np.int64)
        rest = ranks.astype(np.int64)
        for axis in parse_order(self.order):  # fastest first
            out[:, DIMS.index(axis)] = rest % self.sizes[axis]
            rest = rest // self.sizes[axis]
        return out

    def crossing(self, dim: str) -> int:
        """How many groups of `dim` span more than one NVLink domain."""
        g = self.domain_of(self.group_ranks(dim))
        return int((g.min(axis=1) != g.max(axis=1)).sum())

    def link(self, dim: str) -> str:
        """The slowest link any group of `dim` uses: 'inter' if one crosses domains, else 'intra'."""
        return "inter" if self.crossing(dim) else "intra"


def domain_index(ranks: Any, domain: int) -> Any:
    """The NVLink domain of each rank when `domain` consecutive ranks share one (Topology.domain_of)."""
    return ranks // domain


def spanning(sizes: dict[str, int], order: str, domain: int, dims: tuple[str, ...]) -> tuple[bool, int]:
    """(whether any group over `dims` -- ranks that differ only in those coordinates of the dense
    layout `sizes` {dp, pp, cp, tp} in `order` -- spans NVLink domains of `domain` ranks, the fewest
    ranks a spanning group has in one domain: its group size over the domains it spans, or the group
    size when none spans).

    The answer of laying every group out and taking domain_of (Topology.crossing), from the strides
    alone: a group is its first rank b plus the offsets of `dims`' coordinates, so it spans domains
    exactly when b and b + its largest offset do; only spanning groups are laid out to count their
    domains. A search asks this for every distinct plan shape (parallel.core.comm)."""
    stride, step = {}, 1
    for axis in parse_order(order):  # fastest first
        stride[axis], step = step, step * sizes[axis]

    def points(names) -> np.ndarray:  # every sum of coordinate x stride over `names`, ascending
        out = np.zeros(1, dtype=np.int64)
        for axis in sorted(names, key=stride.get):
            out = (np.arange(sizes[axis], dtype=np.int64)[:, None] * stride[axis] + out[None, :]).ravel()
        return out

    offsets = points(dims)  # ascending: each axis's stride is at least the span of the faster ones
    firsts = points([a for a in DIMS if a not in dims])
    spans = domain_index(firsts, domain) != domain_index(firsts + offsets[-1], domain)
    if not spans.any():
        return False, len(offsets)
    domains = domain_index(firsts[spans][:, None] + offsets[None, :], domain)  # ascending along each row
    count = 1 + (np.diff(domains, axis=1) != 0).sum(axis=1)
    return True, int((len(offsets) // count).min())


def placed(plan: Any, cluster: Any) -> Topology:
    """The plan's layout on the cluster's hosts and NVLink domains (a Plan and a Cluster; typed
    loosely so that this module needs neither)."""
    return dataclasses.replace(plan.topology(cluster.gpus_per_node), nvlink_domain=cluster.domain_gpus)
