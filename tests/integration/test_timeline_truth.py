"""The Collective timeline's overview tells the truth about each class.

At whole-step zoom the analyzer merges events down to a few rectangles per rank. Each class -- compute,
memory copies, and the collectives of each parallel dimension -- must keep its own busy time: the
overview's busy time per (rank, class) equals the union of that class's unmerged events in the
detail, on our engine's pattern (DP2 × TP2 × PP2 + SP, where tp and sp collectives interleave) and on
every real set in ../shared/traces. Before, a merged rectangle took the class covering most of it and
kept everything it held as its busy time (a "tp" bar that was mostly SP; a memory bar over compute).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler import TraceAnalysis, TraceError
from profiler.traces import intervals as iv
from tests.conftest import SHARED_TRACES
from tests.support import tracegen


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    return tracegen.generate(tmp_path_factory.mktemp("run") / "r", dp=2, tp=2, pp=2, sp=True, steps=2)


def _sets(engine_run):
    shared = sorted(p for p in SHARED_TRACES.iterdir() if p.is_dir()) if SHARED_TRACES.is_dir() else []
    return [engine_run, *shared]


def _union_ns(rects: pd.DataFrame) -> int:
    """Total length of the union of [start_ns, end_ns) intervals (profiler.traces.intervals, tested on its own)."""
    return iv.length(iv.union(rects["start_ns"].to_numpy(dtype=np.int64), rects["end_ns"].to_numpy(dtype=np.int64)))


def _by_class(rects: pd.DataFrame, how) -> dict:
    key = [rects["rank"], rects["lane"], rects["dim"].astype(str)]
    return {k: how(g) for k, g in rects.groupby(key, observed=True, sort=True)}


def test_overview_class_totals_equal_the_detail(engine_run):
    checked = 0
    for source in _sets(engine_run):
        try:
            a = TraceAnalysis.load(source)
        except TraceError:  # a set that needs the user's help (a rank number, a plan): its own tests
            continue
        ranks = list(a.traces.rank_ids)[:4]
        detail = a.timeline(ranks=ranks, max_rects=10**7)
        if detail.empty:
            continue
        assert not detail["merged"].any()  # a budget past every event: nothing merged
        overview = a.timeline(ranks=ranks, max_rects=12)
        assert overview["merged"].any(), source  # the coarse view did merge
        truth = _by_class(detail, _union_ns)
        shown = _by_class(overview, lambda g: int(g["busy_ns"].sum()))
        assert shown == truth, source
        # no rectangle claims more busy time than its length, and none mixes two classes' time
        assert (overview["busy_ns"] <= overview["end_ns"] - overview["start_ns"]).all()
        checked += 1
    assert checked >= 1
