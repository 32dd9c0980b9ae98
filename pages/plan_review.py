"""Plan review: compare 2–4 plans side by side, search the plan space, import a Megatron-LM script /
torchtitan TOML / plan JSON, share the review as a URL, export it (Markdown, JSON), save it for the team.

State: one `parallel.review.urls.ReviewState` in the session, mirrored into the URL on every run (so a copied
link reproduces the view) and adopted back from a URL this session did not write. Widgets hold their
values under `rv.*` keys, re-seeded from the state whenever it changes from outside (a link, an import,
a search result, a reopened review).
"""

from __future__ import annotations

import dataclasses
import hashlib

import streamlit as st

from parallel.core.plan import PLAN_FIELDS, RECOMPUTE, Plan
from parallel.core.specs import CLUSTERS, MODELS, SpecError, cluster_preset
from parallel.core.topology import ORDERS
from parallel.importers import KINDS, SUFFIXES, ImportFailed, config_names, detect, import_text, place
from parallel.review.document import (
    NamedPlan,
    Review,
    compare,
    compute_text,
    justify,
    plan_rows,
    review_markdown,
)
from parallel.review.refit import refit_review
from parallel.review.store import ReviewStore, default_url
from parallel.review.urls import (
    REVIEW_VIEWS,
    ReviewState,
    default_review_state,
    plan_page_params,
    plan_rows_of,
    plans_from_rows,
    review_from_params,
    review_of,
    review_to_params,
    state_of_review,
    title_of,
)
from parallel.search.explain import explain, runner_up
from parallel.search.space import EQUIVALENCE_RULE, Constraints, SearchEmpty, search, shared_text
from profiler.collect import runs_calibration, trace_sets
from ui import calibration_views, run_loaders
from ui import review_charts as rc
from ui.routing import ensure_navigation
from ui.text import error_md, md
from ui.theme import link_names

STATE, WRITTEN, VERSION, BASE, IMPORTED = "rv.state", "rv.url", "rv.version", "rv.editor_base", "rv.imported"
SWITCH = "rv.switch"  # the plans the last model / cluster switch changed or left unfit
MAX_PLANS = 4
VIEW_TITLES = {"compare": "Compare & share", "search": "Search", "import": "Import", "saved": "Saved reviews"}
PAGES = (
    ("pages/topology.py", "Topology"),
    ("pages/activation_memory.py", "Activation memory"),
    ("pages/tp_scaling.py", "TP scaling"),
    ("pages/long_context.py", "Long context"),
)


# ------------------------------------------------------------------ cached loaders (plain arguments)


@st.cache_data(show_spinner=False, max_entries=64)
def comparison(review_json: str):
    return compare(Review.from_json(review_json))


@st.cache_data(show_spinner=False, max_entries=16)
def markdown(review_json: str) -> str:
    return review_markdown(Review.from_json(review_json))


@st.cache_data(show_spinner="Searching the plan space…", max_entries=16)
def search_result(review_json: str, gb: int, constraints: Constraints):
    r = Review.from_json(review_json)
    return search(r.model, r.cluster, gb, constraints, r.options)


@st.cache_resource(show_spinner=False)
def _store(url: str) -> ReviewStore:
    return ReviewStore(url)


def store() -> ReviewStore:
    return _store(default_url())  # PARASCOPE_REVIEWS_DB, else SQLite under PARASCOPE_DATA or ./.parascope


# ------------------------------------------------------------------ state <-> widgets <-> URL


def widget_values(s: ReviewState) -> dict:
    return {
        "rv.view": s.view,
        "rv.model": s.model.name,
        "rv.cluster": s.cluster,
        "rv.nodes": s.nodes,
        "rv.title": s.title,
        "rv.verdict": s.verdict,
        "rv.chosen": s.chosen or "—",
        "rv.compute": "mfu" if s.mfu is not None else "device",
        "rv.mfu": 0.5 if s.mfu is None else s.mfu,
        "rv.dp_fixed": s.dp_overlap is not None,
        "rv.dp_overlap": 0.0 if s.dp_overlap is None else s.dp_overlap,
        "rv.s_gb": s.search_gb or (s.plans[0].plan.global_batch if s.plans else 1536),
        "rv.s_headroom": s.headroom,
        "rv.s_max_tp": s.max_tp or 0,
        "rv.s_sp": s.require_sp,
        "rv.s_zero": list(s.zero),
        "rv.s_recompute": list(s.recompute),
        "rv.s_top": s.top,
    }


