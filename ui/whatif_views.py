"""The Collective timeline's "Critical path" and "What if" sections: thin Streamlit views over
run_loaders.critical_path / run_loaders.whatif (profiler.analyzers.replay, .whatif, .bubble)."""

from __future__ import annotations

import streamlit as st

from parallel.core.comm import DIMS
from profiler.analyzers.aggregates import ALL
from profiler.analyzers.steps import STEP_DEFINITION, STEPS_DEFINITION
from ui import run_loaders, whatif_charts
from ui import whatif_tables as whatif_data

MEDIAN = "median of its peers"


def critical_path_section(key: tuple, step: int, path: dict) -> None:
    st.subheader("Critical path across ranks")
    frame = path["frame"]
    if frame.empty:
        st.info("No critical path: the traces have no step windows with matched collectives.")
        return
    st.caption(path_caption(path["extent"], len(set(frame["rank"])), len(path["links"]), step == ALL))
    c1, c2 = st.columns([2, 3])
    c1.dataframe(
        path["categories"],
        hide_index=True,
        column_config={
            "ms": st.column_config.NumberColumn("ms on the path", format="%.2f"),
            "share": st.column_config.NumberColumn(format="percent"),
        },
    )
    longest = frame.sort_values("dur_ms", ascending=False).head(25)[["rank", "category", "label", "start_ms", "dur_ms"]]
    c2.dataframe(
        longest,
        hide_index=True,
        column_config={
            "start_ms": st.column_config.NumberColumn("from ms", format="%.2f"),
            "dur_ms": st.column_config.NumberColumn("ms", format="%.3f"),
            "label": "op",
        },
    )


def path_caption(x: dict, n_ranks: int, hops: int, every_step: bool) -> str:
    """What the path is and where it lies against the measured step, in the step's own numbers."""
    ranks = f"{n_ranks} rank{'s' if n_ranks != 1 else ''} ({hops} hop{'s' if hops != 1 else ''})"
    if every_step:
        where = (
            f"{x['length_ms']:,.2f} ms over the {x['steps']} traced steps, {ranks}: each step's path, walked back "
            "from the rank that finishes it last"
        )
    else:
        late = x["start_ms"] > 0.005 * max(x["span_ms"], 1e-9)
        where = (
            f"{x['length_ms']:,.2f} ms of the step's {x['span_ms']:,.2f} ms span (first start to last end over all "
            f"ranks), {ranks}: walked back from rank {x['last_rank']}, which finishes last, to "
            + (
                f"rank {x['first_rank']}'s start of the step at {x['start_ms']:,.2f} ms — before that, rank "
                f"{x['first_rank']} had not begun the step, so the time before is not on this step's path"
                if late
                else f"the step's start on rank {x['first_rank']}"
            )
        )
    past = (
        f" The replay ends {x['past_ms']:,.2f} ms past the measured step: ranks whose clocks disagree had "
        "circular waits cut, and the replay re-times them."
        if x["past_ms"] > 0.005 * max(x["span_ms"], 1e-9)
        else ""
    )
    return (
        f"The chain of ranks' own time and transfers that ends the step: {where}. A collective ends after its "
        "last participant arrives, so the path jumps to that rank (the dashed hops on the overview); in between "
        "it follows the rank's own time: compute (its device busy), host (its CPU alone) or idle (neither, "
        f"dotted). Drawn in pink over the overview above.{past}"
    )


def whatif_section(key: tuple, ranks: list[int], step: int) -> None:
    st.subheader("What if")
    st.caption(
        "Replays the traced steps over their dependency graph with a change: a rank at its peers' median speed "
        "(the ranks of its pipeline stage), a link or a dimension's transfers k× faster, a dimension's "
        "communication hidden, more microbatches for the pipeline. With no change the replay reproduces the "
        "measured step exactly."
    )
    with st.form("whatif_form", border=True):
        c1, c2, c3 = st.columns(3)
        rank = c1.selectbox("Rank", [None, *ranks], format_func=lambda r: "none" if r is None else f"rank {r}")
        speed = c1.selectbox("… runs at", [MEDIAN, "1.5× speed", "2× speed"])
        link = c2.selectbox(
            "Link or dimension", [None, "inter", "intra", *DIMS, "unknown"], format_func=lambda v: v or "none"
        )
        factor = c2.number_input("… k× faster", min_value=0.1, max_value=100.0, value=2.0, step=0.5)
        overlap = c3.multiselect("Hide communication of", [*DIMS, "unknown"])
        micro = c3.number_input("Microbatches (0: as run)", min_value=0, max_value=4096, value=0, step=1)
        st.form_submit_button("Replay")
    value = "median" if speed == MEDIAN else float(speed.split("×")[0])
    out = run_loaders.whatif(
        key,
        rank,
        value if rank is not None else None,
        link,
        float(factor),
        tuple(overlap),
        int(micro) or None,
        None if step == ALL else step,
    )
    m1, m2, m3 = st.columns(3)
    m1.metric(
        "Measured step",
        f"{out['measured_step_time_s'] * 1e3:,.2f} ms",
        help=STEPS_DEFINITION if out["step"] is None else f"step {out['step']}: {STEP_DEFINITION}",
    )
    m2.metric(
        "Predicted step",
        f"{out['predicted_step_time_s'] * 1e3:,.2f} ms",
        delta=None if out["change_pct"] is None or abs(out["change_pct"]) < 0.05 else f"{out['change_pct']:+.1f}%",
        delta_color="inverse",
    )
    m3.metric("Dependencies cut", f"{out['cut_dependencies']:,}", help="circular waits from clocks that disagree")
    if out["scenarios"]:
        st.markdown("\n".join(f"- **{s['kind']}** — assumes {s['assumes']}" for s in out["scenarios"]))
        for s in out["scenarios"]:
            if s.get("note"):
                st.warning(f"{s['kind']}: {s['note']}")
    if out["changed"][1:]:
        st.caption("What changed: " + "; ".join(out["changed"]))
    st.altair_chart(whatif_charts.phases_chart(whatif_data.phase_rows(out)))
    table = whatif_data.pipeline_table(out)
    if len(table):
        st.subheader("Pipeline: bubble vs P2P wait")
        st.caption(
            "Per stage: work, the schedule's own bubble (warm-up and cool-down idle, at most (p−1)/(v·m) of the "
            "work), P2P wait beyond it (a late peer), and P2P transfer — from matched send/recv pairs on both ranks. "
            "Bubble % = the bubble / work, beside the theory; P2P wait % = the wait beyond it / work."
        )
        st.altair_chart(whatif_charts.pipeline_chart(table))
        st.dataframe(table, hide_index=True)


def path_toggle(n_ranks: int) -> bool:
    """Whether to compute and draw the critical path (on by default up to a Gantt's worth of ranks)."""
    return st.toggle(
        "Critical path",
        value=n_ranks <= run_loaders.MAX_GANTT_RANKS,
        key="tl_path",
        help="draw the cross-rank critical path over the overview, and the what-if section below",
    )
