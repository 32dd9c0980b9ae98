"""`python -m profiler run` end to end: one real 8-rank TP2+SP × CP2 × PP2 job (every
parallel dimension) profiled into a run directory, then read back three ways -- the files
themselves, the raw ps.comm / ps.phase annotations of every rank, and the analyzer through
`python -m profiler analyze --json` and its instance matching. Marked slow (spawns processes).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

from parallel.core.engine_plan import engine_plan
from parallel.core.plan import Plan
from profiler import load_traces
from profiler.analyzers import collectives
from profiler.analyzers.matching import instances
from profiler.traces import intervals as iv
from runfiles.annotations import parse_comm, parse_phase
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
STEPS, MICROBATCHES, PROFILED = 4, 2, [2, 3]
FLAGS = [
    "--tp=2",
    "--sp",
    "--cp=2",
    "--pp=2",
    f"--steps={STEPS}",
    f"--global-batch={MICROBATCHES}",
    "--wait=1",
    "--warmup=1",
]
RUN_KEYS = {
    "schema",
    "run_id",
    "status",
    "progress",
    "plan",
    "model",
    "cluster",
    "world_size",
    "nodes",
    "hosts",
    "torch_version",
    "backend",
    "launcher",
    "profile",
    "command",
    "supervisor",
    "started_at",
    "finished_at",
    "traces",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "run"
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "run", *FLAGS, f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def raw(run_dir):
    """rank -> the decoded Kineto trace."""
    return {
        r: json.loads(gzip.decompress((run_dir / "traces" / f"rank{r}_trace.json.gz").read_bytes())) for r in range(8)
    }


def test_run_json_is_complete(run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    assert set(run) == RUN_KEYS  # no `error` on success
    assert run["status"] == "completed" and run["progress"] == {"step": STEPS, "steps": STEPS}
    want = engine_plan(Plan(tp=2, sp=True, cp=2, pp=2, global_batch=MICROBATCHES), dropout=0.0)
    assert Plan.from_dict(run["plan"]) == want  # as the engine runs it: its own attention, no dropout
    assert run["model"]["name"] == "tiny" and run["cluster"]["name"] == "local-cpu"
    assert run["world_size"] == 8 and run["nodes"] == 1 and run["launcher"] == "local"
    assert sorted(run["hosts"], key=int) == [str(r) for r in range(8)]
    assert [h["local_rank"] for h in run["hosts"].values()] == list(range(8))
    assert {h["node"] for h in run["hosts"].values()} == {0}
    assert run["backend"] == "gloo" and run["torch_version"].startswith("2.")
    assert run["profile"] == {"wait": 1, "warmup": 1, "active": 2, "profiled_steps": PROFILED}
    assert run["started_at"] < run["finished_at"]
    assert [t["rank"] for t in run["traces"]] == list(range(8))
    assert all(t["bytes"] == (run_dir / t["path"]).stat().st_size for t in run["traces"])


def test_directory_layout_and_metrics(run_dir):
    assert sorted(p.name for p in (run_dir / "traces").iterdir()) == sorted(f"rank{r}_trace.json.gz" for r in range(8))
    assert not list((run_dir / ".partial").glob("*"))  # nothing left half-written
    for r in range(8):
        assert (run_dir / "logs" / f"rank{r}.log").is_file()
    m = json.loads((run_dir / "metrics.json").read_text())
    for key in (
        "world_size",
        "plan",
        "loss",
        "step_time_s",
        "step_time_s_per_rank",
        "comm_time_s_per_rank",
        "cpu_time_s_per_rank",
        "comm_cpu_time_s_per_rank",
        "activation_bytes",
        "activation_breakdown",
        "predicted_activation_bytes",
        "hosts",
    ):
        assert key in m
    assert len(m["loss"]) == STEPS and len(m["step_time_s"]) == STEPS
    assert all(len(v) == STEPS for v in m["step_time_s_per_rank"].values())
    for r in map(str, range(8)):  # CPU seconds of each step, the part in communication calls within them
        cpu, comm_cpu = m["cpu_time_s_per_rank"][r], m["comm_cpu_time_s_per_rank"][r]
        assert len(cpu) == len(comm_cpu) == STEPS and all(0 <= c <= u for c, u in zip(comm_cpu, cpu)), r
        assert all(u > 0 for u in cpu), r
    assert m["profile"]["profiled_steps"] == PROFILED
    logged = (run_dir / "logs" / "rank4.log").read_text()  # the last stage's first rank prints the loss
    assert f"step {STEPS - 1}  loss" in logged


def test_the_engine_times_its_communication_as_the_trace_records_it(run_dir, raw):
    """metrics.json's comm_time_s_per_rank (the engine's clock on its ps.comm ranges, on in every step)
    equals, in each profiled step, the union of the trace's ps.comm ranges within ProfilerStep#N --
    less the profiler's own enter/exit of each range (~50 us here), which the clock does not see."""
    m = json.loads((run_dir / "metrics.json").read_text())
    assert sorted(m["comm_time_s_per_rank"], key=int) == [str(r) for r in range(8)]
    for rank, trace in raw.items():
        clock = m["comm_time_s_per_rank"][str(rank)]
        assert len(clock) == STEPS and all(0 < c < t for c, t in zip(clock, m["step_time_s_per_rank"][str(rank)]))
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        comm = [e for e in events if e["name"].startswith("ps.comm")]
        starts = np.array([round(e["ts"] * 1e3) for e in comm])  # trace microseconds -> integer ns
        ends = starts + np.array([round(e["dur"] * 1e3) for e in comm])
        for e in events:
            if not e["name"].startswith("ProfilerStep#"):
                continue
            step, lo, hi = int(e["name"].split("#")[1]), round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)
            inside = int(((ends > lo) & (starts < hi)).sum())
            union_s = iv.length(iv.clip(iv.union(starts, ends), lo, hi)) / 1e9
            assert inside and clock[step] <= union_s + 1e-4, (rank, step, clock[step], union_s)
            assert clock[step] >= union_s - inside * 200e-6 - 0.05 * union_s, (rank, step, clock[step], union_s)