def set_state(s: ReviewState) -> None:
    """Adopt a state from outside the widgets: every widget shows it, the plan table restarts from it."""
    st.session_state[STATE] = s
    st.session_state.update(widget_values(s))
    st.session_state[VERSION] = st.session_state.get(VERSION, 0) + 1
    st.session_state[BASE] = plan_rows_of(s.plans)


def _as_lists(params: dict) -> dict[str, list[str]]:
    return {k: (list(v) if isinstance(v, list) else [v]) for k, v in params.items()}


def load_state() -> ReviewState:
    url = {k: st.query_params.get_all(k) for k in st.query_params}
    if STATE not in st.session_state or (url and url != st.session_state.get(WRITTEN)):
        try:
            set_state(review_from_params(url) if url else default_review_state())
        except SpecError as err:
            st.error(f"The link's review could not be used: {md(err)}. Showing the previous review.")
            set_state(st.session_state.get(STATE) or default_review_state())
    for key, value in widget_values(st.session_state[STATE]).items():
        st.session_state.setdefault(key, value)  # widgets of a section not drawn last run lose their value
    return st.session_state[STATE]


def write_state(s: ReviewState) -> None:
    st.session_state[STATE] = s
    params = review_to_params(s)
    if _as_lists(params) != {k: st.query_params.get_all(k) for k in st.query_params}:
        st.query_params.from_dict(params)
    st.session_state[WRITTEN] = _as_lists(params)


def review_json(s: ReviewState) -> str:
    return review_of(s).to_json(with_summary=False)


# ------------------------------------------------------------------ the review's machine and assumptions


def machine(s: ReviewState) -> ReviewState:
    models = list(MODELS) + ([] if s.is_preset_model else [s.model.name])
    c1, c2, c3 = st.columns([3, 2, 1])
    name = c1.selectbox(
        "Model",
        models,
        key="rv.model",
        format_func=lambda n: n if n in MODELS else f"{n} (imported)",
        on_change=_machine_changed,
    )
    cluster = c2.selectbox("Cluster", list(CLUSTERS), key="rv.cluster", on_change=_machine_changed)
    nodes = c3.number_input("Nodes", min_value=1, max_value=65536, step=1, key="rv.nodes", on_change=_machine_changed)
    with st.expander("Modelling assumptions"):
        a1, a2 = st.columns(2)
        compute = a1.radio(
            "Compute",
            ["device", "mfu"],
            key="rv.compute",
            format_func={"device": "per operator, on the device", "mfu": "one MFU for everything"}.get,
            help="per operator: each GEMM, the attention core and the element-wise traffic timed from its "
            "shape on the cluster's GPU (parallel.core.compute; checked against published runs in bench/README)",
        )
        mfu = a1.slider("MFU", 0.1, 1.0, step=0.05, key="rv.mfu", disabled=compute != "mfu")
        fixed = a2.toggle(
            "Fixed DP overlap", key="rv.dp_fixed", help="off: each plan's own grad-reduce / param-gather overlap flags"
        )
        overlap = a2.slider(
            "DP overlap",
            0.0,
            1.0,
            step=0.05,
            key="rv.dp_overlap",
            disabled=not fixed,
            help="fraction of gradient reduction hidden behind backward",
        )
        st.caption("Each plan's attention kernel, dropout and overlaps are its own: columns of the plan table.")
    return dataclasses.replace(
        s,
        model=MODELS.get(name, s.model),
        cluster=cluster,
        nodes=int(nodes),
        mfu=float(mfu) if compute == "mfu" else None,
        dp_overlap=float(overlap) if fixed else None,
    )


def _machine_changed() -> None:
    """The model, cluster or nodes widget changed (a callback: before any widget is drawn, so every
    widget can restart from the new state)."""
    ss = st.session_state
    old = ss[STATE]
    set_state(_switched(old, MODELS.get(ss["rv.model"], old.model), ss["rv.cluster"], int(ss["rv.nodes"])))


def _switched(old: ReviewState, model, cluster: str, nodes: int) -> ReviewState:
    """`old` on another model or cluster, by the model / cluster / nodes widgets or an import: the plans
    re-fitted to the new GPU count, the title following when it was the default one, and what changed
    said (rv.switch)."""
    new = dataclasses.replace(old, model=model, cluster=cluster, nodes=nodes)
    if (new.model, new.cluster, new.nodes) == (old.model, old.cluster, old.nodes):
        return old
    fits = refit_review(new.plans, new.model, new.cluster_spec)
    title = old.title
    if not title or title == title_of(old.model, old.cluster_spec):
        title = title_of(new.model, new.cluster_spec)
    st.session_state[SWITCH] = [f for f in fits if f.change or not f.valid]
    return dataclasses.replace(new, plans=tuple(f.named for f in fits), title=title, search_gb=None)


