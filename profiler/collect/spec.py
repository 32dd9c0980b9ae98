"""The flags of `python -m profiler run`: `python -m parallel train`'s (plan, model, cluster,
training) plus the profiler's schedule, the run directory, and the launcher's.

    spec, errors, warnings = parse_run(argv)        # imports no torch; errors mean exit 2

Schedule (torch.profiler.schedule, one cycle): `--wait` steps untraced, `--warmup` steps traced
but dropped, then `--active` steps recorded (default: all that remain). wait + warmup >= 1: the
trace starts after the first step, once torch.distributed is up, so it carries distributedInfo
(rank, world size, process groups).

Launchers: `local` (default) forks the ranks from one process that imported torch once (fast, one
node); `torchrun` runs one torchrun agent for this node: `--standalone` for one node, or the
multi-node flags `--nnodes N --node-rank K --nproc-per-node P --rdzv-endpoint HOST:PORT
[--rdzv-backend c10d] [--rdzv-id ID]` given to each node's `profiler run` alike. `--lab`:
one `profiler run` starts a torchrun agent in each node of the two-node lab (profiler/lab/settings.py), half
the ranks each; it implies torchrun and --gpus-per-node = world / 2, and takes no other node flags.

Pure: stdlib and parallel's pure modules only.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from parallel.cli import args as cli_args
from parallel.cli.dispatch import prog_name
from parallel.cli.train import config_from_namespace
from parallel.cli.train import parser as train_parser
from parallel.core.plan import Plan
from parallel.core.specs import Cluster, SpecError
from parallel.engine.api import TrainConfig
from parallel.engine.injection import parse_injection

DEFAULT_STEPS = 4  # wait 1 + warmup 1 + active 2: two recorded steady steps
MAX_STEPS = 1_000_000  # a profiled run records every step it traces: far past any useful profile


@dataclass(frozen=True)
class RunSpec:
    """Everything `profiler run` was asked to do; `argv` is kept to start the ranks under torchrun."""

    cfg: TrainConfig
    cluster: Cluster
    wait: int
    warmup: int
    active: int
    out: Path | None
    force: bool
    job_timeout_s: float | None
    launcher: str  # local | torchrun
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str = "parascope"
    lab: str | None = None  # the lab's prefix with --lab: both nodes' agents started by this process
    inject_hang: str | None = None  # RANK:STEP[:KIND] (parallel.engine.injection)
    max_local_ranks: int | None = None  # None: max_local_ranks() of the machine
    argv: tuple[str, ...] = field(default=())

    @property
    def plan(self) -> Plan:
        return self.cfg.plan

    @property
    def profiled_steps(self) -> list[int]:
        return list(range(self.wait + self.warmup, self.wait + self.warmup + self.active))

    @property
    def multinode(self) -> bool:
        """Each node runs its own `profiler run` (not the lab, where one supervisor starts both)."""
        return self.nnodes > 1 and self.lab is None

    def worker_argv(self, out: Path) -> list[str]:
        """The arguments a torchrun rank is started with (the same flags, the resolved --out)."""
        return [*self.argv, f"--out={out}"]


def parser() -> argparse.ArgumentParser:
    p = train_parser()
    p.prog = prog_name("python -m profiler run")
    p.description = "Profile every rank of a parallel training job into a run directory."
    p.set_defaults(steps=DEFAULT_STEPS)
    for action in p._actions:  # the same flags, with what they mean here
        if action.dest == "out":
            action.help = "run directory (default: a new one under $PARASCOPE_RUNS or ./runs)"
        elif action.dest == "launcher":
            action.help = "local: fork the ranks from one process (fast, one node); torchrun: a torchrun agent"
        elif action.dest == "timeout":
            action.help = "process-group timeout in seconds: a collective a peer never joins fails after it"
    g = p.add_argument_group("profiler")
    g.add_argument(  # read by profiler.cli.run before this parser: its fields become the plan flags
        "--plan",
        metavar="FILE",
        default=None,
        help="a plan JSON (a `profiler replan --json` or `parallel search --json` row's plan): its fields as the "
        "plan flags; a flag given beside it wins",
    )
    g.add_argument("--wait", type=int, default=1, help="steps before tracing starts (default 1)")
    g.add_argument("--warmup", type=int, default=1, help="steps traced but dropped (default 1)")
    g.add_argument("--active", type=int, default=None, help="steps recorded (default: the rest)")
    g.add_argument("--force", action="store_true", help="replace a previous run in --out (nothing else)")
    g.add_argument(
        "--max-local-ranks",
        type=int,
        default=None,
        help="most rank processes this machine may start (default: its cores x 16, and its memory at 300 MB a rank)",
    )
    g.add_argument(
        "--inject-hang",
        metavar="RANK:STEP[:KIND]",
        default=None,
        help="make RANK misbehave at STEP's first collective, then stop issuing any: skip it (default), "
        "issue it with another size, or another op; every rank's Flight Recorder dump lands in fr/ "
        "(python -m profiler hang RUN_DIR)",
    )
    g.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        help="seconds the whole job may take before it is stopped and marked failed",
    )
    t = p.add_argument_group(
        "torchrun (multi-node: each node runs `profiler run` with the same flags, its own --node-rank)"
    )
    t.add_argument("--nnodes", type=int, default=1)
    t.add_argument("--node-rank", type=int, default=0)
    t.add_argument("--nproc-per-node", type=int, default=None, help="default: world size / nnodes")
    t.add_argument("--rdzv-backend", default="c10d")
    t.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (node 0)")
    t.add_argument("--rdzv-id", default="parascope", help="job id, the same on every node")
    lab = p.add_argument_group("lab (two nodes on this machine; needs root and `profiler lab up`)")
    lab.add_argument(
        "--lab",
        action="store_true",
        help="run half the ranks in each lab node: ranks on one node talk over loopback, across "
        "nodes over the shaped link (implies torchrun)",
    )
    lab.add_argument("--lab-prefix", default="psl-", help="the lab's name prefix (default %(default)s)")
    return p


def _schedule_errors(args, steps: int) -> tuple[int, list[str]]:
    errors = []
    if args.wait < 0 or args.warmup < 0:
        errors.append(f"--wait {args.wait} and --warmup {args.warmup} must be >= 0")
    if args.wait + args.warmup < 1:
        errors.append(
            "--wait + --warmup must be at least 1: the trace starts after the first step, once "
            "torch.distributed is up, so that it records the rank and its process groups"
        )
    active = args.active if args.active is not None else steps - args.wait - args.warmup
    if active < 1:
        errors.append(
            f"--active {active}: record at least one step (steps {steps} = wait {args.wait} + "
            f"warmup {args.warmup} + active; raise --steps)"
        )
    elif args.wait + args.warmup + active > steps:
        errors.append(
            f"wait {args.wait} + warmup {args.warmup} + active {active} = "
            f"{args.wait + args.warmup + active} > --steps {steps}"
        )
    return active, errors


def lab_node_flags_error(args) -> str | None:
    """--lab (run and commbench): this process starts both lab nodes, so the node flags must be unset."""
    given = [
        f
        for f, v in (
            ("--nnodes", args.nnodes != 1),
            ("--node-rank", args.node_rank != 0),
            ("--rdzv-endpoint", args.rdzv_endpoint),
        )
        if v
    ]
    return f"--lab starts both lab nodes itself; drop {', '.join(given)}" if given else None


def _lab_errors(args, world_size: int) -> tuple[int, list[str]]:
    """--lab: two nodes of world / 2 ranks each, started by this process (so no node flags)."""
    errors = [e for e in (lab_node_flags_error(args),) if e]
    if world_size < 2 or world_size % 2:
        errors.append(f"--lab splits the ranks over its 2 nodes, but dp×tp×pp×cp = {world_size} is not even")
    if args.nproc_per_node and args.nproc_per_node * 2 != world_size:
        errors.append(f"--lab: --nproc-per-node {args.nproc_per_node} × 2 nodes != {world_size} ranks")
    return max(world_size // 2, 1), errors


def _launch_errors(args, world_size: int) -> tuple[int, list[str]]:
    if args.lab:
        return _lab_errors(args, world_size)
    errors = []
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        errors.append(f"--nnodes {args.nnodes} --node-rank {args.node_rank}: need 0 <= node-rank < nnodes")
    nproc = args.nproc_per_node or max(world_size // max(args.nnodes, 1), 1)
    if args.nnodes > 1:
        if args.launcher != "torchrun":
            errors.append("--nnodes > 1 needs --launcher torchrun (the local launcher forks on one node)")
        if not args.rdzv_endpoint:
            errors.append("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (where node 0's rendezvous listens)")
    if nproc * args.nnodes != world_size:
        errors.append(
            f"--nnodes {args.nnodes} × --nproc-per-node {nproc} = {nproc * args.nnodes} ranks, "
            f"but dp×tp×pp×cp = {world_size}"
        )
    return nproc, errors


def local_ranks_error(spec: RunSpec, max_ranks: int | None) -> str | None:
    """Why this machine cannot start the spec's ranks (checked by the supervisor, before it starts any)."""
    limit = max_ranks if max_ranks is not None else max_local_ranks()
    nproc = spec.nproc_per_node * (2 if spec.lab else 1)
    if nproc <= limit:
        return None
    return (
        f"{nproc:,} rank processes on this machine, more than it can host ({limit:,}: {os.cpu_count() or 1} cores "
        f"x {RANKS_PER_CORE}, and {RANK_MEMORY_MB} MB of memory per rank); give --max-local-ranks to allow more, "
        "or run across nodes"
    )


