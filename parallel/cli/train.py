"""`python -m parallel train`: train the small GPT under a DP×TP×PP×CP(+SP) plan; write DIR/metrics.json.

Run it (the plan and model flags are `python -m parallel plan`'s):

    python -m parallel train --dp 2 --tp 2 --pp 2 --sp --steps 3 --global-batch 8 --out runs/a
        # local launcher: imports torch once and forks the 8 ranks (gloo on 127.0.0.1)
    python -m parallel train ... --launcher torchrun        # the same job through torchrun, one node
    torchrun --nproc-per-node 4 -m parallel train --dp 2 --tp 2 ... --out runs/b
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 -m parallel train --dp 2 --tp 4 ... --out runs/c   # each node

Under torchrun every rank validates the plan and runs `run_rank`. Exit codes: 0 trained; 2 the
plan model (parallel.core.validate) or the engine rejects the plan, printed before any process starts;
1 a rank failed, named with its error.

Wrappers (the profiler) use parallel.engine.api. Hidden test hook: PARASCOPE_FAIL_RANK=r [PARASCOPE_FAIL_STEP=k]
[PARASCOPE_FAIL_MODE=raise|kill|hang] makes rank r raise, SIGKILL itself, or hang at step k.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

from parallel.cli import args as cli_args
from parallel.cli.dispatch import prog_name
from parallel.core.engine_plan import ENGINE_PLAN_FLAGS, engine_plan
from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from parallel.core.validate import VOCAB_PADDED, check
from parallel.engine.api import TrainConfig, engine_errors, memory_errors, run_rank, torchrun_env
from parallel.engine.launch import RankFailure, run_local, run_torchrun


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("python -m parallel train"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli_args.add_model_args(p, default="tiny")
    cli_args.add_plan_args(p, only=ENGINE_PLAN_FLAGS)
    cli_args.add_cluster_args(p, default="local-cpu")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument(
        "--swiglu",
        choices=("fused", "unfused"),
        default="fused",
        help="llama: keep only the SwiGLU's input for backward (fused, as Megatron-LM) or also silu(gate) (unfused PyTorch)",
    )
    g.add_argument("--bucket-mb", type=float, default=25.0, help="gradient all-reduce bucket size (MiB)")
    g.add_argument("--timeout", type=float, default=60.0, help="process-group timeout in seconds")
    g.add_argument("--out", default=None, help="run directory for metrics.json")
    g.add_argument(
        "--straggler",
        default=None,
        metavar="RANK:MS",
        help="inject a straggler: a host delay of MS ms on every microbatch's forward of RANK",
    )
    g.add_argument("--save-params", action="store_true", help="write each rank's parameter shards to OUT/params/")
    g.add_argument(
        "--launcher",
        choices=("local", "torchrun"),
        default="local",
        help="local: fork the ranks from one process (fast); torchrun: one-node torchrun",
    )
    return p


def out_error(out: Path) -> str | None:
    """Why --out cannot hold the job's files, found before any rank starts (rank 0 writes
    metrics.json only after the last step); None when it can."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory"
    blocked = cli_args.unwritable_ancestor(out)
    if blocked is None:
        return None
    where, what = blocked
    if what == "is not a directory":
        return f"--out {out}: cannot be created ({where} {what})"
    return f"--out {out}: {where} {what}"