def switch_notes(s: ReviewState) -> None:
    """What the last model / cluster switch did to each plan, and one click to the nearest plans that fit."""
    fits = st.session_state.get(SWITCH) or []
    if not fits:
        return
    with st.container(border=True):
        st.markdown(f"**Now {md(s.model.name)} on {s.cluster_spec.gpus:,} {md(s.cluster)} GPUs.**")
        for f in fits:
            if f.change:
                st.markdown(f"- {md(f.named.name)}: {md(f.change)}.")
            if not f.valid:
                why = "; ".join(f.errors[:2]) or "it does not fit"
                st.markdown(f"- {md(f.named.name)} ({md(f.named.plan.label())}) does not fit: {md(why)}")
                for i, plan in enumerate(f.nearest):
                    st.button(
                        f"Use {plan.label()} for {f.named.name}",
                        key=f"rv.near.{f.named.name}.{i}",
                        on_click=_replace_plan,
                        args=(f.named.name, plan),
                    )
        st.button("Search this model and cluster", key="rv.switch_search", on_click=_to_search)


def _replace_plan(name: str, plan) -> None:
    s = st.session_state[STATE]
    plans = tuple(dataclasses.replace(p, plan=plan) if p.name == name else p for p in s.plans)
    st.session_state[SWITCH] = [f for f in st.session_state.get(SWITCH, []) if f.named.name != name]
    set_state(dataclasses.replace(s, plans=plans))


def _to_search() -> None:
    st.session_state.pop(SWITCH, None)
    set_state(dataclasses.replace(st.session_state[STATE], view="search"))


# ------------------------------------------------------------------ compare & share


def _column(spec):
    """The plan editor's column of one plan field, from its declaration (parallel.core.plan)."""
    k = spec.knob
    if spec.kind == "bool":
        return st.column_config.CheckboxColumn(k.column, help=k.help)
    if spec.kind == "choice":
        return st.column_config.SelectboxColumn(k.column, options=list(k.choices), required=True, help=k.help)
    if spec.kind == "opt_bool":
        return st.column_config.SelectboxColumn(k.column, options=[True, False], help=k.help + " (empty: the default)")
    if spec.name == "order":  # the rank order: the listed ones
        return st.column_config.SelectboxColumn(k.column, options=list(ORDERS), required=True, help=k.help)
    if spec.kind == "text":  # module lists (recompute, offload): the plan checks the names
        return st.column_config.TextColumn(k.column, required=True, help=k.help)
    if spec.kind == "opt_float":
        return st.column_config.NumberColumn(k.column, min_value=0.0, step=0.05, help=k.help + " (empty: the default)")
    return st.column_config.NumberColumn(
        k.column,
        min_value=k.lo,
        max_value=k.hi,
        step=1,
        required=spec.kind == "int",
        help=k.help + (" (empty: the default)" if spec.kind == "opt_int" else ""),
    )


def plan_editor(s: ReviewState) -> ReviewState:
    key = f"rv.plans.{st.session_state.get(VERSION, 0)}"
    if key not in st.session_state:
        st.session_state[BASE] = plan_rows_of(s.plans)
    cfg = {"name": st.column_config.TextColumn("name", required=True, width="small")}
    cfg.update({spec.knob.url: _column(spec) for spec in PLAN_FIELDS})
    cfg["model"] = st.column_config.SelectboxColumn(
        "model",
        options=["", *MODELS],
        help="empty: the review's model; a preset to compare, e.g., a dense model with a MoE one",
    )
    edited = st.data_editor(
        st.session_state[BASE], key=key, num_rows="dynamic", column_config=cfg, hide_index=True, width="stretch"
    )
    plans, errors = plans_from_rows(edited)
    for e in errors:
        st.error(md(e))
    if len(plans) > MAX_PLANS:
        st.warning(f"Comparing the first {MAX_PLANS} of {len(plans)} plans.")
        plans = plans[:MAX_PLANS]
    return dataclasses.replace(s, plans=plans, chosen=s.chosen if s.chosen in [p.name for p in plans] else None)


def links(s: ReviewState, named: NamedPlan, where) -> None:
    params = plan_page_params(s, named)
    for page, title in PAGES:
        if params is None:
            where.page_link(page, label=title, disabled=True, help="those pages take preset models only")
        else:
            where.page_link(page, label=title, query_params=params, help=f"open {named.name} in {title}")


