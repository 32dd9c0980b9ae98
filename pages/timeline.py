"""Collective timeline: every rank of a run or uploaded set on one time axis -- compute and collectives
coloured by the parallel dimension they serve -- with a brush to zoom, one collective highlighted on all
its ranks, the arrival skew and stragglers, the per-rank breakdown, and downloads."""

import streamlit as st

from profiler.analyzers.aggregates import ALL
from profiler.analyzers.steps import STEP_DEFINITION, STEPS_DEFINITION, measured_step_s
from profiler.collect.trace_sets import TraceSet
from profiler.traces.errors import TraceError
from ui import run_loaders, run_status, selection, timeline_charts, whatif_views
from ui.routing import ensure_navigation
from ui.run_tables import HEAT_VALUES, slowest_ranks
from ui.text import md, plural

BRUSH_KEY, WINDOW = "tl_brush", "win"  # the overview chart's selection; the window's query parameter
INST_KEY, INSTANCE = "tl_inst", "inst"  # the highlighted instance: picker key, query parameter


def _window() -> tuple[float, float] | None:
    try:
        lo, hi = (float(v) for v in st.query_params.get(WINDOW, "").split(","))
    except ValueError:
        return None
    return (lo, hi) if hi > lo else None


def _on_brush() -> None:
    brush = (st.session_state.get(BRUSH_KEY) or {}).get("selection", {}).get(timeline_charts.BRUSH) or {}
    values = brush.get("start_ms")
    if values and len(values) == 2 and values[1] > values[0]:
        st.query_params[WINDOW] = f"{values[0]:.3f},{values[1]:.3f}"
    else:
        st.query_params.pop(WINDOW, None)


def _on_highlight() -> None:
    if st.session_state.get(INST_KEY):
        st.query_params[INSTANCE] = st.session_state[INST_KEY]
    else:
        st.query_params.pop(INSTANCE, None)


def _whole_step() -> None:
    st.query_params.pop(WINDOW, None)


def _all_ranks(key: tuple, n_ranks: int) -> None:
    """Every rank x step in one heat map, the ranks that made others wait listed first: the view of a
    set too large for one Gantt (first on the page past MAX_GANTT_RANKS ranks, last below it)."""
    st.subheader(f"All {n_ranks:,} ranks" if n_ranks != 1 else "The one rank traced")
    heat = run_loaders.heat(key)
    c1, c2 = st.columns([3, 2])
    value = c1.radio(
        "Colour by",
        list(HEAT_VALUES),
        format_func=lambda v: HEAT_VALUES[v][0],
        horizontal=True,
        key="tl_heat",
        bind="query-params",
    )
    c1.altair_chart(timeline_charts.rank_heat_chart(heat, value, HEAT_VALUES[value][1]))
    c2.caption("Slowest ranks first: the time their collectives started after their group's first rank")
    c2.dataframe(slowest_ranks(heat), hide_index=True)


def timeline_page(s: TraceSet) -> None:
    """The page in its sections: the pickers, the headline numbers, the overview and detail Gantts,
    where each rank's time goes, the critical path and what-if, and the downloads."""
    key = run_loaders.set_key(s)
    try:
        a = run_loaders.open_analysis(key, preview=_preview)
    except TraceError as err:
        st.error(f"These traces cannot be analysed: {md(err)}")
        return
    if a is None:  # the user cancelled the first load
        return
    step, first, highlight, tables = _pickers(key, a)
    ranks = a.traces.rank_ids
    _headline(a, tables["summary"], tables["counts"], step)
    if len(ranks) > run_loaders.MAX_GANTT_RANKS:  # too many for one Gantt: the all-ranks picture first
        _all_ranks(key, len(ranks))
    path = _gantts(key, step, first, ranks, highlight)
    _where_time_goes(tables)
    if path is not None:
        whatif_views.critical_path_section(key, step, path)
        whatif_views.whatif_section(key, ranks, step)
    _downloads(s, key)
    if len(ranks) <= run_loaders.MAX_GANTT_RANKS:
        _all_ranks(key, len(ranks))


def _preview(key: tuple) -> None:
    """A large set's first ranks, analysed on their own while the whole set loads: the overview of
    the step the URL names (else the first), without widgets (the full page draws those)."""
    a = run_loaders.analysis(key)
    if not a.steps:
        return
    wanted = st.query_params.get("tl_step", "")
    step = int(wanted) if wanted.lstrip("-").isdigit() and int(wanted) in a.steps else a.steps[0]
    over = run_loaders.overview_view(key, step, 0)
    ranks = over["ranks"]
    st.subheader(f"Ranks {ranks[0]}–{ranks[-1]}, first" if ranks else "The first ranks")
    st.caption(
        f"While the whole set loads: its first {len(ranks)} ranks, analysed on their own (clocks aligned among "
        f"them only), {'step ' + str(step) if step >= 0 else 'the whole trace'}. The page fills in when every "
        "rank is analysed."
    )
    st.altair_chart(timeline_charts.gantt_overview_chart(over["frame"], span=over["span"], window=None))