RANKS_PER_CORE = 16  # gloo ranks share cores well past one each (bench/launch.py runs 32 on 2 cores)
RANK_MEMORY_MB = 300  # a rank of the tiny models: torch, gloo and the profiler


def max_local_ranks() -> int:
    """Rank processes one machine can host: cores x RANKS_PER_CORE, and the memory available at RANK_MEMORY_MB each."""
    by_cores = (os.cpu_count() or 1) * RANKS_PER_CORE
    try:
        with open("/proc/meminfo") as f:
            available_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        by_memory = max(1, available_kb // 1024 // RANK_MEMORY_MB)
    except (OSError, StopIteration, ValueError):
        by_memory = by_cores
    return min(by_cores, by_memory)


def parse_run(argv) -> tuple[RunSpec | None, list[str], list[str]]:
    """(spec, errors, warnings) from the command line, without importing torch."""
    argv = list(argv)
    args = parser().parse_args(argv)
    if args.plan is not None:  # profiler.cli.run replaces --plan FILE by its flags before parsing
        return None, ["--plan FILE is read by `python -m profiler run`: give the plan's flags here"], []
    cfg, errors, warnings = config_from_namespace(args)
    if cfg is None:
        return None, errors, warnings
    active, sched = _schedule_errors(args, cfg.steps)
    nproc, launch = _launch_errors(args, cfg.plan.world_size)
    if args.lab:  # the lab's shape: 2 nodes of nproc ranks, under torchrun
        args.launcher, args.nnodes = "torchrun", 2
        if args.gpus_per_node is None:
            args.gpus_per_node = nproc
    errors = errors + sched + launch
    for flag, value in (("--steps", cfg.steps), ("--wait", args.wait), ("--warmup", args.warmup), ("--active", active)):
        if value > MAX_STEPS:
            errors.append(f"{flag} {value}: at most {MAX_STEPS:,} steps")
    if args.job_timeout is not None and not 0 < args.job_timeout < math.inf:  # nan compares false: refused
        errors.append(f"--job-timeout {args.job_timeout} must be a number of seconds > 0")
    try:
        injection = parse_injection(args.inject_hang)
    except ValueError as err:
        errors.append(str(err))
    else:
        if injection is not None and injection.rank >= cfg.plan.world_size:
            errors.append(f"--inject-hang {args.inject_hang}: rank {injection.rank} of {cfg.plan.world_size} ranks")
        if injection is not None and injection.step >= cfg.steps:
            errors.append(f"--inject-hang {args.inject_hang}: step {injection.step} of {cfg.steps} steps (0-based)")
    try:
        cluster = cli_args.launch_cluster(args, cfg.plan.world_size, nnodes=args.nnodes)
    except SpecError as err:
        return None, errors + [str(err)], warnings
    spec = RunSpec(
        cfg=cfg,
        cluster=cluster,
        wait=args.wait,
        warmup=args.warmup,
        active=active,
        out=Path(args.out) if args.out else None,
        force=args.force,
        job_timeout_s=args.job_timeout,
        launcher=args.launcher,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        nproc_per_node=nproc,
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        lab=args.lab_prefix if args.lab else None,
        inject_hang=args.inject_hang,
        max_local_ranks=args.max_local_ranks,
        argv=tuple(argv),
    )
    return spec, errors, warnings
