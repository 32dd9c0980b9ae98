"""Search the plan space: every valid (dp, tp, pp, cp, sp, vpp, micro_batch, zero, recompute) for a
model, a cluster and a global batch; keep those that fit in memory; rank by estimated step time.

    python -m parallel search --model gpt3-175b --cluster dgx-h100 --gpus 512 --global-batch 1536 \\
        [--top N] [--json] [--headroom 0.1] [--max-tp 8] [--require-sp] [--zero 0,1] [--recompute none,selective]

How: the candidates are built degree by degree, each structural rule of `parallel.core.validate` applied
as a named filter (the *funnel*), so an empty space says which constraint emptied it. The survivors
(~3e5 rows for GPT-3 175B on 4096 GPUs) are then evaluated as numpy columns by `evaluate`, which
calls the plan model's own functions (`parallel.core.memory`, `parallel.core.comm`,
`parallel.core.perf`, written for one plan or a PlanColumns) — there is no restated copy.
`search_naive` is the same search as a plain loop over `parallel.core.report.plan_report`, and a
test checks that both agree on a small space.

Pure: numpy and pandas.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.comm import DIMS as COMM_DIMS
from parallel.core.comm import crosses_nodes
from parallel.core.memory import ActivationOptions, activation_bytes_per_layer, memory_per_gpu_bytes
from parallel.core.perf import bubble_fraction, step_time
from parallel.core.plan import (
    CP_KINDS,
    DISPATCHERS,
    MAX_GLOBAL_BATCH,
    MAX_WORLD_SIZE,
    PLAN_DEFAULTS,
    RECOMPUTE,
    Plan,
    PlanColumns,
)
from parallel.core.report import Options, plan_report
from parallel.core.specs import Cluster, GiB, Model, SpecError

# The plan fields the search explores, one value per row; every other field of a plan is the
# search's base plan's (Constraints.base), shared by all rows.
PLAN_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "sp",
    "vpp",
    "micro_batch",
    "zero",
    "recompute",
    "ep",
    "etp",
    "moe_dispatcher",
    "cp_kind",
    "first_stage_layers",
    "last_stage_layers",
)
# Base fields the search sets itself: a row's stage split is its own (first / last layers, so the
# embedding and loss are not counted in it; a base plan's pipeline layout is dropped: it would pin
# pp and vpp, which the search explores, and layouts are not searched); no partial recompute.
SEARCH_SETS = {"embedding_in_split": False, "loss_in_split": False, "pp_layout": "", "recompute_layers": None}
LINKS = ("intra", "inter")


class TooManyPlans(SpecError):
    """The candidate space (`total` plans) is past MAX_CANDIDATES; the message says which limits would
    bring it under."""

    def __init__(self, message: str, total: int):
        super().__init__(message)
        self.total = total


class SearchEmpty(SpecError):
    """No plan survives the constraints; the message names the one that removed the last candidates."""

    def __init__(self, message: str, funnel: list[dict] | None = None):
        super().__init__(message)
        self.funnel = funnel or []  # how many candidates each constraint left


Columns = pd.DataFrame | Mapping[str, np.ndarray]  # candidates' table, or its columns as arrays
MAX_CANDIDATES = 3_000_000  # ~5x GPT-3 175B on 4,096 GPUs' 629k; the table's memory stays under ~1 GB


@dataclass(frozen=True)
class Constraints:
    headroom: float = 0.1  # fraction of GPU memory kept free (allocator, NCCL buffers); validate warns above 90%
    max_tp: int | None = None  # e.g. gpus_per_node to keep TP on NVLink
    max_pp: int | None = None
    max_cp: int | None = None
    max_micro_batch: int | None = None
    # the fewest tokens a CP rank keeps (seq_len / cp): set by the search itself when the whole space is
    # past MAX_CANDIDATES and no --max-cp was given (narrowed_for_size)
    min_cp_tokens: int | None = None
    require_sp: bool = False  # every plan with tp > 1 uses sequence parallelism
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    cp_kinds: tuple[str, ...] = CP_KINDS  # the context-parallel exchanges tried where cp > 1
    dispatchers: tuple[str, ...] = ("alltoall", "flex")  # the MoE dispatchers tried where ep > 1 (expert_layouts)
    # every field the search does not explore (PLAN_KEYS) comes from this plan, with the defaults the
    # rest of the project uses (Plan's declarations): rank order, schedule, gradient dtype, FP8, the
    # overlaps, the attention kernel, dropout. A search row's plan is this plan with the row's fields.
    base: Plan = field(default_factory=Plan)

    def __post_init__(self):
        # a list given twice is the same list: 300 copies of ZeRO-3 in a link must not mean 300x the work
        object.__setattr__(self, "zero", tuple(sorted(set(self.zero))))
        object.__setattr__(self, "recompute", tuple(dict.fromkeys(self.recompute)))
        object.__setattr__(self, "cp_kinds", tuple(dict.fromkeys(self.cp_kinds)))
        object.__setattr__(self, "dispatchers", tuple(dict.fromkeys(self.dispatchers)))
        if not self.dispatchers or set(self.dispatchers) - set(DISPATCHERS):
            raise SpecError(f"dispatchers must be among {', '.join(DISPATCHERS)}, got {self.dispatchers}")
        object.__setattr__(self, "base", dataclasses.replace(self.base, **SEARCH_SETS))
        if not self.cp_kinds or set(self.cp_kinds) - set(CP_KINDS):
            raise SpecError(f"cp kinds must be among {', '.join(CP_KINDS)}, got {self.cp_kinds}")
        if not 0 <= self.headroom < 1:
            raise SpecError(f"headroom must be in [0, 1), got {self.headroom}")
        for name in ("max_tp", "max_pp", "max_cp", "max_micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecError(f"{name} must be at least 1, got {value}")
        if not self.zero or set(self.zero) - {0, 1, 2, 3}:
            raise SpecError(f"zero stages must be among 0, 1, 2, 3, got {self.zero}")
        if not self.recompute or set(self.recompute) - set(RECOMPUTE):
            raise SpecError(f"recompute modes must be among {', '.join(RECOMPUTE)}, got {self.recompute}")

    @property
    def order(self) -> str:
        return self.base.order

    def shared(self) -> dict:
        """The base plan's fields every candidate takes (all but PLAN_KEYS and global_batch)."""
        return {k: getattr(self.base, k) for k in PLAN_DEFAULTS if k not in PLAN_KEYS and k != "global_batch"}


