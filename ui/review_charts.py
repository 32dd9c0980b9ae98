"""Chart builders and display frames for the Plan review page (frames of parallel.review.document / parallel.search.space
in, `alt.Chart`s and display-ready frames out). Encodings are channel objects (see ui.theme).

    memory_chart(cmp.memory, capacity)   stacked GiB per GPU by component, one bar per plan, capacity rule
    time_chart(cmp.time)                 the step split into compute, bubble and exposed comm per dimension
    hidden_chart(cmp.hidden)             communication hidden behind compute, per dimension
    comm_chart(cmp.comm)                 communication seconds per step by dimension, coloured by link
    predicted_measured_chart(frame)      analytic vs calibrated vs a run's measured step, per plan
    pareto_chart(points, budget)         search results: memory vs step time, the Pareto front drawn
    compare_styler(table, names)         the side-by-side table with differing rows highlighted

Pure: altair and pandas.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from parallel.core.plan import Plan
from parallel.core.specs import GiB
from parallel.search.space import plan_of
from ui.text import md
from ui.theme import MEMORY_COLORS, link_colors, link_names, named_links, palette, scale

COMPONENTS = ("params", "grads", "optimizer", "activations")
PARTS = (
    "compute",
    "bubble",
    "exposed TP",
    "exposed SP",
    "exposed CP",
    "exposed EP",
    "exposed PP",
    "exposed DP",
    "optimizer",  # the optimizer step over the rank's shard (the device model; the flat MFU has none)
    "per-step fixed",  # the calibrated model's optimizer, data and loss time
)
PART_COLORS = dict(
    zip(
        PARTS,
        ["#4c6ef5", "#ced4da", "#e8590c", "#f08c00", "#ae3ec9", "#1098ad", "#2f9e44", "#868e96", "#74c0fc", "#495057"],
    )
)
DIM_COLORS = {"TP": "#e8590c", "SP": "#f08c00", "CP": "#ae3ec9", "EP": "#1098ad", "PP": "#2f9e44", "DP": "#868e96"}
DIFF_BACKGROUND = "background-color: #fff3bf"


def _bar_height(n: int) -> int:
    """Total chart height (Streamlit's theme fits title, axis and legend inside it) for n horizontal bars."""
    return 150 + 55 * n


def memory_chart(memory: pd.DataFrame, capacity_bytes: float, budget_bytes: float | None = None) -> alt.LayerChart:
    """GiB per GPU (most loaded stage) by component, one horizontal bar per plan; the GPU's memory as
    a red rule (and the search budget, if given, dashed)."""
    data = memory.assign(gib=memory["bytes"] / GiB, order=memory["component"].map(COMPONENTS.index))
    plans = list(dict.fromkeys(data["plan"]))
    bars = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=alt.Y("plan:N", sort=plans, title=None),
            x=alt.X("sum(gib):Q", title="memory per GPU (GiB, most loaded stage)", stack="zero"),
            color=alt.Color(
                "component:N", scale=scale(MEMORY_COLORS, data["component"]), sort=list(COMPONENTS), title="component"
            ),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("plan:N"),
                alt.Tooltip("component:N"),
                alt.Tooltip("gib:Q", title="GiB", format=".2f"),
            ],
        )
    )
    lines = [{"what": "GPU memory", "gib": capacity_bytes / GiB}]
    if budget_bytes is not None:
        lines.append({"what": "budget (less headroom)", "gib": budget_bytes / GiB})
    rules = (
        alt.Chart(pd.DataFrame(lines))
        .mark_rule(color="#e03131", strokeWidth=2)
        .encode(
            x=alt.X("gib:Q"),
            strokeDash=alt.StrokeDash("what:N", title=None, legend=alt.Legend(orient="bottom")),
            tooltip=[alt.Tooltip("what:N"), alt.Tooltip("gib:Q", title="GiB", format=".1f")],
        )
    )
    return alt.layer(bars, rules).properties(height=_bar_height(len(plans)), title="Memory per GPU")


