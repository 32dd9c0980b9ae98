"""`python -m profiler hang PATH [--plan FILE] [--json]`: why a job hung, from its Flight Recorder dumps.

    python -m profiler run --dp 4 --global-batch 4 --inject-hang 2:2 --timeout 10 --out runs/hang
    python -m profiler hang runs/hang                    # the run's fr/ dumps, its plan and hosts
    python -m profiler hang dumps.zip --plan pretrain_gpt.sh --gpus-per-node 8 --json

PATH: a run directory (its fr/), a folder of dumps, or a .zip / .tar(.gz) of them -- one JSON file per
rank, as `torch._C._distributed_c10d._dump_fr_trace_json()` returns it, the rank the last number in
its name. Pickled dumps are refused, never read. `--plan` (a plan JSON, a Megatron-LM launch script
or a torchtitan TOML) names the groups' dimensions where the dumps' group descriptions do not.
Prints the diagnosis paragraph and the evidence (names with control characters escaped); --json
prints {diagnosis, suspects [{rank, dim, kind, op, seq, node, group}], groups [{name, desc, dim, ranks,
last_completed}], ranks, world_size, missing_dumps, evidence, progress}. Exit 0 when the dumps were read
(whatever they show), 2 when they cannot be (one line: profiler.analyzers.hang_dumps's bounds).
Pure: no torch.
"""

from __future__ import annotations

import argparse
import sys

import orjson

from parallel.cli.dispatch import prog_name
from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from profiler.analyzers.hang import diagnose, load_dumps
from profiler.cli.analyze import _plan
from profiler.traces.errors import TraceError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog_name("python -m profiler hang"), description="why a job hung: Flight Recorder dumps"
    )
    ap.add_argument("path", help="run directory, folder of dumps, or .zip/.tar.gz of them")
    ap.add_argument("--plan", help="a plan JSON, a Megatron-LM launch script or a torchtitan TOML")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="for each rank's node (default 8; a run's hosts win)")
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.gpus_per_node < 1:
        print(f"error: --gpus-per-node {args.gpus_per_node}: expected 1 or more", file=sys.stderr)
        return 2
    try:
        dumps = load_dumps(args.path)
        world = max(dumps.dumps) + 1
        plan_dict = _plan(args.plan, world)
        plan = Plan.from_dict(plan_dict) if plan_dict else None
        report = diagnose(dumps, plan=plan, gpus_per_node=args.gpus_per_node)
    except (TraceError, SpecError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(report["diagnosis"])
    if report["suspects"]:
        print("\nsuspects:")
        for s in report["suspects"]:
            print(f"  rank {s['rank']:>5}  node {s['node']:>3}  {s['dim']:<7} {s['kind']:<15} {s['op']} #{s['seq']}")
    if report["evidence"]:
        print("\nevidence (the root cause's collective on each rank):")
        for row in report["evidence"]:
            print(
                f"  rank {row['rank']:>5}  {row['op']:<14} sizes {row.get('input_sizes', '—')}  {row.get('state', '')}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
