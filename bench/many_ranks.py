"""Ten thousand small ranks: `profiler analyze --json` and the dashboard's preparation of one zip of
10,000 tiny CPU (gloo) rank traces, this tree against a baseline checkout, side by side.

    .venv/bin/python -m bench.many_ranks                          # 10,000 ranks, baseline: git main
    .venv/bin/python -m bench.many_ranks --ranks 2000 --baseline-ref HEAD~3
    .venv/bin/python -m bench.many_ranks --baseline /path/to/other/checkout

The set: rank r's trace is tests/support/trace_samples.gloo_cpu(r, N) -- a main thread computing, a
world all-reduce issued from it and run on a gloo worker thread -- repeated over --steps
ProfilerSteps, one JSON file a rank, zipped (~9 MB at 10,000 ranks and 2 steps). Each command runs
in its own process with an empty cache and `--workers` parse/analysis processes (default 2: the
2-core machine the figure is for); ours and the baseline alternate, --repeat times, and the table
shows each one's median. The baseline runs the same command from a detached git worktree of
--baseline-ref (removed afterwards), or from --baseline. A benchmark, not a test: the numbers depend
on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tests.support import trace_samples as ts

ROOT = Path(__file__).resolve().parents[1]
STEP_US = 1000  # gloo_cpu's step is [0, 1000) us


def tiny_ranks_zip(path: Path, ranks: int, steps: int = 2) -> Path:
    """A zip of `ranks` tiny gloo rank traces of `steps` ProfilerSteps each (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for r in range(ranks):
            one = ts.gloo_cpu(r, ranks)
            events = [e for e in one["traceEvents"] if e.get("ph") == "X"]
            rest = [e for e in one["traceEvents"] if e.get("ph") != "X"]
            repeated = []
            for s in range(steps):
                for e in events:
                    e = dict(e, ts=e["ts"] + s * STEP_US)
                    if e["name"].startswith("ProfilerStep#"):
                        e["name"] = f"ProfilerStep#{3 + s}"
                    repeated.append(e)
            zf.writestr(f"rank{r}_trace.json", json.dumps({**one, "traceEvents": repeated + rest}))
    return path


@contextlib.contextmanager
def baseline_tree(ref: str | None, given: Path | None):
    """The baseline checkout: `given`, or a detached worktree of `ref` removed afterwards."""
    if given is not None:
        yield given
        return
    where = Path(tempfile.mkdtemp(prefix="parascope-baseline-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(where), ref], cwd=ROOT, check=True, capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)


def _timed(tree: Path, argv: list[str], cache: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "PARASCOPE_CACHE": str(cache)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(argv[:3])} failed:\n{done.stderr[-2000:]}")
    return took


def commands(zip_path: Path, workers: int) -> dict[str, list[str]]:
    spec = {"source": str(zip_path), "plan": None, "workers": workers, "preview": 64}
    return {
        "profiler analyze --json": ["-m", "profiler", "analyze", str(zip_path), "--json", f"--workers={workers}"],
        "dashboard preparation": ["-m", "profiler.analyzers.prepare", json.dumps(spec)],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.many_ranks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline-ref", default="main", help="git ref of the baseline (default main)")
    ap.add_argument("--baseline", type=Path, help="a checkout to use as the baseline instead of --baseline-ref")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="parascope-many-ranks-"))
    zip_path = tiny_ranks_zip(work / "set.zip", args.ranks, args.steps)
    size_mb = zip_path.stat().st_size / 1e6
    print(f"{args.ranks:,} ranks x {args.steps} steps: {size_mb:.1f} MB zip, {args.workers} workers", flush=True)
    print("| command | this tree s | baseline s | speed-up |")
    print("|---|---|---|---|")
    with baseline_tree(args.baseline_ref, args.baseline) as base:
        for name, cmd in commands(zip_path, args.workers).items():
            ours, theirs = [], []
            for i in range(args.repeat):
                ours.append(_timed(ROOT, cmd, work / f"cache-ours-{name[:8]}-{i}"))
                theirs.append(_timed(base, cmd, work / f"cache-base-{name[:8]}-{i}"))
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
