"""Every per-step figure is a part of the step it belongs to.

On the demo run (DP2 × TP2 × PP2 + SP, profiled by `python -m profiler run` with the dashboard's own
flags) and on every real set in ../shared/traces, for every rank and traced step: compute, exposed
communication, exposed memory copies and idle add up to the step's window exactly; communication,
each dimension's exposed communication and the memory copies each fit inside it; and the per-rank
means the Topology page colours GPUs by are each at most that rank's mean traced step.
"""

from __future__ import annotations

import pytest

from profiler import TraceAnalysis, TraceError
from profiler.collect.demo import DEMO_FLAGS
from tests.conftest import SHARED_TRACES, run_module
from ui import run_tables


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    run_module("profiler", "run", *DEMO_FLAGS, "--out", str(out))
    return out


def _sets(demo_run):
    shared = sorted(p for p in SHARED_TRACES.iterdir() if p.is_dir()) if SHARED_TRACES.is_dir() else []
    return [demo_run, *shared]


@pytest.mark.slow
def test_phases_add_up_to_every_step(demo_run):
    checked = 0
    for source in _sets(demo_run):
        try:
            a = TraceAnalysis.load(source)
        except TraceError:  # a set that needs the user's help (a rank number): its own tests
            continue
        bd = a.breakdown
        assert len(bd), source
        parts = bd["compute_ns"] + bd["exposed_comm_ns"] + bd["exposed_memory_ns"] + bd["idle_ns"]
        assert (parts == bd["window_ns"]).all(), (source, bd[parts != bd["window_ns"]])
        for col in ("comm_ns", "memory_ns", "compute_ns", "exposed_comm_ns", "idle_ns"):
            assert (bd[col] <= bd["window_ns"]).all() and (bd[col] >= 0).all(), (source, col)
        assert (bd["overlapped_comm_ns"] + bd["exposed_comm_ns"] == bd["comm_ns"]).all()
        by_dim = a.comm_by_dim.merge(bd[["rank", "step", "window_ns"]], on=["rank", "step"])
        assert (by_dim["exposed_comm_ns"] <= by_dim["comm_ns"]).all()
        assert (by_dim["comm_ns"] <= by_dim["window_ns"]).all(), source
        values = run_tables.rank_values(bd, a.collectives, a.instances)
        for col in ("exposed_comm_ms", "comm_ms", "compute_ms", "idle_ms"):
            assert (values[col] <= values["step_ms"] + 1e-9).all(), (source, col)
        checked += 1
    assert checked >= 1
