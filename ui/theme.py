"""Colours, scales and conventions every chart shares, so NVLink, InfiniBand and the parallel
dimensions look the same on every page.

Chart-builder convention (speed): write every encoding as a channel object (`alt.X("tp:O")`,
`alt.Tooltip(...)`, `alt.Detail(...)`), constants as mark properties, and conditions as
`alt.<Channel>Value(value, condition={...})`. Shorthand strings, `alt.value` and `alt.when` inside
`encode` go through Altair's `from_dict`, about 10 ms each, which adds up to seconds per page.
One DataFrame per chart where possible: layers share it through `transform_filter`.
Pure: altair only.
"""

from __future__ import annotations

import altair as alt

INTRA_COLOR, INTER_COLOR = "#2f9e44", "#e8590c"


def link_words(cluster=None) -> tuple[str, str]:
    """The cluster's own (intra, inter)-node link names: NVLink and InfiniBand for the GPU presets
    (and a cluster that names none), loopback and the lab's shaped veth for local-cpu."""
    intra = (cluster.intra.name if cluster is not None else "") or "NVLink"
    inter = (cluster.inter.name if cluster is not None else "") or "InfiniBand"
    return intra, inter


def link_names(cluster=None) -> dict[str, str]:
    """'intra'/'inter' as the legends say them, with the cluster's own link names (link_words); on a
    cluster whose NVLink domain spans nodes (an NVL72 rack) the fast link reaches past the node."""
    intra, inter = link_words(cluster)
    if cluster is not None and cluster.domain_gpus > cluster.gpus_per_node:
        return {"intra": f"{intra} (intra-domain)", "inter": f"{inter} (inter-domain)"}
    return {"intra": f"{intra} (intra-node)", "inter": f"{inter} (inter-node)"}


def named_links(links, names: dict[str, str] | None = None):
    """A column of 'intra'/'inter' (the plan model's words) as the legends say them (`names`:
    link_names of the cluster, default a GPU cluster's); names already given stay."""
    names = names or link_names()
    return links.map(lambda v: names.get(v, v))


def link_colors(names: dict[str, str]) -> dict[str, str]:
    """The same two colours for whatever the links are called."""
    return {names["intra"]: INTRA_COLOR, names["inter"]: INTER_COLOR}


NVLINK, INFINIBAND = link_names().values()  # a GPU cluster's names (the default)
LINK_COLORS = link_colors(link_names())
MEMORY_COLORS = {"params": "#4c6ef5", "grads": "#15aabf", "optimizer": "#868e96", "activations": "#f59f00"}
GROUP_COLORS = {
    "attention": "#e8590c",
    "mlp": "#4c6ef5",
    "layernorm/dropout/residual": "#2f9e44",
    "layer input (checkpoint)": "#868e96",
    "embedding/output": "#ae3ec9",
    "other": "#ced4da",
}
# Collectives by the parallel dimension they serve (timeline, per-dimension tables); compute and
# memory copies stay quiet greys so the communication stands out.
DIM_COLORS = {
    "tp": "#e8590c",
    "sp": "#f59f00",
    "cp": "#ae3ec9",
    "pp": "#1c7ed6",
    "dp": "#2f9e44",
    "ep": "#0ca678",
    "world": "#845ef7",  # every rank, dimension unknown
    "unknown": "#495057",
}
ACTIVITY_COLORS = {"compute": "#ced4da", "memory": "#b197fc", **DIM_COLORS}
TABLEAU20 = [
    "#4c78a8",
    "#9ecae9",
    "#f58518",
    "#ffbf79",
    "#54a24b",
    "#88d27a",
    "#b79a20",
    "#f2cf5b",
    "#439894",
    "#83bcb6",
    "#e45756",
    "#ff9d98",
    "#79706e",
    "#bab0ac",
    "#d67195",
    "#fcbfd2",
    "#b279a2",
    "#d6a5c9",
    "#9e765f",
    "#d8b5a5",
]


def scale(colors: dict[str, str], present=None) -> alt.Scale:
    """A nominal colour scale over `colors` (only the keys in `present`, if given, keeping their order)."""
    keys = [k for k in colors if present is None or k in set(present)]
    return alt.Scale(domain=keys, range=[colors[k] for k in keys])


def palette(n: int) -> list[str]:
    """n categorical colours (Tableau 20, repeated beyond 20)."""
    return [TABLEAU20[i % len(TABLEAU20)] for i in range(n)]
