"""A plan on a cluster <-> URL query parameters, so a copied dashboard URL reopens the same plan.

Keys (all values are strings, as in `st.query_params`):

    model     preset name (parallel.core.specs.MODELS)        cluster   preset name (parallel.core.specs.CLUSTERS)
    nodes     nodes of the cluster                       dp tp pp cp   parallel degrees
    gpn       GPUs (CPU ranks) per node (default: the cluster preset's)
    gpumem    memory per GPU in GiB, when not the cluster preset's (an uploaded job's GPUs, from its traces)
    sp        0 | 1 (Megatron sequence parallelism)      mb gb     micro batch, global batch (sequences)
    vpp       virtual pipeline stages per rank           zero      ZeRO stage 0-3
    recompute none | selective | full                    order     rank order, fastest first
    ep        expert parallelism (MoE models; from dp x cp)
    grads     fp32 | bf16 (gradient buffer; only when bf16)  fp8      none | gemm | weights (only when not none)
    ck        allgather | ring | ulysses (context parallelism's exchange; only when not allgather)
    tpo gro pgo p2po  0 | 1: overlap TP comm, DP grad reduce, DP param gather, PP send/recv (only when 1)
    first last        layers of the first and last pipeline stage (only when uneven)

A missing key takes DEFAULT_PARAMS' value, except `nodes`, which then fits the plan (just enough
nodes for dp*tp*pp*cp GPUs), and `gpn`, which then is the cluster preset's. Pure: stdlib and parallel/ only (no streamlit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from parallel.core.plan import Plan
from parallel.core.specs import Cluster, GiB, Model, SpecError, cluster_preset, model_preset

KEYS = (
    "model",
    "cluster",
    "nodes",
    "gpn",
    "dp",
    "tp",
    "pp",
    "cp",
    "sp",
    "mb",
    "gb",
    "vpp",
    "zero",
    "recompute",
    "order",
    "ep",
)
# Optional keys, written only when not the default (the plan form has no widgets for them; the
# review page's plan codes carry them): the gradient dtype, the FP8 mode, the context-parallel
# exchange (ck: allgather | ring | ulysses), the overlaps (0 | 1: TP comm, DP grad reduce, DP param
# gather, PP send/recv) and uneven pipeline stages (first, last: layers of the first and last stage).
OPTIONAL_FIELDS = {
    "grads": "main_grads",
    "fp8": "fp8",
    "ck": "cp_kind",
    "tpo": "tp_overlap",
    "gro": "grad_reduce_overlap",
    "pgo": "param_gather_overlap",
    "p2po": "p2p_overlap",
    "first": "first_stage_layers",
    "last": "last_stage_layers",
}
OPTIONAL_KEYS = tuple(OPTIONAL_FIELDS)
BOOL_KEYS = ("sp", "tpo", "gro", "pgo", "p2po")
STAGE_KEYS = ("first", "last")  # may be empty: an even split
MAX_GPU_MEMORY_GIB = 65536.0
FORM_KEYS = (*KEYS, "ck")  # what the sidebar plan form reads and writes: ck is its one optional key
_INT_FIELDS = {
    "dp": "dp",
    "tp": "tp",
    "pp": "pp",
    "cp": "cp",
    "mb": "micro_batch",
    "gb": "global_batch",
    "vpp": "vpp",
    "zero": "zero",
    "ep": "ep",
}

# The dashboard's opening plan: GPT-3 175B on 64 DGX H100 nodes, Megatron-style 8-way TP inside each
# node with SP, 8 pipeline stages, 8-way DP, batch 1536 (Narayanan et al. 2021, Table 1's 175B row).
DEFAULT_PARAMS: dict[str, str] = {
    "model": "gpt3-175b",
    "cluster": "dgx-h100",
    "nodes": "64",
    "gpn": "8",
    "dp": "8",
    "tp": "8",
    "pp": "8",
    "cp": "1",
    "sp": "1",
    "mb": "1",
    "gb": "1536",
    "vpp": "1",
    "zero": "0",
    "recompute": "none",
    "order": Plan().order,
    "ep": "1",
}


def _code(value) -> str:
    """A plan field as a URL value: 0/1 for flags, '' for an unset stage count."""
    return "" if value is None else str(int(value)) if isinstance(value, bool) else str(value)


OPTIONAL_DEFAULTS = {key: _code(getattr(Plan(), name)) for key, name in OPTIONAL_FIELDS.items()}


def plan_to_params(
    model_name: str,
    cluster_name: str,
    nodes: int,
    plan: Plan,
    gpus_per_node: int | None = None,
    gpu_memory_bytes: int | None = None,
) -> dict[str, str]:
    """The query parameters of a plan: every key of KEYS (and OPTIONAL_KEYS that differ from the
    defaults), as strings. `gpus_per_node` defaults to
    the cluster preset's (a 4-rank CPU run is one node of 4, not half of a preset's 8);
    `gpu_memory_bytes`, when given and not the preset's, becomes `gpumem`."""
    gpn = gpus_per_node or cluster_preset(cluster_name).gpus_per_node
    memory = {}
    if gpu_memory_bytes and gpu_memory_bytes != cluster_preset(cluster_name).gpu_memory_bytes:
        memory["gpumem"] = f"{gpu_memory_bytes / GiB:.4g}"
    return {
        **memory,
        "model": model_name,
        "cluster": cluster_name,
        "nodes": str(int(nodes)),
        "gpn": str(int(gpn)),
        "dp": str(plan.dp),
        "tp": str(plan.tp),
        "pp": str(plan.pp),
        "cp": str(plan.cp),
        "sp": "1" if plan.sp else "0",
        "mb": str(plan.micro_batch),
        "gb": str(plan.global_batch),
        "vpp": str(plan.vpp),
        "zero": str(plan.zero),
        "recompute": plan.recompute,
        "order": plan.order,
        "ep": str(plan.ep),
        **_optional(plan),
    }