def launch_nodes(args: argparse.Namespace, world_size: int) -> int:
    """The machines this launch spreads its ranks over: the lab's two nodes, the profiler's --nnodes,
    torchrun's world / LOCAL_WORLD_SIZE, else one (the local launcher)."""
    if getattr(args, "lab", False):
        return 2
    if getattr(args, "nnodes", None):
        return int(args.nnodes)
    env = torchrun_env()
    if env is not None and env["gpus_per_node"]:
        return max(1, world_size // env["gpus_per_node"])
    return 1


def plan_of_args(args: argparse.Namespace) -> Plan:
    """The plan a `parallel train` command line runs: its plan flags, as this engine runs them."""
    return engine_plan(cli_args.plan_from_args(args, only=ENGINE_PLAN_FLAGS), dropout=args.dropout)


def config_from_args(argv) -> tuple[TrainConfig | None, list[str], list[str]]:
    """(config, errors, warnings) from the command line; errors mean exit 2."""
    return config_from_namespace(parser().parse_args(argv))


def config_from_namespace(args: argparse.Namespace) -> tuple[TrainConfig | None, list[str], list[str]]:
    """config_from_args for a namespace parsed by `parser()` or a parser built on it (the profiler's)."""
    try:
        model, plan = cli_args.model_from_args(args), plan_of_args(args)
        cluster = cli_args.launch_cluster(args, plan.world_size, nnodes=launch_nodes(args, plan.world_size))
    except SpecError as err:
        return None, [str(err)], []
    verdict = check(plan, model, cluster)
    errors = verdict.errors + engine_errors(model, plan)
    warnings = verdict.warnings
    if (
        model.vocab % plan.tp
    ):  # the engine refuses to pad (engine_errors): the plan model's padding note would contradict it
        warnings = [w for w in warnings if not w.endswith(VOCAB_PADDED)]
    if not errors:  # ranks on this host: all of them, unless torchrun says how many run here
        env = torchrun_env()
        errors += memory_errors(model, plan, ranks_here=env["gpus_per_node"] if env else plan.world_size)
    if args.steps < 1:
        errors.append(f"--steps {args.steps}: train at least one step")
    if not 0 <= args.dropout < 1:
        errors.append(f"--dropout {args.dropout} must be in [0, 1)")
    elif args.dropout and model.arch == "llama":
        errors.append(f"--dropout {args.dropout:g}: the engine's llama has no dropout (as Llama 2/3)")
    elif args.dropout and plan.cp > 1 and plan.cp_kind == "ring":
        errors.append(
            f"--dropout {args.dropout:g} with --cp-kind ring: the engine's ring attention has no attention dropout"
        )
    if not args.timeout > 0:
        errors.append(f"--timeout {args.timeout:g} must be > 0 (seconds a collective may wait for its peers)")
    if args.out and (why := out_error(Path(args.out))):
        errors.append(why)
    straggler, why = _straggler(getattr(args, "straggler", None), plan.world_size)
    if why:
        errors.append(why)
    cfg = TrainConfig(
        model=model,
        plan=plan,
        steps=args.steps,
        seed=args.seed,
        lr=args.lr,
        weight_decay=args.weight_decay,
        dropout=args.dropout,
        swiglu=getattr(args, "swiglu", "fused"),
        bucket_mb=args.bucket_mb,
        timeout_s=args.timeout,
        out=args.out,
        save_params=args.save_params,
        launcher=args.launcher,
        straggler=straggler,
    )
    return cfg, errors, warnings


def _straggler(text: str | None, world_size: int) -> tuple[tuple[int, float] | None, str | None]:
    """--straggler RANK:MS -> (rank, ms), or the error that says what is wrong with it."""
    if not text:
        return None, None
    rank, _, ms = text.partition(":")
    try:
        r, delay = int(rank), float(ms)
    except ValueError:
        return None, f"--straggler {text!r}: expected RANK:MS, e.g. 3:20"
    if not 0 <= r < world_size:
        return None, f"--straggler {text!r}: rank {r} is outside 0..{world_size - 1}"
    if not 0 <= delay <= 60_000:
        return None, f"--straggler {text!r}: the delay must be 0-60000 ms"
    return (r, delay), None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, errors, warnings = config_from_args(argv)
    env = torchrun_env()
    quiet = env is not None and env["rank"] != 0
    if errors:
        if not quiet:
            print("invalid plan:\n" + "\n".join(f"  error: {e}" for e in errors), file=sys.stderr)
        return 2
    if not quiet:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    if env is not None:  # we are one rank of a torchrun job
        if env["world_size"] != cfg.plan.world_size:
            print(
                f"dp×tp×pp×cp = {cfg.plan.world_size}, but torchrun started {env['world_size']} ranks", file=sys.stderr
            )
            return 2
        # lazy: torch, on a torchrun rank only; the parser's importers (profiler.collect.spec, tpsweep) load none
        from torch.distributed.elastic.multiprocessing.errors import record  # torchrun reports the traceback

        cfg = dataclasses.replace(cfg, launcher="torchrun")
        record(run_rank)(
            cfg,
            rank=env["rank"],
            world_size=env["world_size"],
            local_rank=env["local_rank"],
            node=env["node"],
            gpus_per_node=env["gpus_per_node"],
        )
        return 0
    try:  # before any rank starts: rank 0 writes metrics.json there only after the last step
        if cfg.out:
            Path(cfg.out).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"invalid plan:\n  error: --out {cfg.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    if cfg.launcher == "torchrun":  # the ranks see torchrun's environment and ignore --launcher
        return run_torchrun(argv, nproc=cfg.plan.world_size)
    # lazy: torch and the engine (2 s), loaded once here before forking the ranks, never by the parser's importers
    from parallel.engine import job as engine  # noqa: F401

    if cfg.plan.pp > 1:  # autograd.backward(grad_tensors=...) imports this and sympy on first use: once, here
        # lazy: sympy, which only a pipeline's backward needs
        import torch.fx.experimental.symbolic_shapes  # noqa: F401

    try:
        run_local(functools.partial(_local_rank, cfg), world_size=cfg.plan.world_size)
    except RankFailure as err:
        print(f"error: rank {err.rank} failed: {err.message}", file=sys.stderr)
        return 1
    return 0


def _local_rank(cfg: TrainConfig, *, rank: int, world_size: int, init_method: str) -> None:
    run_rank(cfg, rank=rank, world_size=world_size, init_method=init_method)
