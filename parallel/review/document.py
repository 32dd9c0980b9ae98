"""A plan review: 2-4 named plans for one model on one cluster, compared side by side, with a verdict
and notes by author and time; exported as Markdown (tables and a justification per dimension, made
from the numbers) and as JSON that imports back (`Review.from_json`, `python -m parallel plan --import`).

    review = Review(title="175B on 64 nodes", model=MODELS["gpt3-175b"], cluster=c, plans=(NamedPlan("A", p),))
    cmp = compare(review)          # tidy frames: table (metric x plan), memory, comm, time, issues
    review_markdown(review), review.to_json(), Review.from_json(text)

Pure: pandas and the plan model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pandas as pd

from parallel.core.comm import DIMS as COMM_DIMS
from parallel.core.comm import CommOptions
from parallel.core.memory import ActivationOptions, activation_bytes_per_layer, memory_per_gpu_bytes
from parallel.core.perf import PerfOptions, flops_per_step
from parallel.core.plan import PLAN_DEFAULTS, PLAN_FIELDS, RECOMPUTE, Plan, stage_layer_counts
from parallel.core.report import Options, plan_report
from parallel.core.specs import Cluster, GiB, Model, SpecError

KIND, VERSION = "parascope-review", 1
MiB = 2**20
LINK = {"intra": "NVLink", "inter": "InfiniBand"}
# The plan fields the compare table always shows, first; every other field follows where a compared plan
# sets it away from its default (compare_plans).
ALWAYS_SHOWN = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "sp",
    "vpp",
    "micro_batch",
    "global_batch",
    "zero",
    "recompute",
    "order",
    "main_grads",
    "fp8",
    "cp_kind",
)


def now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class NamedPlan:
    name: str
    plan: Plan
    # The model this plan trains, when it is not the review's: a review may compare, e.g., a dense
    # model with a mixture-of-experts one on the same cluster.
    model: Model | None = None

    def model_or(self, default: Model) -> Model:
        return self.model if self.model is not None else default


@dataclass(frozen=True)
class Note:
    author: str
    text: str
    at: str  # ISO 8601, UTC


def options_to_dict(o: Options) -> dict:
    return dataclasses.asdict(o)


# Activation options a review saved before they became fields of each plan (Plan.attention, Plan.dropout)
PLAN_WIDE_OPTIONS = ("flash_attention", "dropout")


def options_from_dict(d: dict | None) -> Options:
    d = d or {}
    acts = {k: v for k, v in (d.get("activations") or {}).items() if k not in PLAN_WIDE_OPTIONS}
    return Options(
        activations=ActivationOptions(**acts),
        comm=CommOptions(**d.get("comm", {})),
        perf=PerfOptions(**d.get("perf", {})),
    )


def _plan_wide(options: dict | None) -> dict:
    """The plan fields an older review set for all its plans in its options (flash attention, dropout)."""
    acts = (options or {}).get("activations") or {}
    out = {}
    if acts.get("flash_attention") is False:
        out["attention"] = "unfused"
    if isinstance(acts.get("dropout"), bool):
        out["dropout"] = acts["dropout"]
    return out


@dataclass(frozen=True)
class Review:
    title: str
    model: Model
    cluster: Cluster  # with its nodes: every plan is judged on this machine
    plans: tuple[NamedPlan, ...]
    verdict: str = ""  # the decision, in the team's words
    chosen: str | None = None  # the name of the plan the verdict picks
    notes: tuple[Note, ...] = ()
    author: str = ""
    created: str = ""
    options: Options = field(default_factory=Options)  # modelling assumptions (MFU, DP overlap, flash, ...)

    def __post_init__(self):
        names = [p.name for p in self.plans]
        if len(set(names)) != len(names):
            raise SpecError(f"plan names must differ, got {names}")
        if self.chosen is not None and self.chosen not in names:
            raise SpecError(f"the chosen plan {self.chosen!r} is not one of {names}")

    def with_note(self, author: str, text: str, at: str | None = None) -> "Review":
        return dataclasses.replace(self, notes=self.notes + (Note(author, text, at or now()),))

    def to_dict(self) -> dict:
        return {
            "kind": KIND,
            "version": VERSION,
            "title": self.title,
            "author": self.author,
            "created": self.created,
            "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "plans": [
                {"name": p.name, "plan": p.plan.to_dict(), **({"model": p.model.to_dict()} if p.model else {})}
                for p in self.plans
            ],
            "verdict": self.verdict,
            "chosen": self.chosen,
            "notes": [dataclasses.asdict(n) for n in self.notes],
            "options": options_to_dict(self.options),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Review":
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise SpecError(f'not a ParaScope review (expected "kind": "{KIND}")')
        try:
            return cls(
                title=d.get("title", ""),
                model=Model.from_dict(d["model"]),
                cluster=Cluster.from_dict(d["cluster"]),
                plans=tuple(
                    NamedPlan(
                        p["name"],
                        Plan.from_dict({**_plan_wide(d.get("options")), **p["plan"]}),
                        Model.from_dict(p["model"]) if p.get("model") else None,
                    )
                    for p in d["plans"]
                ),
                verdict=d.get("verdict", ""),
                chosen=d.get("chosen"),
                notes=tuple(Note(**n) for n in d.get("notes", [])),
                author=d.get("author", ""),
                created=d.get("created", ""),
                options=options_from_dict(d.get("options")),
            )
        except (KeyError, TypeError) as err:
            raise SpecError(f"review JSON is missing or has a wrong field: {err}") from None

    def to_json(self, *, with_summary: bool = True) -> str:
        d = self.to_dict()
        if with_summary:  # for readers of the file; ignored on import
            d["summary"] = [
                {k: row[k] for k in ("name", "label", "valid", "memory_gib", "step_time_s", "mfu")}
                for row in plan_rows(compare(self)).to_dict("records")
            ]
        return json.dumps(d, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Review":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as err:
            raise SpecError(f"review JSON line {err.lineno}: {err.msg}") from None


# ------------------------------------------------------------------ compare


@dataclass
class Comparison:
    names: list[str]
    plans: dict[str, Plan]
    reports: dict[str, dict]
    table: pd.DataFrame  # section, metric, one column per plan, differs
    memory: pd.DataFrame  # plan, component, bytes
    comm: pd.DataFrame  # plan, dim, collective, link, calls, bytes_per_call, seconds, overlapped
    time: pd.DataFrame  # plan, part, seconds
    issues: pd.DataFrame  # plan, level, message
    hidden: pd.DataFrame  # plan, dim, seconds: communication the step hides behind compute
    models: dict[str, Model] = field(default_factory=dict)  # the model each plan trains

    def issues_of(self, name: str, level: str = "error") -> list[str]:
        """The messages of one plan at one level (errors by default)."""
        rows = self.issues[(self.issues["plan"] == name) & (self.issues["level"] == level)]
        return rows["message"].tolist()


def _gib(x) -> float | None:
    return None if x is None else round(x / GiB, 2)


def _rows(plan: Plan, rep: dict, model: Model) -> list[tuple[str, str, object]]:
    """(section, metric, value) for one plan: what the compare table shows, in its order."""
    rows = [
        ("model", "name", model.name),
        ("model", "parameters (B)", round(model.params_total() / 1e9, 2)),
        ("model", "active parameters (B)", round(model.active_params_total() / 1e9, 2)),
    ]
    rows += [("plan", k, getattr(plan, k)) for k in ALWAYS_SHOWN]
    rows += [("plan", spec.name, getattr(plan, spec.name)) for spec in PLAN_FIELDS if spec.name not in ALWAYS_SHOWN]
    rows += [
        ("plan", "microbatches per step", plan.microbatches),
        ("verdict", "valid", rep["valid"]),
        ("verdict", "errors", len(rep["errors"])),
        ("verdict", "warnings", len(rep["warnings"])),
    ]
    mem = rep["memory_per_gpu_bytes"] or {}
    rows += [
        ("memory per GPU (GiB)", k, _gib(mem.get(k))) for k in ("params", "grads", "optimizer", "activations", "total")
    ]
    t = rep.get("step_time") or {}
    rows += [
        ("time", "step time (s)", t.get("step_time_s")),
        ("time", "MFU", t.get("mfu")),
        ("time", "bubble fraction", rep["bubble_fraction"]),
        ("time", "compute (s)", t.get("compute_s")),
        ("time", "bubble (s)", t.get("bubble_s")),
    ]
    rows += [("time", f"exposed {d.upper()} comm (s)", t.get(f"exposed_{d}_s")) for d in COMM_DIMS]
    rows += [("time", "optimizer (s)", t.get("optimizer_s"))]
    per_dim = {}
    for r in rep["comm_per_step"] or []:
        key = (r["dim"], r["link"])
        per_dim[key] = per_dim.get(key, 0.0) + r["seconds"]
    for dim in COMM_DIMS:
        for link in ("intra", "inter"):  # every pair, so the rows line up across plans (None: no such traffic)
            rows.append(("communication per step (s)", f"{dim.upper()} on {LINK[link]}", per_dim.get((dim, link))))
    crossing = rep.get("crossing_groups") or {}
    rows += [("groups crossing NVLink domains", d.upper(), crossing.get(d)) for d in ("tp", "cp", "ep", "pp", "dp")]
    return rows


def _unset_rows(table: pd.DataFrame, names: list[str]) -> pd.Series:
    """The plan rows to leave out: a field beyond ALWAYS_SHOWN that every compared plan leaves at its
    default (so every setting any plan changes is shown, as its label shows it), and the expert groups'
    crossings where no plan has expert groups."""
    default = table["metric"].map(lambda m: json.dumps(PLAN_DEFAULTS.get(m, ()), default=str))
    same = table[names].apply(lambda row: {json.dumps(v, default=str) for v in row}, axis=1)
    plan_rows = (table["section"] == "plan") & ~table["metric"].isin(ALWAYS_SHOWN)
    unset = plan_rows & (same.map(len) == 1) & (same.map(lambda v: next(iter(v))) == default)
    no_ep = (table["section"] == "groups crossing NVLink domains") & (table["metric"] == "EP")
    return unset | (no_ep & table[names].isna().all(axis=1))


def compare_plans(
    model: Model, cluster: Cluster, plans: list[NamedPlan] | tuple[NamedPlan, ...], options: Options = Options()
) -> Comparison:
    """Everything the plan model says about each plan, side by side; `table.differs` flags metrics
    whose value is not the same for every plan."""
    if not plans:
        raise SpecError("nothing to compare: add a plan")
    models = {p.name: p.model_or(model) for p in plans}
    reports = {p.name: plan_report(p.plan, models[p.name], cluster, options) for p in plans}
    names = [p.name for p in plans]
    columns = {p.name: {(s, m): v for s, m, v in _rows(p.plan, reports[p.name], models[p.name])} for p in plans}
    index = [(s, m) for s, m, _ in _rows(plans[0].plan, reports[names[0]], models[names[0]])]
    table = pd.DataFrame([{"section": s, "metric": m, **{n: columns[n].get((s, m)) for n in names}} for s, m in index])
    comm = table["section"] == "communication per step (s)"
    table = table[~comm | table[names].notna().any(axis=1)].reset_index(drop=True)  # drop traffic no plan has
    table = table[~_unset_rows(table, names)].reset_index(drop=True)
    values = table[names].astype(object).where(table[names].notna(), None)
    table["differs"] = [len({json.dumps(v, default=str) for v in row}) > 1 for row in values.itertuples(index=False)]
    mem = [
        {"plan": n, "component": k, "bytes": float(reports[n]["memory_per_gpu_bytes"][k])}
        for n in names
        if reports[n]["memory_per_gpu_bytes"]
        for k in ("params", "grads", "optimizer", "activations")
    ]
    traffic = [
        {
            "plan": n,
            **{k: r[k] for k in ("dim", "collective", "link", "calls", "bytes_per_call", "seconds", "overlapped")},
        }
        for n in names
        for r in reports[n]["comm_per_step"] or []
    ]
    time = [
        {"plan": n, "part": part, "seconds": float(reports[n]["step_time"][key])}
        for n in names
        if reports[n].get("step_time")
        for part, key in (
            ("compute", "compute_s"),
            ("bubble", "bubble_s"),
            ("exposed TP", "exposed_tp_s"),
            ("exposed SP", "exposed_sp_s"),
            ("exposed CP", "exposed_cp_s"),
            ("exposed EP", "exposed_ep_s"),
            ("exposed PP", "exposed_pp_s"),
            ("exposed DP", "exposed_dp_s"),
            ("optimizer", "optimizer_s"),
        )
    ]
    hidden = [
        {"plan": n, "dim": d.upper(), "seconds": float(reports[n]["step_time"][f"hidden_{d}_s"])}
        for n in names
        if reports[n].get("step_time")
        for d in ("tp", "sp", "cp", "ep", "pp", "dp")
    ]
    issues = [
        {"plan": n, "level": level, "message": msg}
        for n in names
        for level, key in (("error", "errors"), ("warning", "warnings"))
        for msg in reports[n][key]
    ]
    return Comparison(
        names,
        {p.name: p.plan for p in plans},
        reports,
        table,
        pd.DataFrame(mem, columns=["plan", "component", "bytes"]),
        pd.DataFrame(
            traffic, columns=["plan", "dim", "collective", "link", "calls", "bytes_per_call", "seconds", "overlapped"]
        ),
        pd.DataFrame(time, columns=["plan", "part", "seconds"]),
        pd.DataFrame(issues, columns=["plan", "level", "message"]),
        pd.DataFrame(hidden, columns=["plan", "dim", "seconds"]),
        models,
    )


def compare(review: Review) -> Comparison:
    return compare_plans(review.model, review.cluster, review.plans, review.options)


def plan_rows(cmp: Comparison) -> pd.DataFrame:
    """One row per plan: name, model, label, valid, memory_gib, step_time_s, mfu, bubble, warnings, errors."""
    rows = []
    for n in cmp.names:
        rep, plan = cmp.reports[n], cmp.plans[n]
        t = rep.get("step_time") or {}
        rows.append(
            {
                "name": n,
                "model": cmp.models[n].name if n in cmp.models else None,
                "label": plan.label(),
                "valid": rep["valid"],
                "memory_gib": _gib((rep["memory_per_gpu_bytes"] or {}).get("total")),
                "step_time_s": t.get("step_time_s"),
                "mfu": t.get("mfu"),
                "bubble": rep["bubble_fraction"],
                "warnings": len(rep["warnings"]),
                "errors": len(rep["errors"]),
            }
        )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ justification, from the numbers


def stages_text(model: Model, plan: Plan) -> str:
    """'12 layers', or the uneven stages' counts: '7 layers on the first stage, 8 in between, 7 on the last'."""
    first, middle, last = stage_layer_counts(model.layers, plan)
    if first == middle == last:
        return f"{middle:g} layers"
    inner = f", {middle:g} in between" if plan.pp > 2 else ""
    return f"{first:g} layers on the first stage{inner}, {last:g} on the last"


