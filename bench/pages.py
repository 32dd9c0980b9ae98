"""How fast each dashboard page renders, and how much chart data it sends: AppTest runs, in-process.

For every page registered in app.py (and a few heavier plans): one cold run (imports, first
plan-model calls) and then warm reruns of the same session (what a user waits for after a click,
with the cached loaders warm), plus the bytes of chart data (Arrow) and specs the run produced.
The run pages (and the plan pages' measured views) are measured on a 64-rank trace set -- DP8 x
TP4 x PP2 + SP, a real gloo run made by bench/ingest.py -- selected with ?run= as Home's links do;
their cold run includes loading and analysing the set once (cached for the server's lifetime), and
"zoom" is a new brush window of the timeline (an uncached level-of-detail query).

    .venv/bin/python -m bench.pages [--reruns 5] [--json] [--only timeline,topology]

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from bench.ingest import ensure_ours
from parallel.review.urls import DEFAULT_PARAMS
from profiler.collect import trace_sets
from tests.support.apptest import APP, registered_pages

HEAVY = [  # plans that stress a page beyond the default
    ("pages/topology.py", "4096 GPUs", {**DEFAULT_PARAMS, "nodes": "512", "dp": "64"}),
    (
        "pages/activation_memory.py",
        "llama3-405b",
        {
            "model": "llama3-405b",
            "nodes": "112",
            "dp": "8",
            "tp": "8",
            "pp": "14",
            "gb": "512",
            "sp": "1",
            "recompute": "selective",
        },
    ),
    (
        "pages/tp_scaling.py",
        "llama3-70b a100",
        {"model": "llama3-70b", "cluster": "dgx-a100", "nodes": "16", "dp": "4", "tp": "8", "pp": "4", "gb": "256"},
    ),
]


def run_cases() -> list[tuple[str, str, dict]]:
    """The run pages on the 64-rank set, in a fresh runs folder (PARASCOPE_RUNS)."""
    runs = Path(tempfile.mkdtemp(prefix="parascope-bench-runs-"))
    shutil.copytree(ensure_ours("ours64"), runs / "ours64")
    os.environ["PARASCOPE_RUNS"] = str(runs)
    os.environ["PARASCOPE_UPLOADS"] = str(runs / "uploads")
    run = {"run": "ours64"}
    plan = {**trace_sets.plan_params(trace_sets.find_set("ours64")), **run}
    return [
        ("pages/timeline.py", "64 ranks", run),
        ("pages/timeline.py", "64 ranks, zoom", {**run, "win": "300,900"}),
        ("pages/timeline.py", "64 ranks, all steps", {**run, "tl_step": "all"}),
        ("pages/home.py", "64 ranks", run),
        ("pages/topology.py", "64 ranks measured", plan),
        ("pages/activation_memory.py", "64 ranks measured", plan),
        ("pages/tp_scaling.py", "64 ranks measured", plan),
    ]


def chart_bytes(at) -> tuple[int, int, int]:
    """(charts, Arrow data bytes, spec bytes) of the charts in an AppTest run."""
    data = spec = 0
    charts = at.get("vega_lite_chart")
    for c in charts:
        spec += len(c.proto.spec)
        data += sum(len(d.data.data) for d in c.proto.datasets) + len(c.proto.data.data)
    return len(charts), data, spec


def bench_page(path: str, query: dict, reruns: int) -> dict:
    at = AppTest.from_file(str(APP), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(path)
    t0 = time.perf_counter()
    at.run()
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(reruns):
        t0 = time.perf_counter()
        at.run()
        warm.append(time.perf_counter() - t0)
    if at.exception:
        raise RuntimeError(f"{path}: {at.exception[0].value}")
    n, data, spec = chart_bytes(at)
    return {
        "page": path,
        "cold_s": cold,
        "warm_median_s": statistics.median(warm),
        "warm_min_s": min(warm),
        "charts": n,
        "chart_data_kb": data / 1e3,
        "chart_spec_kb": spec / 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", default="", help="comma list of page names to run (e.g. timeline,home)")
    args = ap.parse_args()
    cases = [(p["path"], "default plan", DEFAULT_PARAMS) for p in registered_pages()] + HEAVY + run_cases()
    if args.only:
        cases = [c for c in cases if Path(c[0]).stem in args.only.split(",")]
    rows = []
    for path, label, query in cases:
        row = bench_page(path, query, args.reruns)
        row["case"] = label
        rows.append(row)
        if not args.json:
            print(
                f"{path:30s} {label:20s} cold {row['cold_s']:6.2f} s   warm {row['warm_median_s']:5.2f} s "
                f"(min {row['warm_min_s']:4.2f})   {row['charts']} charts, {row['chart_data_kb']:6.1f} kB data, "
                f"{row['chart_spec_kb']:5.1f} kB specs",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
