"""How fast each dashboard page renders, and how much chart data it sends: AppTest runs, in-process.

For every page registered in app.py (and a few heavier plans): one cold run (imports, first
plan-model calls) and then warm reruns of the same session (what a user waits for after a click,
with the cached loaders warm), plus the bytes of chart data (Arrow) and specs the run produced.

    .venv/bin/python bench/pages.py [--reruns 5] [--json]

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ui.plan_params import DEFAULT_PARAMS  # noqa: E402
from ui.testing import APP, registered_pages  # noqa: E402

HEAVY = [  # plans that stress a page beyond the default
    ("pages/topology.py", "4096 GPUs", {**DEFAULT_PARAMS, "nodes": "512", "dp": "64"}),
    ("pages/activation_memory.py", "llama3-405b", {"model": "llama3-405b", "nodes": "112", "dp": "8", "tp": "8",
                                                   "pp": "14", "gb": "512", "sp": "1", "recompute": "selective"}),
    ("pages/tp_scaling.py", "llama3-70b a100", {"model": "llama3-70b", "cluster": "dgx-a100", "nodes": "16", "dp": "4",
                                                "tp": "8", "pp": "4", "gb": "256"}),
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
    from streamlit.testing.v1 import AppTest

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
    return {"page": path, "cold_s": cold, "warm_median_s": statistics.median(warm), "warm_min_s": min(warm),
            "charts": n, "chart_data_kb": data / 1e3, "chart_spec_kb": spec / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cases = [(p["path"], "default plan", DEFAULT_PARAMS) for p in registered_pages()] + HEAVY
    rows = []
    for path, label, query in cases:
        row = bench_page(path, query, args.reruns)
        row["case"] = label
        rows.append(row)
        if not args.json:
            print(f"{path:30s} {label:16s} cold {row['cold_s']:6.2f} s   warm {row['warm_median_s']:5.2f} s "
                  f"(min {row['warm_min_s']:4.2f})   {row['charts']} charts, {row['chart_data_kb']:6.1f} kB data, "
                  f"{row['chart_spec_kb']:5.1f} kB specs", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
