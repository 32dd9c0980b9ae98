"""How long each analyzer takes on the 64-rank set, and what a new brush window of the timeline costs.

The first analysis of a set is what the run pages do once per set (ui.run_loaders.analysis, through
profiler.TraceAnalysis): load (warm cache), collectives, clock offsets, per-rank wait, instances,
breakdown, per-dim totals. Then the timeline
calls the Collective timeline page makes: the step's overview (the first timeline call on a set),
the whole step in detail, and new brush windows (each a window not seen before, so nothing cached by
the page; the median and worst of them are printed).

    .venv/bin/python -m bench.analyzers [--set ours64] [--windows 20] [--repeat 3] [--json]

Times are the best of --repeat rounds, in-process, imports excluded; every round of the first
analysis (and of the first timeline call) starts from a fresh load_traces, so the caches a Traces
keeps (its arrays, the timeline's lanes) are built inside the call that first needs them. The set is made once by
bench/ingest.py (a real gloo run of `python -m profiler run`, DP8 x TP4 x PP2 + SP).
A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.ingest import ensure_ours
from profiler import TraceAnalysis, load_traces

OVERVIEW_RECTS, DETAIL_RECTS = 2500, 6000  # ui.run_loaders' budgets over all ranks shown


def timed(fn, repeat: int = 1):
    """(best seconds of `repeat` calls, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def step_span(bd, offsets, step: int) -> tuple[int, int]:
    """As ui.run_tables.step_span: the step's first start and last end over all ranks, aligned."""
    off = bd["rank"].map(dict(zip(offsets["rank"], offsets["offset_ns"]))).fillna(0).astype("int64")
    rows = bd.assign(start_ns=bd["start_ns"] + off, end_ns=bd["end_ns"] + off)
    rows = rows[rows["step"] == step]
    return int(rows["start_ns"].min()), int(rows["end_ns"].max())


def bench(path: Path, *, windows: int, repeat: int) -> dict:
    out: dict = {}
    got: dict = {}
    load_traces(path)  # fill the cache

    def keep(name, seconds):
        out[name] = min(out.get(name, float("inf")), seconds)

    for _ in range(repeat):  # each round on a fresh Traces (as a new server process has): per-Traces caches
        t = time.perf_counter()  # are built inside the first call that needs them, every round
        analysis = TraceAnalysis(load_traces(path))
        keep("load_traces (warm)", time.perf_counter() - t)
        # in the order the pages first need them; each property computes once, from the ones before
        for name in ("collectives", "offsets", "per_rank_wait", "instances", "breakdown", "comm_by_dim"):
            seconds, got[name] = timed(lambda a=analysis, n=name: getattr(a, n))
            keep(name, seconds)
    out["first analysis (sum)"] = sum(out.values())
    traces, table = analysis.traces, got["collectives"]
    offsets, bd = got["offsets"], got["breakdown"]
    ranks = traces.rank_ids[:64]
    step = sorted(int(s) for s in bd["step"].unique())[0]
    t0, t1 = step_span(bd, offsets, step)
    per = max(1, len(ranks))

    def tl(lo, hi, total):
        return analysis.timeline(ranks=ranks, start_ns=lo, end_ns=hi, max_rects=max(8, min(400, total // per)))

    out["timeline: overview, first call"], rects = timed(lambda: tl(t0, t1, OVERVIEW_RECTS))
    for _ in range(repeat - 1):  # the first call again, each on a fresh Traces (tables reused)
        analysis = TraceAnalysis(load_traces(path))
        for name in ("collectives", "offsets"):
            analysis.__dict__[name] = got[name]
        keep("timeline: overview, first call", timed(lambda: tl(t0, t1, OVERVIEW_RECTS))[0])
    out["timeline: overview again"], _ = timed(lambda: tl(t0, t1, OVERVIEW_RECTS), repeat)
    out["timeline: whole step, detail"], detail = timed(lambda: tl(t0, t1, DETAIL_RECTS), repeat)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(windows):  # brushes of 2-60% of the step, anywhere in it
        width = int((t1 - t0) * rng.uniform(0.02, 0.6))
        lo = t0 + int(rng.integers(0, t1 - t0 - width))
        times.append(timed(lambda lo=lo, width=width: tl(lo, lo + width, DETAIL_RECTS))[0])
    out["timeline: new window, median"] = statistics.median(times)
    out["timeline: new window, worst"] = max(times)
    out["_info"] = {
        "set": str(path),
        "ranks": len(traces.rank_ids),
        "events": traces.n_events,
        "collectives": len(table),
        "overview_rects": len(rects),
        "detail_rects": len(detail),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="ours64", help="ours8, ours64 (made by bench/ingest.py) or a path")
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if Path(args.set).exists():
        path = Path(args.set)
    else:
        path = ensure_ours(args.set)
    out = bench(path, windows=args.windows, repeat=args.repeat)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    info = out.pop("_info")
    print(
        f"{info['set']}: {info['ranks']} ranks, {info['events']:,} events, {info['collectives']:,} collective rows; "
        f"overview {info['overview_rects']:,} rects, detail {info['detail_rects']:,} rects"
    )
    for name, s in out.items():
        print(f"  {name:34s} {s * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