def explain_panel(s: ReviewState) -> None:
    """Why the faster of two compared plans wins: the step breakdown side by side."""
    names = [p.name for p in s.plans]
    with st.expander("Why one plan beats another", expanded=False):
        c1, c2 = st.columns(2)
        a = c1.selectbox("Plan", names, index=0, key="rv.x_a")
        b = c2.selectbox("against", names, index=1, key="rv.x_b")
        if a == b:
            st.info("Pick two different plans.")
            return
        plans = {p.name: p for p in s.plans}
        if plans[a].model_or(s.model) != plans[b].model_or(s.model):
            st.info("The two plans train different models: their steps are not comparable part by part.")
            return
        try:
            ex = explain(plans[a].model_or(s.model), s.cluster_spec, plans[a].plan, plans[b].plan, review_of(s).options)
        except (SpecError, ValueError) as err:
            st.warning(f"Cannot compare these two: {md(err)}")
            return
        st.markdown(md(ex["summary"]))
        st.dataframe(rc.explain_frame(ex, a, b), hide_index=True)
        st.caption(EQUIVALENCE_RULE)


def predicted_vs_measured(s: ReviewState, cmp) -> None:
    """The calibrated model's step beside the analytic one, and a run's measured step where a run
    here ran the very plan (profiler.collect.runs_calibration.review_predictions)."""
    st.subheader("Predicted vs measured")
    cal, problem = calibration_views.calibration()
    if problem:
        st.warning(f"The calibration cannot be used: {md(problem)}")
    steps = plan_rows(cmp).set_index("name")["step_time_s"].to_dict()
    plans = [(p.name, p.model_or(s.model), p.plan, steps.get(p.name)) for p in s.plans]
    view = runs_calibration.review_predictions(
        plans, s.cluster_spec, cal, trace_sets.list_sets(), run_loaders.run_metrics
    )
    if set(view["chart"]["source"]) > {"analytic"}:  # the analytic step alone is the chart above
        st.altair_chart(rc.predicted_measured_chart(view["chart"]))
        st.dataframe(view["table"].round(3), hide_index=True)
    if len(view["phases"]):
        st.altair_chart(rc.time_chart(view["phases"], title="Calibrated step time"))
    if view["calibrated"]:
        st.caption(
            "Calibrated: parallel.core.calibrated fitted from "
            + ", ".join(str(src.get("plan")) for src in cal.sources)
            + ". Measured: the latest completed run of exactly this model and plan on this cluster "
            "(its unprofiled steps when it was profiled with `--wait`)."
        )
    else:
        st.caption(
            f"No calibrated prediction ({md(view['note'])}). {calibration_views.HOW} For GPU clusters, "
            "calibrate from your own job's traces: upload them on the Upload page with the job's launch script "
            "(or plan and model) and fit on Home, or `python -m profiler calibrate TRACES --plan pretrain_gpt.sh "
            f"--out $PARASCOPE_RUNS/{runs_calibration.CALIBRATION_FILE}`."
        )


