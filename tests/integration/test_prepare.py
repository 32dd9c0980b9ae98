"""A trace set prepared in a process of its own (profiler.analyzers.prepare), as the dashboard's
server does before it opens a set: the tables it keeps are the in-process analysis's, its first ranks
come first, a bad set fails with the loader's message, and a cancel or an exhausted budget stops
its whole process group and leaves nothing in the cache."""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import pandas as pd
import psutil
import pytest

from profiler import TraceAnalysis
from profiler.analyzers.prepare import TABLES, Preparation
from profiler.traces.sources import resolve
from tests.support import trace_samples as ts
from tests.support import tracegen

WAIT_S = 600  # generous: CI machines are shared and slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tracegen.generate(tmp_path_factory.mktemp("run") / "r", dp=2, tp=2, pp=2, sp=True, steps=2, late_rank=3)


def _tiny_zip(folder: Path, ranks: int) -> Path:
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "set.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(ranks):
            zf.writestr(f"traces/rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, ranks)))
    return folder


def _gone(p: Preparation) -> bool:
    return not psutil.pid_exists(p._proc.pid) or psutil.Process(p._proc.pid).status() == psutil.STATUS_ZOMBIE


def _left(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name != "digests.json") if cache.exists() else []


def test_a_prepared_set_opens_from_the_cache_with_the_in_process_tables(run, tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    p = Preparation(run, None, workers=2)
    state = p.wait(WAIT_S)
    assert state.status == "done", state
    assert state.fraction == 1.0 and not state.preview  # 8 ranks: nothing to preview
    warm = TraceAnalysis.load(run)
    assert warm.traces.from_cache
    kept = warm._results
    assert kept is not None and {f"{t}.arrow" for t in TABLES} <= {f.name for f in kept.iterdir()}
    alone = TraceAnalysis.load(run, cache=False)
    for table in ("collectives", "offsets", "per_rank_wait", "instances", "breakdown", "comm_by_dim"):
        pd.testing.assert_frame_equal(getattr(warm, table), getattr(alone, table), obj=table)


def test_the_first_ranks_are_prepared_first_and_open_on_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    folder = _tiny_zip(tmp_path / "set", 24)
    p = Preparation(folder, None, preview=4)
    seen = []
    while p.state().status == "running":
        seen.append((p.state().stage, p.state().preview))
        p.wait(0.05)
    assert p.state().status == "done" and p.state().preview
    first = TraceAnalysis.load(resolve(folder).first_ranks(4))
    assert first.traces.from_cache and first.traces.rank_ids == [0, 1, 2, 3]
    assert len(first.collectives) == 4  # one all-reduce per rank, of the first four only
    whole = TraceAnalysis.load(folder)
    assert whole.traces.from_cache and len(whole.traces.rank_ids) == 24
    # no stage of the whole set is reported before the preview is ready
    stages = [stage for stage, ready in seen if not ready]
    assert not set(stages) & {"parse", *TABLES}, stages


def test_a_set_that_cannot_be_read_fails_with_the_loaders_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "rank0_trace.json").write_text('{"traceEvents": [')
    state = Preparation(folder, None).wait(WAIT_S)
    assert state.status == "failed" and state.trace_error
    assert "rank0_trace.json" in state.message and "Traceback" not in state.message
    assert _left(tmp_path / "cache") == []


def test_a_tar_of_ranks_has_no_preview_but_prepares(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tarred"
    folder.mkdir()
    with tarfile.open(folder / "set.tar.gz", "w:gz") as tf:
        for r in range(12):
            f = ts.write(tmp_path / f"rank{r}_trace.json", ts.gloo_cpu(r, 12))
            tf.add(f, arcname=f.name)
    assert resolve(folder).first_ranks(4) is None  # listing a compressed tar would decompress it
    state = Preparation(folder, None, preview=4).wait(WAIT_S)
    assert state.status == "done" and not state.preview


@pytest.mark.parametrize(
    "budget, words",
    [({"memory_mb": 40}, "memory budget of 40 MB"), ({"time_s": 0.3}, "took longer than its budget of 0 s")],
)
def test_a_preparation_past_its_budget_is_stopped_and_keeps_nothing(tmp_path, monkeypatch, budget, words):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    folder = _tiny_zip(tmp_path / "set", 300)
    p = Preparation(folder, None, workers=2, **budget)
    state = p.wait(WAIT_S)
    assert state.status == "failed" and not state.trace_error
    assert words in state.message, state.message
    assert _gone(p)
    assert [n for n in _left(tmp_path / "cache") if not n.startswith(".tmp-")] == []


def test_cancel_stops_the_process_group_and_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path / "cache"))
    folder = _tiny_zip(tmp_path / "set", 3000)
    p = Preparation(folder, None, workers=2)
    while p.state().status == "running" and not (p.state().stage == "parse" and p.state().done > 0):
        p.wait(0.05)
    children = psutil.Process(p._proc.pid).children(recursive=True)
    p.cancel()
    assert p.state().status == "cancelled"
    assert _gone(p) and not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    assert _left(tmp_path / "cache") == []  # SIGTERM unwinds: the half-written folder is removed
