"""The cases of PyTorch's own Flight Recorder analyzer tests (test/distributed/flight_recorder/
test_fr_analysis.py in pytorch/pytorch), rebuilt as per-rank JSON dumps: two ranks, one process group
"0" of both (and a per-rank group "1" where a case has one), the entries each rank recorded, and the
verdict the PyTorch test expects.

    for case in CASES: write_case(tmp_path / case.name, case)      # rank0.json, rank1.json

Verdicts: None (every rank agrees: FULLY_MATCHED, UNDECIDED, or build_db's pass_check True) or the
kind our diagnosis names (MatchState COLLECTIVE_TYPE_MISMATCH -> op_mismatch, SIZE_OR_SYNTAX_MISMATCH ->
size_mismatch, COLLECTIVE_DTYPE_MISMATCH -> dtype_mismatch, COLLECTIVE_STATE_MISMATCH ->
state_mismatch) with the ranks either may be blamed for (a two-rank disagreement has no majority).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

BACKEND = "nccl"
# the operation names the analyzer knows as collectives (torch...flight_recorder.components.types.COLLECTIVES)
COLLECTIVE_NAMES = (
    "broadcast", "_broadcast_oop", "reduce", "_reduce_oop", "all_gather", "all_gather_single", "all_gather_v",
    "all_reduce", "_all_gather_base", "all_gather_into_tensor_coalesced", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_v", "reduce_scatter_tensor_coalesced", "_reduce_scatter_base",
    "gather", "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "all_reduce_barrier",
    "barrier", "split", "new_window", "allreduce_coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced",
)  # fmt: skip


def event(op: str, inp, out, state="scheduled", seq=0, p2p_seq=0, out_dtypes="float32", pg=("0", "default"), rid=0):
    """One entry as the PyTorch test builds it (its sequence numbers are strings, its dtypes one string)."""
    return {
        "record_id": rid,
        "profiling_name": f"{BACKEND}:{op}",
        "state": state,
        "process_group": list(pg),
        "input_sizes": inp,
        "output_sizes": out,
        "input_dtypes": "float32",
        "output_dtypes": out_dtypes,
        "collective_seq_id": str(seq),
        "p2p_seq_id": str(p2p_seq),
        "time_created_ns": 0,
        "is_p2p": False,
        "frames": [],
    }


@dataclass(frozen=True)
class Case:
    name: str
    entries: tuple[list, list]  # rank 0's, rank 1's
    verdict: str | None = None
    blame: frozenset = field(default_factory=lambda: frozenset({0, 1}))
    sub_groups: bool = False  # each rank also has a group "1" of itself alone (build_db's template)


def _pair(name, a, b, verdict=None, blame=(0, 1)) -> list[Case]:
    """The case, and the case with the ranks swapped (the verdict must not depend on who reads first)."""
    return [
        Case(f"match_one_event-{name}", ([a], [b]), verdict, frozenset(blame)),
        Case(f"match_one_event-{name}-swapped", ([b], [a]), verdict, frozenset(1 - r for r in blame)),
    ]


E1 = event("all_reduce", [[4, 4]], [[4, 4]], "scheduled", 1)
E9 = event("all_reduce", [[4, 4]], [[4, 4]], "completed", 1)
E11 = event("gather", [[4, 4]], [[4, 4], [4, 4]], "completed", 1)
MATCH_ONE_EVENT = [
    *_pair("e1-e1", E1, E1),
    *_pair("e1-e2", E1, event("all_gather", [[4, 4]], [[4, 4]], "scheduled", 1), "op_mismatch"),
    *_pair("e3-e4", *[event("all_to_all", [[4, 4]], [[4, 4]], "scheduled", 1)] * 2),  # UNDECIDED
    *_pair("e1-e5", E1, event("all_reduce", [[5, 4]], [[4, 4]], "scheduled", 1, 1), "size_mismatch", (1,)),
    *_pair("e1-e6", E1, event("all_reduce", [[4, 4]], [[5, 4]], "scheduled", 1, 2), "size_mismatch", (1,)),
    *_pair("e7-e7", *[event("all_reduce", [[4, 4]], [[5, 4]], "scheduled", 2)] * 2, "size_mismatch"),
    *_pair("e1-e9", E1, E9, "state_mismatch", (0,)),
    *_pair(
        "e10-e9",
        event("all_reduce", [[4, 4]], [[4, 4]], "completed", 1, out_dtypes="float16"),
        E9,
        "dtype_mismatch",
        (0,),
    ),  # fmt: skip
    *_pair("e11-e12", E11, event("gather", [[4, 4]], [[]], "completed", 1, out_dtypes="")),
    *_pair("e11-e13", E11, event("gather", [[4, 4]], [[4, 4]], "completed", 1, out_dtypes="")),
]


def _all_events() -> list[Case]:
    cases = []
    for op in sorted(COLLECTIVE_NAMES):
        inp, out = [[4, 4]], [[4, 4]]
        if op in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
            out = [[inp[0][0] * 2]]
        if op in ("all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced"):
            out = [[math.prod(inp[0]) * 2]]
        e = event(op, inp, out, "scheduled", 1)
        cases.append(Case(f"all_events-{op}", ([e], [e])))
    return cases


def _db(name: str, rank0: list, rank1: list, verdict=None, blame=(0, 1)) -> Case:
    def entries(specs):
        return [event(op, i, o, "completed", pg=pg, rid=rid) for rid, (op, i, o, pg) in enumerate(specs)]

    return Case(f"build_db-{name}", (entries(rank0), entries(rank1)), verdict, frozenset(blame), sub_groups=True)


D, SUB = ("0", "default"), ("1", "sub_pg")
BUILD_DB = [
    _db("all_reduce", [("all_reduce", [[4, 4]], [[4, 4]], D), ("all_reduce", [[5, 5]], [[5, 5]], SUB)],
        [("all_reduce", [[4, 4]], [[4, 4]], D), ("all_reduce", [[5, 5]], [[5, 5]], SUB)]),
    _db("allreduce_coalesced", [("allreduce_coalesced", [[4, 4]], [[4, 4]], D)],
        [("allreduce_coalesced", [[4, 4]], [[4, 4]], D)]),
    _db("broadcast_coalesced", [("broadcast", [[4, 4]], [[4, 4]], D), ("broadcast", [[4, 4]], [[4, 4]], D),
                                ("coalesced", [[]], [[]], D)],
        [("broadcast", [[4, 4]], [[4, 4]], D), ("broadcast", [[4, 4]], [[4, 4]], D), ("coalesced", [[]], [[]], D)]),
    _db("uneven_broadcast_oop", [("_broadcast_oop", [[4, 4]], [[4, 4]], D), ("_broadcast_oop", [[5, 5]], [[5, 5]], D),
                                 ("ALLGATHER_coalesced", [[]], [[]], D)],
        [("_broadcast_oop", [[4, 4]], [[4, 4]], D), ("_broadcast_oop", [[4, 4]], [[4, 4]], D),
         ("ALLGATHER_coalesced", [[]], [[]], D)], "size_mismatch", (0,)),
    _db("reduce_oop_coalesced", [("_reduce_oop", [[4, 4]], [[4, 4]], D), ("_reduce_oop", [[4, 4]], [[4, 4]], D),
                                 ("REDUCE_SCATTER_coalesced", [[]], [[]], D)],
        [("_reduce_oop", [[4, 4]], [[4, 4]], D), ("_reduce_oop", [[4, 4]], [[4, 4]], D),
         ("REDUCE_SCATTER_coalesced", [[]], [[]], D)]),
    _db("empty_coalesced_on_rank0", [("all_reduce", [[4, 4]], [[4, 4]], D)],
        [("all_reduce", [[4, 4]], [[4, 4]], D), ("_reduce_oop", [[4, 4]], [[4, 4]], D),
         ("_reduce_oop", [[4, 4]], [[4, 4]], D), ("REDUCE_SCATTER_coalesced", [[]], [[]], D)]),
]  # fmt: skip

CASES = MATCH_ONE_EVENT + _all_events() + BUILD_DB


def write_case(folder: Path, case: Case) -> Path:
    """rank0.json and rank1.json of the case, each with its pg_config, as PyTorch 2.8 dumps them."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, entries in enumerate(case.entries):
        config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        if case.sub_groups:
            config["1"] = {"name": "1", "desc": "sub_pg", "ranks": f"[{rank}]"}
        dump = {"version": "2.8", "pg_config": config, "pg_status": {}, "entries": entries}
        (folder / f"rank{rank}.json").write_text(json.dumps(dump))
    return folder