def compare_section(s: ReviewState) -> ReviewState:
    st.caption("One row per plan (2–4). Edit cells, add or delete rows; every number below follows.")
    s = plan_editor(s)
    if not s.plans:
        st.info("Add a plan to the table, import one, or send one from Search.")
        return s
    c1, c2 = st.columns([2, 1])
    title = c1.text_input("Review title", key="rv.title")
    names = ["—"] + [p.name for p in s.plans]
    if st.session_state.get("rv.chosen") not in names:
        st.session_state["rv.chosen"] = "—"
    chosen = c2.selectbox("Chosen plan", names, key="rv.chosen")
    verdict = st.text_area("Verdict", key="rv.verdict", height=68, placeholder="Why this plan, in a sentence or two")
    s = dataclasses.replace(s, title=title, verdict=verdict, chosen=None if chosen == "—" else chosen)
    text = review_json(s)
    cmp = comparison(text)
    cards = st.columns(len(s.plans))
    for col, card, named in zip(cards, rc.plan_cards(plan_rows(cmp)), s.plans):
        with col.container(border=True):
            st.markdown(
                f"**{card['name']}** "
                + (":green[valid]" if card["valid"] else ":red[**invalid**]")
                + (" · :blue[chosen]" if card["name"] == s.chosen else "")
            )
            st.caption(card["label"])
            if card["valid"]:
                st.metric("step time", card["step"], help=card["issues"])
                st.metric("memory per GPU", card["memory"])
                st.metric("MFU", card["mfu"])
            else:  # the numbers of a plan that cannot run would read as a forecast
                for message in cmp.issues_of(named.name)[:3]:
                    st.error(md(message))
            links(s, named, st)
    issues = cmp.issues
    if len(issues):
        with st.expander(f"Errors and warnings ({len(issues)})", expanded=bool((issues["level"] == "error").any())):
            for r in issues.to_dict("records"):
                (st.error if r["level"] == "error" else st.warning)(f"{r['plan']}: {r['message']}")
    cluster = s.cluster_spec
    if len(cmp.memory):
        st.altair_chart(rc.memory_chart(cmp.memory, cluster.gpu_memory_bytes))
        st.altair_chart(rc.time_chart(cmp.time))
        st.caption(f"Compute: {compute_text(review_of(s).options, cmp.reports[cmp.names[0]].get('step_time'))}.")
        if (cmp.hidden["seconds"] > 0).any():
            st.altair_chart(rc.hidden_chart(cmp.hidden))
    if len(s.plans) >= 2:
        explain_panel(s)
    if len(cmp.comm):
        st.altair_chart(rc.comm_chart(cmp.comm, link_names(s.cluster_spec)))
    predicted_vs_measured(s, cmp)
    st.subheader("Side by side")
    st.caption("Highlighted rows differ between the plans.")
    st.dataframe(rc.compare_styler(cmp.table, cmp.names), hide_index=True, height=420)
    st.subheader("Why each plan")
    for named in s.plans:
        title = f"{md(named.name)}: {named.plan.label()}" + (f" · {named.model.name}" if named.model else "")
        with st.expander(title, expanded=named.name == s.chosen):
            why = justify(named.plan, cmp.reports[named.name], named.model_or(s.model), cluster, review_of(s).options)
            st.markdown("\n".join(f"- **{dim}** — {t}" for dim, t in why))
    st.subheader("Share and export")
    st.caption("The page's URL holds this review (plans, verdict, search settings): copy it to share the view.")
    d1, d2 = st.columns(2)
    stem = (s.title or "plan-review").strip().replace(" ", "_")[:60]
    d1.download_button(
        "Download Markdown", markdown(text), file_name=f"{stem}.md", mime="text/markdown", width="stretch"
    )
    d2.download_button(
        "Download JSON",
        review_of(s).to_json(),
        file_name=f"{stem}.json",
        mime="application/json",
        width="stretch",
        help="imports back: Import → upload, or python -m parallel plan --import",
    )
    return s


# ------------------------------------------------------------------ search


def _add_plan(named: NamedPlan, machine: tuple | None = None) -> None:
    """`named` into compare (the last plan replaced when full); `machine`: (model, cluster, nodes) an
    import brings, which the review switches to first (its other plans re-fitted, as a switch by hand)."""
    s = st.session_state[STATE]
    if machine is not None:
        s = _switched(s, *machine)
    plans = tuple(p for p in s.plans if p.name != named.name)[: MAX_PLANS - 1] + (named,)
    set_state(dataclasses.replace(s, plans=plans, view="compare"))


