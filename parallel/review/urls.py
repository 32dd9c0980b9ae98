"""A plan on a cluster <-> URL query parameters, so a copied dashboard URL reopens the same plan; and
the plan review page's state <-> its URL.

Keys (all values are strings, as in `st.query_params`):

    model     preset name (parallel.core.specs.MODELS)        cluster   preset name (parallel.core.specs.CLUSTERS)
    nodes     nodes of the cluster                           gpn       GPUs (CPU ranks) per node (default: the preset's)
    nvl       GPUs per NVLink domain, whole hosts, when not the preset's (its 72 on an NVL72 rack, else one host)
    gpumem    memory per GPU in GiB, when not the cluster preset's (an uploaded job's GPUs, from its traces)
    the plan  one key per plan field, named by its declaration (parallel.core.plan: dp tp pp cp sp mb gb vpp
              sched zero recompute rcl order grads fp8 ep etp ck tpo gro pgo p2po first last embsplit
              losssplit attn dropout); flags are 0 | 1, an unset optional value is empty

A link that names no plan field opens on OPENING, the dashboard's example plan; one that names any
takes each field it does not name from that field's one declared default (parallel.core.plan's
plan_from_values: the global batch then is dp x micro batch x pp). A missing `nodes` fits the plan (just
enough nodes for its GPUs). Pure: stdlib and parallel/ only (no streamlit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from parallel.core.memory import ActivationOptions
from parallel.core.perf import PerfOptions
from parallel.core.plan import PLAN_FIELDS, Plan, parse_value, plan_from_values, plan_values
from parallel.core.plan_schema import OPTIONAL_KINDS, value_error
from parallel.core.report import Options
from parallel.core.specs import MODELS, SHAPE_LIMITS, Cluster, GiB, Model, SpecError, cluster_preset, model_preset
from parallel.review.document import NamedPlan, Review
from parallel.review.refit import refit_plan

PLAN_KEYS = tuple(spec.knob.url for spec in PLAN_FIELDS)  # the plan's URL keys, in declaration order
PLACE_KEYS = ("model", "cluster", "nodes", "gpn", "nvl")  # where the plan runs
KEYS = (*PLACE_KEYS, *PLAN_KEYS)
ALWAYS = ("dp", "tp", "pp", "gb")  # written into every link, default or not, so a link shows its degrees
MAX_GPU_MEMORY_GIB = 65536.0

# The dashboard's opening plan: GPT-3 175B on 64 DGX H100 nodes, Megatron-style 8-way TP inside each
# node with SP, 8 pipeline stages, 8-way DP, batch 1536 (Narayanan et al. 2021, Table 1's 175B row).
OPENING = ("gpt3-175b", "dgx-h100", 64, Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536))


def plan_params_of(plan: Plan) -> dict[str, str]:
    """A plan's URL keys: ALWAYS, and every other field that differs from its default, as text."""
    values = plan_values(plan, "url", changed_only=True)
    values.update({k: v for k, v in plan_values(plan, "url").items() if k in ALWAYS})
    return {k: _text(values[k]) for k in PLAN_KEYS if k in values}


def _text(value) -> str:
    """A field's value as URL text: 0/1 for flags, '' for unset."""
    return "" if value is None else str(int(value)) if isinstance(value, bool) else str(value)


def plan_to_params(
    model_name: str,
    cluster_name: str,
    nodes: int,
    plan: Plan,
    gpus_per_node: int | None = None,
    gpu_memory_bytes: int | None = None,
    nvlink_domain: int | None = None,
) -> dict[str, str]:
    """The query parameters of a plan on a cluster, as strings. `gpus_per_node` defaults to the cluster
    preset's (a 4-rank CPU run is one node of 4, not half of a preset's 8); `gpu_memory_bytes`, when
    given and not the preset's, becomes `gpumem`; `nvlink_domain` (GPUs), when given and not the one
    the preset has on hosts of that size, becomes `nvl`."""
    preset = cluster_preset(cluster_name)
    gpn = gpus_per_node or preset.gpus_per_node
    extra = {}
    if gpu_memory_bytes and gpu_memory_bytes != preset.gpu_memory_bytes:
        extra["gpumem"] = f"{gpu_memory_bytes / GiB:.4g}"
    if nvlink_domain and nvlink_domain != (preset.nvlink_domain or gpn):
        extra["nvl"] = str(int(nvlink_domain))
    place = {"model": model_name, "cluster": cluster_name, "nodes": str(int(nodes)), "gpn": str(int(gpn))}
    return {**extra, **place, **plan_params_of(plan)}