def time_chart(time: pd.DataFrame, title: str = "Step time") -> alt.Chart:
    """Seconds per step: compute, the pipeline bubble and each dimension's exposed communication
    (frame: plan, part, seconds; the analytic model's cmp.time or the calibrated one's phases)."""
    data = time[time["seconds"] > 0].assign(order=lambda d: d["part"].map(PARTS.index))
    plans = list(dict.fromkeys(time["plan"]))
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=alt.Y("plan:N", sort=plans, title=None),
            x=alt.X("sum(seconds):Q", title="seconds per training step", stack="zero"),
            color=alt.Color(
                "part:N", scale=scale(PART_COLORS, data["part"]), sort=list(PARTS), title="part of the step"
            ),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("plan:N"), alt.Tooltip("part:N"), alt.Tooltip("seconds:Q", format=".3f")],
        )
        .properties(height=_bar_height(len(plans)), title=title)
    )


def hidden_chart(hidden: pd.DataFrame) -> alt.Chart:
    """Seconds per step of communication the plan hides behind compute (frame: plan, dim, seconds):
    TP/SP under their GEMMs (--tp-comm-overlap), ring CP under attention, PP sends under the other
    chunks, DP under backward (--overlap-grad-reduce / --overlap-param-gather). Not part of the step."""
    data = hidden[hidden["seconds"] > 0]
    plans = list(dict.fromkeys(hidden["plan"]))
    return (
        alt.Chart(data)
        .mark_bar(opacity=0.55)
        .encode(
            y=alt.Y("plan:N", sort=plans, title=None),
            x=alt.X("sum(seconds):Q", title="seconds per step hidden behind compute", stack="zero"),
            color=alt.Color("dim:N", scale=scale(DIM_COLORS, data["dim"]), sort=list(DIM_COLORS), title="hidden"),
            tooltip=[alt.Tooltip("plan:N"), alt.Tooltip("dim:N"), alt.Tooltip("seconds:Q", format=".3f")],
        )
        .properties(height=_bar_height(len(plans)), title="Communication hidden behind compute")
    )


def explain_frame(ex: dict, a: str, b: str) -> pd.DataFrame:
    """parallel.search.explain's parts as a table: each part of the step in seconds (and memory per GPU
    in GiB) for plan `a` (explain's top), plan `b` (its other) and b − a."""
    rows = [{"": r["part"], a: r["top_s"], b: r["other_s"], f"{b} − {a}": r["difference_s"]} for r in ex["parts"]]
    m = ex["memory_per_gpu_bytes"]
    rows.append(
        {"": "memory per GPU (GiB)", a: m["top"] / GiB, b: m["other"] / GiB, f"{b} − {a}": m["difference"] / GiB}
    )
    return pd.DataFrame(rows).round(3)


SOURCE_COLORS = {"analytic": "#adb5bd", "calibrated": "#4c6ef5", "measured": "#212529"}


def predicted_measured_chart(chart: pd.DataFrame) -> alt.Chart:
    """Step seconds per plan (profiler.collect.runs_calibration.review_predictions' chart frame): the analytic model,
    the calibrated one and a run's measured step side by side, on a log scale (the analytic model can be
    100x off on a machine it was not calibrated for)."""
    plans = list(dict.fromkeys(chart["plan"]))
    sources = [s for s in SOURCE_COLORS if s in set(chart["source"])]
    # dots, not bars: a bar on a log scale has no zero to start from (Vega draws none)
    return (
        alt.Chart(chart)
        .mark_point(filled=True, size=160, opacity=1)
        .encode(
            y=alt.Y("plan:N", sort=plans, title=None),
            yOffset=alt.YOffset("source:N", sort=sources),
            x=alt.X("seconds:Q", title="seconds per training step (log scale)", scale=alt.Scale(type="log")),
            shape=alt.Shape("source:N", sort=sources, title=None),
            color=alt.Color("source:N", scale=scale(SOURCE_COLORS, sources), sort=sources, title=None),
            tooltip=[alt.Tooltip("plan:N"), alt.Tooltip("source:N"), alt.Tooltip("seconds:Q", format=".4g")],
        )
        .properties(height=_bar_height(len(plans)), title="Step time: predicted and measured")
    )


