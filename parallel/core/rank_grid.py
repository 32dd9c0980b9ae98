"""Tables behind the Topology page: GPU cells, group paths, NVLink domains, node overview, per-dimension summary.

Every GPU is a cell at (node, local GPU); the same rank <-> coordinate function as the engine and
the analyzers (parallel.core.topology.Topology) places it. Nodes run along x and local GPUs along y, so
TP groups are short vertical strokes inside a node and DP/PP groups run across nodes. A group's link
is the one Topology.domain_of says: inside one NVLink domain (a node on a DGX, a rack of 18 nodes on a
GB200 NVL72) it is the fast link, else the scale-out one; `domain_spans` says which nodes form each
domain. Large clusters are shown through a window of at most MAX_WINDOW_NODES nodes plus a
one-cell-per-node overview, so the browser never receives more than about a thousand GPU cells.

Pure: numpy and pandas only (no streamlit; ui.theme for the link names).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from parallel.core.topology import DIMS, Topology, parse_order

# the legends' words for the plan model's 'intra' / 'inter' when a caller names no cluster's (a GPU cluster's)
DEFAULT_LINK_NAMES = {"intra": "NVLink (intra-node)", "inter": "InfiniBand (inter-node)"}

MAX_GPU_CELLS = 1024  # per-GPU cells sent to the browser at most
OVERVIEW_PER_ROW = 64  # nodes per row of the node overview


def max_window_nodes(gpus_per_node: int) -> int:
    return max(1, MAX_GPU_CELLS // gpus_per_node)


def same_order(a: str, b: str) -> bool:
    """Orders that lay ranks out identically (`ep` has size 1 here, so it does not count)."""
    return parse_order(a) == parse_order(b)


def _ranks_label(ranks: np.ndarray, limit: int = 8) -> str:
    items = [str(int(r)) for r in ranks[:limit]]
    more = f", … ({len(ranks)} ranks)" if len(ranks) > limit else ""
    return "[" + ", ".join(items) + more + "]"


def _crosses_domains(topo: Topology, groups: np.ndarray) -> np.ndarray:
    """Per group (a row of ranks): whether its ranks span NVLink domains (Topology.domain_of decides)."""
    domains = topo.domain_of(groups)
    return domains.min(axis=1) != domains.max(axis=1)


def _group_index(topo: Topology, dim: str) -> tuple[np.ndarray, np.ndarray]:
    """(group id of every rank, the groups' rank arrays) for `dim`."""
    groups = topo.group_ranks(dim)
    gid = np.empty(topo.world_size, dtype=np.int64)
    gid[groups.reshape(-1)] = np.repeat(np.arange(len(groups)), groups.shape[1])
    return gid, groups


def node_count(world_size: int, gpus_per_node: int) -> int:
    return -(-world_size // gpus_per_node)


def gpu_cells(
    topo: Topology,
    *,
    group_dim: str,
    compare_order: str,
    first_node: int = 0,
    nodes: int | None = None,
    names: dict | None = None,
) -> pd.DataFrame:
    """One row per GPU of nodes [first_node, first_node + nodes): rank, node, local, domain (its NVLink
    domain), dp, pp, cp, tp, group (its `group_dim` group), group_ranks, group_link (whether the group
    leaves an NVLink domain), moved (its coordinates differ under `compare_order`), c_dp, c_pp, c_cp,
    c_tp (its coordinates there)."""
    gpn = topo.gpus_per_node
    nodes = node_count(topo.world_size, gpn) if nodes is None else nodes
    lo, hi = first_node * gpn, min(topo.world_size, (first_node + nodes) * gpn)
    ranks = np.arange(lo, hi)
    coords = topo.coords[ranks]
    other_coords = dataclasses.replace(topo, order=compare_order).coords[ranks]
    gid, groups = _group_index(topo, group_dim)
    crosses = _crosses_domains(topo, groups)
    df = pd.DataFrame(
        {
            "rank": ranks,
            "node": ranks // gpn,
            "local": ranks % gpn,
            "domain": topo.domain_of(ranks),
            **{d: coords[:, i] for i, d in enumerate(DIMS)},
        }
    )
    df["group"] = gid[ranks]
    labels = {g: _ranks_label(groups[g]) for g in np.unique(df["group"])}
    df["group_ranks"] = df["group"].map(labels).astype("category")  # categorical: sent once per group
    intra, inter = (names or DEFAULT_LINK_NAMES).values()
    df["group_link"] = pd.Categorical(np.where(crosses[df["group"]], inter, intra), categories=[intra, inter])
    df["moved"] = (coords != other_coords).any(axis=1)
    for i, d in enumerate(DIMS):
        df[f"c_{d}"] = other_coords[:, i]
    ints = ["rank", "node", "local", "domain", "group", *DIMS, *(f"c_{d}" for d in DIMS)]
    return df.astype({c: "int32" for c in ints})  # half the bytes sent to the browser


def group_paths(
    topo: Topology, dim: str, *, first_node: int = 0, nodes: int | None = None, names: dict | None = None
) -> pd.DataFrame:
    """Polyline vertices of every `dim` group inside the window: group, step, rank, x, y, link (whether
    the group leaves an NVLink domain, in theme.link_names of the cluster: `names`, by default a GPU
    cluster's).

    Groups that would draw on top of each other (PP groups sharing a row of GPUs) get a small
    lane offset, so each stays visible."""
    gpn = topo.gpus_per_node
    nodes = node_count(topo.world_size, gpn) if nodes is None else nodes
    lo, hi = first_node * gpn, min(topo.world_size, (first_node + nodes) * gpn)
    groups = topo.group_ranks(dim)
    if groups.shape[1] < 2:  # a dimension of size 1 has nothing to connect
        return pd.DataFrame(
            {
                c: pd.Series(dtype=t)
                for c, t in (
                    ("group", "int64"),
                    ("step", "int64"),
                    ("rank", "int64"),
                    ("x", "float64"),
                    ("y", "float64"),
                    ("link", "object"),
                )
            }
        )
    intra, inter = (names or DEFAULT_LINK_NAMES).values()
    link = np.where(_crosses_domains(topo, groups), inter, intra)
    inside = (groups >= lo) & (groups < hi)
    keep = inside.sum(axis=1) >= 2
    gids = np.repeat(np.flatnonzero(keep)[:, None], groups.shape[1], axis=1)[inside[keep]]
    ranks = groups[keep][inside[keep]]
    steps = (np.cumsum(inside[keep], axis=1) - 1)[inside[keep]]
    lanes = min(len(groups), 6)
    offset = ((gids % lanes) - (lanes - 1) / 2) * (0.5 / lanes)
    return pd.DataFrame(
        {
            "group": gids.astype("int32"),
            "step": steps.astype("int32"),
            "rank": ranks.astype("int32"),
            "x": (ranks // gpn + offset).astype("float32"),
            "y": (ranks % gpn + offset).astype("float32"),
            "link": pd.Categorical(link[gids], categories=[intra, inter]),
        }
    )


def _nodes_text(first: int, last: int) -> str:
    return f"node {first}" if first == last else f"nodes {first}–{last}"


def domain_spans(topo: Topology, *, first_node: int = 0, nodes: int | None = None) -> pd.DataFrame:
    """One row per NVLink domain with a node in the window [first_node, first_node + nodes): domain,
    first_node and last_node (its nodes in the whole job), gpus (the job's ranks in it), x0 and x1 (its
    nodes' extent inside the window, in the grid's node units), label ("NVLink domain (rack) 1: nodes
    18–35, 72 GPUs"). A domain is ranks [k·D, (k+1)·D) for D = topo.nvlink_domain (Topology.domain_of):
    one node on a DGX, a rack of 18 nodes on a GB200 NVL72."""
    gpn, size = topo.gpus_per_node, topo.nvlink_domain
    total = node_count(topo.world_size, gpn)
    nodes = total if nodes is None else nodes
    lo, hi = first_node, min(total, first_node + nodes) - 1  # the window's first and last node
    first_rank = np.arange(0, topo.world_size, size, dtype=np.int64)
    last_rank = np.minimum(first_rank + size, topo.world_size) - 1
    first, last = first_rank // gpn, last_rank // gpn
    keep = (last >= lo) & (first <= hi)
    domain, first, last = np.flatnonzero(keep), first[keep], last[keep]
    gpus = (last_rank - first_rank + 1)[keep]
    word = "NVLink domain (rack)" if size > gpn else "NVLink domain"
    labels = [f"{word} {d}: {_nodes_text(a, b)}, {g:,} GPUs" for d, a, b, g in zip(domain, first, last, gpus)]
    return pd.DataFrame(
        {
            "domain": domain.astype("int32"),
            "first_node": first.astype("int32"),
            "last_node": last.astype("int32"),
            "gpus": gpus.astype("int32"),
            "x0": (np.maximum(first, lo) - 0.5).astype("float32"),
            "x1": (np.minimum(last, hi) + 0.5).astype("float32"),
            "label": labels,
        }
    )


def domain_note(topo: Topology, *, listed: int = 4) -> str:
    """One sentence on how the job's nodes form NVLink domains, naming the first `listed` domains."""
    gpn, size = topo.gpus_per_node, topo.nvlink_domain
    if size <= gpn:  # Cluster keeps a domain whole nodes; one node (or a partial one) is the DGX case
        return f"NVLink domain = one node ({gpn} GPUs): a group stays on NVLink only inside its node."
    spans = domain_spans(topo)
    count = len(spans)
    shown = "; ".join(spans["label"].head(listed))
    more = f"; … {count - listed} more (hover a band)" if count > listed else ""
    partial = " (the last one partly used)" if topo.world_size % size else ""
    return (
        f"{count} NVLink domain{'s' * (count != 1)} (racks) of {size // gpn} nodes × {gpn} GPUs = {size} GPUs"
        f"{partial}, drawn as bands around their nodes: {shown}{more}."
    )


def node_overview(topo: Topology, color_dim: str, *, per_row: int = OVERVIEW_PER_ROW) -> pd.DataFrame:
    """One row per node: node, col, row, value (the node's `color_dim` coordinate, or 'mixed'),
    ranks, domain (the NVLink domain of its first GPU), each dimension's range on the node, and
    `<color_dim>_size` (how many coordinates)."""
    gpn = topo.gpus_per_node
    df = pd.DataFrame(topo.coords, columns=list(DIMS))
    df["node"] = np.arange(topo.world_size) // gpn
    df["rank"] = np.arange(topo.world_size)
    agg = (
        df.groupby("node")
        .agg(
            **{f"{d}_min": (d, "min") for d in DIMS},
            **{f"{d}_max": (d, "max") for d in DIMS},
            rank_min=("rank", "min"),
            rank_max=("rank", "max"),
        )
        .reset_index()
    )
    out = pd.DataFrame({"node": agg["node"], "col": agg["node"] % per_row, "row": agg["node"] // per_row})
    lo, hi = agg[f"{color_dim}_min"], agg[f"{color_dim}_max"]
    out["value"] = np.where(lo == hi, lo.astype(str), "mixed")
    lo_r, hi_r = agg["rank_min"].astype(str), agg["rank_max"].astype(str)
    out["ranks"] = np.where(lo_r == hi_r, lo_r, lo_r + "–" + hi_r)  # a one-GPU node: "3", not "3–3"
    out["domain"] = topo.domain_of(agg["rank_min"].to_numpy())
    for d in DIMS:
        a, b = agg[f"{d}_min"].astype(str), agg[f"{d}_max"].astype(str)
        out[d] = np.where(a == b, a, a + "–" + b)
    out[f"{color_dim}_size"] = topo.sizes[color_dim]
    return out


def dim_summary(topo: Topology, compare_order: str, words: tuple[str, str] = ("NVLink", "InfiniBand")) -> pd.DataFrame:
    """Per dimension (and the MoE layers' expert groups, when ep > 1): size, groups, how many cross NVLink
    domains (and so use the scale-out link: `words`, the cluster's (fast, scale-out) link names), under the
    plan's order and under `compare_order`."""
    other = dataclasses.replace(topo, order=compare_order)
    rows = []
    for d in ("tp", "cp", "ep", "pp", "dp") if topo.ep > 1 else ("tp", "cp", "pp", "dp"):
        size, n = topo.ep if d == "ep" else topo.sizes[d], len(topo.group_ranks(d))
        crossing, crossing_other = topo.crossing(d), other.crossing(d)
        rows.append(
            {
                "dimension": d.upper(),
                "size": size,
                "groups": n,
                "crossing domains": crossing if size > 1 else 0,
                "link": "—" if size == 1 else words[1] if crossing else words[0],
                f"crossing under {compare_order}": crossing_other if size > 1 else 0,
            }
        )
    return pd.DataFrame(rows)


def moved_count(topo: Topology, compare_order: str) -> int:
    """Ranks whose (dp, pp, cp, tp) coordinates differ between the plan's order and `compare_order`."""
    other = dataclasses.replace(topo, order=compare_order)
    return int((topo.coords != other.coords).any(axis=1).sum())


def with_rank_values(cells: pd.DataFrame, values: pd.Series, name: str = "value") -> pd.DataFrame:
    """`cells` with a measured per-rank column (a Series indexed by rank); ranks without a value get NaN.
    The hook for colouring the grid by measured values (exposed communication, busbw, ...)."""
    series = pd.Series(values, dtype="float64")
    series.index = series.index.astype("int64")
    return cells.assign(**{name: cells["rank"].map(series)})