DEFAULT_PARAMS: dict[str, str] = plan_to_params(*OPENING)


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


def plan_of_params(params: Mapping) -> Plan:
    """The plan a URL names: OPENING's when it names no plan field, else its fields over the defaults."""
    given = {k: v for k in PLAN_KEYS if (v := _value(params, k)) is not None and (v != "" or k in _OPTIONAL)}
    return plan_from_values(given, style="url") if given else OPENING[3]


_OPTIONAL = {s.knob.url for s in PLAN_FIELDS if s.kind in OPTIONAL_KINDS}  # '' means unset
_BLANK_OK = {s.knob.url for s in PLAN_FIELDS if s.default == ""}  # text whose default is empty (no layout)


def plan_from_params(params: Mapping) -> tuple[Model, Cluster, Plan]:
    """The model, cluster (with its nodes) and plan a URL names; SpecError with a clear message if bad.

    Unknown keys are ignored (pages keep their own view state beside the plan)."""
    model = model_preset(_value(params, "model") or OPENING[0])
    cluster = cluster_preset(_value(params, "cluster") or OPENING[1])
    shape = {}
    for key, name in (("gpn", "gpus_per_node"), ("nvl", "nvlink_domain")):
        if text := _value(params, key):
            shape[name] = _int(key, text)
            if shape[name] < 1:
                raise SpecError(f"URL parameter {key}={shape[name]} must be at least 1")
    if shape:  # the Cluster says whether the NVLink domain is whole hosts
        cluster = dataclasses.replace(cluster, **shape)
    if mem := _value(params, "gpumem"):
        cluster = dataclasses.replace(cluster, gpu_memory_bytes=int(gpu_memory_gib(mem) * GiB))
    plan = plan_of_params(params)
    if nodes_text := _value(params, "nodes"):
        nodes = _int("nodes", nodes_text)
        if nodes < 1:
            raise SpecError(f"URL parameter nodes={nodes} must be at least 1")
    else:
        nodes = max(1, -(-plan.world_size // cluster.gpus_per_node))
    return model, cluster.with_nodes(nodes), plan


# The step model's assumptions (parallel.core.perf.PerfOptions) in a URL, Plan review's and the plan pages'
# alike: absent = the model's own (each operator timed on the device; each plan's own overlap flags).
ASSUMPTION_KEYS = ("mfu", "dp_overlap")
_ASSUMPTION_BOUNDS = {"mfu": (0.01, 1.0), "dp_overlap": (0.0, 1.0)}


def assumption_of(key: str, text: str) -> float:
    """One assumption's URL value: `mfu` a flat MFU, `dp_overlap` the share of DP communication hidden."""
    return _float(key, text, *_ASSUMPTION_BOUNDS[key])


def perf_of_params(params: Mapping) -> PerfOptions:
    """The PerfOptions a URL's assumptions name (SpecError on a bad one)."""
    return PerfOptions(**{key: assumption_of(key, text) for key in ASSUMPTION_KEYS if (text := _value(params, key))})


def assumption_params(mfu: float | None, dp_overlap: float | None) -> dict[str, str]:
    """The URL keys of the assumptions that are set."""
    values = {"mfu": mfu, "dp_overlap": dp_overlap}
    return {key: f"{values[key]:g}" for key in ASSUMPTION_KEYS if values[key] is not None}


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
    """The keys of `params` (KEYS) whose values can be used on their own, and a message for each that
    cannot (so a link with one bad value still opens with the rest of its plan)."""
    good, errors = {}, []
    for key in KEYS:
        value = _value(params, key)
        if value is None or (value == "" and key not in _OPTIONAL):
            continue
        try:
            if key in PLACE_KEYS:
                _check_place(key, value, good, params)
            else:
                spec = _BY_URL[key]
                problem = value_error(spec, parse_value(spec, value, "url"))
                if problem:
                    raise SpecError(f"URL parameter {key}={value!r} {problem}")
        except SpecError as err:
            errors.append(str(err))
        else:
            good[key] = value
    return good, errors


_BY_URL = {spec.knob.url: spec for spec in PLAN_FIELDS}


def _check_place(key: str, value: str, good: Mapping, params: Mapping) -> None:
    """SpecError if `key` cannot be used. The hosts and the NVLink domain are one cluster's shape,
    checked on the link's cluster: `gpn` beside the link's `nvl` (else alone), `nvl` beside the good `gpn`."""
    if key not in ("gpn", "nvl"):
        plan_from_params({key: value})
        return
    context = {k: good[k] for k in ("cluster", "gpn") if k in good and k != key}
    domain = _value(params, "nvl") if key == "gpn" else None
    try:
        plan_from_params({**context, **({"nvl": domain} if domain else {}), key: value})
    except SpecError:
        if not domain:
            raise
        plan_from_params({**context, key: value})


# ---------------------------------------------------------------- the plan review page's state
# Besides the keys above (model, cluster, nodes: the review's machine), the review page keeps
#   plan       repeated, one per compared plan: "name|dp=8,tp=8,pp=8,sp=1,gb=1536" (the plan's URL keys:
#              plan_params_of's), and `model=NAME` when it trains another preset than the review's
#   shape      a model that is no preset (model=custom): "L=32,h=3840,a=32,kv=32,f=15360,s=2048,V=50432,d=2,arch=gpt",
#              then every other Model field that differs from its default (model_code: experts=128,top_k=8,...)
#   title chosen verdict view review   the review's words, the open section, the saved review's id
#   s_gb s_headroom s_max_tp s_sp s_zero s_recompute s_top   the search constraints
#   mfu dp_overlap                     the modelling assumptions

REVIEW_VIEWS = ("compare", "search", "import", "saved")
# Review-wide keys of older links, now fields of each plan: flash=0 -> attention unfused, dropout=0|1
_LEGACY_PLAN_KEYS = {"flash": ("attn", {"0": "unfused", "false": "unfused"}), "dropout": ("dropout", None)}
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
    model: Model = field(default_factory=lambda: model_preset(OPENING[0]))
    cluster: str = OPENING[1]
    nodes: int = OPENING[2]
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

    @property
    def cluster_spec(self) -> Cluster:
        return cluster_preset(self.cluster).with_nodes(self.nodes)

    @property
    def is_preset_model(self) -> bool:
        return MODELS.get(self.model.name) == self.model


def title_of(model: Model, cluster: Cluster) -> str:
    """A review's default title: 'gpt3-175b on 64 dgx-h100 nodes'."""
    return f"{model.name} on {cluster.nodes} {cluster.name} nodes"


def default_review_state() -> ReviewState:
    plan = OPENING[3]
    # B: Megatron-core's defaults on the same degrees -- interleaved, distributed optimizer, every overlap
    overlaps = dict(tp_overlap=True, grad_reduce_overlap=True, param_gather_overlap=True, p2p_overlap=True)
    b = dataclasses.replace(plan, vpp=2, zero=1, recompute="selective", **overlaps)
    s = ReviewState(plans=(NamedPlan("A", plan), NamedPlan("B", b)))
    return dataclasses.replace(s, title=title_of(s.model, s.cluster_spec))


_CODE_SAFE = "+-*()._~/:"  # kept as written in a plan code's values (all but its separators and '%')


def plan_code(named: NamedPlan) -> str:
    """'name|dp=8,tp=8,...' for one NamedPlan (the `plan` URL parameter)."""
    values = plan_params_of(named.plan)
    if named.model is not None:  # a preset: the page's own model else
        values["model"] = named.model.name
    # a value's own '|', ',', '=' or '%' (a pipeline layout's stage ends) percent-encoded: the code's separators
    return f"{named.name}|" + ",".join(f"{k}={quote(str(v), safe=_CODE_SAFE)}" for k, v in values.items())


def parse_plan_code(text: str, legacy: Mapping[str, str] | None = None) -> NamedPlan:
    """A NamedPlan from its code; `legacy`: plan fields an older link set review-wide (URL keys), taken
    where the code does not set them."""
    name, sep, body = str(text).rpartition("|")
    if not sep or not name.strip():
        raise SpecError(f"URL parameter plan={text!r} must look like 'name|dp=8,tp=8,pp=8,...'")
    pairs = {k: unquote(v) for k, v in (item.partition("=")[::2] for item in body.split(",") if item)}
    unknown = sorted(set(pairs) - set(PLAN_KEYS) - {"model"})
    if unknown:
        raise SpecError(f"URL parameter plan={text!r}: unknown key(s) {', '.join(unknown)}")
    model = pairs.pop("model", "")
    plan = plan_from_values({**(legacy or {}), **pairs}, style="url")
    return NamedPlan(name.strip(), plan, model_preset(model) if model else None)


_SHORT = {name: short for short, name in _SHAPE.items()}
_MODEL_FIELDS = {f.name: f for f in dataclasses.fields(Model) if f.name != "name"}


def _model_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):  # a per-layer 0/1 pattern (moe_pattern): one digit a layer
        return "".join(str(int(v)) for v in value)
    return str(value)


def model_code(model: Model) -> str:
    """The `shape` URL parameter: every field of the model but its name, the nine of a dense shape
    always (short keys), any other where it differs from Model's default (its field name), so a link
    carries a mixture-of-experts or multi-latent-attention model whole."""
    out = []
    for name, f in _MODEL_FIELDS.items():
        value = getattr(model, name)
        if name in _SHORT or value != f.default:
            out.append(f"{_SHORT.get(name, name)}={_model_value(value)}")
    return ",".join(out)


def _parse_model_value(name: str, text: str) -> Any:
    kind = str(_MODEL_FIELDS[name].type)
    if "tuple" in kind:  # one digit a layer: no longer than the most layers a model may have
        if not text or len(text) > SHAPE_LIMITS["layers"] or set(text) - {"0", "1"}:
            raise ValueError(name)
        return tuple(int(c) for c in text)
    if "bool" in kind:
        if text not in ("0", "1"):
            raise ValueError(name)
        return text == "1"
    return text if kind == "str" else int(text)


def model_from_code(text: str, name: str = "custom") -> Model:
    pairs = dict(item.partition("=")[::2] for item in str(text).split(",") if item)
    try:
        fields = {}
        for key, value in pairs.items():
            field_name = _SHAPE.get(key, key)
            if field_name not in _MODEL_FIELDS:
                raise KeyError(key)
            fields[field_name] = _parse_model_value(field_name, value)
    except (KeyError, ValueError):
        raise SpecError(
            f"URL parameter shape={text!r} must look like '{model_code(model_preset('gpt3-22b'))}'"
            " (and any other model field as name=value)"
        ) from None
    return Model.from_dict({"name": name, **fields})


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
            **assumption_params(s.mfu, s.dp_overlap),
        }
    )
    return out


