"""The on-disk columnar store and its executors: the same analysis, table by table, from
the cache store, a fresh temporary store, the in-memory fallback, 1 or 2 worker processes, and a
real local Dask cluster; a cancelled or failed load leaves nothing a later load would trust."""

from __future__ import annotations

import gc
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from profiler import TraceAnalysis, load_traces
from profiler.traces.errors import NotJSONError, TraceError
from profiler.traces.loader import Cancelled, shared_workers
from tests.conftest import ROOT, SHARED_TRACES
from tests.support import trace_samples as ts
from tests.support import tracegen
from tests.support.ports import free_port

TABLES = ("collectives", "breakdown", "comm_by_dim", "per_rank_wait", "instances", "offsets")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real 8-rank run of our engine's collective pattern (DP2 x TP2 x PP2 + SP)."""
    return tracegen.generate(tmp_path_factory.mktemp("run") / "r", dp=2, tp=2, pp=2, sp=True, steps=2, late_rank=3)


def _analysis(source, **options) -> TraceAnalysis:
    return TraceAnalysis.load(source, **options)


def _assert_same(a: TraceAnalysis, b: TraceAnalysis) -> None:
    assert a.summary(top=100) == b.summary(top=100)
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=True, obj=name)
    for name in ("ranks", "pg_config", "threads", "skipped", "step_windows"):
        pd.testing.assert_frame_equal(getattr(a.traces, name), getattr(b.traces, name), obj=name)
    pd.testing.assert_frame_equal(a.timeline(max_rects=200), b.timeline(max_rects=200), obj="timeline")
    for rank in a.traces.rank_ids:
        pd.testing.assert_frame_equal(a.traces.rank_events(rank), b.traces.rank_events(rank), obj=f"events {rank}")
        pd.testing.assert_frame_equal(a.traces.rank_comm_args(rank), b.traces.rank_comm_args(rank))


def _sets(shared, run):
    out = [run]
    if shared is not None:
        out += sorted(p for p in shared.iterdir() if p.is_dir())
    return out


@pytest.fixture
def shared_or_none():
    return SHARED_TRACES if SHARED_TRACES.is_dir() else None


def test_cache_store_fresh_store_memory_and_two_workers_agree(run, shared_or_none, tmp_path, monkeypatch):
    for i, source in enumerate(_sets(shared_or_none, run)):
        cache = tmp_path / f"cache{i}"
        try:
            cold = _analysis(source, cache_dir=cache)
        except TraceError:  # a set that needs --rank (test_trace_real covers it)
            continue
        warm = _analysis(source, cache_dir=cache)
        assert not cold.traces.from_cache and warm.traces.from_cache
        _assert_same(cold, warm)
        _assert_same(cold, _analysis(source, cache=False, workers=2))
        with monkeypatch.context() as m:  # no writable folder anywhere: the parts stay in memory
            blocked = tmp_path / f"not-a-folder{i}"
            blocked.write_text("")
            m.setattr(tempfile, "tempdir", str(blocked))
            memory = _analysis(source, cache=False)
        assert memory.traces.store.folder is None and memory.traces.store.tables
        _assert_same(cold, memory)