def search_section(s: ReviewState) -> ReviewState:
    c1, c2, c3, c4 = st.columns(4)
    gb = c1.number_input("Global batch", min_value=1, step=1, key="rv.s_gb", help="sequences per optimizer step")
    headroom = c2.slider(
        "Memory headroom",
        0.0,
        0.5,
        step=0.05,
        key="rv.s_headroom",
        help="fraction of GPU memory kept free (allocator, NCCL buffers)",
    )
    max_tp = c3.selectbox(
        "Max TP", [0, 1, 2, 4, 8, 16, 32, 64], key="rv.s_max_tp", format_func=lambda t: "no limit" if t == 0 else str(t)
    )
    sp = c4.toggle("SP required", key="rv.s_sp", help="every plan with TP > 1 uses sequence parallelism")
    c1, c2, c3 = st.columns([2, 2, 1])
    zero = c1.multiselect("ZeRO stages", [0, 1, 2, 3], key="rv.s_zero")
    recompute = c2.multiselect("Recompute modes", list(RECOMPUTE), key="rv.s_recompute")
    top = c3.number_input("Show top", min_value=1, max_value=200, step=1, key="rv.s_top")
    s = dataclasses.replace(
        s,
        search_gb=int(gb),
        headroom=float(headroom),
        max_tp=int(max_tp) or None,
        require_sp=bool(sp),
        zero=tuple(sorted(zero)),
        recompute=tuple(recompute),
        top=int(top),
    )
    if not zero or not recompute:
        st.info("Pick at least one ZeRO stage and one recompute mode.")
        return s
    base = search_base(s)
    st.caption(f"Every plan the search tries shares {md(shared_text(base))}: the first compared plan's.")
    constraints = Constraints(
        headroom=s.headroom, max_tp=s.max_tp, require_sp=s.require_sp, zero=s.zero, recompute=s.recompute, base=base
    )
    try:
        result = search_result(review_json(s), s.search_gb, constraints)
    except SearchEmpty as err:
        st.error(md(err))
        st.dataframe(rc.funnel_frame(err.funnel), hide_index=True)
        return s
    cluster = s.cluster_spec
    m1, m2, m3 = st.columns(3)
    m1.metric("Plans that fit", f"{len(result.table):,}")
    m2.metric("Plans evaluated", f"{result.evaluated:,}", help=f"{cluster.gpus:,} GPUs, every valid split")
    m3.metric("Search time", f"{result.seconds:.2f} s")
    budget = cluster.gpu_memory_bytes * (1 - s.headroom)
    st.altair_chart(rc.pareto_chart(rc.pareto_points(result.table, result.base), budget))
    hidden, slowest = rc.hidden_slow(result.table)
    st.caption(
        "Each dot is a plan that fits; dark dots and the line are the Pareto front (no plan is both "
        "leaner and faster). Red dashes: the memory budget."
        + (
            f" {hidden:,} slower plans (more than {rc.SLOWEST_DRAWN:g}× the fastest, up to "
            f"{slowest:,.0f} s a step, the lean end of the front among them) are not drawn."
            if hidden
            else ""
        )
    )
    rows = rc.search_rows(result.table, result.base, s.top)
    st.dataframe(rows, hide_index=True)
    st.caption(f"Order: {result.rule}.")
    explain_top(s, result)
    with st.expander("How the space was narrowed"):
        st.dataframe(rc.funnel_frame(result.funnel), hide_index=True)
    ranks = list(range(1, len(rows) + 1))
    c1, c2 = st.columns([4, 1])
    rank = c1.selectbox("Send to compare", ranks, key="rv.s_pick", format_func=lambda r: f"#{r}: {rows['plan'][r - 1]}")
    named = NamedPlan(f"search #{rank}", result.plan_at(rank - 1))
    c2.button(
        "Add to compare",
        on_click=_add_plan,
        args=(named,),
        width="stretch",
        help=f"compare holds {MAX_PLANS} plans; the last one is replaced when full",
    )
    return s


def search_base(s: ReviewState) -> Plan:
    """The fields every searched plan shares (overlaps, attention, dropout, precision, order): the first
    compared plan of the review's model, else the defaults."""
    own = [p.plan for p in s.plans if p.model is None]
    return own[0] if own else Plan()


def explain_top(s: ReviewState, result) -> None:
    """Why the search's first plan beats its runner-up or a compared plan of the same size."""
    top = result.plan_at(0)
    second, ties = runner_up(result.table)  # exact twins (a mirrored stage split) teach nothing
    against = {}
    if second is not None:
        tied = f" (#2-#{second} tie with #1)" if ties > 1 else " (#2 ties with #1)" if ties else ""
        against[f"#{second + 1}{tied}"] = result.plan_at(second)
    against.update(
        {
            p.name: dataclasses.replace(p.plan, global_batch=s.search_gb)
            for p in s.plans
            if p.model is None and p.plan.world_size == s.cluster_spec.gpus
        }
    )
    if not against:
        return
    with st.expander(f"Why #1 ({top.label()})"):
        other = st.selectbox("against", list(against), key="rv.s_against")
        try:
            fastest = float(result.table["step_time_s"].min())
            ex = explain(s.model, s.cluster_spec, top, against[other], review_of(s).options, fastest)
        except (SpecError, ValueError) as err:
            st.warning(f"Cannot compare: {md(err)}")
            return
        st.markdown(md(ex["summary"]))
        st.dataframe(rc.explain_frame(ex, "#1", other.split(" (")[0]), hide_index=True)


# ------------------------------------------------------------------ import


# Import's inputs, kept across sections (not the uploader's file: Streamlit lets no session set it)
IMPORT_INPUTS = ("rv.i_how", "rv.i_text", "rv.i_kind", "rv.i_config", "rv.i_nodes")