def compute_text(options: Options, timing: dict | None = None) -> str:
    """How compute was timed: the explicit flat MFU, or per operator on the cluster's device."""
    if options.perf.mfu is not None:
        return f"every FLOP at an assumed {options.perf.mfu:.0%} of peak"
    device = (timing or {}).get("compute_model")
    return f"each operator timed from its shape on {device}" if device else "each operator timed from its shape"


def dp_overlap_text(plan: Plan, options: Options) -> str:
    """What of the DP traffic is assumed hidden, and why."""
    if options.perf.dp_overlap is not None:
        return f"with {options.perf.dp_overlap:.0%} assumed hidden behind backward"
    hidden = [
        w
        for w, on in (
            ("the gradient reduction under backward", plan.grad_reduce_overlap),
            ("the weight gathers under forward", plan.param_gather_overlap),
        )
        if on
    ]
    return "with " + " and ".join(hidden) + " overlapped" if hidden else "not overlapped"


def justify(
    plan: Plan, rep: dict, model: Model, cluster: Cluster, options: Options = Options()
) -> list[tuple[str, str]]:
    """One sentence per dimension (TP, SP, PP, DP, CP, EP, ZeRO, recompute, memory, time), each with its numbers."""
    if rep.get("step_time") is None:
        return [("plan", "cannot be evaluated: " + "; ".join(rep["errors"]))]
    why = _Why(plan, rep, model, cluster, options)
    parts = [why.tp, why.sp, why.pp, why.dp, why.cp, why.ep, why.zero, why.recompute, why.memory, why.time]
    return [line for part in parts if (line := part()) is not None]


