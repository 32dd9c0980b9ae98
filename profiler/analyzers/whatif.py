"""What-if on a measured trace: scenarios replayed over the step's dependency graph (replay.py).

    out = whatif(analysis, Scenario(rank_speed={3: "median"}), microbatches=None)

`out` is `python -m profiler whatif --json`'s object:
    step                   the traced step measured and replayed, or None: every step, and then
    measured_step_time_s   the trace's own step (steps.measured_step_s: the mean over ranks of `step`'s
                           ProfilerStep#N range in the files, else its median over the traced steps)
    predicted_step_time_s  the measured step plus what the replay changes in the step's windows; equal
                           to the measured one when no scenario is given (the replay reproduces the
                           trace exactly)
    change_pct             predicted vs measured
    measured_phases / predicted_phases   per rank and step, averaged: work_s (the rank's own time) split
                           into compute_s (its device busy), host_s (its CPU alone) and idle_s (neither),
                           wait_s and transfer_s per dimension -- they add up to the step
    scenarios              what was applied (rank speed factors per step, link factors, hidden dims,
                           microbatches), each with what it assumes; a link or overlap one also with
                           `ops` (the traced ops it applies to) and, when that is 0, `note` (why)
    changed                sentences: what moved, largest first
    critical_path          of `step` (else the measured step closest to the median) and of its replay: length_s,
                           by_category (compute, host, idle, comm:<dim>), ranks, segments
    pipeline               per stage (pp > 1): work, bubble, p2p wait and transfer (ms), the bubble's
                           and the p2p wait's fractions of the work apart, beside (p-1)/(v m) -- bubble.py
    cut_dependencies, overlapped_left_out   the replay's honesty counters

More microbatches (`microbatches=M`, same global batch, so each is smaller): the pipeline's schedule
bubble (bubble.py's bubble_ns, not the late-peer wait) scales by m/M, per-microbatch work and
communication stay the same in total -- optimistic by the per-microbatch fixed costs. It is applied on
top of the replayed step, not replayed (the trace has no schedule for M microbatches).

Pure: numpy, pandas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler.analyzers import bubble
from profiler.analyzers.replay import (
    OWN_KINDS,
    Graph,
    Replay,
    Scenario,
    critical_path,
    phases,
    replay,
    step_windows,
)
from profiler.analyzers.steps import measured_step_s, step_time_s


def _phase_summary(ph: pd.DataFrame) -> dict[str, Any]:
    if not len(ph):
        return {"window_s": 0.0, "work_s": 0.0, **{f"{k}_s": 0.0 for k in OWN_KINDS}, "wait_s": 0.0, "transfer_s": {}}
    mean = ph.drop(columns=["rank", "step"]).mean()
    transfer = {
        c[len("transfer_") : -3]: round(float(mean[c]) / 1e9, 6) for c in ph.columns if c.startswith("transfer_")
    }
    return {
        "window_s": round(float(mean["window_ns"]) / 1e9, 6),
        "work_s": round(float(mean["work_ns"]) / 1e9, 6),
        **{f"{k}_s": round(float(mean[f"{k}_ns"]) / 1e9, 6) for k in OWN_KINDS},
        "wait_s": round(float(mean["wait_ns"]) / 1e9, 6),
        "transfer_s": transfer,
    }


def _median_step(g: Graph) -> int | None:
    w = step_windows(g)
    if not len(w):
        return None
    per = (w["end_ns"] - w["start_ns"]).groupby(w["step"]).mean()
    return int((per - per.median()).abs().idxmin())


def path_summary(path: pd.DataFrame) -> dict[str, Any]:
    """A critical path's length, its time per category (compute, host, idle, comm:<dim>), the ranks it
    visits."""
    if not len(path):
        return {"length_s": 0.0, "by_category": {}, "ranks": [], "segments": 0, "rank_switches": 0}
    cat = np.where(path["kind"] == "comm", "comm:" + path["dim"].astype(str), path["kind"].astype(str))
    by = path.groupby(cat)["dur_ns"].sum().sort_values(ascending=False)
    ranks = path["rank"].to_numpy()
    return {
        "step": int(path["step"].iloc[0]),
        "length_s": round(float(path["end_ns"].max() - path["start_ns"].min()) / 1e9, 6),
        "by_category": {str(k): round(float(v) / 1e9, 6) for k, v in by.items()},
        "ranks": sorted({int(r) for r in ranks}),
        "segments": len(path),
        "rank_switches": int((ranks[1:] != ranks[:-1]).sum()),
    }


def _changed(measured: dict, predicted: dict, m_step: float, p_step: float) -> list[str]:
    out = []
    if m_step:
        out.append(f"step {m_step * 1e3:,.2f} → {p_step * 1e3:,.2f} ms ({(p_step / m_step - 1) * 100:+.1f}%)")
    deltas = [(k, measured[f"{k}_s"], predicted[f"{k}_s"]) for k in OWN_KINDS]
    deltas.append(("wait", measured["wait_s"], predicted["wait_s"]))
    for dim in sorted(set(measured["transfer_s"]) | set(predicted["transfer_s"])):
        deltas.append((f"{dim} transfer", measured["transfer_s"].get(dim, 0.0), predicted["transfer_s"].get(dim, 0.0)))
    for name, a, b in sorted(deltas, key=lambda d: -abs(d[2] - d[1])):
        if abs(b - a) * 1e3 >= 0.01:
            out.append(f"{name} per rank {a * 1e3:,.2f} → {b * 1e3:,.2f} ms")
    return out


def _touched(graph: Graph, key: str, *, link: bool) -> dict[str, Any]:
    """{ops: the traced ops a link or overlap scenario applies to, and, when none, note: why nothing
    changes} -- a scenario that matches no op (a dimension the traces do not label, a node boundary
    one node does not have) must say so rather than report +0%."""
    inst = graph.instances
    if not len(inst):
        return {"ops": 0, "note": "no collective or p2p op in the traces: nothing changes"}
    dims, tiers = inst["dim"].astype(str), inst["tier"].astype(str)
    hit = (((dims == key) | (tiers == key)) if link else (dims == key)).to_numpy()
    ops = sum(len(graph.members[c]) for c in np.flatnonzero(hit))  # each instance's nodes on the traced ranks
    if ops:
        return {"ops": ops}
    if link and key in ("intra", "inter"):
        links = sorted(set(tiers))
        why = f"no op of these traces ran over the {key}-node link (their links: {', '.join(links)})"
        if links == ["unknown"]:
            why += "; some rank of each group sits on no known node (its trace is missing or names no host)"
    else:
        seen = sorted(set(dims))
        why = f"no {key} op in these traces (their dimensions: {', '.join(seen)})"
        if seen == ["unknown"]:
            why += "; attach the job's plan (--plan, or a plan file on Upload) to label them, or name 'unknown'"
    return {"ops": 0, "note": why + ": nothing changes"}


class StepNotTraced(ValueError):
    """The what-if was asked for a step the traces do not hold."""


def whatif(
    graph: Graph,
    scenario: Scenario = Scenario(),
    *,
    plan: Any = None,
    microbatches: int | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """The what-if object (see the module docstring). `plan`: the set's Plan (stages, microbatches);
    `step`: one traced step to measure and replay (default: the median over the traced steps);
    StepNotTraced when the traces have no such step."""
    rp: Replay = replay(graph, scenario)
    measured_w, predicted_w = step_windows(graph), step_windows(graph, rp)
    if step is not None and not (measured_w["step"] == step).any():
        have = sorted({int(s) for s in measured_w["step"]})
        raise StepNotTraced(f"step {step} is not in these traces; their steps: {', '.join(map(str, have)) or 'none'}")
    # the files' step (steps.measured_step_s), moved by what the replay changes in the graph's windows
    m_graph, p_graph = step_time_s(measured_w, step) or 0.0, step_time_s(predicted_w, step) or 0.0
    m_step = measured_step_s(graph.files_windows, measured_w, step) or m_graph
    p_step = max(m_step + (p_graph - m_graph), 0.0)
    m_ph, p_ph = _phase_summary(phases(graph)), _phase_summary(phases(graph, rp))
    applied: list[dict] = []
    for rank, speed in scenario.rank_speed.items():
        factors = {str(s): round(f, 4) for (r, s), f in rp.speed.items() if r == rank}
        applied.append(
            {
                "kind": "rank_speed",
                "rank": int(rank),
                "speed": speed,
                "work_factor_by_step": factors,
                "assumes": "the rank's own time (compute, host code) scales; its transfers do not",
            }
        )
    for key, k in scenario.link.items():
        applied.append(
            {
                "kind": "link",
                "link": key,
                "factor": float(k),
                "assumes": "transfer time (after the last arrival) scales by 1/k; latency-bound ops gain less in reality",
                **_touched(graph, key, link=True),
            }
        )
    for dim in sorted(scenario.overlap):
        applied.append(
            {
                "kind": "overlap",
                "dim": dim,
                "assumes": "fully hidden behind compute: costs nothing, waits for no one",
                **_touched(graph, dim, link=False),
            }
        )
    pipeline: list[dict] = []
    if plan is not None and plan.pp > 1:
        table = bubble.pipeline_phases(graph, pp=plan.pp, vpp=plan.vpp, microbatches=plan.microbatches)
        pipeline = [
            {k: (round(float(v), 4) if isinstance(v, float) else int(v)) for k, v in r.items()}
            for r in bubble.per_stage(table).to_dict("records")
        ]
        if microbatches:
            m = plan.microbatches
            bubble_s = float(table["bubble_ns"].mean()) / 1e9 if len(table) else 0.0
            saved = bubble_s * (1 - m / microbatches)
            p_step -= saved
            applied.append(
                {
                    "kind": "microbatches",
                    "from": m,
                    "to": int(microbatches),
                    "bubble_s": round(bubble_s, 6),
                    "assumes": "same global batch in smaller microbatches: the schedule's bubble scales by m/M, "
                    "the work does not change (per-microbatch fixed costs make this optimistic)",
                }
            )
    elif microbatches:
        applied.append(
            {"kind": "microbatches", "to": int(microbatches), "assumes": "no pipeline (pp 1): nothing changes"}
        )
    chosen = step
    step = _median_step(graph) if step is None else step
    out = {
        "step": chosen,
        "measured_step_time_s": round(m_step, 9),
        "predicted_step_time_s": round(p_step, 9),
        "change_pct": round((p_step / m_step - 1) * 100, 2) if m_step else None,
        "measured_phases": m_ph,
        "predicted_phases": p_ph,
        "scenarios": applied,
        "changed": _changed(m_ph, p_ph, m_step, p_step),
        "critical_path": {
            "measured": path_summary(critical_path(graph, replay(graph), step)) if step is not None else {},
            "predicted": path_summary(critical_path(graph, rp, step)) if step is not None else {},
        },
        "pipeline": pipeline,
        "steps": sorted({int(s) for s in measured_w["step"]}),
        "cut_dependencies": rp.cut,
        "overlapped_left_out": graph.dropped_overlapped,
    }
    return out