def test_a_store_is_per_rank_files_and_a_window_reads_its_rows(run, tmp_path):
    traces = load_traces(run, cache_dir=tmp_path)
    entry = tmp_path / traces.key
    parts = sorted(p.name for p in entry.iterdir())
    assert "meta.json" in parts and len([p for p in parts if p.endswith(".events.arrow")]) == 8
    ev = traces.rank_events(5)
    lo, hi = int(ev["ts_ns"].iloc[len(ev) // 3]), int(ev["ts_ns"].iloc[2 * len(ev) // 3])
    got = traces.window(5, lo, hi)
    expect = ev[(ev["ts_ns"] >= lo) & (ev["ts_ns"] < hi)]
    pd.testing.assert_frame_equal(got, expect)
    assert 0 < len(got) < len(ev)


def test_the_temporary_store_goes_with_its_traces(run):
    traces = load_traces(run, cache=False)
    folder = traces.store.folder
    assert folder is not None and folder.is_dir()
    del traces
    gc.collect()
    assert not folder.exists()


def test_progress_is_reported_and_a_cancelled_load_keeps_nothing(run, tmp_path):
    seen = []
    load_traces(run, cache_dir=tmp_path / "a", progress=lambda d, t, n: seen.append((d, t)))
    assert seen[-1] == (8, 8) and [d for d, _ in seen] == list(range(1, 9))

    def stop(done, total, name):
        if done == 3:
            raise Cancelled("user")

    for workers in (1, 2):
        cache = tmp_path / f"c{workers}"
        with pytest.raises(Cancelled):
            load_traces(run, cache_dir=cache, workers=workers, progress=stop)
        assert _left(cache) == []  # neither an entry nor a temporary folder


def _left(cache: Path) -> list[Path]:
    """What a load left in a cache dir besides the file-hash memo (which is about the inputs, not the load)."""
    return [p for p in cache.iterdir() if p.name != "digests.json"] if cache.exists() else []


def test_one_shared_pool_serves_parse_and_analyses_and_survives_a_cancelled_load(run, tmp_path):
    """shared_workers: the parse and the per-rank analyses reuse one pool; a load cancelled inside the
    block keeps nothing and the next load in the same block (same pool) gives the one-worker results."""

    def stop(done, total, name):
        if done == 2:
            raise Cancelled("user")

    alone = TraceAnalysis.load(run, cache_dir=tmp_path / "one", workers=1)
    with shared_workers(2):
        with pytest.raises(Cancelled):
            load_traces(run, cache_dir=tmp_path / "cut", workers=2, progress=stop)
        assert _left(tmp_path / "cut") == []
        shared = TraceAnalysis.load(run, cache_dir=tmp_path / "two", workers=2)
        pd.testing.assert_frame_equal(shared.collectives, alone.collectives)
        pd.testing.assert_frame_equal(shared.breakdown, alone.breakdown)


def test_a_bad_file_in_the_middle_leaves_no_entry(run, tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    for p in sorted((run / "traces").iterdir()):
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "rank4_trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", '))
    cache = tmp_path / "cache"
    for workers in (1, 2):
        with pytest.raises(NotJSONError, match="rank4_trace.json.gz"):
            load_traces(folder, cache_dir=cache, workers=workers)
        assert _left(cache) == []


def test_cli_workers_give_the_same_json(run, tmp_path):
    def analyze(*extra):
        r = subprocess.run(
            [sys.executable, "-m", "profiler", "analyze", str(run), "--json", "--no-cache", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), r.stderr

    one, _ = analyze("--workers", "1")
    two, err = analyze("--workers", "2", "--progress")
    assert one == two
    assert "8/8 files parsed" in err
    r = subprocess.run(
        [sys.executable, "-m", "profiler", "analyze", str(run), "--workers", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: --workers 0")


def _wait_for_workers(address: str, n: int, timeout: float = 90) -> None:
    from distributed import Client  # lazy: the optional 'cluster' extra, for the Dask tests only

    with Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(n, timeout=timeout)


@pytest.mark.slow
def test_a_local_dask_cluster_gives_the_same_json(run, tmp_path):
    pytest.importorskip("distributed")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PARASCOPE_CACHE": str(tmp_path / "cache"), "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    bin_dir = os.path.dirname(sys.executable)
    procs = [
        subprocess.Popen(
            [os.path.join(bin_dir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--no-dashboard"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:
        time.sleep(1)
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [os.path.join(bin_dir, "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
                     "--no-dashboard", "--host", "127.0.0.1"],
                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        _wait_for_workers(address, 2)

        def analyze(*extra, **env_extra):
            r = subprocess.run(
                [sys.executable, "-m", "profiler", "analyze", str(run), "--json", *extra],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
                env={**env, **env_extra},
            )
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        local = analyze("--no-cache", "--workers", "1")
        on_dask = analyze("--scheduler", address)
        assert on_dask == local
        from_env = analyze("--no-cache", PARASCOPE_DASK_SCHEDULER=address)
        assert from_env == local
        entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and not p.name.startswith(".")]
        assert len(entries) == 1 and len(list(entries[0].glob("part-*.events.arrow"))) == 8  # written by the workers
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "profiler",
                "analyze",
                str(run),
                "--no-cache",
                "--scheduler",
                f"tcp://127.0.0.1:{free_port()}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert bad.returncode == 2 and "cannot reach the Dask scheduler" in bad.stderr
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_small_in_memory_traces_still_hand_out_the_whole_set(tmp_path):
    t0 = ts.trace(0, 2, [ts.cpu("aten::mm", 0, 10), ts.cpu("aten::add", 20, 5)])
    t1 = ts.trace(1, 2, [ts.cpu("aten::add", 0, 10)])
    ts.write(tmp_path / "rank0.json", t0)
    ts.write(tmp_path / "rank1.json", t1)
    traces = load_traces(tmp_path, cache=False)
    ev = traces.events
    assert ev["rank"].tolist() == [0, 0, 1] and ev["name"].astype(str).tolist() == [
        "aten::mm",
        "aten::add",
        "aten::add",
    ]
    assert traces.n_events == 3