# The step model's error against published GPU runs (bench/published.py: dense runs 6.0% mean, Blackwell
# 7.3%; the larger kept): plans whose predicted steps differ by less are not told apart by it.
MODEL_ERROR = 0.07
CP_NEEDED_TOKENS = 32_768  # below this a sequence fits a GPU's activations without context parallelism
EQUIVALENCE_RULE = (
    f"plans within {MODEL_ERROR:.0%} of the fastest (the model's mean error against published GPU runs) are "
    "equivalent: they are ordered by simplicity -- fewer parallel dimensions in use (dp, tp, pp, cp, ep, "
    "interleaving, ZeRO-2/3 and recomputation count one each), TP inside a node (a crossing counts two), no "
    f"CP below {CP_NEEDED_TOKENS:,} tokens (one more) -- then by time; the rest by time"
)


@dataclass
class SearchResult:
    table: pd.DataFrame  # one row per plan that fits: the equivalent ones by simplicity first, then by time
    funnel: list[dict] = field(default_factory=list)  # [{constraint, remaining}] in the order applied
    evaluated: int = 0  # plans whose memory and time were computed
    seconds: float = 0.0
    rule: str = EQUIVALENCE_RULE
    base: Plan = field(default_factory=Plan)  # the shared fields, with the global batch searched for

    def plan_at(self, i: int) -> Plan:
        """The plan of the table's row `i` (0: the first)."""
        return plan_of(self.table.iloc[i].to_dict(), self.base)

    def plans(self) -> list[Plan]:
        return [plan_of(row, self.base) for row in self.table.to_dict("records")]


