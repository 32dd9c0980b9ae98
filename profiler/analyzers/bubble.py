"""Pipeline bubble vs P2P wait vs P2P transfer, per stage and step, from matched send/recv pairs.

Megatron-LM users ask it most: a SendRecv kernel's time includes waiting for the peer,
so "p2p time" mixes the schedule's bubble with a late peer. Here, per (rank, step), on the replay
graph's measured times (replay.build_graph: each op's wait ends at its last participant's arrival):

    work_ns           the rank's own time in the step (compute and host code)
    pipeline_idle_ns  waits in ops whose group spans pipeline stages: p2p sends/recvs, and collectives
                      across stages (the tied embedding's all-reduce, a world-wide sync) where the
                      cool-down idle of the last stages ends up
    p2p_transfer_ns   the p2p ops' time after both sides had arrived
    expected_bubble_ns  (p - 1)/(v m) x work_ns: the idle the schedule itself imposes on a stage when
                      every stage computes at this stage's speed (Narayanan et al. 2021, Sec. 2.2:
                      GPipe and 1F1B idle (p - 1) forward-backward slots per step, interleaved 1/v of it)
    bubble_ns         min(pipeline_idle, expected): the warm-up/cool-down idle
    p2p_wait_ns       pipeline_idle - bubble: idle beyond the schedule's, a peer that was late
    bubble_fraction   bubble / work: the schedule's bubble, beside theory (p - 1)/(v m) (never above it)
    p2p_wait_fraction p2p_wait / work: the rest of the pipeline idle, apart from the bubble
    idle_fraction     pipeline_idle / work = bubble_fraction + p2p_wait_fraction

Uniform stages give a bubble near theory and p2p_wait near 0; one slow stage shows up as p2p_wait on
the others. Assumes the stage's work is its forward and backward (the optimizer and the
loss are a few percent of a step on the runs checked).

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analyzers.labels import P2P_OPS
from profiler.analyzers.replay import OP, START, Graph, op_wait

COLUMNS = [
    "rank",
    "step",
    "stage",
    "window_ns",
    "work_ns",
    "pipeline_idle_ns",
    "p2p_transfer_ns",
    "expected_bubble_ns",
    "bubble_ns",
    "p2p_wait_ns",
    "bubble_fraction",
    "p2p_wait_fraction",
    "idle_fraction",
    "theory_fraction",
]


def theory_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """(p - 1)/(v m) -- Narayanan et al. 2021, Sec. 2.2."""
    return 0.0 if pp <= 1 else (pp - 1) / (vpp * max(microbatches, 1))


def pipeline_phases(g: Graph, *, pp: int, vpp: int, microbatches: int) -> pd.DataFrame:
    """One row per (rank, step), COLUMNS (see the module docstring); empty when pp is 1."""
    if pp <= 1 or not len(g.instances):
        return pd.DataFrame(columns=COLUMNS)
    theory = theory_fraction(pp, vpp, microbatches)
    ops = g.instances["op"].to_numpy()
    spans = np.array(
        [
            len({g.stage.get(int(r), 0) for r in str(grp).split(",") if r.strip().isdigit()}) > 1
            for grp in g.instances["group"]
        ]
    )
    p2p = np.isin(ops, list(P2P_OPS))
    rows = []
    for rank, ch in g.chains.items():
        for i0 in np.flatnonzero(ch.kind == START):
            j = i0 + int(np.argmax(ch.kind[i0:] == 2))
            work = idle = transfer = 0
            for i in range(i0 + 1, j + 1):
                work += max(0, int(ch.a[i] - ch.e[i - 1]))
                if ch.kind[i] != OP:
                    continue
                c = int(ch.inst[i])
                dur = int(ch.e[i] - ch.a[i])
                wait = op_wait(ch, i, ch.a, ch.e, g.last_arrival)
                if spans[c]:
                    idle += wait
                if p2p[c]:
                    transfer += dur - wait
            expected = int(round(theory * work))
            bubble = min(idle, expected)
            rows.append(
                {
                    "rank": rank,
                    "step": int(ch.step[i0]),
                    "stage": g.stage.get(rank, 0),
                    "window_ns": int(ch.a[j] - ch.a[i0]),
                    "work_ns": work,
                    "pipeline_idle_ns": idle,
                    "p2p_transfer_ns": transfer,
                    "expected_bubble_ns": expected,
                    "bubble_ns": bubble,
                    "p2p_wait_ns": idle - bubble,
                    "bubble_fraction": bubble / work if work else np.nan,
                    "p2p_wait_fraction": (idle - bubble) / work if work else np.nan,
                    "idle_fraction": idle / work if work else np.nan,
                    "theory_fraction": theory,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def per_stage(table: pd.DataFrame) -> pd.DataFrame:
    """The per-(rank, step) table averaged per stage: one row per stage, ms columns and the fractions."""
    if not len(table):
        return pd.DataFrame(
            columns=[
                "stage",
                "ranks",
                "work_ms",
                "bubble_ms",
                "p2p_wait_ms",
                "p2p_transfer_ms",
                "bubble_fraction",
                "p2p_wait_fraction",
                "theory_fraction",
            ]
        )
    g = table.groupby("stage")
    out = pd.DataFrame(
        {
            "ranks": g["rank"].nunique(),
            "work_ms": g["work_ns"].mean() / 1e6,
            "bubble_ms": g["bubble_ns"].mean() / 1e6,
            "p2p_wait_ms": g["p2p_wait_ns"].mean() / 1e6,
            "p2p_transfer_ms": g["p2p_transfer_ns"].mean() / 1e6,
            "bubble_fraction": g["bubble_ns"].sum() / g["work_ns"].sum().clip(lower=1),
            "p2p_wait_fraction": g["p2p_wait_ns"].sum() / g["work_ns"].sum().clip(lower=1),
            "theory_fraction": g["theory_fraction"].first(),
        }
    )
    return out.reset_index()
