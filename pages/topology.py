"""Topology: every GPU of the plan on its cluster, coloured by its parallel coordinate, with one
dimension's groups drawn on their links and what moves under another rank order."""

import streamlit as st

from parallel.core.rank_grid import max_window_nodes, same_order
from parallel.core.topology import DEFAULT_ORDER, DIMS, ORDERS
from ui import loaders, run_views, topology_charts
from ui.plan_form import PlanChoice, plan_form
from ui.routing import ensure_navigation

AUTO = "auto"


def topology_page(choice: PlanChoice) -> None:
    plan, gpn = choice.plan, choice.cluster.gpus_per_node
    c1, c2, c3 = st.columns([2, 2, 3])
    url = {"bind": "query-params"}  # the view's choices live in the URL beside the plan
    color_dim = c1.segmented_control(
        "Colour GPUs by", DIMS, default="pp", required=True, key="topo_color", format_func=str.upper, **url
    )
    group_dim = c2.segmented_control(
        "Draw the groups of",
        (*DIMS, "ep"),
        default="tp",
        required=True,
        key="topo_groups",
        format_func=str.upper,
        **url,
    )
    other = "tp-cp-pp-dp" if same_order(plan.order, DEFAULT_ORDER) else DEFAULT_ORDER
    picked = c3.selectbox(
        "Compare with rank order",
        [AUTO, *ORDERS],
        key="topo_vs",
        **url,
        format_func=lambda o: f"auto: {other}" if o == AUTO else o,
        help="ranks whose coordinates change under this order get a dot. "
        + "; ".join(f"{o}: {d}" for o, d in ORDERS.items()),
    )
    compare = other if picked == AUTO else picked
    nodes = -(-plan.world_size // gpn)
    window = max_window_nodes(gpn)
    first = 0
    if nodes > window:
        first = st.select_slider(
            "Nodes shown GPU by GPU",
            options=list(range(0, nodes, window)),
            key="topo_first",
            format_func=lambda a: f"nodes {a}–{min(a + window, nodes) - 1}",
            **url,
        )
    view = loaders.topology_view(choice.params, color_dim, group_dim, compare, first)

    m1, m2, m3 = st.columns(3)
    domain = choice.cluster.domain_gpus
    m1.metric("GPUs", f"{plan.world_size:,}", help=f"{nodes} nodes × {gpn} GPUs per node, {domain} per NVLink domain")
    crossing = view["crossing"][group_dim]
    inter, intra = choice.cluster.inter.name or "the scale-out link", choice.cluster.intra.name or "the fast link"
    m2.metric(
        f"{group_dim.upper()} groups crossing NVLink domains",
        f"{crossing:,}",
        help=f"a group that spans NVLink domains ({domain} GPUs each) runs its collectives over {inter}",
    )
    if view["compare"]:
        m3.metric(
            f"Ranks that move under {compare}",
            f"{view['moved']:,} of {plan.world_size:,}",
            help="ranks whose (dp, pp, cp, tp) coordinates differ; marked with a dot in the grid",
        )
    else:
        m3.metric("Ranks that move", "0", help=f"the plan already uses {plan.order}; pick another order to compare")

    if view["overview"] is not None:
        st.subheader(f"All {nodes:,} nodes")
        st.caption(
            f"One cell per node, coloured by its {color_dim.upper()} coordinate (grey: its GPUs differ). "
            f"The outlined nodes are drawn GPU by GPU below; move the slider to scroll."
        )
        st.altair_chart(
            topology_charts.node_overview_chart(view["overview"], color_dim=color_dim, window=view["window"])
        )
    lo, hi = view["window"]
    st.subheader(f"GPUs of nodes {lo}–{hi}" if view["overview"] is not None else "Every GPU")
    st.caption(
        f"Cells: GPUs by node (x) and local GPU (y), coloured by {color_dim.upper()} coordinate. "
        f"Lines: {group_dim.upper()} groups, green on {intra} inside an NVLink domain, "
        f"orange on {inter} across domains. "
        "Click a GPU to highlight its group, double-click to clear; hover for coordinates."
    )
    st.caption(view["domain_note"])
    if getattr(plan, group_dim) == 1:
        st.info(
            f"{group_dim.upper()} = 1: every rank is its own {group_dim.upper()} group, so there are no lines to draw. "
            "Pick another dimension above."
        )
    st.altair_chart(
        topology_charts.gpu_grid_chart(
            view["cells"],
            view["paths"],
            color_dim=color_dim,
            color_size=getattr(plan, color_dim),
            group_dim=group_dim,
            compare_order=view["compare"],
            domains=view["domains"],
        )
    )
    st.subheader("Groups per dimension")
    st.dataframe(view["summary"], hide_index=True)
    run_views.topology_measured(choice, view["cells"])  # only when the URL names a run (?run=)


ensure_navigation()
st.title("Topology")
run_views.adopt_run_plan()  # ?run= without a plan: start from the set's (or its traces') layout
topology_choice = plan_form(ask_model=run_views.model_question())
run_views.adoption_note()  # the layout or GPU the plan took from the set, if it did
if topology_choice.computable or not topology_choice.model_known:  # the layout needs no model
    topology_page(topology_choice)