def uneven_split(layers: int, pp: int) -> tuple[int, int, int] | None:
    """(first, middle, last) stage layers when `layers` do not divide by pp: Megatron-LM's uneven
    pipeline (--decoder-first/last-pipeline-num-layers), the middle stages as full as a ceil(L/pp) split
    allows and the rest shared by the two ends, which also hold the embedding and the output layer (Llama
    3 405B: 126 layers on 16 stages -> 7, 8 x 14, 7); None when the layers divide evenly or no split
    leaves both ends a layer and no more than a middle stage."""
    if pp == 1 or layers % pp == 0:
        return None
    for middle in range(-(-layers // pp), 0, -1):
        rest = layers - (pp - 2) * middle
        first, last = rest // 2, rest - rest // 2
        if 1 <= first and last <= middle:
            return first, middle, last
    return None


def balanced_split(model: Model, pp: int) -> tuple[int, int, int] | None:
    """(first, middle, last) stage layers that take the output layer's work off the last stage: its
    logits GEMM costs h·V / (a layer's weights) layers of compute (Llama-3 8B: about 2.4 layers, with a
    vocabulary of 128k; GPT-3 175B: 0.3), so the last stage gets that many fewer layers -- what
    Megatron-LM's --decoder-last-pipeline-num-layers (or --account-for-loss-in-pipeline-split) is for.
    None when the output layer weighs less than half a layer, or no split fits."""
    if pp == 1:
        return None
    experts = model.moe_layers
    dense = model.params_per_layer()
    routed = model.moe_layer_params_besides_experts() + model.top_k * model.mlp_matrix_params(model.expert_width)
    per_layer = ((model.layers - experts) * dense + experts * routed) / model.layers if experts else dense
    lighter = round(model.hidden * model.padded_vocab() / per_layer)
    if lighter < 1:
        return None
    layers = model.layers
    if pp == 2:
        last = (layers - lighter) // 2
        return (layers - last, 0, last) if last >= 1 else None
    for middle in range(-(-(layers + lighter) // pp), layers):
        last = middle - lighter
        if last < 1:
            return None
        first = layers - (pp - 2) * middle - last
        if 1 <= first <= middle:
            return first, middle, last
    return None


def stage_splits(model: Model, pp: int) -> list[tuple[int, int]]:
    """The (first, last) stage layers the search tries for `pp` stages ((-1, -1): an even split): the
    even split where the layers divide, else Megatron-LM's uneven one; and the split that balances the
    output layer, where it differs."""
    split = uneven_split(model.layers, pp)
    if split is None and model.layers % pp:
        return []
    out = [(split[0], split[2]) if split else (-1, -1)]
    balanced = balanced_split(model, pp)
    if balanced and (balanced[0], balanced[2]) not in out:
        out.append((balanced[0], balanced[2]))
    return out


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, by trial division up to sqrt(n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def plan_of(row: dict, base: Plan) -> Plan:
    """The Plan of one row of a search table: `base` (the search's shared fields and global batch)
    with the row's explored fields (PLAN_KEYS; a stage split of -1 or absent: even)."""
    fields = {k: type(PLAN_DEFAULTS[k])(row[k]) for k in PLAN_KEYS if k in row and PLAN_DEFAULTS[k] is not None}
    if "etp" in row:  # the experts' TP: None where it follows tp
        fields["etp"] = None if int(row["etp"]) == fields.get("tp", base.tp) else int(row["etp"])
    for k in ("first_stage_layers", "last_stage_layers"):  # numpy ints and floats from a table: plain ints
        value = row.get(k)
        fields[k] = None if value is None or value < 0 else int(value)
    return dataclasses.replace(base, **fields)


def shared_text(base: Plan) -> str:
    """The settings every candidate shares, in words: the base plan's fields the search does not explore."""
    overlaps = [k.removesuffix("_overlap") for k in PLAN_DEFAULTS if k.endswith("_overlap") and getattr(base, k)]
    dropout = "the model's" if base.dropout is None else "on" if base.dropout else "off"
    return (
        f"rank order {base.order}, {base.schedule}, {base.main_grads} grads, FP8 {base.fp8}, attention "
        f"{base.attention}, dropout {dropout}, overlaps: {', '.join(overlaps) or 'none'}"
        + (f", selective recompute of {base.recompute_modules}" if base.recompute_modules != "core_attn" else "")
        + (f", offloaded: {base.offload_modules}" if base.offload_modules != "none" else "")
    )


def _for_attention(c: Constraints) -> Constraints:
    """Without flash attention only Ulysses CP is searched: Megatron-Core's ring and all-gather CP run
    inside Transformer Engine's flash/fused attention, while Ulysses' all-to-all feeds any kernel."""
    if c.base.flash or set(c.cp_kinds) <= {"ulysses"}:
        return c
    if "ulysses" in c.cp_kinds:
        return dataclasses.replace(c, cp_kinds=("ulysses",))
    return dataclasses.replace(c, max_cp=1)


def cp_kinds_for(model: Model, tp: int, cp: int, kinds: tuple[str, ...] = CP_KINDS) -> list[str]:
    """The context-parallel exchanges a (tp, cp) plan can use (validate's rules): at cp 1 only the
    default; Ulysses only where heads and kv_heads divide by cp·tp."""
    if cp == 1:
        return ["allgather"]
    ok = model.heads % (cp * tp) == 0 and model.kv_heads % (cp * tp) == 0
    return [k for k in kinds if k != "ulysses" or ok]


# ---------------------------------------------------------------- candidates, rule by rule


def _degrees(model: Model, world: int, gb: int, c: Constraints, funnel: list[dict]) -> list[tuple[int, int, int, int]]:
    m = model
    combos = [
        (tp, pp, cp, world // (tp * pp * cp))
        for tp in divisors(world)
        for pp in divisors(world // tp)
        for cp in divisors(world // (tp * pp))
    ]
    rules = [
        (f"dp×tp×pp×cp = {world} GPUs", lambda tp, pp, cp, dp: True),
        (f"max TP {c.max_tp}", lambda tp, pp, cp, dp: c.max_tp is None or tp <= c.max_tp),
        (f"max PP {c.max_pp}", lambda tp, pp, cp, dp: c.max_pp is None or pp <= c.max_pp),
        (f"max CP {c.max_cp}", lambda tp, pp, cp, dp: c.max_cp is None or cp <= c.max_cp),
        (
            f"each CP rank keeps at least {c.min_cp_tokens} tokens of the {m.seq_len} (the whole space was past "
            f"{MAX_CANDIDATES:,} plans; --max-cp searches more)",
            lambda tp, pp, cp, dp: c.min_cp_tokens is None or m.seq_len // cp >= c.min_cp_tokens,
        ),
        (
            f"tp divides heads {m.heads} and ffn_hidden {m.ffn_hidden}; tp and kv_heads {m.kv_heads} divide one another",
            lambda tp, pp, cp, dp: (
                m.heads % tp == 0 and m.ffn_hidden % tp == 0 and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)
            ),
        ),
        (
            f"pp divides layers {m.layers}, or the layers split with lighter first and last stages",
            lambda tp, pp, cp, dp: m.layers % pp == 0 or uneven_split(m.layers, pp) is not None,
        ),
        (
            f"seq_len {m.seq_len} divisible by 2·cp (load-balanced CP)",
            lambda tp, pp, cp, dp: cp == 1 or m.seq_len % (2 * cp) == 0,
        ),
        (f"global batch {gb} divisible by dp", lambda tp, pp, cp, dp: gb % dp == 0),
    ]
    for name, keep in rules:
        if "None" in name:
            continue
        combos = [t for t in combos if keep(*t)]
        funnel.append({"constraint": name, "remaining": len(combos)})
    return combos


def expert_degrees(model: Model, dp_cp: int) -> list[int]:
    """The ep degrees a plan with dp x cp = `dp_cp` can take: divisors of both it and the experts
    (validate's rules); [1] for a dense model."""
    return [e for e in divisors(dp_cp) if model.experts % e == 0] if model.experts else [1]


def expert_layouts(
    model: Model, tp: int, dp_cp: int, c: "Constraints", domain: int | None = None, world: int = 1
) -> list[tuple[int, int, int]]:
    """The (ep, etp, dispatcher index) a (tp, dp x cp) plan's MoE layers can take (validate's rules,
    Megatron-LM's expert layout etp x ep x expert-dp x pp = the world): etp = tp, ep dividing dp x cp;
    and etp = 1 where tp > 1, ep dividing dp x cp x tp (MoE parallel folding: the experts' EP ranks
    taken from the attention's TP ranks too); etp dividing the experts' width.

    The dispatcher, where tokens move between ranks (ep > 1), among c.dispatchers: flex where the
    etp x ep consecutive ranks of an EP group may span NVLink domains of `domain` GPUs (it sends less
    across them and the same inside: comm.flex_inter_share), else alltoall -- each the other's equal
    or better there, so the search does not carry both; allgather as a row of its own. Where nothing
    is dispatched (ep 1) the base plan's. [(1, tp, its index)] for a dense model."""
    if not model.experts:
        return [(1, tp, DISPATCHERS.index(c.base.moe_dispatcher))]
    return [
        (ep, etp, DISPATCHERS.index(d))
        for etp in dict.fromkeys((tp, 1))
        if model.expert_width % etp == 0
        for ep in expert_degrees(model, dp_cp * (tp // etp))
        for d in search_dispatchers(ep, etp, c, domain, world)
    ]


def search_dispatchers(ep: int, etp: int, c: "Constraints", domain: int | None, world: int) -> list[str]:
    """The dispatchers the search tries for an (ep, etp) expert layout (expert_layouts' rule): the
    base plan's at ep 1; else flex where the etp x ep consecutive ranks may span NVLink domains,
    alltoall where they cannot, of c.dispatchers, and allgather if listed."""
    if ep == 1:
        return [c.base.moe_dispatcher]
    sends = [d for d in ("flex", "alltoall") if d in c.dispatchers]
    span = ep * etp
    crosses = domain is not None and world > domain and (span > domain or domain % span != 0)
    return ([sends[0] if crosses else sends[-1]] if sends else []) + (
        ["allgather"] if "allgather" in c.dispatchers else []
    )


def candidates(
    model: Model,
    world: int,
    global_batch: int,
    c: Constraints = Constraints(),
    cluster: Cluster | None = None,
    acts: ActivationOptions | None = None,
) -> tuple[pd.DataFrame, list[dict]]:
    """Every structurally valid plan (all of validate's shape rules hold) and the funnel that built it.
    With the `cluster`: its NVLink domain picks the dispatcher (expert_layouts), and no micro batch
    is tried past the largest that the leanest plan of its layout fits (leanest_micro_batch)."""
    funnel: list[dict] = []
    domain = cluster.domain_gpus if cluster is not None else None
    # the layouts, each (tp, pp, cp, dp, first, last stage layers (-1: even), ep, etp, dispatcher, cp kinds)
    layouts = []
    degrees = _degrees(model, world, global_batch, c, funnel)
    splits = {pp: stage_splits(model, pp) for pp in {pp for _, pp, _, _ in degrees}}
    for tp, pp, cp, dp in degrees:
        kinds = tuple(CP_KINDS.index(k) for k in cp_kinds_for(model, tp, cp, c.cp_kinds))
        experts = expert_layouts(model, tp, dp * cp, c, domain, world)
        layouts += [(tp, pp, cp, dp, f, la, *e, kinds) for f, la in splits[pp] for e in experts]
    mb_cap = leanest_micro_batch(model, layouts, global_batch, c, cluster, acts) if cluster is not None else None
    if mb_cap is not None and not mb_cap.any():  # nothing fits: the memory filter says so, with its hints
        mb_cap = None
    base = []  # (dp, tp, pp, cp, mb, vpp, ep, cp_kind, first, last stage layers, etp, dispatcher)
    n_mb = n_lean = 0
    n_cat = 2 * len(c.zero) * len(c.recompute)  # each base row becomes this many candidates
    mb_of = {dp: divisors(global_batch // dp) for dp in {x[3] for x in layouts}}
    vpp_of: dict[tuple[int, int, int], list[int]] = {}
    total = 0  # candidates so far; past MAX_CANDIDATES only counted (by cp and micro batch), not built
    by_cp: dict[int, int] = {}
    by_mb: dict[int, int] = {}
    for i, (tp, pp, cp, dp, first, last, ep, etp, disp, kinds) in enumerate(layouts):
        per_row = n_cat // 2 if model.experts and tp > 1 else n_cat  # MoE with TP needs SP (Megatron-core)
        key = (pp, first, last)
        if key not in vpp_of:  # every stage's layers divide by vpp
            # uneven: the first, the last and each middle stage's own layers (validate's rule)
            middle = (model.layers - first - last) // (pp - 2) if pp > 2 else 0
            per_stage = model.layers // pp if first < 0 else math.gcd(first, last, middle)
            vpp_of[key] = divisors(per_stage)
        for mb in mb_of[dp]:
            if c.max_micro_batch is not None and mb > c.max_micro_batch:
                continue
            n_mb += 1
            if mb_cap is not None and mb > mb_cap[i]:
                continue
            n_lean += 1
            m = global_batch // (dp * mb)
            for v in vpp_of[key]:
                if v == 1 or (pp > 1 and m % pp == 0):
                    total += per_row * len(kinds)
                    by_cp[cp] = by_cp.get(cp, 0) + per_row * len(kinds)
                    by_mb[mb] = by_mb.get(mb, 0) + per_row * len(kinds)
                    if total <= MAX_CANDIDATES:
                        base += [(dp, tp, pp, cp, mb, v, ep, k, first, last, etp, disp) for k in kinds]
    if total > MAX_CANDIDATES:  # refused before the table is built, with the limits that would do
        raise TooManyPlans(
            f"more than {MAX_CANDIDATES:,} candidate plans for {world:,} GPUs and global batch {global_batch:,} "
            f"({total:,}); narrow the search: {_narrowing(by_cp, '--max-cp')}{_narrowing(by_mb, '--max-micro-batch')}"
            "--max-pp, fewer ZeRO stages or recompute modes",
            total,
        )
    if c.max_micro_batch is not None:
        funnel.append({"constraint": f"max micro batch {c.max_micro_batch} (per layout)", "remaining": n_mb})
    if mb_cap is not None:
        funnel.append(
            {
                "constraint": "micro batches the leanest plan of their layout fits (ZeRO-3 or the most sharding allowed, "
                "the most recompute allowed, SP, vpp 1)",
                "remaining": n_lean,
            }
        )
    funnel.append(
        {
            "constraint": "vpp divides layers/pp; vpp > 1 needs pp > 1 and microbatches divisible by pp"
            + (
                "; × (etp tp, ep dividing dp·cp) and (etp 1, ep dividing dp·cp·tp), ep dividing the experts; "
                f"dispatchers {list(c.dispatchers)} where ep > 1 (flex only where EP spans domains, alltoall inside)"
                if model.experts
                else ""
            )
            + f"; × cp kinds {list(c.cp_kinds)} where cp > 1 (Ulysses: cp·tp dividing the heads)",
            "remaining": len(base),
        }
    )
    cols = ["dp", "tp", "pp", "cp", "micro_batch", "vpp", "ep", "ck", "fl", "ll", "etp", "disp"]
    b = np.array(base, dtype=np.int64).reshape(-1, len(cols))
    if not c.order.strip().lower().endswith("pp"):  # validate._expert_layout_errors: Megatron-LM refuses them
        dp, tp, pp, cp, ep, etp = b[:, 0], b[:, 1], b[:, 2], b[:, 3], b[:, 6], b[:, 10]
        b = b[(pp == 1) | ((dp * tp * pp * cp) // (etp * ep * pp) == dp)]
        funnel.append(
            {
                "constraint": f"rank order {c.order} is not pp-last: with pp > 1 the expert layout's data-parallel "
                "size must equal dp (no cp, ep or etp < tp), as Megatron-LM requires",
                "remaining": len(b),
            }
        )
    zero = np.array(c.zero, dtype=np.int64)
    rc = np.array([RECOMPUTE.index(r) for r in c.recompute], dtype=np.int64)
    cat = np.array(list(itertools.product((False, True), zero, rc)), dtype=np.int64).reshape(-1, 3)
    # each base row x each (sp, zero, recompute), base rows outer; which pairs stand decided on the
    # (rows, categories) grid, so only those are built
    tp, cp, sp = b[:, 1:2], b[:, 3:4], cat[:, 0].astype(bool)
    ok = ~sp | ((tp > 1) & ((model.seq_len // cp) % tp == 0))
    if model.experts:  # Megatron-core's MoE layer refuses to train with TP but no SP (moe_layer.py)
        ok &= sp | (tp == 1)
    row, pick = np.divmod(np.flatnonzero(ok), len(cat))
    rows = {k: b[row, i] for i, k in enumerate(cols)}
    rows["sp"], rows["zero"], rows["rc"] = sp[pick], cat[pick, 1], cat[pick, 2]
    funnel.append(
        {
            "constraint": f"× sp, ZeRO {list(c.zero)}, recompute {list(c.recompute)}; SP needs tp > 1 and "
            f"tp dividing seq_len/cp" + ("; MoE with tp > 1 needs SP" if model.experts else ""),
            "remaining": len(rows["dp"]),
        }
    )
    if c.require_sp:
        keep = rows["sp"] | (rows["tp"] == 1)
        rows = {k: v[keep] for k, v in rows.items()}
        funnel.append({"constraint": "SP required whenever tp > 1", "remaining": len(rows["dp"])})
    if model.experts and (c.base.ep_overlap or c.base.capacity_pad):
        rows = _moe_rules(rows, c.base, funnel)
    return pd.DataFrame(rows, copy=False), funnel


def _moe_rules(rows: dict, base: Plan, funnel: list[dict]) -> dict:
    """validate._moe_errors' rules for the base plan's EP overlap and padding, as filters."""
    gather, flex = DISPATCHERS.index("allgather"), DISPATCHERS.index("flex")
    keep, names = np.ones(len(rows["dp"]), dtype=bool), []
    if base.ep_overlap:
        keep &= (rows["ep"] > 1) & (rows["disp"] != gather) & (rows["rc"] != RECOMPUTE.index("full"))
        keep &= (rows["pp"] == 1) | (rows["vpp"] > 1)
        names.append("EP overlap: ep > 1, alltoall or flex, no full recompute, vpp > 1 where pp > 1")
    if base.capacity_pad:
        keep &= rows["disp"] != flex
        names.append("padding to capacity: no flex dispatcher")
    funnel.append({"constraint": "; ".join(names), "remaining": int(keep.sum())})
    return {k: v[keep] for k, v in rows.items()}


def _narrowing(counts: dict[int, int], flag: str) -> str:
    """'<flag> N (k plans), ' for the largest N that leaves at most MAX_CANDIDATES, '' if none does."""
    kept, best = 0, None
    for value in sorted(counts):
        kept += counts[value]
        if kept > MAX_CANDIDATES:
            break
        best = (value, kept)
    return f"{flag} {best[0]} ({best[1]:,} plans), " if best and best[0] < max(counts) else ""


def leanest_micro_batch(
    model: Model, layouts: list, global_batch: int, c: Constraints, cluster: Cluster, acts: ActivationOptions | None
) -> np.ndarray:
    """The largest micro batch (a divisor of global_batch / dp; 0: none) each of candidates' layouts
    fits in the search's memory budget with its leanest settings: the most ZeRO sharding and the most
    recomputation c allows, SP where it may, no interleaving, the CP kind that keeps least. A plan's
    memory grows with its micro batch (the tokens in flight, mb x min(pp, microbatches), never
    shrink), so each layout's bound is found by bisection over its micro batches, all layouts at once."""
    n = len(layouts)
    if not n:
        return np.zeros(0, dtype=np.int64)
    cols = np.array([x[:9] for x in layouts], dtype=np.int64)  # tp, pp, cp, dp, first, last, ep, etp, disp
    tp, pp, cp, dp = cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3]
    mbs = {d: divisors(global_batch // d) for d in np.unique(dp).tolist()}
    width = max(len(v) for v in mbs.values())
    table = np.full((n, width), np.iinfo(np.int64).max, dtype=np.int64)  # each layout's micro batches, padded
    count = np.zeros(n, dtype=np.int64)
    for d, values in mbs.items():
        rows = dp == d
        table[rows, : len(values)] = values
        count[rows] = len(values)
    recompute = next(r for r in ("full", "selective", "none") if r in c.recompute)
    budget = cluster.gpu_memory_bytes * (1 - c.headroom)
    base = dataclasses.replace(c.base, global_batch=global_batch)
    kinds = sorted({k for x in layouts for k in x[9]})
    frame = {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "vpp": np.ones(n, dtype=np.int64),
        "zero": np.full(n, max(c.zero)),
        "ep": cols[:, 6],
        "etp": cols[:, 7],
        "fl": cols[:, 4],
        "ll": cols[:, 5],
        "disp": cols[:, 8],
        "sp": (tp > 1) & ((model.seq_len // cp) % tp == 0),
        "rc": np.full(n, RECOMPUTE.index(recompute)),
    }
    lo, hi = np.full(n, -1, dtype=np.int64), count - 1  # index of the largest that fits, in [lo, hi]
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        least = np.full(n, np.inf)
        for k in kinds:  # the leanest CP kind each layout may use
            usable = np.array([k in x[9] for x in layouts])
            mb = table[np.arange(n), np.maximum(mid, 0)]
            cands = {**frame, "micro_batch": np.minimum(mb, global_batch), "ck": np.full(n, k)}
            total = memory_per_gpu_bytes(model, columns_of(cands, base), acts or ActivationOptions())["total"]
            least = np.where(usable, np.minimum(least, total), least)
        fits = least <= budget
        active = lo < hi
        lo = np.where(active & fits, mid, lo)
        hi = np.where(active & ~fits, mid - 1, hi)
    return np.where(lo >= 0, table[np.arange(n), np.maximum(lo, 0)], 0)


# ---------------------------------------------------------------- the plan model over columns


def columns_of(cands: Columns, base: Plan) -> PlanColumns:
    """The candidates (candidates' table, or its columns as arrays) as a PlanColumns, for parallel.core's
    formulas: each row's explored fields (PLAN_KEYS), every other field the base plan's (its global
    batch included)."""
    ints = {
        k: np.asarray(cands[k], np.int64) for k in ("dp", "tp", "pp", "cp", "micro_batch", "vpp", "zero", "ep", "etp")
    }
    shared = {k: getattr(base, k) for k in PLAN_DEFAULTS if k not in PLAN_KEYS}
    plans = PlanColumns(
        **ints,
        **shared,
        sp=np.asarray(cands["sp"], bool),
        # the names as references to three strings (8 bytes a row, not a 36-byte copy of each); the
        # formulas compare their integer codes (plan.equals)
        recompute=np.array(RECOMPUTE, dtype=object)[np.asarray(cands["rc"])],
        cp_kind=np.array(CP_KINDS, dtype=object)[np.asarray(cands["ck"])],
        moe_dispatcher=np.array(DISPATCHERS, dtype=object)[np.asarray(cands["disp"])],
    )
    if (np.asarray(cands["fl"]) >= 0).any():  # uneven stages: -1 where a row splits evenly
        plans = dataclasses.replace(
            plans,
            first_stage_layers=np.asarray(cands["fl"], np.int64),
            last_stage_layers=np.asarray(cands["ll"], np.int64),
        )
    plans.memo[("codes", "recompute")] = np.asarray(cands["rc"], np.int64)  # PlanColumns.distinct's keys
    plans.memo[("codes", "cp_kind")] = np.asarray(cands["ck"], np.int64)
    plans.memo[("codes", "moe_dispatcher")] = np.asarray(cands["disp"], np.int64)
    return plans


def evaluate(
    model: Model,
    cluster: Cluster,
    cands: Columns,
    base: Plan,
    options: Options = Options(),
    memory: dict | None = None,
) -> pd.DataFrame:
    """Memory of the most loaded GPU and step time of every candidate row (each `base` with the row's
    fields): parallel.core's own formulas (memory_per_gpu_bytes, step_time), evaluated over the
    columns at once. `memory`: memory_per_gpu_bytes' columns for these rows, when the caller has them."""
    plans = columns_of(cands, base)
    memory = memory or memory_per_gpu_bytes(model, plans, options.activations)
    timing = step_time(model, plans, cluster, options.perf, options.comm, options.activations)
    out = {k: np.asarray(cands[k]) for k in ("dp", "tp", "pp", "cp", "sp", "vpp", "micro_batch", "zero", "ep", "etp")}
    out["moe_dispatcher"] = pd.Categorical.from_codes(np.asarray(cands["disp"]), categories=DISPATCHERS)
    out["first_stage_layers"] = np.asarray(cands["fl"])
    out["last_stage_layers"] = np.asarray(cands["ll"])
    out["recompute"] = pd.Categorical.from_codes(np.asarray(cands["rc"]), categories=RECOMPUTE)
    out["cp_kind"] = pd.Categorical.from_codes(np.asarray(cands["ck"]), categories=CP_KINDS)
    out["microbatches"] = np.maximum(plans.microbatches, 1)
    for name in ("params", "grads", "optimizer", "activations"):
        out[f"{name}_bytes"] = memory[name]
    out["memory_per_gpu_bytes"] = memory["total"]
    out["activation_bytes_per_layer"] = activation_bytes_per_layer(model, plans, options.activations)
    out.update(
        {
            "step_time_s": timing["step_time_s"],
            "bubble_fraction": bubble_fraction(plans),
            "mfu": timing["mfu"],
            "compute_s": timing["compute_s"],
            "bubble_s": timing["bubble_s"],
            **{f"exposed_{d}_s": timing[f"exposed_{d}_s"] for d in COMM_DIMS},
            "tp_link": pd.Categorical.from_codes(crosses_nodes(plans, cluster, ("tp",)).astype(np.int8), LINKS),
            "dp_link": pd.Categorical.from_codes(crosses_nodes(plans, cluster, ("dp", "cp")).astype(np.int8), LINKS),
        }
    )
    return pd.DataFrame(
        {k: np.broadcast_to(v, len(plans)) if np.ndim(v) == 0 else v for k, v in out.items()}, copy=False
    )


# ---------------------------------------------------------------- the search


def _rank_order(table: pd.DataFrame) -> np.ndarray:
    """The rows fastest first; ties (e.g. ZeRO 0 vs 1 cost the same traffic) broken by memory, then
    simpler plans (recompute, ZeRO, vpp, cp, pp, tp, micro batch, in that order)."""
    rc = pd.Categorical(table["recompute"], categories=RECOMPUTE).codes.astype(np.int64)
    ties = [table[k].to_numpy().astype(np.int64) for k in ("micro_batch", "tp", "pp", "cp", "vpp", "zero")] + [rc]
    # the integer tie-breakers packed into one key (the first the least significant) where they fit 62 bits:
    # np.lexsort's cost grows with its keys
    bases = [int(k.max(initial=0)) + 1 for k in ties]
    if math.prod(bases) < 1 << 62:
        packed = np.zeros(len(table), dtype=np.int64)
        for key, base in zip(reversed(ties), reversed(bases)):
            packed = packed * base + key
        ties = [packed]
    # by step first (one stable argsort), then only the rows of equal steps -- a few in a thousand --
    # by memory and the tie-breakers: np.lexsort over every row and key costs three times as much
    step = table["step_time_s"].to_numpy().round(9)
    order = np.argsort(step, kind="stable")
    ordered = step[order]
    equal = ordered[1:] == ordered[:-1]
    if equal.any():
        at = np.flatnonzero(np.r_[equal, False] | np.r_[False, equal])  # positions in runs of equal steps
        run = np.cumsum(np.r_[True, ordered[at][1:] != ordered[at][:-1]])
        rows = order[at]
        mem = table["memory_per_gpu_bytes"].to_numpy()
        # np.lexsort: the last key is the primary one; it is stable, so rows equal on all keep their order
        order[at] = rows[np.lexsort([*(k[rows] for k in ties), mem[rows], run])]
    return order


def pareto_front(table: pd.DataFrame, order: np.ndarray | None = None) -> np.ndarray:
    """True for plans no other plan beats on both memory and step time (lower is better on both).
    `order`: the rows by step time, then memory, when the caller has it (_rank_order: steps equal to
    the nanosecond are one step there, as in the ranking)."""
    if order is None:
        order = np.lexsort((table["memory_per_gpu_bytes"].to_numpy(), table["step_time_s"].to_numpy()))
    mem = table["memory_per_gpu_bytes"].to_numpy()[order]
    best = np.minimum.accumulate(mem)
    keep = np.ones(len(mem), dtype=bool)
    keep[1:] = mem[1:] < best[:-1]
    out = np.zeros(len(mem), dtype=bool)
    out[order] = keep
    return out


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


# Past MAX_CANDIDATES the search keeps at least this many tokens on each CP rank (unless --max-cp says
# otherwise): below it the ring's attention blocks (seq_len / 2cp keys) are too short for a flash kernel
# to reach its rate (compute.attention_rate: 36% of its long-sequence rate at 512) and CP's exchange
# cannot hide behind them, so such plans are never among the fastest.
CP_MIN_TOKENS = 1024


def narrowed_for_size(model: Model, c: Constraints) -> Constraints | None:
    """The constraints with CP_MIN_TOKENS a CP rank, where that is new (no --max-cp, a sequence that
    CP could cut below it); None when it would not narrow anything."""
    if c.max_cp is not None or c.min_cp_tokens is not None or model.seq_len < 2 * CP_MIN_TOKENS:
        return None
    return dataclasses.replace(c, min_cp_tokens=CP_MIN_TOKENS)


MAX_LAYOUT_RANKS = 400_000_000  # layouts x ranks the node-crossing checks lay out (~5 times each): ~30 s on one core


def search(
    model: Model,
    cluster: Cluster,
    global_batch: int,
    constraints: Constraints = Constraints(),
    options: Options = Options(),
) -> SearchResult:
    """Every plan for `model` on all of `cluster`'s GPUs that fits in memory, fastest first.

    Raises SearchEmpty naming the constraint that removed the last candidates."""
    t0 = time.perf_counter()
    world = cluster.gpus
    if world > MAX_WORLD_SIZE:
        raise SpecError(f"{world:,} GPUs; plans are limited to {MAX_WORLD_SIZE:,}")
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        raise SpecError(f"global batch {global_batch:,} sequences; it must be 1 to {MAX_GLOBAL_BATCH:,}")
    constraints = _for_attention(constraints)
    base = dataclasses.replace(constraints.base, global_batch=global_batch)
    try:
        cands, funnel = candidates(model, world, global_batch, constraints, cluster, options.activations)
    except TooManyPlans as whole:
        narrowed = narrowed_for_size(model, constraints)
        if narrowed is None:
            raise
        try:
            cands, funnel = candidates(model, world, global_batch, narrowed, cluster, options.activations)
        except TooManyPlans:
            raise whole from None  # its counts are of the space the flags it suggests narrow
    for step in funnel:
        if step["remaining"] == 0:
            raise SearchEmpty(_empty_message(model, cluster, global_batch, funnel, step), funnel)
    # memory first: only the plans that fit are timed
    plans = columns_of(cands, base)
    memory = memory_per_gpu_bytes(model, plans, options.activations)
    budget = cluster.gpu_memory_bytes * (1 - constraints.headroom)
    fits = memory["total"] <= budget
    name = (
        f"memory per GPU ≤ {_gib(budget)} ({_gib(cluster.gpu_memory_bytes)} less {constraints.headroom:.0%} headroom)"
        if constraints.headroom
        else f"memory per GPU ≤ {_gib(budget)}"
    )
    funnel.append({"constraint": name, "remaining": int(fits.sum())})
    if not fits.any():
        i = int(np.argmin(memory["total"]))
        least = {**cands.iloc[i].to_dict(), "recompute": RECOMPUTE[int(cands["rc"].iloc[i])]}
        raise SearchEmpty(
            f"no plan fits: all {len(cands):,} valid plans of {model.name} on {world} GPUs need more than "
            f"{_gib(budget)} per GPU ({_gib(cluster.gpu_memory_bytes)} less {constraints.headroom:.0%} "
            f"headroom); the leanest, {plan_of(least, base).label()}, needs "
            f"{_gib(memory['total'][i])}; try {_memory_hints(constraints)}",
            funnel,
        )
    kept = {k: cands[k].to_numpy()[fits] for k in cands.columns}  # columns, not a frame: no block copies
    layouts = len(np.unique(plans.distinct_degrees()[1][fits]))  # each laid out over every rank once
    if layouts * world > MAX_LAYOUT_RANKS:
        raise SpecError(
            f"{model.name} on {world:,} GPUs: {layouts:,} distinct layouts of {world:,} ranks each are past the "
            f"search's budget of {MAX_LAYOUT_RANKS:,} rank placements; narrow it (--max-tp, --max-pp, --max-cp) "
            "or search fewer GPUs"
        )
    evaluated, memory = len(cands), {k: v[fits] for k, v in memory.items()}
    # every candidate's columns and what was worked out for them go before the fitting ones are timed:
    # the memory they free is what the timing's own columns then take (a fresh process touches less)
    del cands, plans, fits
    table = evaluate(model, cluster, kept, base, options, memory)
    del kept, memory
    order = _rank_order(table)
    table["pareto"] = pareto_front(table, order)
    ranked = by_simplicity(table, order, model.seq_len)
    return SearchResult(ranked, funnel, evaluated=evaluated, seconds=time.perf_counter() - t0, base=base)


def within_model_error(step_s: Any, fastest_s: Any) -> np.ndarray:
    """True where a step is within MODEL_ERROR of the fastest one: the model cannot tell them apart."""
    return np.asarray(step_s) <= np.asarray(fastest_s) * (1 + MODEL_ERROR)


def simplicity_terms(table: pd.DataFrame, seq_len: int) -> dict[str, np.ndarray]:
    """EQUIVALENCE_RULE's count term by term, one int array per term (fewer is simpler): each parallel
    dimension in use (dp, tp, pp, cp, ep, vpp for interleaving), ZeRO-2/3, recomputation, TP across
    nodes (two), CP below CP_NEEDED_TOKENS (one more)."""
    t = table
    terms = {k: (t[k].to_numpy() > 1).astype(np.int64) for k in ("dp", "tp", "pp", "cp", "ep", "vpp")}
    terms["zero"] = (t["zero"].to_numpy() >= 2).astype(np.int64)
    terms["recompute"] = (pd.Categorical(t["recompute"], categories=RECOMPUTE).codes > 0).astype(np.int64)
    crossing = pd.Categorical(t["tp_link"], categories=LINKS).codes == LINKS.index("inter")
    terms["tp_across_nodes"] = 2 * crossing.astype(np.int64)
    terms["cp_short_sequence"] = ((t["cp"].to_numpy() > 1) & (seq_len < CP_NEEDED_TOKENS)).astype(np.int64)
    return terms


def simplicity(table: pd.DataFrame, seq_len: int) -> np.ndarray:
    """EQUIVALENCE_RULE's count: the sum of simplicity_terms; fewer is simpler."""
    return sum(simplicity_terms(table, seq_len).values())


def by_simplicity(table: pd.DataFrame, order: np.ndarray, seq_len: int) -> pd.DataFrame:
    """`table` in `order` (fastest first), the plans within MODEL_ERROR of the fastest reordered by
    simplicity, then time; columns `equivalent` and `simplicity` added. One gather of the rows."""
    if table.empty:
        return table.assign(equivalent=pd.Series(dtype=bool), simplicity=pd.Series(dtype=np.int64))
    steps = table["step_time_s"].to_numpy()
    equivalent = within_model_error(steps, steps[order[0]])
    simple = simplicity(table, seq_len)
    band = order[equivalent[order]]
    band = band[np.lexsort((steps[band], simple[band]))]  # stable: ties keep the ranked order
    final = np.concatenate([band, order[~equivalent[order]]])
    # each column gathered by numpy (a third faster than DataFrame.iloc's take) into one new frame
    cols = {k: _gathered(table[k], final) for k in table.columns}
    cols.update(equivalent=equivalent[final], simplicity=simple[final])
    return pd.DataFrame(cols, copy=False)


def _gathered(column: pd.Series, rows: np.ndarray) -> Any:
    """The column's values at `rows`, a categorical one kept categorical."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return pd.Categorical.from_codes(column.cat.codes.to_numpy()[rows], dtype=column.dtype)
    return column.to_numpy()[rows]


def _memory_hints(c: Constraints) -> str:
    hints = ["more GPUs"]
    if "full" not in c.recompute:
        hints.append("allowing full recompute")
    if 3 not in c.zero:
        hints.append("allowing ZeRO-3")
    hints += [f"a --max-{d} above {getattr(c, 'max_' + d)}" for d in ("tp", "pp", "cp") if getattr(c, "max_" + d)]
    if c.headroom:
        hints.append("less headroom")
    return ", ".join(hints[:-1]) + " or " + hints[-1] if len(hints) > 1 else hints[0]


def _empty_message(model: Model, cluster: Cluster, gb: int, funnel: list[dict], step: dict) -> str:
    i = funnel.index(step)
    if i == 0:
        return f"no plan: {cluster.gpus} GPUs cannot be split into dp×tp×pp×cp"
    return (
        f"no plan for {model.name} on {cluster.gpus} GPUs (global batch {gb}): the constraint "
        f"'{step['constraint']}' removed the last {funnel[i - 1]['remaining']:,} candidates"
    )


def search_naive(
    model: Model,
    cluster: Cluster,
    global_batch: int,
    constraints: Constraints = Constraints(),
    options: Options = Options(),
) -> pd.DataFrame:
    """The same search as a plain loop over every degree combination through parallel.core.report.plan_report:
    the reference `search` is tested against (slow: ~1 ms a plan)."""
    c, world = _for_attention(constraints), cluster.gpus
    base = dataclasses.replace(c.base, global_batch=global_batch)
    budget = cluster.gpu_memory_bytes * (1 - c.headroom)
    rows = []
    for tp, pp, cp in itertools.product(divisors(world), repeat=3):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        splits = stage_splits(model, pp) or [(-1, -1)]  # no split: validate refuses the plan
        if any(lim is not None and x > lim for x, lim in ((tp, c.max_tp), (pp, c.max_pp), (cp, c.max_cp))):
            continue
        # every (ep, etp, dispatcher): validate refuses the bad ones
        experts = (
            [
                (ep, etp, d)
                for etp in dict.fromkeys((tp, 1))
                for ep in divisors(dp * cp * tp // etp)
                for d in search_dispatchers(ep, etp, c, cluster.domain_gpus, world)
            ]
            if model.experts
            else [(1, tp, c.base.moe_dispatcher)]
        )
        kinds = c.cp_kinds if cp > 1 else ("allgather",)  # every kind: validate refuses Ulysses' bad ones
        for mb, v, sp, zero, rc, (ep, etp, disp), kind, (first, last) in itertools.product(
            divisors(global_batch), divisors(model.layers), (False, True), c.zero, c.recompute, experts, kinds, splits
        ):
            if (c.max_micro_batch and mb > c.max_micro_batch) or (c.require_sp and tp > 1 and not sp):
                continue
            plan = dataclasses.replace(
                base,
                dp=dp,
                tp=tp,
                pp=pp,
                cp=cp,
                sp=sp,
                vpp=v,
                micro_batch=mb,
                zero=zero,
                recompute=rc,
                ep=ep,
                etp=None if etp == tp else etp,
                moe_dispatcher=disp,
                cp_kind=kind,
                **({"first_stage_layers": first, "last_stage_layers": last} if first >= 0 else {}),
            )
            rep = plan_report(plan, model, cluster, options)
            if rep["memory_per_gpu_bytes"] is None:
                continue
            shape_ok = not [e for e in rep["errors"] if not e.startswith("memory per GPU")]
            if shape_ok and rep["memory_per_gpu_bytes"]["total"] <= budget:
                rows.append(
                    {
                        **{k: getattr(plan, k) for k in PLAN_KEYS},
                        "etp": plan.expert_tp,
                        "first_stage_layers": -1 if plan.first_stage_layers is None else plan.first_stage_layers,
                        "last_stage_layers": -1 if plan.last_stage_layers is None else plan.last_stage_layers,
                        "memory_per_gpu_bytes": rep["memory_per_gpu_bytes"]["total"],
                        "step_time_s": rep["step_time_s"],
                        "bubble_fraction": rep["bubble_fraction"],
                        "mfu": rep["step_time"]["mfu"],
                    }
                )
    return pd.DataFrame(rows)


def result_json(result: SearchResult, top: int | None = None) -> list[dict]:
    """The `--json` list, best first: each row's `label`, its `plan` (every field of the schema: given
    to `parallel plan --import` with the model and cluster it reproduces the row), memory, time, ..."""
    table = result.table if not top else result.table.head(top)
    out = []
    for i, row in enumerate(table.to_dict("records")):
        plan = plan_of(row, result.base)
        out.append(
            {
                "rank": i + 1,
                "label": plan.label(),
                "plan": plan.to_dict(),
                "memory_per_gpu_bytes": float(row["memory_per_gpu_bytes"]),
                "step_time_s": float(row["step_time_s"]),
                "bubble_fraction": float(row["bubble_fraction"]),
                "mfu": float(row["mfu"]),
                "pareto": bool(row["pareto"]),
                "equivalent": bool(row.get("equivalent", False)),
                "memory_by_component_bytes": {
                    k: float(row[f"{k}_bytes"]) for k in ("params", "grads", "optimizer", "activations")
                },
                "exposed_comm_s": {d: float(row[f"exposed_{d}_s"]) for d in COMM_DIMS},
            }
        )
    return out
