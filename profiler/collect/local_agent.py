"""`python -m profiler.collect.local_agent --nproc N --outcome FILE -- MODULE ARGS`: the fast one-node launcher.

Imports MODULE once (torch, the engine, what its ranks need), then forks N ranks that each call
`MODULE.rank(ctx, rank=, world_size=, init_method=, local_rank=, node=0, gpus_per_node=N)` with
`ctx = MODULE.prepare(ARGS)` (parallel.engine.launch.run_local: FileStore rendezvous, gloo on loopback,
the first failure stops the rest). The outcome -- {ok} or {ok: false, rank, message, exitcode} --
goes to FILE as JSON, and the agent leaves with os._exit, skipping the second or so the interpreter
spends tearing torch down. SIGTERM stops the ranks (SIGTERM, then SIGKILL after a grace period).

Rank modules: profiler.collect.worker (`profiler run`), profiler.commbench.worker (`profiler commbench`).
It is started by launchers.local_commands (what `--launcher local` means); torchrun plays the same
role for `--launcher torchrun`, starting `python -m MODULE ARGS` per rank.

Runtime layer (imports torch through MODULE).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
from pathlib import Path

from parallel.engine.launch import RankFailure, run_local
from runfiles.rundir import write_json_atomic


def _rank(module, ctx, *, rank: int, world_size: int, init_method: str) -> None:
    module.rank(
        ctx,
        rank=rank,
        world_size=world_size,
        init_method=init_method,
        local_rank=rank,
        node=0,
        gpus_per_node=world_size,
    )


def _stop_on_sigterm() -> None:
    def handler(signum, frame):
        raise SystemExit(f"stopped by signal {signum} ({signal.Signals(signum).name})")

    signal.signal(signal.SIGTERM, handler)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiler.collect.local_agent")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--outcome", type=Path, required=True)
    p.add_argument("module")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    module = importlib.import_module(a.module)
    ctx = module.prepare(args)

    _stop_on_sigterm()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        run_local(functools.partial(_rank, module, ctx), world_size=a.nproc)
        outcome = {"ok": True}
    except RankFailure as err:
        outcome = {"ok": False, "rank": err.rank, "message": err.message, "exitcode": err.exitcode}
    except SystemExit as err:
        outcome = {"ok": False, "rank": None, "message": str(err), "exitcode": None}
    write_json_atomic(a.outcome, outcome)
    if not outcome["ok"]:
        who = f"rank {outcome['rank']}" if outcome["rank"] is not None else "the job"
        print(f"error: {who} failed: {outcome['message']}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if outcome["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
