"""The Re-plan page's sections: the job as identified, measured against modelled, the best plans as
cards (gain, why, open in Plan review, the Megatron-LM script and torchtitan TOML to download).
Each takes a profiler.analyzers.replan.Replan and draws; nothing here computes about the job.
"""

from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS
from parallel.importers.export import megatron_script, torchtitan_toml
from parallel.review.document import NamedPlan
from parallel.review.urls import ReviewState, review_to_params
from profiler.analyzers.replan import gap_lines
from ui import replan_charts
from ui.text import md

REVIEW_PAGE = "plan_review"  # app.py's url path of pages/plan_review.py
CARDS_PER_ROW = 3


def review_link(r, plan: Plan) -> str:
    """Plan review comparing the job's plan with `plan`, on the job's cluster (its plan codes in the URL)."""
    job = r.job
    name = job.cluster.get("preset") or ("local-cpu" if job.device["name"] == "cpu" else "dgx-h100")
    per = CLUSTERS[name].gpus_per_node
    state = ReviewState(
        model=job.model,
        cluster=name,
        nodes=max(1, -(-plan.world_size // per)),
        plans=(NamedPlan("job", job.plan), NamedPlan("re-planned", plan)),
        title=f"{job.model.name}: the job re-planned",
        view="compare",
    )
    return f"{REVIEW_PAGE}?{urlencode(review_to_params(state), doseq=True)}"


def job_section(r) -> None:
    job = r.job
    st.subheader("The job, as identified")
    st.caption(
        f"{md(job.model.name)} under **{md(job.plan.label() or 'DP1')}** on {job.plan.world_size} × "
        f"{md(job.device['name'])} · each fact with where it came from"
    )
    st.dataframe(r.facts_frame(), hide_index=True)
    for fact, why in job.missing.items():
        st.warning(f"**{md(fact)}** could not be told: {md(why)}")


def gap_section(r) -> None:
    st.subheader("Measured against modelled")
    m, p = r.measured, r.modelled
    c1, c2, c3 = st.columns(3)
    c1.metric("Measured step", f"{m['step_s'] * 1e3:,.2f} ms", help=m["source"])
    c2.metric("Modelled step", f"{p['step_s'] * 1e3:,.2f} ms", help=p["how"])
    c3.metric("The model's error", f"{p['error']:.0%}")
    st.altair_chart(replan_charts.step_parts_chart(r.components_frame()))
    lines = gap_lines(r.gaps)
    if lines:
        st.markdown("Parts that differ by more than the model's error:\n" + "\n".join(f"- {md(x)}" for x in lines))
    else:
        st.success("No part differs by more than the model's error.")


def plans_section(r, set_name: str) -> None:
    st.subheader("Re-planned")
    best = r.plans[0] if r.plans else None
    if best is None or best["gain"] <= r.modelled["error"]:
        st.info(md(r.verdict))
    else:
        st.success(md(r.verdict))
    gpn = r.job.cluster.get("gpus_per_node") or 8
    for start in range(0, len(r.plans), CARDS_PER_ROW):
        cols = st.columns(CARDS_PER_ROW)
        for i, (col, row) in enumerate(zip(cols, r.plans[start : start + CARDS_PER_ROW]), start):
            plan = Plan.from_dict(row["plan"])
            with col.container(border=True):
                st.markdown(f"**{md(row['label'])}**")
                st.metric("Gain over the measured step", f"{row['gain']:+.0%}", help=f"{row['step_s'] * 1e3:,.2f} ms")
                st.caption(f"{md(row['why'])} · {row['memory_gib']:,.2f} GiB per GPU")
                st.link_button("Open in Plan review", review_link(r, plan), key=f"rp_review_{i}")
                script, _ = megatron_script(plan, r.job.model, gpus_per_node=gpn)
                toml, _ = torchtitan_toml(plan, r.job.model)
                st.download_button(
                    "Megatron-LM script",
                    data=script,
                    file_name=f"{set_name}-plan{i + 1}.sh",
                    mime="text/x-shellscript",
                    key=f"rp_megatron_{i}",
                    on_click="ignore",
                )
                st.download_button(
                    "torchtitan TOML",
                    data=toml,
                    file_name=f"{set_name}-plan{i + 1}.toml",
                    mime="application/toml",
                    key=f"rp_torchtitan_{i}",
                    on_click="ignore",
                )