def _all(params: Mapping, key: str) -> list[str]:
    value = params.get(key)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(v) for v in [value]]


def _legacy(get) -> dict[str, str]:
    """The plan fields an older review link set for every plan (flash, dropout), as URL keys."""
    out = {}
    for key, (url_key, mapping) in _LEGACY_PLAN_KEYS.items():
        text = get(key)
        if text not in (None, ""):
            if mapping is None:
                out[url_key] = text
            elif text.lower() in mapping:
                out[url_key] = mapping[text.lower()]
    return out


def review_from_params(params: Mapping) -> ReviewState:
    """The review page's state from its URL (missing keys: the defaults); SpecError naming a bad key."""
    d = default_review_state()
    get = lambda key: _value(params, key)  # noqa: E731
    shape = get("shape")
    model = model_from_code(shape, get("mname") or "custom") if shape else model_preset(get("model") or d.model.name)
    cluster = get("cluster") or d.cluster
    cluster_preset(cluster)
    codes = _all(params, "plan")
    legacy = _legacy(get)
    plans = tuple(parse_plan_code(c, legacy) for c in codes) if codes else d.plans
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
    spec = cluster_preset(cluster).with_nodes(nodes)
    if not codes:  # the opening plans, carried to the link's GPUs as switching the place by hand carries them
        plans = tuple(dataclasses.replace(p, plan=refit_plan(p.plan, spec.gpus)) for p in plans)
    chosen = get("chosen") or None
    if chosen is not None and chosen not in names:
        chosen = None
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
        title=get("title") or ("" if codes else title_of(model, spec)),
        chosen=chosen,
        verdict=get("verdict") or "",
        view=view,
        review_id=opt_int("review"),
        search_gb=opt_int("s_gb"),
        headroom=_float("s_headroom", get("s_headroom") or "0.1", 0, 0.95),
        max_tp=opt_int("s_max_tp"),
        require_sp=(get("s_sp") or "0") in ("1", "true"),
        zero=zero,
        recompute=recompute,
        top=opt_int("s_top") or d.top,
        mfu=assumption_of("mfu", get("mfu")) if get("mfu") else None,
        dp_overlap=assumption_of("dp_overlap", get("dp_overlap")) if get("dp_overlap") else None,
    )


