"""Bench: how long `python -m parallel search` takes -- the command's own search, its defaults and
all -- for GPT-3 175B on 512 and 4096 H100s (goal: ≤ 1 s for 4096), as the `seconds` the search
reports itself, and what the plain loop over `parallel.core.report` would cost for the same space.

    .venv/bin/python -m bench.search [--fresh 7] [--repeat 3] [--gpus 512 4096] [--global-batch 1536] [--model M] [--cluster C]

Prints one line per size: the seconds the command reports in `--fresh` fresh processes (what a user
who types it sees: a new interpreter, nothing laid out or touched yet), their median and range;
then, in this process with the command's own argument parsing (parallel.cli.search.search_inputs),
the best of `--repeat` calls with its CPU time (what a machine shared with other jobs cannot
stretch); the plans evaluated and kept, and the estimated naive time (`plan_report` timed on a
sample of the same candidates, times their count). Exit 1 if the median fresh call at 4096 GPUs
takes longer than the goal. Pure CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time

from bench._subprocess import run_module
from parallel.cli.search import build_parser, search_inputs
from parallel.core.report import plan_report
from parallel.search.space import candidates, plan_of, search

GOAL_S = 1.0


def naive_seconds_per_plan(model, cluster, gb, constraints, options, sample=30) -> float:
    cands, _ = candidates(model, cluster.gpus, gb, constraints, cluster, options.activations)
    rows = cands.sample(min(sample, len(cands)), random_state=0).to_dict("records")
    base = dataclasses.replace(constraints.base, global_batch=gb)
    t0 = time.perf_counter()
    for row in rows:
        plan_report(plan_of(row, base), model, cluster, options)
    return (time.perf_counter() - t0) / len(rows)


def fresh_seconds(argv: list[str]) -> float:
    """The seconds `python -m parallel search ARGV` reports in a new process (its first line)."""
    first = run_module("parallel", "search", *argv, "--top", "1").splitlines()[0]
    found = re.search(r"evaluated in ([0-9.]+) s\)", first)
    if not found:
        raise SystemExit(f"parallel search printed no time: {first!r}")
    return float(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--gpus", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=7, help="fresh `parallel search` processes timed per size")
    args = ap.parse_args()
    slow = False
    for gpus in args.gpus:
        argv = ["--model", args.model, "--cluster", args.cluster, "--gpus", str(gpus)]
        argv += ["--global-batch", str(args.global_batch)]
        fresh = sorted(fresh_seconds(argv) for _ in range(args.fresh))
        command = build_parser().parse_args(argv)
        model, cluster, constraints, options = search_inputs(command)
        times, cpu, result = [], [], None
        for _ in range(args.repeat):
            t0 = time.process_time()
            result = search(model, cluster, args.global_batch, constraints, options)
            times.append(result.seconds)
            cpu.append(time.process_time() - t0)
        naive = naive_seconds_per_plan(model, cluster, args.global_batch, constraints, options) * result.evaluated
        median, best = statistics.median(fresh), min(times)
        slow |= gpus >= 4096 and median > GOAL_S
        print(
            f"{model.name} on {gpus:>5} GPUs, global batch {args.global_batch}: a fresh command's search "
            f"{median:.2f} s median of {len(fresh)} ({fresh[0]:.2f}-{fresh[-1]:.2f}); in one process "
            f"{best:.2f} s best of {args.repeat} ({min(cpu):.2f} s of CPU); "
            f"{result.evaluated:,} plans evaluated, {len(result.table):,} fit; "
            f"plain loop over plan_report ≈ {naive:,.0f} s; goal ≤ {GOAL_S:.0f} s at 4096: "
            f"{'n/a' if gpus < 4096 else 'OK' if median <= GOAL_S else 'MISSED'}"
        )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
