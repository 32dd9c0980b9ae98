"""Bench: how long `python -m parallel search` takes for GPT-3 175B on 512 and 4096 H100s (goal: ≤ 1 s
for 4096), and what the plain loop over `parallel.core.report` would cost for the same space.

    .venv/bin/python -m bench.search [--repeat 3] [--gpus 512 4096] [--global-batch 1536]

Prints one line per size: best of `--repeat` wall times of `parallel.search.space.search` (candidates, the
vectorised plan model, ranking), the plans evaluated and kept, and the estimated naive time
(`plan_report` timed on a sample of the same candidates, times their count). Exit 1 if 4096 GPUs
take longer than the goal. Pure CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import sys
import time

from parallel.core.report import plan_report
from parallel.core.specs import CLUSTERS, MODELS
from parallel.search.space import Constraints, candidates, plan_of, search

GOAL_S = 1.0


def naive_seconds_per_plan(model, cluster, gb, sample=30) -> float:
    cands, _ = candidates(model, cluster.gpus, gb, Constraints())
    rows = cands.sample(min(sample, len(cands)), random_state=0).to_dict("records")
    t0 = time.perf_counter()
    for row in rows:
        row["recompute"] = ("none", "selective", "full")[row["rc"]]
        plan_report(plan_of(row, gb), model, cluster)
    return (time.perf_counter() - t0) / len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--gpus", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model, base = MODELS[args.model], CLUSTERS[args.cluster]
    slow = False
    for gpus in args.gpus:
        cluster = base.with_nodes(gpus // base.gpus_per_node)
        times, result = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = search(model, cluster, args.global_batch)
            times.append(time.perf_counter() - t0)
        naive = naive_seconds_per_plan(model, cluster, args.global_batch) * result.evaluated
        best = min(times)
        slow |= gpus >= 4096 and best > GOAL_S
        print(
            f"{model.name} on {gpus:>5} GPUs, global batch {args.global_batch}: search {best:.2f} s "
            f"(best of {args.repeat}; {result.evaluated:,} plans evaluated, {len(result.table):,} fit); "
            f"plain loop over plan_report ≈ {naive:,.0f} s; goal ≤ {GOAL_S:.0f} s at 4096: "
            f"{'n/a' if gpus < 4096 else 'OK' if best <= GOAL_S else 'MISSED'}"
        )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