def _pickers(key: tuple, a) -> tuple[int, int, str, dict]:
    """The step, the first rank shown (past MAX_GANTT_RANKS ranks) and the highlighted instance, all in
    the URL; and the step's tables."""
    url = {"bind": "query-params"}
    steps = ["whole" if x == -1 else str(x) for x in a.steps] + (["all"] if len(a.steps) > 1 else [])
    _wanted_step(steps)
    c1, c2, c3 = st.columns([2, 2, 4])
    step_text = c1.selectbox(
        "Profiler step",
        steps,
        key="tl_step",
        **url,  # the option itself is the URL's value
        help="the ProfilerStep#N window of the traces; all: every step; whole: a trace "
        "without ProfilerStep annotations, shown whole",
    )
    step = {"all": ALL, "whole": -1}[step_text] if step_text in ("all", "whole") else int(step_text)
    first = 0
    ranks = a.traces.rank_ids
    if len(ranks) > run_loaders.MAX_GANTT_RANKS:
        starts = list(range(0, max(ranks) + 1, run_loaders.MAX_GANTT_RANKS))
        first = c2.select_slider(
            "Ranks shown",
            starts,
            key="tl_ranks",
            **url,
            format_func=lambda r: f"{r}–{min(r + run_loaders.MAX_GANTT_RANKS, max(ranks) + 1) - 1}",
        )
    tables = run_loaders.step_tables(key, step)
    labels = tables["labels"]
    picks = ["", *labels]
    wanted = st.query_params.get(INSTANCE, "")
    if wanted in picks and st.session_state.get(INST_KEY) != wanted:
        st.session_state[INST_KEY] = wanted  # the URL (a shared link) wins
    highlight = c3.selectbox(
        "Highlight a collective on all its ranks",
        picks,
        key=INST_KEY,
        on_change=_on_highlight,
        format_func=lambda i: labels.get(i, "none (or click one in the detail view)"),
        help="the worst stragglers of the step; clicking a collective in the detail view highlights it too",
    )
    return step, first, highlight, tables


def _wanted_step(steps: list[str]) -> None:
    """A link's step (`tl_step`, or plain `step`): taken when the set has it; otherwise said, never
    silently replaced by another step."""
    given = st.query_params.get("step") or st.query_params.get("tl_step")
    st.query_params.pop("step", None)
    if not given:
        return
    if given in steps:
        st.session_state["tl_step"] = given
        return
    st.query_params.pop("tl_step", None)
    shown = [x for x in steps if x != "all"]
    listed = f"{shown[0]}–{shown[-1]}" if len(shown) > 3 else ", ".join(shown)
    st.warning(
        f"The link asks for step {md(given)}, which these traces do not have (their steps: {listed}); "
        f"showing step {shown[0]}."
    )


def _headline(a, head: dict, counts: dict, step: int) -> None:
    ranks, world = a.traces.rank_ids, a.traces.world_size
    m = st.columns(5)
    m[0].metric(
        "Ranks",
        f"{len(ranks):,}" if len(ranks) >= world else f"{len(ranks):,} of {world:,}",
        help=f"ranks traced, of the job's world size {world:,}",
    )
    measured = measured_step_s(a.traces.step_windows, a.bd, None if step == ALL else step)
    m[4].metric(
        "Measured step",
        "—" if measured is None else f"{measured * 1e3:,.2f} ms",
        help=STEPS_DEFINITION
        if step == ALL
        else f"step {step if step != -1 else '(the whole trace)'}: {STEP_DEFINITION}",
    )
    m[1].metric(
        "Collectives",
        f"{head['collectives']:,}",
        help="collectives in the chosen steps, each counted once across the ranks that took part",
    )
    m[2].metric(
        "Exposed communication",
        "—" if head["exposed_share"] is None else f"{head['exposed_share']:.0%}",
        help="mean over ranks of exposed comm / step window",
    )
    m[3].metric(
        "Worst arrival skew",
        "—" if head["worst_skew_ms"] is None else f"{head['worst_skew_ms']:,.2f} ms",
        help="last start − first start of one collective instance across its group",
    )
    world, unknown = counts["world"], counts["unknown"]
    if world or unknown:
        st.caption(
            f"No plan or group names tell the parallel dimension of {plural(world + unknown, 'collective')}: "
            + (f"{world:,} {'spans' if world == 1 else 'span'} all ranks ('world'), " if world else "")
            + (f"{unknown:,} {'is' if unknown == 1 else 'are'} 'unknown', " if unknown else "")
            + "give the job's plan or launch script (Upload, or `profiler analyze --plan`) to label them."
        )


