"""bench.predict's two-node lab plans: held-back plans
whose DP or PP groups cross the lab's shaped link (profiler/lab: two network namespaces on this
machine, TP innermost so TP stays inside a node), predicted by the same calibration with the lab's
inter-node link from `profiler commbench --lab` (`profiler calibrate --links`: the calibration runs
stay on one node, so no traced collective crossed the link), and measured on the lab.

A lab plan is measured by `profiler run --lab` -- one process starts a torchrun agent inside each
namespace, as `parallel train` has no lab launcher -- with the profiler waiting until the last steps:
its steady step is the median of the untraced steps before the profiler's warm-up (what the model
predicts: a step without the profiler), one traced step at the end so the run directory is whole.
Needs root and `python -m profiler lab up`; `bench.predict --lab` says so and exits when either is
missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench._subprocess import run_module
from bench.plans import MODEL, plan_model
from profiler.analyzers.calibrate import _unprofiled
from profiler.lab import settings as lab
from runfiles.metrics import load_metrics

# world / 2 ranks a node: TP inside a node, the outer dimension across the link
LAB_HELD_BACK = {
    "lab dp2": ["--dp", "2", "--global-batch", "4"],  # the gradients' all-reduce crosses
    "lab pp2": ["--pp", "2", "--global-batch", "4"],  # the stages' sends cross
    "lab dp2 tp2": ["--dp", "2", "--tp", "2", "--global-batch", "4"],  # TP inside each node, DP across
    "lab tp2 pp2": ["--tp", "2", "--pp", "2", "--global-batch", "4"],  # TP inside, PP across
    "lab dp2 pp2": ["--dp", "2", "--pp", "2", "--global-batch", "8"],  # a pipeline a node, DP across
}
COMMBENCH = [  # the lab's links over the sizes the tiny model's collectives move (KiB to ~1 MiB)
    "--ops=all_reduce,all_gather,reduce_scatter,send_recv",
    "--sizes=4KiB..1MiB",
    "--size-factor=4",
    "--iters=5",
    "--nproc=2",
]


def lab_error(prefix: str) -> str | None:
    """Why the lab plans cannot run here (not root, no lab up), or None."""
    if os.geteuid() != 0:
        return "the two-node lab needs root (network namespaces)"
    try:
        lab.settings(prefix)
    except lab.LabError as err:
        return f"{err} (sudo python -m profiler lab up --like dgx-h100)"
    return None


def world(flags: list[str]) -> int:
    """The plan's ranks."""
    return plan_model(flags)[1].world_size


def cluster_flags(flags: list[str]) -> list[str]:
    """`parallel plan`'s view of the lab: two nodes of world / 2 ranks on this machine's cores."""
    return ["--cluster=local-cpu", "--nodes=2", f"--gpus-per-node={world(flags) // 2}"]


def commbench(out: Path, prefix: str) -> Path:
    """`profiler commbench --lab`: the lab's fitted intra and inter links."""
    path = out / "commbench.json"
    run_module("profiler", "commbench", "--lab", f"--lab-prefix={prefix}", *COMMBENCH, f"--out={path}")
    return path


def measure(flags: list[str], steps: int, out: Path, prefix: str) -> list[float]:
    """The untraced steady steps (after the first) of one `profiler run --lab` of the plan."""
    run_module(
        "profiler", "run", *MODEL, *flags, "--lab", f"--lab-prefix={prefix}", f"--steps={steps + 3}",
        f"--wait={steps + 1}", "--warmup=1", "--active=1", f"--out={out}",
    )  # fmt: skip
    metrics = load_metrics(out)
    return _unprofiled(metrics["step_time_s"], metrics["profile"]["profiled_steps"])
