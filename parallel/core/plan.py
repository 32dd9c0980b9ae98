"""The parallel plan: how a job splits one model over dp x tp x pp x cp ranks (frozen, JSON round trip).

A Plan checks what it can on its own when it is built (positive degrees, known names); whether it
fits a given model and cluster is `parallel.core.validate.check`'s job, which returns every problem at
once with the numbers in the message.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from parallel.core.specs import SpecError, _from_dict, _positive
from parallel.core.topology import DEFAULT_ORDER, Topology, TopologyError, parse_order

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")
# Gradient dtype of the accumulation buffer that is reduced and fed to the optimizer (Megatron-LM:
# fp32 unless --grad-reduce-in-bf16 / --main-grads-dtype bf16; torchtitan: mixed_precision_reduce).
MAIN_GRADS = ("fp32", "bf16")
# FP8 training (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; Transformer Engine):
# none; gemm = FP8 GEMMs, bf16 weights with an FP8 copy of each GEMM weight (Megatron --fp8-format,
# torchtitan float8); weights = FP8 primary GEMM weights, fp32 master copy in the optimizer
# (Megatron --fp8-param-gather). See parallel.core.memory for what each stores.
FP8 = ("none", "gemm", "weights")
# How context parallelism exchanges the sequence (parallel.core.memory / comm have each one's cost):
# allgather = K/V all-gathered before attention (Megatron-LM's --cp-comm-type allgather; Llama 3);
# ring = K/V blocks passed around the CP ring with an online softmax (Liu et al. 2023, Ring
# Attention; Megatron-LM's default p2p); ulysses = all-to-all from sequence to head shards and back
# (Jacobs et al. 2023, DeepSpeed-Ulysses; Megatron-LM's a2a).
CP_KINDS = ("allgather", "ring", "ulysses")


MAX_WORLD_SIZE = 1 << 24  # 16.8 M GPUs: far past any cluster, small enough to lay out in memory
MAX_GLOBAL_BATCH = 1 << 32  # sequences per step; keeps the divisor searches over it bounded


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sp: bool = False  # Megatron sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2); needs tp > 1
    micro_batch: int = 1
    global_batch: int = 1
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B, Narayanan et al. 2021)
    zero: int = 0  # ZeRO stage 0-3 over the DP group (Rajbhandari et al. 2020)
    recompute: str = "none"  # activation recomputation: none | selective | full
    order: str = DEFAULT_ORDER  # rank order, fastest axis first (see parallel.core.topology)
    schedule: str = "1f1b"  # pipeline schedule: 1f1b | gpipe
    main_grads: str = "fp32"  # gradient buffer dtype: fp32 (Megatron-LM's default) | bf16
    fp8: str = "none"  # none | gemm | weights (see FP8)
    # Expert parallelism (Lepikhin et al. 2021, GShard): a MoE layer's routed experts are split over
    # ep ranks taken from the data-parallel x context ranks (Megatron-LM's expert layout: tp x ep x
    # expert-dp x pp = the world), so ep adds no GPUs; the experts' ZeRO shards over dp*cp/ep.
    ep: int = 1
    # Expert tensor parallelism (Megatron-LM --expert-tensor-parallel-size): the experts' matrices split
    # over etp ranks instead of tp; None = tp (Megatron's default). Expert layout: etp x ep x edp x pp.
    etp: int | None = None
    cp_kind: str = "allgather"  # see CP_KINDS; no effect at cp 1
    # Communication hidden behind computation, as the frameworks overlap it (parallel.core.perf):
    # tp_overlap: TP/SP collectives split into chunks and run under the GEMMs they feed (Megatron-LM
    # --tp-comm-overlap, torchtitan's async TP); grad_reduce_overlap: the data-parallel gradient
    # reduction bucket by bucket during the last backward (Megatron --overlap-grad-reduce, DDP,
    # FSDP2); param_gather_overlap: ZeRO's weight all-gather under the forward (Megatron
    # --overlap-param-gather, FSDP2's prefetch); p2p_overlap: pipeline sends and receives under the
    # neighbouring microbatch's work (Megatron's interleaved schedule, --overlap-p2p-communication).
    tp_overlap: bool = False
    grad_reduce_overlap: bool = False
    param_gather_overlap: bool = False
    p2p_overlap: bool = False
    # Uneven pipeline stages (Megatron-LM --decoder-first/last-pipeline-num-layers): the first / last
    # stage's transformer layers, the rest split evenly over the other stages; None = even.
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    # Megatron-LM --account-for-embedding/loss-in-pipeline-split: the embedding (the loss) counts as
    # one layer of the split, so the first (last) stage holds one transformer layer fewer.
    embedding_in_split: bool = False
    loss_in_split: bool = False
    # With recompute "full": recompute only this many layers of each virtual stage chunk, keeping the
    # others' activations (Megatron-LM --recompute-method block --recompute-num-layers N; torchtitan's
    # activation checkpointing of every k-th layer); None = every layer.
    recompute_layers: int | None = None

    def __post_init__(self):
        _positive(self, "dp", "tp", "pp", "cp", "micro_batch", "global_batch", "vpp", "ep")
        if self.world_size > MAX_WORLD_SIZE:  # the rank layout is an array of this many ints
            raise SpecError(
                f"dp×tp×pp×cp = {self.dp}×{self.tp}×{self.pp}×{self.cp} = {self.world_size:,} GPUs; "
                f"plans are limited to {MAX_WORLD_SIZE:,}"
            )
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise SpecError(f"global batch {self.global_batch:,} sequences; at most {MAX_GLOBAL_BATCH:,}")
        if not isinstance(self.sp, bool):
            raise SpecError(f"Plan.sp must be true or false, got {self.sp!r}")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise SpecError(f"Plan.zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise SpecError(f"Plan.recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise SpecError(f"Plan.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.etp is not None:
            _positive(self, "etp")
        if self.main_grads not in MAIN_GRADS:
            raise SpecError(f"Plan.main_grads must be one of {', '.join(MAIN_GRADS)}, got {self.main_grads!r}")
        if self.fp8 not in FP8:
            raise SpecError(f"Plan.fp8 must be one of {', '.join(FP8)}, got {self.fp8!r}")
        if self.cp_kind not in CP_KINDS:
            raise SpecError(f"Plan.cp_kind must be one of {', '.join(CP_KINDS)}, got {self.cp_kind!r}")
        for name in (
            "tp_overlap",
            "grad_reduce_overlap",
            "param_gather_overlap",
            "p2p_overlap",
            "embedding_in_split",
            "loss_in_split",
        ):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"Plan.{name} must be true or false, got {getattr(self, name)!r}")
        if self.recompute_layers is not None:
            _positive(self, "recompute_layers")
            if self.recompute != "full":
                raise SpecError(f"Plan.recompute_layers needs recompute 'full', got {self.recompute!r}")
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise SpecError(f"Plan.{name} must be a non-negative integer or null, got {value!r}")
        try:
            parse_order(self.order)
        except TopologyError as err:
            raise SpecError(str(err)) from None

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> int:
        """Microbatches per optimizer step on each pipeline: global_batch / (dp * micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def cp_exchange(self) -> str:
        """The CP exchange in effect: cp_kind, or the default at cp 1 (where nothing is exchanged)."""
        return self.cp_kind if self.cp > 1 else CP_KINDS[0]

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: etp, else tp."""
        return self.tp if self.etp is None else self.etp

    def topology(self, gpus_per_node: int) -> Topology:
        return Topology(
            dp=self.dp,
            pp=self.pp,
            cp=self.cp,
            tp=self.tp,
            gpus_per_node=gpus_per_node,
            order=self.order,
            ep=self.ep,
            etp=self.expert_tp,
        )

    def label(self) -> str:
        """A short human name: 'DP8 TP8+SP PP8 v2 ZeRO-1 mb1'."""
        parts = [f"DP{self.dp}", f"TP{self.tp}" + ("+SP" if self.sp else ""), f"PP{self.pp}"]
        if self.cp > 1:
            parts.append(f"CP{self.cp}" + ("" if self.cp_kind == "allgather" else f"-{self.cp_kind}"))
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}" + (f"{self.recompute_layers}" if self.recompute_layers else ""))
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"ETP{self.etp}")
        if self.fp8 != "none":
            parts.append("FP8" + ("-weights" if self.fp8 == "weights" else ""))
        if self.uneven:
            parts.append(
                f"stages {self.first_stage_layers if self.first_stage_layers is not None else '='}"
                f"/{self.last_stage_layers if self.last_stage_layers is not None else '='}"
                if self.first_stage_layers is not None or self.last_stage_layers is not None
                else "emb/loss in split"
            )
        parts.append(f"mb{self.micro_batch}")
        return " ".join(parts)

    @property
    def uneven(self) -> bool:
        """Whether the pipeline's first or last stage holds another number of layers than the rest."""
        return (
            self.first_stage_layers is not None
            or self.last_stage_layers is not None
            or self.embedding_in_split
            or self.loss_in_split
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        return _from_dict(cls, data)


@dataclass(frozen=True)
class PlanColumns:
    """Many plans at once, one numpy array per field (the same names as Plan), so the plan model's
    formulas (parallel.core.memory / comm / perf, written with parallel.core.vector) evaluate every
    candidate of a search in one call. global_batch, order, schedule, main_grads and fp8 are shared
    by all rows; ep and cp_kind may be shared or one per row."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    sp: np.ndarray  # bool
    micro_batch: np.ndarray
    vpp: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray  # str: none | selective | full
    global_batch: int = 1
    order: str = DEFAULT_ORDER
    schedule: str = "1f1b"
    main_grads: str = "fp32"
    fp8: str = "none"
    ep: Any = 1  # an array, or one degree shared by all rows
    etp: int | None = None  # shared; None = each row's tp
    cp_kind: Any = "allgather"  # an array of CP_KINDS names, or one shared by all rows
    tp_overlap: bool = False  # the overlaps are shared by all rows (Plan's fields)
    grad_reduce_overlap: bool = False
    param_gather_overlap: bool = False
    p2p_overlap: bool = False
    # uneven stages: arrays with -1 where a row splits evenly, or None (every row even)
    first_stage_layers: Any = None
    last_stage_layers: Any = None
    embedding_in_split: bool = False
    loss_in_split: bool = False
    recompute_layers: int | None = None  # shared by all rows

    @property
    def expert_tp(self) -> Any:
        return self.tp if self.etp is None else self.etp

    @property
    def world_size(self) -> np.ndarray:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> np.ndarray:
        return self.global_batch // (self.dp * self.micro_batch)

    def __len__(self) -> int:
        return len(self.dp)

    @cached_property
    def memo(self) -> dict:
        """Results that depend on these plans and hashable arguments alone (e.g. which groups cross
        nodes on a cluster), kept for the other formulas of the same evaluation."""
        return {}

    def distinct(self, keys: tuple[str, ...]) -> tuple["PlanColumns", np.ndarray]:
        """(the plans of the distinct rows over the fields `keys` -- the other per-row fields taken from
        each one's first row --, each plan's index into them): what depends on those fields alone is
        computed once per distinct row and spread back with the index."""
        memo = self.memo.setdefault(("distinct", keys), {})
        if "rows" not in memo:
            n = len(self)
            key = np.zeros(n, dtype=np.int64)
            for name in keys:
                if getattr(self, name) is None:  # a field no row sets (first / last stage layers)
                    continue
                values = np.broadcast_to(np.asarray(getattr(self, name)), (n,))
                if ("codes", name) in self.memo:  # the integer codes its maker kept beside the names
                    values = self.memo[("codes", name)]
                elif values.dtype.kind not in "iub":  # a name: its index among the known ones (no string sort)
                    names = {"recompute": RECOMPUTE, "cp_kind": CP_KINDS}.get(name) or tuple(np.unique(values))
                    codes = np.zeros(n, dtype=np.int64)
                    for i, known in enumerate(names):
                        codes[values == known] = i
                    values = codes
                values = values.astype(np.int64)
                key = key * (int(values.max(initial=0)) + 1) + values
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            fields = {}
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                fields[f.name] = value[first] if isinstance(value, np.ndarray) and value.shape == (n,) else value
            memo["rows"] = (PlanColumns(**fields), inverse.reshape(-1))
        return memo["rows"]

    def distinct_degrees(self, *, with_ep: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct (dp, tp, pp, cp[, ep]) rows, each plan's index into them): what depends on
        the degrees alone (the rank layout; the expert layout also on ep) is computed once per
        distinct row, not once per plan."""
        memo = self.memo.setdefault(("distinct_degrees", with_ep), {})
        if "rows" not in memo:
            cols = [np.asarray(x, dtype=np.int64) for x in (self.dp, self.tp, self.pp, self.cp)]
            if with_ep:
                cols.append(np.broadcast_to(np.asarray(self.ep, dtype=np.int64), cols[0].shape))
            key = cols[0]
            for c in cols[1:]:  # one int64 key per row: a 1-D unique is far faster than unique(axis=0)
                key = key * (int(c.max()) + 1) + c
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            memo["rows"] = (np.stack(cols, axis=1)[first], inverse.reshape(-1))
        return memo["rows"]


def memoized(plan: Plan | PlanColumns, key: Any, compute: Any) -> Any:
    """compute(), kept in a PlanColumns' memo under `key` for the other formulas of the same evaluation
    (a Plan computes it each time: it costs nothing there)."""
    if not isinstance(plan, PlanColumns):
        return compute()
    if key not in plan.memo:
        plan.memo[key] = compute()
    return plan.memo[key]


def stage_layer_counts(layers: int, plan: Plan | PlanColumns) -> tuple[Any, Any, Any]:
    """(first, every middle, last) stage's transformer layers: see _stage_layer_counts."""
    return memoized(plan, ("stage_layer_counts", layers), lambda: _stage_layer_counts(layers, plan))


def _stage_layer_counts(layers: int, plan: Plan | PlanColumns) -> tuple[Any, Any, Any]:
    """Transformer layers on the (first, every middle, last) pipeline stage, as Megatron-LM builds
    them (megatron/core/transformer/transformer_block.py, get_num_layers_to_build): the given first /
    last counts and the rest split evenly over the other stages; with the embedding / loss in the
    split, (layers + those) / pp slots a stage, one of them not a layer on the first / last stage;
    else layers / pp each. At pp 1 the one stage holds every layer. Arrays for a PlanColumns (rows
    a count cannot split evenly get a fractional middle: validate refuses them)."""
    p = plan.pp
    first_set, last_set = plan.first_stage_layers, plan.last_stage_layers
    if isinstance(plan, PlanColumns):
        f = np.asarray(-1 if first_set is None else first_set)
        lst = np.asarray(-1 if last_set is None else last_set)
        has_f, has_l = f >= 0, lst >= 0
    else:
        f, lst = (first_set if first_set is not None else -1), (last_set if last_set is not None else -1)
        has_f, has_l = first_set is not None, last_set is not None
    e, ls = int(plan.embedding_in_split), int(plan.loss_in_split)
    even = layers / p if isinstance(plan, PlanColumns) else layers // p if layers % p == 0 else layers / p
    slots = (layers + e + ls) / p
    rest = layers - np.where(has_f, f, 0) - np.where(has_l, lst, 0)
    left = p - np.asarray(has_f, dtype=np.int64) - np.asarray(has_l, dtype=np.int64)
    uneven_mid = np.where(left > 0, rest / np.maximum(left, 1), 0.0)
    explicit = np.asarray(has_f) | np.asarray(has_l)
    middle = np.where(explicit, uneven_mid, slots if (e or ls) else even)
    first = np.where(has_f, f, np.where(explicit, uneven_mid, slots - e if (e or ls) else even))
    last = np.where(has_l, lst, np.where(explicit, uneven_mid, slots - ls if (e or ls) else even))
    one = p == 1
    first = np.where(one, layers, first)
    last = np.where(one, layers, last)
    if not isinstance(plan, PlanColumns):
        return _num(first), _num(middle), _num(last)
    return first.astype(np.float64), middle.astype(np.float64), last.astype(np.float64)


def _num(x: Any) -> int | float:
    """A 0-d result as a Python int when whole, else a float."""
    x = float(x)
    return int(x) if x.is_integer() else x


def layers_on_stage(layers: int, plan: Plan | PlanColumns, stage: Any) -> Any:
    """Transformer layers on pipeline stage `stage` (an int, or one per row): stage_layer_counts'."""
    first, middle, last = stage_layer_counts(layers, plan)
    if isinstance(plan, PlanColumns) or np.ndim(stage):
        return np.where(stage == 0, first, np.where(stage == plan.pp - 1, last, middle))
    return first if stage == 0 else last if stage == plan.pp - 1 else middle


def recomputed_share(layers: int, plan: Plan | PlanColumns) -> Any:
    """The share of layers whose forward is recomputed: 1 under recompute "full" (every layer, or
    recompute_layers of each virtual stage chunk of layers / (pp x vpp)), 0 otherwise."""
    full = plan.recompute == "full"
    if plan.recompute_layers is None:
        return np.where(full, 1.0, 0.0) if isinstance(plan, PlanColumns) else float(full)
    chunk = np.maximum(layers / (plan.pp * plan.vpp), 1.0)
    share = np.minimum(plan.recompute_layers, chunk) / chunk
    return np.where(full, share, 0.0) if isinstance(plan, PlanColumns) else float(share) * full