def _gantts(key: tuple, step: int, first: int, ranks: list[int], highlight: str):
    """The overview (with the critical path when it is on) and the detail view of its brushed window;
    returns the critical path, or None."""
    over = run_loaders.overview_view(key, step, first)
    detail = run_loaders.detail_view(key, step, _window(), first)
    st.subheader(
        "Overview"
        if len(ranks) <= run_loaders.MAX_GANTT_RANKS
        else f"Ranks {first}–{min(first + run_loaders.MAX_GANTT_RANKS, max(ranks) + 1) - 1}"
    )
    st.caption(
        "Every rank (rows) over the step; drag across it to zoom the detail view below, double-click to reset. "
        "Each rank's row holds a strip per class: compute, memory copies, and each dimension's collectives. "
        "Short events are merged within their class so the chart stays light; a merged span is as opaque as it "
        "is busy (hover: events merged, busy %)."
    )
    path = run_loaders.critical_path(key, step) if whatif_views.path_toggle(len(ranks)) else None
    span = over["span"]
    if path is not None and len(path["frame"]):  # the axis holds the whole path, also where a replay ends later
        span = (min(span[0], path["extent"]["start_ms"]), max(span[1], path["extent"]["end_ms"]))
    st.altair_chart(
        timeline_charts.gantt_overview_chart(
            over["frame"],
            span=span,
            window=detail["window"],
            path=None if path is None else path["frame"][path["frame"]["rank"].isin(over["ranks"])],
            links=None if path is None else path["links"],
        ),
        key=BRUSH_KEY,
        on_select=_on_brush,
        selection_mode=timeline_charts.BRUSH,
    )
    lo, hi = detail["window"] or over["span"]
    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    c1.subheader(f"Detail: {lo:,.1f}–{hi:,.1f} ms")
    c2.button("Whole step", on_click=_whole_step, disabled=detail["window"] is None, key="tl_reset")
    st.caption(
        "Per rank a compute lane and a collective lane. Click a collective to highlight the same instance on "
        "every rank of its group (double-click clears); hover for op, bytes, group and busbw."
    )
    st.altair_chart(timeline_charts.gantt_detail_chart(detail["frame"], window=(lo, hi), highlight=highlight or None))
    return path


def _where_time_goes(tables: dict) -> None:
    st.subheader("Where each rank's time goes")
    st.altair_chart(timeline_charts.breakdown_chart(tables["parts"]))
    t1, t2, t3, t4 = st.tabs(["Per rank", "Skew by dimension", "Stragglers", "By dimension"])
    t1.dataframe(
        tables["breakdown"],
        hide_index=True,
        column_config={"exposed share": st.column_config.NumberColumn(format="percent")},
    )
    t2.caption("Arrival skew = last start − first start of a collective instance across its group (aligned clocks).")
    t2.dataframe(tables["skew"], hide_index=True)
    t3.dataframe(tables["stragglers"], hide_index=True)
    t4.dataframe(tables["dims"], hide_index=True)
    if tables["clock_note"]:
        st.caption(tables["clock_note"])


def _downloads(s: TraceSet, key: tuple) -> None:
    d1, d2 = st.columns(2)
    d1.download_button(
        "Merged Perfetto trace (.json.gz)",
        data=lambda: run_loaders.perfetto_bytes(key),
        file_name=f"{s.name}-merged.json.gz",
        mime="application/gzip",
        key="tl_perfetto",
        help="one process per rank; opens in ui.perfetto.dev",
        on_click="ignore",
    )
    d2.download_button(
        "Collectives table (.csv)",
        data=lambda: run_loaders.collectives_csv(key),
        file_name=f"{s.name}-collectives.csv",
        mime="text/csv",
        key="tl_csv",
        on_click="ignore",
    )


ensure_navigation()
st.title("Collective timeline")
timeline_set = selection.current_set()
if timeline_set is None:
    selection.no_set()
else:
    selection.set_caption(timeline_set)
    if timeline_set.status in run_status.ACTIVE:
        run_status.live_progress(timeline_set.id)
    if timeline_set.status in ("failed", "cancelled"):
        run_status.failure(timeline_set)
    if timeline_set.has_traces:
        timeline_page(timeline_set)
    elif timeline_set.status == "failed":
        st.info("No rank wrote its trace before the failure: there is nothing to draw.")
    elif timeline_set.status != "cancelled":  # a cancelled run's warning says it already
        st.info("No traces yet: a run writes one trace per rank when it finishes; this page fills in then.")