def _optional(plan: Plan) -> dict[str, str]:
    """The optional keys, only where they are not the defaults (URLs of other plans stay as they were)."""
    values = {key: _code(getattr(plan, name)) for key, name in OPTIONAL_FIELDS.items()}
    return {key: v for key, v in values.items() if v != OPTIONAL_DEFAULTS[key]}


def _flag(key: str, text: str) -> bool:
    if text.lower() not in ("0", "1", "true", "false"):
        raise SpecError(f"URL parameter {key}={text!r} must be 0 or 1")
    return text.lower() in ("1", "true")


def _value(params: Mapping, key: str) -> str | None:
    value = params.get(key)
    if isinstance(value, (list, tuple)):  # parse_qs style {key: [values]}: the last one wins, as in st.query_params
        value = value[-1] if value else None
    return None if value is None else str(value).strip()


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"URL parameter {key}={text!r} must be an integer") from None


def plan_from_params(params: Mapping) -> tuple[Model, Cluster, Plan]:
    """The model, cluster (with its nodes) and plan a URL names; SpecError with a clear message if bad.

    Unknown keys are ignored (pages keep their own view state beside the plan)."""
    given = {k: v for k in (*KEYS, *OPTIONAL_KEYS) if (v := _value(params, k)) not in (None, "")}
    values = {**DEFAULT_PARAMS, **OPTIONAL_DEFAULTS, **given}
    model = model_preset(values["model"])
    cluster = cluster_preset(values["cluster"])
    gpn = _int("gpn", given["gpn"]) if "gpn" in given else cluster.gpus_per_node
    if gpn < 1:
        raise SpecError(f"URL parameter gpn={gpn} must be at least 1")
    cluster = dataclasses.replace(cluster, gpus_per_node=gpn)
    if (mem := _value(params, "gpumem")) not in (None, ""):
        cluster = dataclasses.replace(cluster, gpu_memory_bytes=int(gpu_memory_gib(mem) * GiB))
    fields = {name: _int(key, values[key]) for key, name in _INT_FIELDS.items()}
    flags = {OPTIONAL_FIELDS.get(key, key): _flag(key, values[key]) for key in BOOL_KEYS}
    stages = {OPTIONAL_FIELDS[k]: _int(k, values[k]) for k in STAGE_KEYS if values[k]}
    plan = Plan(
        **fields,
        **flags,
        **stages,
        recompute=values["recompute"],
        order=values["order"],
        main_grads=values["grads"],
        fp8=values["fp8"],
        cp_kind=values["ck"],
    )
    if "nodes" in given:
        nodes = _int("nodes", given["nodes"])
        if nodes < 1:
            raise SpecError(f"URL parameter nodes={nodes} must be at least 1")
    else:
        nodes = max(1, -(-plan.world_size // cluster.gpus_per_node))
    cluster = cluster.with_nodes(nodes)
    return model, cluster, plan


def gpu_memory_gib(text: str) -> float:
    """The `gpumem` URL value: GiB per GPU, a positive number up to MAX_GPU_MEMORY_GIB."""
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"URL parameter gpumem={text!r} must be a number of GiB") from None
    if not 0 < value <= MAX_GPU_MEMORY_GIB:
        raise SpecError(f"URL parameter gpumem={text!r} must be above 0 and at most {MAX_GPU_MEMORY_GIB:,.0f} GiB")
    return value


def usable_params(params: Mapping) -> tuple[dict[str, str], list[str]]:
    """The plan keys of `params` that can be used on their own, and a message for each that cannot
    (so a link with one bad value still opens with the rest of its plan)."""
    good, errors = {}, []
    for key in FORM_KEYS:
        value = _value(params, key)
        if value in (None, ""):
            continue
        try:
            plan_from_params({key: value})
        except SpecError as err:
            errors.append(str(err))
        else:
            good[key] = value
    return good, errors


# ---------------------------------------------------------------- the plan review page's state
# Besides the keys above (model, cluster, nodes: the review's machine), the review page keeps
#   plan       repeated, one per compared plan: "name|dp=8,tp=8,pp=8,cp=1,sp=1,mb=1,gb=1536,vpp=1,zero=0,
#              recompute=none,order=tp-cp-ep-dp-pp" (keys as above)
#   shape      a model that is no preset (model=custom): "L=32,h=3840,a=32,kv=32,f=15360,s=2048,V=50432,d=2,arch=gpt"
#   title chosen verdict view review   the review's words, the open section, the saved review's id
#   s_gb s_headroom s_max_tp s_sp s_zero s_recompute s_top   the search constraints
#   mfu dp_overlap flash dropout       the modelling assumptions

REVIEW_VIEWS = ("compare", "search", "import", "saved")
# A plan code's keys: the plan's own URL keys (not where it runs), then `model`: a preset this plan
# trains when it is not the review's (dense vs MoE side by side).
_PLAN_FIELDS = (*(k for k in KEYS if k not in ("model", "cluster", "nodes", "gpn")), *OPTIONAL_KEYS)
_PLAN_CODE_KEYS = (*_PLAN_FIELDS, "model")
_LATER_COLUMNS = ("ep", *OPTIONAL_KEYS, "model")  # columns an older editor's rows may lack: their defaults
_PLAN_CODE_DEFAULTS = {
    "dp": "1",
    "tp": "1",
    "pp": "1",
    "cp": "1",
    "sp": "0",
    "mb": "1",
    "vpp": "1",
    "zero": "0",
    "recompute": "none",
    "order": DEFAULT_PARAMS["order"],
    "ep": "1",
    **OPTIONAL_DEFAULTS,
    "model": "",
}
_SHAPE = {
    "L": "layers",
    "h": "hidden",
    "a": "heads",
    "kv": "kv_heads",
    "f": "ffn_hidden",
    "s": "seq_len",
    "V": "vocab",
    "d": "dtype_bytes",
    "arch": "arch",
}


@dataclass(frozen=True)
class ReviewState:
    model: Model = field(default_factory=lambda: model_preset("gpt3-175b"))
    cluster: str = "dgx-h100"
    nodes: int = 64
    plans: tuple = ()  # of parallel.review.document.NamedPlan
    title: str = ""
    chosen: str | None = None
    verdict: str = ""
    view: str = "compare"
    review_id: int | None = None
    search_gb: int | None = None  # None: the first plan's global batch
    headroom: float = 0.1
    max_tp: int | None = None
    require_sp: bool = False
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    top: int = 20
    mfu: float | None = None  # None: each operator timed on the cluster's device; else a flat MFU
    dp_overlap: float | None = None  # None: as each plan's overlap flags say; else this share hidden
    flash: bool = True
    dropout: bool = True

    @property
    def cluster_spec(self) -> Cluster:
        return cluster_preset(self.cluster).with_nodes(self.nodes)

    @property
    def is_preset_model(self) -> bool:
        from parallel.core.specs import MODELS

        return MODELS.get(self.model.name) == self.model


def default_review_state() -> ReviewState:
    from parallel.review.document import NamedPlan

    _, _, plan = plan_from_params(DEFAULT_PARAMS)
    # B: Megatron-core's defaults on the same degrees -- interleaved, distributed optimizer, every overlap
    overlaps = dict(tp_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True, p2p_overlap=True)
    b = Plan(**{**plan.to_dict(), "vpp": 2, "zero": 1, "recompute": "selective", **overlaps})
    return ReviewState(plans=(NamedPlan("A", plan), NamedPlan("B", b)), title="GPT-3 175B on 64 DGX H100 nodes")


def plan_code(named) -> str:
    """'name|dp=8,tp=8,...' for one NamedPlan (the `plan` URL parameter)."""
    p = named.plan
    values = {
        "dp": p.dp,
        "tp": p.tp,
        "pp": p.pp,
        "cp": p.cp,
        "sp": int(p.sp),
        "mb": p.micro_batch,
        "gb": p.global_batch,
        "vpp": p.vpp,
        "zero": p.zero,
        "recompute": p.recompute,
        "order": p.order,
        **({"ep": p.ep} if p.ep > 1 else {}),  # only where it is not 1: older plan codes stay as they were
        **_optional(p),
        **({"model": named.model.name} if named.model is not None else {}),  # a preset: the page's own model else
    }
    return f"{named.name}|" + ",".join(f"{k}={values[k]}" for k in _PLAN_CODE_KEYS if k in values)


def parse_plan_code(text: str):
    from parallel.review.document import NamedPlan

    name, sep, body = str(text).rpartition("|")
    if not sep or not name.strip():
        raise SpecError(f"URL parameter plan={text!r} must look like 'name|dp=8,tp=8,pp=8,...'")
    pairs = dict(item.partition("=")[::2] for item in body.split(",") if item)
    unknown = sorted(set(pairs) - set(_PLAN_CODE_KEYS))
    if unknown:
        raise SpecError(f"URL parameter plan={text!r}: unknown key(s) {', '.join(unknown)}")
    base = {**_PLAN_CODE_DEFAULTS, **pairs}  # unnamed degrees are 1, as on the plan CLI
    if "gb" not in pairs:
        try:
            base["gb"] = str(int(base["dp"]) * int(base["mb"]) * int(base["pp"]))
        except ValueError:
            pass  # plan_from_params names the bad key
    _, _, plan = plan_from_params({k: base[k] for k in _PLAN_FIELDS})
    return NamedPlan(name.strip(), plan, model_preset(base["model"]) if base["model"] else None)


def model_code(model: Model) -> str:
    return ",".join(f"{short}={getattr(model, name)}" for short, name in _SHAPE.items())


def model_from_code(text: str, name: str = "custom") -> Model:
    pairs = dict(item.partition("=")[::2] for item in str(text).split(",") if item)
    try:
        fields = {_SHAPE[k]: (v if k == "arch" else int(v)) for k, v in pairs.items()}
    except (KeyError, ValueError):
        raise SpecError(
            f"URL parameter shape={text!r} must look like '{model_code(model_preset('gpt3-22b'))}'"
        ) from None
    return Model(name=name, **fields)


def _float(key: str, text: str, lo: float, hi: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"URL parameter {key}={text!r} must be a number") from None
    if not lo <= value <= hi:
        raise SpecError(f"URL parameter {key}={value} must be in [{lo}, {hi}]")
    return value


def review_to_params(s: ReviewState) -> dict[str, str | list[str]]:
    """The URL of the review page: every value a string, `plan` a list (repeated key)."""
    out: dict[str, str | list[str]] = {
        "view": s.view,
        "model": s.model.name if s.is_preset_model else "custom",
        "cluster": s.cluster,
        "nodes": str(s.nodes),
        "plan": [plan_code(p) for p in s.plans],
    }
    if not s.is_preset_model:
        out["shape"] = model_code(s.model)
        out["mname"] = s.model.name
    for key, value in (
        ("title", s.title),
        ("chosen", s.chosen),
        ("verdict", s.verdict),
        ("review", s.review_id),
        ("s_gb", s.search_gb),
        ("s_max_tp", s.max_tp),
    ):
        if value not in (None, ""):
            out[key] = str(value)
    out.update(
        {
            "s_headroom": f"{s.headroom:g}",
            "s_sp": str(int(s.require_sp)),
            "s_zero": ",".join(map(str, s.zero)),
            "s_recompute": ",".join(s.recompute),
            "s_top": str(s.top),
            **({} if s.mfu is None else {"mfu": f"{s.mfu:g}"}),
            **({} if s.dp_overlap is None else {"dp_overlap": f"{s.dp_overlap:g}"}),
            "flash": str(int(s.flash)),
            "dropout": str(int(s.dropout)),
        }
    )
    return out


def _all(params: Mapping, key: str) -> list[str]:
    value = params.get(key)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def review_from_params(params: Mapping) -> ReviewState:
    """The review page's state from its URL (missing keys: the defaults); SpecError naming a bad key."""
    d = default_review_state()
    get = lambda key: _value(params, key)  # noqa: E731
    shape = get("shape")
    model = model_from_code(shape, get("mname") or "custom") if shape else model_preset(get("model") or d.model.name)
    cluster = get("cluster") or d.cluster
    cluster_preset(cluster)
    codes = _all(params, "plan")
    plans = tuple(parse_plan_code(c) for c in codes) if codes else d.plans
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise SpecError(f"URL plans must have different names, got {names}")
    view = get("view") or d.view
    if view not in REVIEW_VIEWS:
        raise SpecError(f"URL parameter view={view!r} must be one of {', '.join(REVIEW_VIEWS)}")
    nodes = (
        _int("nodes", get("nodes"))
        if get("nodes")
        else max(1, -(-plans[0].plan.world_size // cluster_preset(cluster).gpus_per_node))
        if plans
        else d.nodes
    )
    if nodes < 1:
        raise SpecError(f"URL parameter nodes={nodes} must be at least 1")
    chosen = get("chosen") or None
    if chosen is not None and chosen not in names:
        chosen = None
    flag = lambda key, default: default if get(key) in (None, "") else get(key) in ("1", "true")  # noqa: E731
    try:
        zero = tuple(sorted({int(z) for z in (get("s_zero") or "0,1,2,3").split(",")[:64] if z}))
    except ValueError:
        raise SpecError(f"URL parameter s_zero={get('s_zero')!r} must list ZeRO stages like 0,1") from None
    recompute = tuple(dict.fromkeys(r for r in (get("s_recompute") or "none,selective,full").split(",")[:64] if r))
    if set(zero) - {0, 1, 2, 3} or set(recompute) - {"none", "selective", "full"}:
        raise SpecError("URL parameters s_zero / s_recompute name stages or modes that do not exist")
    opt_int = lambda key: _int(key, get(key)) if get(key) else None  # noqa: E731
    return ReviewState(
        model=model,
        cluster=cluster,
        nodes=nodes,
        plans=plans,
        title=get("title") or ("" if codes else d.title),
        chosen=chosen,
        verdict=get("verdict") or "",
        view=view,
        review_id=opt_int("review"),
        search_gb=opt_int("s_gb"),
        headroom=_float("s_headroom", get("s_headroom") or "0.1", 0, 0.95),
        max_tp=opt_int("s_max_tp"),
        require_sp=flag("s_sp", False),
        zero=zero,
        recompute=recompute,
        top=opt_int("s_top") or d.top,
        mfu=_float("mfu", get("mfu"), 0.01, 1) if get("mfu") else None,
        dp_overlap=_float("dp_overlap", get("dp_overlap"), 0, 1) if get("dp_overlap") else None,
        flash=flag("flash", True),
        dropout=flag("dropout", model.dropout),  # the model's own (Llama 3 trains without) unless the URL says
    )


def plan_rows_of(plans) -> list[dict]:
    """The compared plans as rows for the page's plan editor (one dict per plan, URL key names)."""
    rows = []
    for named in plans:
        p = named.plan
        rows.append(
            {
                "name": named.name,
                "dp": p.dp,
                "tp": p.tp,
                "pp": p.pp,
                "cp": p.cp,
                "sp": p.sp,
                "mb": p.micro_batch,
                "gb": p.global_batch,
                "vpp": p.vpp,
                "zero": p.zero,
                "recompute": p.recompute,
                "order": p.order,
                "ep": p.ep,
                "grads": p.main_grads,
                "fp8": p.fp8,
                "ck": p.cp_kind,
                "tpo": p.tp_overlap,
                "gro": p.grad_reduce_overlap,
                "pgo": p.param_gather_overlap,
                "p2po": p.p2p_overlap,
                "first": p.first_stage_layers,
                "last": p.last_stage_layers,
                "model": named.model.name if named.model is not None else "",
            }
        )
    return rows


def _empty(cell) -> bool:
    """A data-editor cell left empty: None, or NaN where the column is numeric."""
    return cell is None or (isinstance(cell, float) and cell != cell)


def plans_from_rows(rows) -> tuple[tuple, list[str]]:
    """Plans from edited rows, and a message per row that cannot be a plan (that row is left out)."""

    if hasattr(rows, "to_dict"):  # the data editor hands back a DataFrame
        rows = rows.to_dict("records")
    plans, errors, seen = [], [], set()
    for i, row in enumerate(rows, 1):
        name = str(row.get("name") or "").strip() or f"plan {i}"
        if name in seen:
            errors.append(f"row {i}: the name {name!r} is used twice")
            continue
        try:
            # a row without the precision columns (an older editor) means the defaults
            values = {k: row.get(k, _PLAN_CODE_DEFAULTS[k] if k in _LATER_COLUMNS else None) for k in _PLAN_CODE_KEYS}
            for k in ("model", *STAGE_KEYS):
                if _empty(values[k]):
                    values[k] = ""  # an empty model cell: the review's model; a stage: an even split
            if any(_empty(v) for v in values.values()):
                raise SpecError("fill every column")
            values.update({k: int(float(values[k])) for k in STAGE_KEYS if values[k] != ""})
            named = parse_plan_code(
                f"{name}|" + ",".join(f"{k}={int(v) if k in BOOL_KEYS else v}" for k, v in values.items())
            )
        except (SpecError, ValueError, TypeError) as err:
            errors.append(f"row {i} ({name}): {err}")
            continue
        seen.add(name)
        plans.append(named)
    return tuple(plans), errors


def plan_page_params(s: ReviewState, named) -> dict[str, str] | None:
    """Query params that open `named` in the Topology / Activation memory / TP scaling pages, or None
    when the review's model is not a preset (those pages take preset names)."""
    if not s.is_preset_model:
        return None
    return plan_to_params(s.model.name, s.cluster, s.nodes, named.plan)


def review_of(s: ReviewState, *, author: str = "", created: str = "", notes: tuple = ()):
    """The parallel.review.document.Review the page state describes."""
    from parallel.core.memory import ActivationOptions
    from parallel.core.perf import PerfOptions
    from parallel.core.report import Options
    from parallel.review.document import Review

    options = Options(
        activations=ActivationOptions(flash_attention=s.flash, dropout=s.dropout),
        perf=PerfOptions(mfu=s.mfu, dp_overlap=s.dp_overlap),
    )
    return Review(
        title=s.title,
        model=s.model,
        cluster=s.cluster_spec,
        plans=s.plans,
        verdict=s.verdict,
        chosen=s.chosen,
        notes=notes,
        author=author,
        created=created,
        options=options,
    )


def state_of_review(
    review, *, review_id: int | None = None, view: str = "compare", base: ReviewState | None = None
) -> ReviewState:
    """The page state that shows `review` (its cluster must be one of the presets, by name)."""
    cluster = cluster_preset(review.cluster.name)
    o = review.options
    return dataclasses.replace(
        base or ReviewState(),
        model=review.model,
        cluster=cluster.name,
        nodes=review.cluster.nodes,
        plans=tuple(review.plans),
        title=review.title,
        chosen=review.chosen,
        verdict=review.verdict,
        view=view,
        review_id=review_id,
        mfu=o.perf.mfu,
        dp_overlap=o.perf.dp_overlap,
        flash=o.activations.flash_attention,
        dropout=o.activations.has_dropout(review.model),
    )