@dataclass
class _Why:
    """The sentences of `justify`, one method each, over one plan's report."""

    p: Plan
    rep: dict
    model: Model
    cluster: Cluster
    options: Options

    @property
    def t(self) -> dict:
        return self.rep["step_time"]

    def pct(self, x: float) -> str:
        step = self.t["step_time_s"]
        return f"{100 * x / step:.1f}% of the step ({x:.3f} s of {step:.3f} s)"

    def link(self, dim: str) -> str:
        n, total = self.rep["crossing_groups"][dim], self.rep["group_counts"][dim]
        c = self.cluster
        unit = "node" if c.domain_gpus == c.gpus_per_node else f"{c.domain_gpus}-GPU NVLink domain"
        return (
            f"stays inside a {unit} on {c.intra.name or 'the intra-node link'}"
            if n == 0
            else f"spans {unit}s ({n} of {total} groups), so it runs on {c.inter.name or 'the inter-node link'}"
        )

    def tp(self) -> tuple[str, str]:
        p, t = self.p, self.t
        if p.tp == 1:
            return "TP", "TP=1: every GPU holds whole layers; there is no tensor-parallel communication."
        exposed = self.pct(t["exposed_tp_s"] + t["exposed_sp_s"])
        return "TP", f"TP={p.tp}: the group {self.link('tp')}; its exposed communication is {exposed}."

    def sp(self) -> tuple[str, str]:
        p = self.p
        if p.tp == 1:
            return "SP", "SP off: sequence parallelism needs TP > 1."
        other = activation_bytes_per_layer(self.model, dataclasses.replace(p, sp=not p.sp), self.options.activations)
        act = self.rep["activation_bytes_per_layer"]
        if p.sp:
            return "SP", (
                f"SP on: LayerNorm and dropout activations are split across the {p.tp} TP ranks, "
                f"{act / MiB:.0f} MiB per layer per microbatch instead of {other / MiB:.0f} MiB "
                f"(−{1 - act / other:.0%}), for the same communication volume."
            )
        return "SP", (
            f"SP off: turning it on would cut activations per layer from {act / MiB:.0f} to "
            f"{other / MiB:.0f} MiB per microbatch at the same communication volume."
        )

    def pp(self) -> tuple[str, str]:
        p, t = self.p, self.t
        if p.pp == 1:
            return "PP", "PP=1: no pipeline, no bubble; every GPU holds all layers."
        return "PP", (
            f"PP={p.pp}{f' with {p.vpp} interleaved stages per rank' if p.vpp > 1 else ''}: "
            f"{stages_text(self.model, p)} per GPU; the pipeline {self.link('pp')}; bubble "
            f"(p−1)/(v·m) = ({p.pp}−1)/({p.vpp}·{p.microbatches}) = {self.rep['bubble_fraction']:.1%}, "
            f"{self.pct(t['bubble_s'])}; point-to-point traffic {self.pct(t['exposed_pp_s'])}."
        )

    def dp(self) -> tuple[str, str]:
        p, nd = self.p, self.p.dp * self.p.cp
        if nd == 1:
            return "DP", "DP=1: one model replica; no gradient reduction."
        dp_link = next((r["link"] for r in self.rep["comm_per_step"] if r["dim"] == "dp"), "intra")
        how = "all-reduce" if p.zero == 0 else "reduce-scatter + all-gather"
        return "DP", (
            f"DP={p.dp}: gradients are reduced over dp×cp = {nd} ranks on {LINK[dp_link]} ({how}); "
            f"exposed {self.pct(self.t['exposed_dp_s'])}, {dp_overlap_text(p, self.options)}."
        )

    def cp(self) -> tuple[str, str]:
        p, s = self.p, self.model.seq_len
        if p.cp == 1:
            return "CP", f"CP=1: each rank holds the whole {s}-token sequence."
        return "CP", (
            f"CP={p.cp}: each rank holds {s // p.cp} of the {s} tokens; "
            f"K/V are gathered by a group that {self.link('cp')}: {self.pct(self.t['exposed_cp_s'])}."
        )

    def ep(self) -> tuple[str, str] | None:
        m, p = self.model, self.p
        if not m.experts:
            return None
        per = m.experts // p.ep if m.experts % p.ep == 0 else m.experts / p.ep
        where = self.link("ep") if p.ep > 1 else "is one rank"
        return "EP", (
            f"EP={p.ep}: each of the {m.moe_layers} MoE layers' {m.experts} experts (top-{m.top_k}) "
            f"is split {per} per GPU; the token dispatch and combine all-to-all group {where}: "
            f"{self.pct(self.t.get('exposed_ep_s', 0.0))}."
        )

    def zero(self) -> tuple[str, str]:
        p, mem, nd = self.p, self.rep["memory_per_gpu_bytes"], self.p.dp * self.p.cp
        states = mem["params"] + mem["grads"] + mem["optimizer"]
        if p.zero:
            plain = memory_per_gpu_bytes(self.model, dataclasses.replace(p, zero=0), self.options.activations)
            what = {
                1: "optimizer states",
                2: "optimizer states and gradients",
                3: "optimizer states, gradients and weights",
            }
            return "ZeRO", (
                f"ZeRO-{p.zero}: {what[p.zero]} sharded over {nd} ranks: model states "
                f"{states / GiB:.1f} GiB per GPU instead of "
                f"{(plain['params'] + plain['grads'] + plain['optimizer']) / GiB:.1f} GiB."
            )
        if nd > 1:
            return "ZeRO", (
                f"ZeRO-0: each of the {nd} data-parallel ranks keeps full optimizer states "
                f"({mem['optimizer'] / GiB:.1f} GiB); ZeRO-1 would cut them to "
                f"{mem['optimizer'] / nd / GiB:.1f} GiB at the same traffic."
            )
        return "ZeRO", "ZeRO: nothing to shard with a single data-parallel rank."

    def recompute(self) -> tuple[str, str]:
        p, m, ao = self.p, self.model, self.options.activations
        # a partial full recompute (recompute_layers: torchtitan's selective AC as read) stays partial for
        # "full"; the other modes recompute no layer count
        modes = {r: dataclasses.replace(p, recompute=r, recompute_layers=None) for r in RECOMPUTE}
        modes[p.recompute] = p
        acts = {r: memory_per_gpu_bytes(m, q, ao)["activations"] for r, q in modes.items()}
        cost = {r: flops_per_step(m, q) for r, q in modes.items()}
        extra = {r: c["hardware_flops"] / c["model_flops"] - 1 for r, c in cost.items()}
        alts = ", ".join(f"{r} {acts[r] / GiB:.1f} GiB (+{extra[r]:.0%} FLOPs)" for r in RECOMPUTE if r != p.recompute)
        return "recompute", (
            f"recompute {p.recompute}: activations {acts[p.recompute] / GiB:.1f} GiB per GPU "
            f"(+{extra[p.recompute]:.0%} FLOPs); the alternatives: {alts}."
        )

    def memory(self) -> tuple[str, str]:
        mem, cap = self.rep["memory_per_gpu_bytes"], self.cluster.gpu_memory_bytes
        return "memory", (
            f"memory per GPU {mem['total'] / GiB:.1f} GiB of {cap / GiB:.0f} GiB "
            f"({mem['total'] / cap:.0%}): params {mem['params'] / GiB:.1f}, grads {mem['grads'] / GiB:.1f}, "
            f"optimizer {mem['optimizer'] / GiB:.1f}, activations {mem['activations'] / GiB:.1f} GiB."
        )

    def time(self) -> tuple[str, str]:
        t = self.t
        return "time", (
            f"step time {t['step_time_s']:.3f} s at MFU {t['mfu']:.1%} (compute {t['compute_s']:.3f} s, "
            f"{compute_text(self.options, t)})."
        )


