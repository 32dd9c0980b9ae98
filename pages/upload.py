"""Upload: bring the per-rank Kineto traces of your own job (Megatron, torchtitan, DeepSpeed, ParaScope)
-- files or one archive. Each file is checked with the trace loader: bad ones are listed with the
loader's message, good ones kept and stored under a name, optionally with the job's plan so
collectives get their parallel dimension. Stored sets open from Home and in the Collective timeline."""

from datetime import datetime

import streamlit as st

from parallel.core.plan import Plan
from parallel.core.specs import MODELS, SpecError
from parallel.core.topology import DEFAULT_ORDER, ORDERS
from profiler.collect import trace_sets, uploads
from ui import selection
from ui.routing import ensure_navigation
from ui.text import error_md, md

NO_PLAN, PLAN_FILE, PLAN_DEGREES = "none", "plan file", "degrees"


def _checked(files) -> uploads.Checked:
    """The loader's verdict on each uploaded file, computed once per upload (kept in the session)."""
    ids = tuple(f.file_id for f in files)
    cache = st.session_state.setdefault("_upload_checked", {})
    if ids not in cache:
        cache.clear()
        with st.spinner(f"Checking {len(files)} file(s) with the trace loader …"):
            cache[ids] = uploads.check_files([(f.name, f.getvalue()) for f in files])
    return cache[ids]


def _plan(checked: uploads.Checked):
    """(plan, model -- a Model, a preset's name or None) from the chosen source, or (None, None); shows
    what is wrong with a bad one."""
    how = st.radio(
        "Plan, for dimension labels",
        [NO_PLAN, PLAN_FILE, PLAN_DEGREES],
        horizontal=True,
        key="up_plan",
        format_func={
            NO_PLAN: "none: label by the traces' group names",
            PLAN_FILE: "a plan file",
            PLAN_DEGREES: "enter the degrees",
        }.get,
        help="with the plan, each collective's group is matched to a TP/SP/CP/PP/DP group of it",
    )
    world = checked.world_size
    if how == PLAN_FILE:
        f = st.file_uploader(
            "ParaScope plan / run.json, Megatron-LM launch script or torchtitan TOML", key="up_plan_file"
        )
        if f is None:
            return None, None
        try:
            return uploads.plan_from_file(f.name, f.getvalue().decode("utf-8", errors="replace"), world)
        except SpecError as err:
            st.error(f"The plan file cannot be used: {error_md(err)}")
            return None, None
    if how == PLAN_DEGREES:
        cols = st.columns(6)
        values = {
            d: cols[i].number_input(
                d.upper(), min_value=1, max_value=65536, step=1, key=f"up_{d}", value=(world or 1) if d == "dp" else 1
            )
            for i, d in enumerate(("dp", "tp", "pp", "cp"))
        }
        sp = cols[4].toggle("SP", key="up_sp")
        order = cols[5].selectbox("Rank order", list(ORDERS), key="up_order", index=list(ORDERS).index(DEFAULT_ORDER))
        model = st.selectbox(
            "Model (optional)",
            [None, *MODELS],
            format_func=lambda m: "none" if m is None else m,
            key="up_model",
            help="with the model, Home can fit the step-time calibration from this set's traces",
        )
        try:
            return Plan(**values, sp=sp, order=order, global_batch=values["dp"]), model
        except SpecError as err:
            st.error(md(err))
    return None, None


def _store(checked: uploads.Checked, name: str, plan, model) -> None:
    try:
        path = uploads.store(
            name, checked.accepted, uploads=trace_sets.uploads_dir(), plan=plan, model=model, rejected=checked.rejected
        )
    except uploads.UploadError as err:
        st.error(md(err))
        return
    set_id = trace_sets.UPLOAD + path.name
    selection.select(set_id)
    st.success(f"Stored **{md(path.name)}**: {checked.kept()}.")
    c1, c2 = st.columns(2)
    c1.page_link(
        selection.PAGES["timeline"],
        label="Open in the Collective timeline",
        icon=":material/view_timeline:",
        query_params={selection.KEY: set_id},
    )
    c2.page_link(
        selection.PAGES["home"], label="See it on Home", icon=":material/list:", query_params={selection.KEY: set_id}
    )


def upload_page() -> None:
    limit = st.get_option("server.maxUploadSize")
    files = st.file_uploader(
        "Trace files (.json, .json.gz, one per rank) or an archive (.zip, .tar.gz)",
        accept_multiple_files=True,
        key="up_files",
        help=f"at most {limit} MB per file (server.maxUploadSize in .streamlit/config.toml)",
    )
    st.caption(
        f"Size limit: **{limit:,} MB per file** (server.maxUploadSize). Rank from each trace's distributedInfo, "
        "else from its name (rank3_trace.json.gz, rank-3.json.gz)."
    )
    if not files:
        st.info(
            "Drop the traces of one job here: one Kineto trace per rank, as torch.profiler's "
            "export_chrome_trace or tensorboard_trace_handler writes them, or a .zip / .tar.gz of them."
        )
        return
    checked = _checked(files)
    for name, message in checked.rejected:
        st.error(
            f"Rejected **{md(name)}**: {md(message.removeprefix(f'{name}: '))}"
        )  # the loader's message names it too
    if not checked.accepted:
        st.warning("No file could be read as a trace; nothing to store.")
        return
    st.success(
        f"Kept {checked.kept()} of a job of world size {checked.world_size}."
        + (f" {len(checked.rejected)} rejected (above)." if checked.rejected else "")
    )
    st.dataframe(checked.rows(), hide_index=True, column_config={"MB": st.column_config.NumberColumn(format="%.2f")})
    missing = (checked.world_size or 0) - len({r for r in checked.ranks if r < (checked.world_size or 0)})
    if missing > 0:  # counted, never laid out: a file may claim any world size
        st.caption(f"{missing:,} rank(s) of the job have no trace here; the set opens with the ranks it has.")
    plan, model = _plan(checked)
    st.session_state.setdefault("up_name", f"traces-{datetime.now():%Y%m%d-%H%M%S}")
    name = st.text_input(
        "Name of the set", key="up_name", help="letters, digits, '.', '_', '-'; an existing set is never overwritten"
    )
    if st.button("Store the set", type="primary", key="up_store", icon=":material/save:"):
        _store(checked, name, plan, model)


ensure_navigation()
st.title("Upload traces")
upload_page()