def keep_import_inputs() -> None:
    """Keep what was pasted and picked in Import while another section shows (Streamlit drops a widget's
    value on a run that does not draw it), so a second config of the same registry is a pick away."""
    for key in IMPORT_INPUTS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def import_section(s: ReviewState) -> ReviewState:
    st.caption(
        "A Megatron-LM launch script or command line, a torchtitan TOML or config registry (.py, read "
        "without running it), or a ParaScope plan/review JSON. Flags it does not know are listed, never fatal."
    )
    how = st.radio("Source", ["Paste", "Upload"], horizontal=True, key="rv.i_how")
    if how == "Paste":
        text, name = (
            st.text_area("Paste the script, command line, TOML, config registry or JSON", key="rv.i_text", height=220),
            "pasted text",
        )
    else:
        up = st.file_uploader("File", type=[*(x.lstrip(".") for x in SUFFIXES), "txt"], key="rv.i_file")
        text, name = (up.getvalue().decode("utf-8", "replace"), up.name) if up else ("", "")
    c1, c2, c3 = st.columns([2, 1, 1])
    kind = c1.selectbox("Kind", ["auto", *KINDS], key="rv.i_kind")
    configs = config_names(text) if (kind if kind != "auto" else detect(text, name)) == "torchtitan" else []
    config = (
        c1.selectbox("Config", configs, key="rv.i_config", help="the registry's config function") if configs else None
    )
    nodes = c2.number_input(
        "Nodes (0: from the file)",
        min_value=0,
        step=1,
        key="rv.i_nodes",
        help=f"nodes of {cluster_preset(s.cluster).gpus_per_node} GPUs of the review's cluster",
    )
    inputs = _import_inputs(text, name, kind, config, int(nodes))
    if c3.button("Read it", disabled=not text.strip(), width="stretch"):
        st.session_state.pop(IMPORTED, None)
        try:
            got = _read_import(text, name, kind, int(nodes), cluster_preset(s.cluster), config)
            st.session_state[IMPORTED] = {**got, "inputs": inputs}
        except (ImportFailed, SpecError) as err:
            st.error(error_md(err))
    got = st.session_state.get(IMPORTED)
    if got and got["inputs"] != inputs:  # read from another file, config or nodes: its plan is not this one's
        if text.strip():
            st.info("Changed since the last **Read it**: press **Read it** to read this file with these settings.")
        return s
    if got:
        model = got["model"] or s.model
        if got["plan"] is None:  # read, but neither the file nor the Nodes field says how many GPUs
            st.warning(
                f"{md(got['name'])}: read as {md(model.name)}, but {md(got['summary']['world_from'])}. Set "
                f"**Nodes** to the nodes of {got['gpus_per_node']} GPUs it runs on, then **Read it** again."
            )
        else:
            st.success(
                f"{got['summary']['kind']}: {md(model.name)}, {got['plan'].label()}, global batch "
                f"{got['plan'].global_batch}, {got['summary']['world_size']} GPUs ({md(got['summary']['world_from'])}) "
                f"on {got['nodes']} {got['cluster']} nodes"
            )
        if got["cluster_note"]:
            st.warning(md(got["cluster_note"]))
        frames = rc.import_frames(got["summary"])
        t1, t2 = st.columns(2)
        t1.dataframe(frames["recognised"], hide_index=True)
        t2.dataframe(frames["unknown"], hide_index=True)
        if notes := rc.import_notes_markdown(got["summary"]):
            st.markdown(notes)
        if got["plan"] is None:
            return s
        # a registry's config by its function's name (llama3_8b and llama3_8b_mxfp8 are two plans, not one
        # replacing the other), else the file's stem
        stem = got["config"] or (
            "imported" if got["name"] == "pasted text" else got["name"].rsplit(".", 1)[0] or "imported"
        )
        named = NamedPlan(stem[:40], got["plan"])
        machine = (model, got["cluster"], got["nodes"])
        moved = [f"model becomes {model.name}"] if model != s.model else []
        moved += [f"cluster becomes {got['cluster']}"] if got["cluster"] != s.cluster else []
        note = f" (the review's {' and '.join(moved)})" if moved else ""
        st.button(f"Add to compare as {named.name!r}{note}", on_click=_add_plan, args=(named, machine))
    return s


def _import_inputs(text: str, name: str, kind: str, config: str | None, nodes: int) -> tuple:
    """What a read depends on, to tell a shown result from the inputs it was read from (the text by its
    digest: the session need not hold a second copy of a file of up to a million characters)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest(), name, kind, config, nodes


def _read_import(text: str, name: str, kind: str, nodes: int, review_cluster, config: str | None = None) -> dict:
    """What Read it shows: the import placed as `python -m parallel plan --import` places it, or, when
    neither the file nor the Nodes field says how many GPUs, what was read without a plan (plan None).
    `config`: a torchtitan registry's config function."""
    imported = import_text(text, name, None if kind == "auto" else kind, config=config)
    base, cluster_note = _import_base(imported, review_cluster)
    got = {
        "model": imported.model,
        "cluster_note": cluster_note,
        "name": name,
        "config": config,
        "gpus_per_node": base.gpus_per_node,
    }
    if imported.world_size is None and not nodes:
        return {**got, "summary": imported.summary(), "plan": None, "nodes": None, "cluster": base.name}
    placed, cluster = place(imported, base, nodes or None)
    return {**got, "summary": placed.summary(), "plan": placed.plan, "nodes": cluster.nodes, "cluster": cluster.name}