# ------------------------------------------------------------------ Markdown


def _cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|")


def _md_table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return out + ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]


def review_markdown(review: Review, cmp: Comparison | None = None) -> str:
    """The review as a Markdown document: summary, verdict, comparison (differences in bold),
    why each plan's dimensions are what they are, errors and warnings, notes."""
    cmp = cmp or compare(review)
    m, c = review.model, review.cluster
    lines = [
        f"# {review.title or 'Plan review'}",
        "",
        f"**Model** {m.name}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} KV), "
        f"FFN {m.ffn_hidden}, sequence {m.seq_len}, vocabulary {m.vocab}, {m.arch}.  ",
        f"**Cluster** {c.name}: {c.nodes} nodes × {c.gpus_per_node} GPUs = {c.gpus}, "
        f"{c.gpu_memory_bytes / GiB:.0f} GiB each, {c.intra.name} {c.intra.bandwidth_bytes_per_s / 1e9:.0f} GB/s, "
        f"{c.inter.name} {c.inter.bandwidth_bytes_per_s / 1e9:.0f} GB/s per GPU per direction.  ",
        f"**Assumptions** compute {compute_text(review.options)}, DP overlap "
        f"{'from each plan' if review.options.perf.dp_overlap is None else f'{review.options.perf.dp_overlap:.0%}'}; "
        "attention kernel, dropout and overlaps: each plan's own (its label).",
    ]
    if review.author or review.created:
        lines.append(f"*{review.author or 'unknown author'}, {review.created or 'undated'}*")
    lines += [
        "",
        "## Verdict",
        "",
        (f"**{review.chosen}** — " if review.chosen else "") + (review.verdict or "_no verdict yet_"),
        "",
        "## Plans",
        "",
    ]
    rows = plan_rows(cmp)
    lines += _md_table(
        ["plan", "layout", "valid", "memory/GPU (GiB)", "step (s)", "MFU", "bubble", "warnings"],
        [
            [
                r["name"],
                r["label"],
                r["valid"],
                r["memory_gib"],
                r["step_time_s"],
                None if r["mfu"] is None else f"{r['mfu']:.1%}",
                r["bubble"],
                r["warnings"],
            ]
            for r in rows.to_dict("records")
        ],
    )
    lines += ["", "## Side by side", "", "Rows in **bold** differ between the plans.", ""]
    body = []
    for r in cmp.table.to_dict("records"):
        label = f"{r['section']}: {r['metric']}"
        body.append([f"**{label}**" if r["differs"] else label] + [r[n] for n in cmp.names])
    lines += _md_table(["metric"] + cmp.names, body)
    for n in cmp.names:
        lines += ["", f"## Why {n}: {cmp.plans[n].label()}", ""]
        why = justify(cmp.plans[n], cmp.reports[n], cmp.models.get(n, m), c, review.options)
        lines += [f"- **{dim}** — {text}" for dim, text in why]
    if len(cmp.issues):
        lines += ["", "## Errors and warnings", ""]
        lines += [f"- {r['plan']} **{r['level']}**: {r['message']}" for r in cmp.issues.to_dict("records")]
    lines += ["", "## Notes", ""]
    lines += [f"- **{n.author}** ({n.at}): {n.text}" for n in review.notes] or ["_none yet_"]
    return "\n".join(lines) + "\n"
