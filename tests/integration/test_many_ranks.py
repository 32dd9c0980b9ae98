"""Many small ranks: stored a batch of files to a part, analysed a part at a time as columns, with
the same tables as one part per rank (the per-rank path), by every way of loading the set."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from profiler.analyzers.breakdown import COLUMNS, _rank_breakdown
from profiler.analyzers.front import TraceAnalysis
from profiler.traces import loader
from profiler.traces.loader import load_traces
from tests.support import trace_samples as ts


def _set(path: Path, ranks: int) -> Path:
    """`ranks` tiny gloo ranks of two steps; every third rank also runs an annotated DP collective."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(ranks):
            one = ts.gloo_cpu(r, ranks, annotated=r % 3 == 0)
            xs = [e for e in one["traceEvents"] if e.get("ph") == "X"]
            later = [dict(e, ts=e["ts"] + 1000) for e in xs]
            for e in later:
                if e["name"].startswith("ProfilerStep#"):
                    e["name"] = "ProfilerStep#4"
            one["traceEvents"] = xs + later + [e for e in one["traceEvents"] if e.get("ph") != "X"]
            zf.writestr(f"rank{r}_trace.json", json.dumps(one))
    return path


def _tables(a: TraceAnalysis) -> dict[str, pd.DataFrame]:
    return {"collectives": a.collectives, "breakdown": a.breakdown, "comm_by_dim": a.comm_by_dim}


def test_small_files_share_parts_and_the_cache_reopens_them(tmp_path):
    source = _set(tmp_path / "set.zip", 600)
    traces = load_traces(source, cache_dir=tmp_path / "cache")
    files = list(traces.store.folder.glob("part-*.arrow"))
    assert len(files) <= 2 * 8  # at most an eighth of the set a part: 8 parts, not 600
    assert len(set(traces.store.parts.values())) <= 8
    again = load_traces(source, cache_dir=tmp_path / "cache")
    assert again.from_cache
    for r in (0, 1, 299, 599):
        pd.testing.assert_frame_equal(traces.rank_events(r), again.rank_events(r))
        assert len(again.rank_events(r)) == traces.ranks.set_index("rank").loc[r, "events"]
        assert set(again.rank_events(r)["name"].cat.categories) == set(again.rank_events(r)["name"].astype(str))


@pytest.mark.parametrize("workers", [1, 2])
def test_batched_parts_give_the_tables_of_one_part_per_rank(tmp_path, monkeypatch, workers):
    source = _set(tmp_path / "set.zip", 96)
    batched = TraceAnalysis(load_traces(source, cache=False, workers=workers), workers=workers)
    assert len(set(batched.traces.store.parts.values())) < 96
    with monkeypatch.context() as m:
        m.setattr(loader, "BATCH_FILES", 1)
        single = TraceAnalysis(load_traces(source, cache=False, workers=1))
        assert len(set(single.traces.store.parts.values())) == 96
        for name, frame in _tables(single).items():  # computed while one rank a part
            pd.testing.assert_frame_equal(_tables(batched)[name], frame, obj=name)
    assert batched.summary() == single.summary()
    assert (batched.breakdown["comm_ns"] > 0).all() and (batched.breakdown["compute_ns"] > 0).all()
    assert set(batched.comm_by_dim["dim"]) >= {"dp"}


def test_cpu_ranks_as_columns_equal_the_per_rank_path(tmp_path):
    """breakdown_cpu (many CPU ranks at once) against breakdown's per-rank path on the same part."""
    traces = load_traces(_set(tmp_path / "set.zip", 40), cache=False)
    a = TraceAnalysis(traces)
    table = a.collectives
    together, _ = a._breakdowns
    rows = []
    for r in traces.rank_ids:
        own = table[table["rank"] == r]
        cols = {
            "kernel": (own["source"] == "kernel").to_numpy(),
            **{c: own[c].to_numpy(dtype="int64") for c in ("start_ns", "end_ns", "issue_ns", "step")},
            "dim": own["dim"].to_numpy(dtype=object).astype(str),
            "bytes": own["bytes"].fillna(0).to_numpy(dtype="int64"),
        }
        w = traces.step_windows[traces.step_windows["rank"] == r]
        windows = {c: w[c].to_numpy() for c in ("step", "start_ns", "end_ns")}
        rows += _rank_breakdown(traces.store, r, False, cols, windows)[0]
    expected = pd.DataFrame(rows, columns=COLUMNS).astype(together.dtypes.to_dict())
    pd.testing.assert_frame_equal(together, expected)
