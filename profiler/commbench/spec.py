"""The flags of `python -m profiler commbench` (see commbench.py), parsed without importing torch.

    spec, errors = parse_commbench(argv)

Pure: stdlib only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from parallel.cli.args import unwritable_ancestor
from parallel.cli.dispatch import prog_name
from profiler.collect.spec import lab_node_flags_error
from profiler.commbench.fit import OPS, parse_sizes

DEFAULT_SIZES = "1KiB..16MiB"
DEFAULT_FACTOR = 4  # 1, 4, 16, 64, 256 KiB, 1, 4, 16 MiB: 8 sizes keep N=4 on 2 cores near 20 s
QUICK = {"sizes": "1KiB..1MiB", "factor": 32, "iters": 3, "warmup": 1}  # 1 KiB, 32 KiB, 1 MiB; group sizes 2 and N


@dataclass(frozen=True)
class CommbenchSpec:
    out: Path
    nproc: int  # ranks per node
    sizes: tuple[int, ...]
    ops: tuple[str, ...]
    iters: int
    warmup_iters: int
    group_sizes_arg: tuple[int, ...] | None  # None: 2..world
    quick: bool
    timeout_s: float
    job_timeout_s: float | None
    launcher: str
    nnodes: int = 1
    node_rank: int = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str = "parascope-commbench"
    lab: str | None = None  # --lab: the lab's prefix; this process starts both nodes' agents
    argv: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def csv_path(self) -> Path:
        return self.out.with_suffix(".csv")

    def group_sizes(self, world: int | None = None) -> list[int]:
        world = world or self.world_size
        if self.group_sizes_arg:
            return sorted(n for n in set(self.group_sizes_arg) if 2 <= n <= world)
        if self.quick:
            return sorted({2, world})
        return list(range(2, world + 1))

    def worker_argv(self) -> list[str]:
        return [*self.argv, f"--out={self.out}"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("python -m profiler commbench"),
        description="time collectives; fit latency and bandwidth per link",
    )
    p.add_argument("--nproc", type=int, default=4, help="ranks per node (default 4)")
    p.add_argument("--out", type=Path, default=Path("commbench.json"), help="JSON result; the CSV goes beside it")
    p.add_argument("--sizes", default=None, help=f"'LOW..HIGH' or a comma list (default {DEFAULT_SIZES})")
    p.add_argument(
        "--size-factor", type=int, default=None, help=f"step of a LOW..HIGH range (default {DEFAULT_FACTOR})"
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--group-sizes", default=None, help="comma list (default 2..N)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per point (default 10)")
    p.add_argument("--warmup-iters", type=int, default=None, help="untimed calls first (default 2)")
    p.add_argument("--quick", action="store_true", help="3 sizes, group sizes 2 and N, 3 iterations (tests)")
    p.add_argument("--timeout", type=float, default=120.0, help="process-group timeout in seconds")
    p.add_argument("--job-timeout", type=float, default=None, help="seconds the whole benchmark may take")
    p.add_argument("--launcher", choices=("local", "torchrun"), default="local")
    t = p.add_argument_group("torchrun across nodes (give each node's commbench the same flags)")
    t.add_argument("--nnodes", type=int, default=1)
    t.add_argument("--node-rank", type=int, default=0)
    t.add_argument("--rdzv-backend", default="c10d")
    t.add_argument("--rdzv-endpoint", default=None)
    t.add_argument("--rdzv-id", default="parascope-commbench")
    lab = p.add_argument_group("lab (two nodes on this machine; needs root and `profiler lab up`)")
    lab.add_argument(
        "--lab",
        action="store_true",
        help="--nproc ranks in each of the lab's two nodes: fits `intra` (loopback) and `inter` "
        "(the shaped link); implies torchrun",
    )
    lab.add_argument("--lab-prefix", default="psl-", help="the lab's name prefix (default %(default)s)")
    return p


def out_errors(out: Path) -> list[str]:
    """Why FILE cannot take the result, found before anything runs (the benchmark takes tens of
    seconds, and rank 0 writes FILE and FILE's .csv only at the end)."""
    csv = out.with_suffix(".csv")
    if out.suffix.lower() == ".csv":
        return [
            f"--out {out}: the CSV goes beside the JSON, at FILE with .csv; give the JSON's name (e.g. {out.with_suffix('.json').name})"
        ]
    for path in (out, csv):
        if path.is_dir():
            return [f"--out {out}: {path} is a directory; give a file name (e.g. {out / 'commbench.json'})"]
    blocked = unwritable_ancestor(out.resolve().parent)
    return [f"--out {out}: cannot write under {blocked[0]}"] if blocked else []


def parse_commbench(argv) -> tuple[CommbenchSpec | None, list[str]]:
    argv = list(argv)
    a = parser().parse_args(argv)
    errors = []
    quick = a.quick
    try:
        sizes = parse_sizes(
            a.sizes or (QUICK["sizes"] if quick else DEFAULT_SIZES),
            a.size_factor or (QUICK["factor"] if quick else DEFAULT_FACTOR),
        )
    except ValueError as err:
        errors.append(str(err))
        sizes = []
    ops = tuple(o.strip() for o in a.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        errors.append(f"--ops {a.ops!r}: choose from {', '.join(OPS)}")
    try:
        group_sizes = tuple(int(x) for x in a.group_sizes.split(",")) if a.group_sizes else None
    except ValueError:
        errors.append(f"--group-sizes {a.group_sizes!r}: a comma list of integers")
        group_sizes = None
    if a.nproc < 1 or a.nnodes < 1 or a.nproc * (2 if a.lab else a.nnodes) < 2:
        errors.append(f"--nproc {a.nproc} × --nnodes {a.nnodes}: need at least 2 ranks")
    if a.lab:
        if why := lab_node_flags_error(a):
            errors.append(why)
        a.launcher, a.nnodes, a.node_rank = "torchrun", 2, 0
    elif a.nnodes > 1 and (a.launcher != "torchrun" or not a.rdzv_endpoint):
        errors.append("--nnodes > 1 needs --launcher torchrun and --rdzv-endpoint HOST:PORT")
    iters = a.iters or (QUICK["iters"] if quick else 10)
    warmup = a.warmup_iters if a.warmup_iters is not None else (QUICK["warmup"] if quick else 2)
    if iters < 1 or warmup < 0:
        errors.append(f"--iters {iters} must be >= 1 and --warmup-iters {warmup} >= 0")
    if not a.timeout > 0 or (a.job_timeout is not None and not a.job_timeout > 0):
        errors.append(f"--timeout {a.timeout:g} and --job-timeout {a.job_timeout} must be > 0 seconds")
    errors += out_errors(a.out)
    if errors:
        return None, errors
    spec = CommbenchSpec(
        out=a.out.resolve(),
        nproc=a.nproc,
        sizes=tuple(sizes),
        ops=ops,
        iters=iters,
        warmup_iters=warmup,
        group_sizes_arg=group_sizes,
        quick=quick,
        timeout_s=a.timeout,
        job_timeout_s=a.job_timeout,
        launcher=a.launcher,
        nnodes=a.nnodes,
        node_rank=a.node_rank,
        rdzv_backend=a.rdzv_backend,
        rdzv_endpoint=a.rdzv_endpoint,
        rdzv_id=a.rdzv_id,
        lab=a.lab_prefix if a.lab else None,
        argv=tuple(argv),
    )
    if not spec.group_sizes():
        return None, [f"--group-sizes: none of {a.group_sizes} is between 2 and {spec.world_size}"]
    return spec, []