# ---------------------------------------------------------------- the review page's plan editor
# One column per plan field (its URL key; the title its Knob's column), then `model`.

EDITOR_COLUMNS = ("name", *PLAN_KEYS, "model")


def plan_rows_of(plans: tuple[NamedPlan, ...]) -> list[dict]:
    """The compared plans as rows for the page's plan editor (one dict per plan, URL key names)."""
    return [
        {"name": named.name, **plan_values(named.plan, "url"), "model": named.model.name if named.model else ""}
        for named in plans
    ]


def _empty(cell) -> bool:
    """A data-editor cell left empty: None, or NaN where the column is numeric."""
    return cell is None or (isinstance(cell, float) and cell != cell)


def plans_from_rows(rows: Any) -> tuple[tuple, list[str]]:
    """Plans from edited rows, and a message per row that cannot be a plan (that row is left out). A
    column a row lacks (an older editor's) takes the field's default; an empty cell of an optional field
    is unset; any other empty cell is an error."""
    if hasattr(rows, "to_dict"):  # the data editor hands back a DataFrame
        rows = rows.to_dict("records")
    plans, errors, seen = [], [], set()
    for i, row in enumerate(rows, 1):
        name = str(row.get("name") or "").strip() or f"plan {i}"
        if name in seen:
            errors.append(f"row {i}: the name {name!r} is used twice")
            continue
        try:
            values = {}
            for key in PLAN_KEYS:
                if key not in row:
                    continue
                cell = row[key]
                if _empty(cell) or cell == "":
                    if key not in _OPTIONAL | _BLANK_OK:
                        raise SpecError(f"fill the {_BY_URL[key].knob.column!r} column")
                    cell = "" if key in _BLANK_OK else None
                values[key] = cell
            plan = plan_from_values(values, style="url")
            model = row.get("model")
            named = NamedPlan(name, plan, model_preset(model) if model and not _empty(model) else None)
        except (SpecError, ValueError, TypeError) as err:
            errors.append(f"row {i} ({name}): {err}")
            continue
        seen.add(name)
        plans.append(named)
    return tuple(plans), errors


def plan_page_params(s: ReviewState, named: NamedPlan) -> dict[str, str] | None:
    """Query params that open `named` in the plan pages (Topology, Activation memory, TP scaling, Long
    context) under the review's assumptions, or None when its model is not a preset (those pages take
    preset names)."""
    model = named.model_or(s.model)
    if MODELS.get(model.name) != model:
        return None
    return {**plan_to_params(model.name, s.cluster, s.nodes, named.plan), **assumption_params(s.mfu, s.dp_overlap)}


def review_of(s: ReviewState, *, author: str = "", created: str = "", notes: tuple = ()) -> Review:
    """The parallel.review.document.Review the page state describes."""
    options = Options(activations=ActivationOptions(), perf=PerfOptions(mfu=s.mfu, dp_overlap=s.dp_overlap))
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
    review: Review, *, review_id: int | None = None, view: str = "compare", base: ReviewState | None = None
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
    )