def _import_base(imported, review_cluster) -> tuple:
    """The cluster an import is placed on, as `python -m parallel plan --import` places it: the file's own
    cluster when it names a preset (a plan JSON), else the review's, on the file's GPUs per node; and a
    note when the file's cluster is no preset (a review holds a preset's name, so it keeps its own)."""
    own = imported.cluster
    if own is not None:
        if own.name in CLUSTERS and cluster_preset(own.name).with_nodes(own.nodes) == own:
            return own, ""
        return review_cluster, (
            f"The file's cluster {own.name} is not a preset as it stands: placed on the review's "
            f"{review_cluster.name} instead (python -m parallel plan --import uses the file's own)."
        )
    if imported.gpus_per_node:
        return dataclasses.replace(review_cluster, gpus_per_node=imported.gpus_per_node), ""
    return review_cluster, ""


# ------------------------------------------------------------------ saved reviews


def _save(as_new: bool) -> None:
    s, author = st.session_state[STATE], st.session_state.get("rv.author") or "anonymous"
    try:
        rid = store().save(review_of(s, author=author), author=author, review_id=None if as_new else s.review_id)
    except SpecError as err:
        st.session_state["rv.flash_msg"] = ("error", str(err))
        return
    st.session_state[STATE] = dataclasses.replace(s, review_id=rid)
    st.session_state["rv.flash_msg"] = ("success", f"Saved as review #{rid}.")


def _open(rid: int) -> None:
    try:
        review = store().open(rid)
        set_state(state_of_review(review, review_id=rid, view="compare", base=st.session_state[STATE]))
    except SpecError as err:
        st.session_state["rv.flash_msg"] = ("error", str(err))


def _note(rid: int) -> None:
    text = st.session_state.get("rv.note_text", "")
    try:
        store().add_note(rid, st.session_state.get("rv.author") or "anonymous", text)
        st.session_state["rv.note_text"] = ""
    except SpecError as err:
        st.session_state["rv.flash_msg"] = ("error", str(err))


def saved_section(s: ReviewState) -> ReviewState:
    db = store()
    st.caption(
        f"Stored in {db.url.split('://')[0]} at {db.url.split('://', 1)[-1] or 'memory'} "
        "(set PARASCOPE_REVIEWS_DB to a team server's database URL)."
    )
    st.text_input("Your name (for saves and notes)", key="rv.author")
    c1, c2 = st.columns(2)
    c1.button("Save as a new review", on_click=_save, args=(True,), width="stretch")
    c2.button(
        f"Save a new revision of #{s.review_id}" if s.review_id else "Save a new revision",
        on_click=_save,
        args=(False,),
        disabled=s.review_id is None,
        width="stretch",
    )
    saved = db.list()
    if not saved:
        st.info("No saved reviews yet: save this one to start.")
        return s
    st.dataframe(rc.saved_frame(saved), hide_index=True)
    ids = [r.id for r in saved]
    titles = {r.id: r.title for r in saved}
    c1, c2 = st.columns([4, 1])
    pick = c1.selectbox("Review", ids, key="rv.pick", format_func=lambda i: f"#{i}: {titles[i]}")
    c2.button("Open", on_click=_open, args=(pick,), width="stretch")
    if s.review_id in ids:
        st.subheader(f"Notes on #{s.review_id}")
        for n in db.open(s.review_id).notes:
            st.markdown(f"**{md(n.author)}** · {md(n.at)}  \n{md(n.text)}")
        st.text_area("Add a note", key="rv.note_text", height=68)
        st.button("Add note", on_click=_note, args=(s.review_id,))
    return s


# ------------------------------------------------------------------ the page

SECTIONS = {"compare": compare_section, "search": search_section, "import": import_section, "saved": saved_section}


def plan_review_page() -> None:
    state = load_state()
    st.title(f"Plan review: {state.title}" if state.title else "Plan review")
    kind, message = st.session_state.pop("rv.flash_msg", (None, None))
    if kind:
        (st.success if kind == "success" else st.error)(message)
    keep_import_inputs()
    state = machine(state)
    switch_notes(state)
    view = st.segmented_control(
        "Section", REVIEW_VIEWS, key="rv.view", required=True, format_func=VIEW_TITLES.get, label_visibility="collapsed"
    )
    state = dataclasses.replace(state, view=view or "compare")
    state = SECTIONS[state.view](state)
    write_state(state)


ensure_navigation()
plan_review_page()
