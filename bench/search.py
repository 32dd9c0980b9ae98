"""Bench: how long `python -m parallel search` takes -- the command's own search, its defaults and
all -- for GPT-3 175B on 512 and 4096 H100s (goal: ≤ 1 s for 4096), as the `seconds` the search
reports itself, and what the plain loop over `parallel.core.report` would cost for the same space.

    .venv/bin/python -m bench.search [--repeat 3] [--gpus 512 4096] [--global-batch 1536] [--model M] [--cluster C]

Each size is searched with the command's own argument parsing (parallel.cli.search.search_inputs:
every constraint and option at the command's defaults), so the bench and the command evaluate the
same plans. Prints one line per size: the search's `seconds` (candidates, the vectorised plan model,
ranking) on its first call, with the layouts it caches cleared (what one `parallel search` command
reports), and the best of `--repeat` calls, each with its CPU time (what a machine shared with other
jobs cannot stretch); the plans evaluated and kept, and the estimated naive time (`plan_report` timed
on a sample of the same candidates, times their count). Exit 1 if the first call at 4096 GPUs takes
longer than the goal. Pure CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from parallel.cli.search import build_parser, search_inputs
from parallel.core import comm
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--gpus", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    slow = False
    for gpus in args.gpus:
        argv = ["--model", args.model, "--cluster", args.cluster, "--gpus", str(gpus)]
        command = build_parser().parse_args([*argv, "--global-batch", str(args.global_batch)])
        model, cluster, constraints, options = search_inputs(command)
        times, cpu, result = [], [], None
        comm.clear_layout_caches()  # the first call lays out every group, as a fresh command does
        for _ in range(args.repeat):
            t0 = time.process_time()
            result = search(model, cluster, args.global_batch, constraints, options)
            times.append(result.seconds)
            cpu.append(time.process_time() - t0)
        naive = naive_seconds_per_plan(model, cluster, args.global_batch, constraints, options) * result.evaluated
        first, best = times[0], min(times)
        slow |= gpus >= 4096 and first > GOAL_S
        print(
            f"{model.name} on {gpus:>5} GPUs, global batch {args.global_batch}: search {first:.2f} s first "
            f"({cpu[0]:.2f} s of CPU), {best:.2f} s best of {args.repeat} ({min(cpu):.2f} s of CPU); "
            f"{result.evaluated:,} plans evaluated, {len(result.table):,} fit; "
            f"plain loop over plan_report ≈ {naive:,.0f} s; goal ≤ {GOAL_S:.0f} s at 4096: "
            f"{'n/a' if gpus < 4096 else 'OK' if first <= GOAL_S else 'MISSED'}"
        )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