def comm_chart(comm: pd.DataFrame, names: dict | None = None) -> alt.Chart:
    """Communication seconds per step by dimension (and plan), coloured by the link it runs on (as the
    review's cluster names its links: theme.link_names); overlapped traffic drawn faint."""
    names = names or link_names()
    data = comm.assign(
        link=named_links(comm["link"], names),
        dim=comm["dim"].str.upper(),
        hidden=comm["overlapped"].map({True: "overlapped", False: "exposed"}),
    )
    data = data.groupby(["plan", "dim", "link", "hidden"], as_index=False)["seconds"].sum()
    plans = list(dict.fromkeys(comm["plan"]))
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("dim:N", title=None, sort=["TP", "SP", "CP", "PP", "DP"], axis=alt.Axis(labelAngle=0)),
            y=alt.Y("sum(seconds):Q", title="seconds per step", stack="zero"),
            color=alt.Color("link:N", scale=scale(link_colors(names), data["link"]), title="link"),
            opacity=alt.Opacity(  # sorted: Vega-Lite warns of opacity on an unsorted nominal field
                "hidden:N",
                sort=["exposed", "overlapped"],
                scale=alt.Scale(domain=["exposed", "overlapped"], range=[1.0, 0.35]),
                title=None,
            ),
            column=alt.Column("plan:N", sort=plans, title=None, header=alt.Header(labelFontWeight="bold")),
            tooltip=[
                alt.Tooltip("plan:N"),
                alt.Tooltip("dim:N", title="dimension"),
                alt.Tooltip("link:N"),
                alt.Tooltip("hidden:N", title="exposed?"),
                alt.Tooltip("seconds:Q", format=".3f"),
            ],
        )
        .properties(width=150, height=220, title="Communication per step")
    )


# Plans slower than this many times the fastest are not drawn: a search's leanest plans (the far end
# of its Pareto front) run 10^4 x slower than its best, and an axis out to them squashes the region a
# user chooses in.
SLOWEST_DRAWN = 10.0


def hidden_slow(table: pd.DataFrame) -> tuple[int, float]:
    """(how many plans that fit are too slow to draw, the slowest step time among them)."""
    slow = table["step_time_s"] > table["step_time_s"].min() * SLOWEST_DRAWN
    return int(slow.sum()), float(table.loc[slow, "step_time_s"].max()) if slow.any() else 0.0


def pareto_points(table: pd.DataFrame, base: Plan, n_other: int = 300) -> pd.DataFrame:
    """What the Pareto chart draws, among the plans no slower than SLOWEST_DRAWN x the fastest: every
    plan on the front and the fastest `n_other` others (the data sent to the browser stays small),
    with labels and GiB."""
    near = table["step_time_s"] <= table["step_time_s"].min() * SLOWEST_DRAWN
    keep = near & (table["pareto"] | (table.index < n_other))
    out = table[keep].copy()
    out["label"] = [plan_of(r, base).label() for r in out.to_dict("records")]
    out["rank"] = out.index + 1
    out["gib"] = out["memory_per_gpu_bytes"] / GiB
    out["front"] = out["pareto"].map({True: "Pareto front", False: "other plans"})
    return out[["rank", "label", "gib", "step_time_s", "mfu", "bubble_fraction", "tp", "pp", "dp", "cp", "front"]]


def pareto_chart(points: pd.DataFrame, budget_bytes: float) -> alt.LayerChart:
    """Memory per GPU against step time (log) for the plans that fit; the Pareto front joined by a line."""
    tps = sorted(points["tp"].unique())
    base = alt.Chart(points)
    dots = base.mark_circle(size=55).encode(
        x=alt.X("gib:Q", title="memory per GPU (GiB)", scale=alt.Scale(zero=False)),
        # log: the drawn plans span up to SLOWEST_DRAWN x; not nice-rounded, or 15 s..150 s reads 10..1000
        y=alt.Y("step_time_s:Q", title="step time (s, log scale)", scale=alt.Scale(type="log", nice=False)),
        color=alt.Color("tp:O", title="TP", scale=alt.Scale(domain=tps, range=palette(len(tps)))),
        opacity=alt.OpacityValue(0.35, condition={"test": "datum.front == 'Pareto front'", "value": 1.0}),
        tooltip=[
            alt.Tooltip("rank:Q", title="rank"),
            alt.Tooltip("label:N", title="plan"),
            alt.Tooltip("gib:Q", title="GiB", format=".1f"),
            alt.Tooltip("step_time_s:Q", title="step s", format=".3f"),
            alt.Tooltip("mfu:Q", title="MFU", format=".1%"),
            alt.Tooltip("bubble_fraction:Q", title="bubble", format=".1%"),
        ],
    )
    front = (
        base.transform_filter("datum.front == 'Pareto front'")
        .mark_line(color="#212529", strokeWidth=1.5, interpolate="step-after")
        .encode(x=alt.X("gib:Q"), y=alt.Y("step_time_s:Q"), order=alt.Order("gib:Q"))
    )
    budget = (
        alt.Chart(pd.DataFrame([{"gib": budget_bytes / GiB}]))
        .mark_rule(color="#e03131", strokeDash=[4, 3])
        .encode(x=alt.X("gib:Q"), tooltip=[alt.Tooltip("gib:Q", title="memory budget (GiB)", format=".1f")])
    )
    return alt.layer(dots, front, budget).properties(height=380, title="Plans that fit: memory against step time")