def test_traces_carry_distributed_info_and_profiler_steps(raw):
    for rank, trace in raw.items():
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 8, "gloo")
        steps = sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
        assert steps == [f"ProfilerStep#{s}" for s in PROFILED]


def _labels(raw):
    comms, phases = {}, {}
    for rank, trace in raw.items():
        events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
        comms[rank] = [parse_comm(e["name"]) for e in events if e["name"].startswith("ps.comm")]
        phases[rank] = [parse_phase(e["name"]) for e in events if e["name"].startswith("ps.phase")]
    return comms, phases


def test_every_collective_is_labelled_and_matches_across_its_group(raw):
    """On a profiled run: each label parses; the members of a group issue the same
    collectives (dim, op, bytes, seq); each send meets its receive; the groups are the plan's."""
    comms, _ = _labels(raw)
    plan = Plan(tp=2, sp=True, cp=2, pp=2, global_batch=MICROBATCHES)
    topo = plan.topology(8)
    groups = {dim: {tuple(int(r) for r in row) for row in topo.group_ranks(dim)} for dim in ("tp", "cp", "pp")}
    expected_groups = {
        "tp": groups["tp"],
        "sp": groups["tp"],
        "cp": groups["cp"],
        "dp": groups["cp"],  # dp = 1: gradients are reduced over dp×cp, the cp group
        "pp": groups["pp"],
    }  # the tied embedding's gradient: first and last stage
    per_group = defaultdict(dict)
    p2p = defaultdict(lambda: defaultdict(list))
    for rank, labels in comms.items():
        assert labels and None not in labels, rank
        for lab in labels:
            assert rank in lab.ranks
            if lab.op in ("send", "recv"):
                assert any(set(lab.ranks) <= set(g) for g in groups["pp"]), lab  # pipeline neighbours
                p2p[lab.ranks][lab.op].append((lab.bytes, lab.seq))
            else:
                group = lab.ranks
                assert group in expected_groups[lab.dim], lab
                per_group[group].setdefault(rank, []).append((lab.dim, lab.op, lab.bytes, lab.seq))
    assert {lab.dim for labels in comms.values() for lab in labels} == {"tp", "sp", "cp", "pp", "dp"}
    for group, by_rank in per_group.items():
        assert set(by_rank) == set(group)
        first = by_rank[group[0]]
        seqs = [s for *_, s in first]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive within the window
        assert all(by_rank[r] == first for r in group), group
    assert p2p
    for pair, ops in p2p.items():
        assert ops["send"] == ops["recv"], pair


def test_phases_cover_every_microbatch_stage_and_profiled_step(raw):
    _, phases = _labels(raw)
    for rank, labels in phases.items():
        stage = {p.stage for p in labels if p.kind != "optim"}
        assert len(stage) == 1
        for kind in ("fwd", "bwd"):
            assert [p.mb for p in labels if p.kind == kind] == list(range(MICROBATCHES)) * len(PROFILED), rank
        assert sum(p.kind == "optim" for p in labels) == len(PROFILED)


def test_the_analyzer_matches_every_instance_labels_dims_and_finds_steps(run_dir, raw, tmp_path):
    """`python -m profiler analyze DIR --json` and the instance matching on this run: the
    counts per (op, dim) are the raw annotations', every instance is seen on all ranks of its
    group (a p2p instance: its sender and its receiver), and the steps are the profiled ones."""
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "analyze", str(run_dir), "--json", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["world_size"] == 8 and out["ranks"] == list(range(8)) and out["steps"] == PROFILED
    raw_counts = Counter()
    for trace in raw.values():
        for e in trace["traceEvents"]:
            m = re.match(r"^ps\.comm dim=(\w+) op=(\w+) ", e.get("name", ""))
            if m and e.get("ph") == "X":
                raw_counts[(m.group(2), m.group(1))] += 1
    assert {(c["op"], c["dim"]): c["count"] for c in out["collectives"]} == dict(raw_counts)

    traces = load_traces(run_dir, cache=False)
    table = collectives(traces)
    assert set(table["dim_source"]) == {"annotation"} and set(table["seq_source"]) == {"annotation"}
    assert sorted(set(table["step"])) == PROFILED
    inst = instances(traces, table=table)
    assert (inst["n_ranks"] == inst["group_size"]).all(), inst[inst["n_ranks"] != inst["group_size"]].head()
    p2p = inst[inst["op"].isin(["send", "recv"])]
    assert len(p2p) == raw_counts[("send", "pp")] == raw_counts[("recv", "pp")]
