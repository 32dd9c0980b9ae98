"""The layout of a set without a plan, from its process groups."""

from __future__ import annotations

import pytest

from parallel.core.plan import Plan
from profiler import TraceAnalysis
from profiler.analyzers.layout import infer_layout
from tests.support import trace_samples as ts


def _pg(name, ranks, desc="undefined"):
    return {"pg_name": name, "pg_desc": desc, "backend_config": "cuda:nccl", "pg_size": len(ranks), "ranks": ranks}


def _set(tmp_path, world, groups_of, *, events=()):
    """One file per rank in `groups_of` ({rank: [(desc, ranks), ...]}), each listing its process groups."""
    for rank, groups in groups_of.items():
        pg = [_pg("0", list(range(world)), "default_pg")] + [
            _pg(str(i + 1), ranks, desc) for i, (desc, ranks) in enumerate(groups)
        ]
        t = ts.trace(rank, world, [ts.annotation("ProfilerStep#1", 0, 100), *events], pg_config=pg)
        ts.write(tmp_path / f"rank{rank}_trace.json.gz", t)
    a = TraceAnalysis.load(tmp_path, cache=False)
    return infer_layout(a.traces, a.collectives)


def test_megatron_groups_named_by_their_description(tmp_path):
    # rank 0 and rank 5 of DP2 x TP2 x PP2 (Megatron order tp-cp-ep-dp-pp), each with its own groups
    named = {
        0: [
            ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1]),
            ("DATA_PARALLEL_GROUP", [0, 2]),
            ("PIPELINE_MODEL_PARALLEL_GROUP", [0, 4]),
        ],
        5: [
            ("TENSOR_MODEL_PARALLEL_GROUP", [4, 5]),
            ("DATA_PARALLEL_GROUP", [5, 7]),
            ("PIPELINE_MODEL_PARALLEL_GROUP", [1, 5]),
        ],
    }
    guess = _set(tmp_path, 8, named)
    assert guess.inferred and (guess.plan.dp, guess.plan.tp, guess.plan.pp, guess.plan.cp) == (2, 2, 2, 1)
    assert "named by their description" in guess.evidence and guess.groups == 6


def test_unnamed_groups_pick_the_layout_they_fit(tmp_path):
    # TP4 inside, the rest DP (ranks 0 and 4 of DP2 x TP4): no description says which is which
    guess = _set(
        tmp_path, 8, {0: [("undefined", [0, 1, 2, 3]), ("undefined", [0, 4])], 4: [("undefined", [4, 5, 6, 7])]}
    )
    assert guess.inferred and (guess.plan.dp, guess.plan.tp, guess.plan.pp) == (2, 4, 1)


@pytest.mark.parametrize(
    "groups, why",
    [
        ({0: []}, "no process group of the trace tells the layout"),  # only the world group
        (
            {0: [("undefined", [0, 3])]},
            "no DP×TP×PP×CP layout has all 1 collective group",
        ),  # no layout of 8 ranks has a group of stride 3
    ],
)
def test_without_evidence_it_is_a_guess_of_data_parallelism(tmp_path, groups, why):
    guess = _set(tmp_path, 8, groups)
    assert not guess.inferred and guess.plan == Plan(dp=guess.plan.world_size, global_batch=guess.plan.world_size)
    assert why in guess.evidence
