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
            parts.append(f"rc-{self.recompute}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"ETP{self.etp}")
        if self.fp8 != "none":
            parts.append("FP8" + ("-weights" if self.fp8 == "weights" else ""))
        parts.append(f"mb{self.micro_batch}")
        return " ".join(parts)

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