def search_rows(table: pd.DataFrame, base: Plan, top: int) -> pd.DataFrame:
    """The best `top` search results as a display table (`base`: the search's shared fields)."""
    head = table.head(top)
    return pd.DataFrame(
        {
            "rank": range(1, len(head) + 1),
            "plan": [plan_of(r, base).label() for r in head.to_dict("records")],
            "memory/GPU (GiB)": (head["memory_per_gpu_bytes"] / GiB).round(1).to_numpy(),
            "step (s)": head["step_time_s"].round(3).to_numpy(),
            "MFU": (head["mfu"] * 100).round(1).to_numpy(),
            "bubble %": (head["bubble_fraction"] * 100).round(1).to_numpy(),
            "Pareto": head["pareto"].to_numpy(),
            **({"≈ fastest": head["equivalent"].to_numpy()} if "equivalent" in head else {}),
        }
    )


def plan_cards(rows: pd.DataFrame) -> list[dict]:
    """parallel.review.document.plan_rows as the page's metric cards: name, label, valid, and formatted numbers."""
    out = []
    for r in rows.to_dict("records"):
        out.append(
            {
                "name": r["name"],
                "label": r["label"],
                "valid": bool(r["valid"]),
                "memory": "—" if r["memory_gib"] is None else f"{r['memory_gib']:,.1f} GiB",
                "step": "—" if r["step_time_s"] is None else f"{r['step_time_s']:,.3f} s",
                "mfu": "—" if r["mfu"] is None else f"{r['mfu']:.1%}",
                "issues": f"{r['errors']} errors, {r['warnings']} warnings",
            }
        )
    return out


def compare_styler(table: pd.DataFrame, names: list[str]):
    """The side-by-side table (section, metric, one column per plan) with differing rows highlighted."""
    shown = table[["section", "metric", *names]].copy()
    for n in names:
        shown[n] = [_fmt(v) for v in shown[n]]
    differs = table["differs"].to_numpy()
    return shown.style.apply(lambda row: [DIFF_BACKGROUND if differs[row.name] else ""] * len(row), axis=1)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def funnel_frame(funnel: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"constraint": s["constraint"], "plans left": s["remaining"]} for s in funnel])


def import_frames(summary: dict) -> dict[str, pd.DataFrame]:
    """An import's summary as small tables: recognised flags/keys and unknown ones (its notes are
    sentences, some 180 characters long, that a table cell would cut: import_notes_markdown)."""
    return {
        "recognised": pd.DataFrame(
            [{"flag or key": r["option"], "value": str(r["value"])} for r in summary["recognised"]]
        ),
        "unknown": pd.DataFrame({"not understood (ignored)": summary["unknown"]}),
    }


def import_notes_markdown(summary: dict) -> str:
    """An import's notes (what it assumed or approximated) as a Markdown list that wraps, each note
    shown as the text it is; "" when there are none."""
    if not summary["notes"]:
        return ""
    return "**Notes** (assumptions and approximations)\n\n" + "\n".join(f"- {md(note)}" for note in summary["notes"])


def saved_frame(saved: list) -> pd.DataFrame:
    """parallel.review.store.SavedReview rows as a table."""
    return pd.DataFrame(
        [
            {
                "id": s.id,
                "title": s.title,
                "model": s.model,
                "cluster": s.cluster,
                "plans": ", ".join(s.plans),
                "chosen": s.chosen or "",
                "by": s.created_by,
                "saved": s.updated_at,
                "revisions": s.revisions,
                "notes": s.notes,
            }
            for s in saved
        ],
        columns=["id", "title", "model", "cluster", "plans", "chosen", "by", "saved", "revisions", "notes"],
    )
