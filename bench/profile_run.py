"""Profiler benchmark: an 8-rank DP2×TP2×PP2+SP profile run of `tiny`, local launcher and
torchrun side by side, each split into start-up, first step, steady steps, trace export and exit.

Run:
    .venv/bin/python -m bench.profile_run [--repeat 3] [--steps 4] [--json FILE] [-- extra profiler run flags]

Each repeat runs `python -m profiler run --dp 2 --tp 2 --pp 2 --sp --global-batch 8 --steps N` (wait 1,
warmup 1, the rest recorded) once per launcher, alternating which goes first, and reads the ranks'
status files (profiler/collect/worker.py) for when each step ended and how long each took:
    wall        the whole command, as a user waits for it
    start-up    launch -> the last rank starts step 0 (interpreters, torch import, fork or torchrun
                agents, rendezvous, process groups, model build)
    first step  step 0, the slowest rank (lazy initialisation, first autograd graph)
    steady      the median of the later steps: unprofiled (waiting) and profiled (recording)
    export      the slowest rank's trace export (Kineto JSON + gzip + rename)
    exit        last step -> the command returns (export, metrics, teardown)
    trace KB/rank/step   gzip bytes (and JSON bytes) of a rank's trace per recorded step, mean over ranks
Goal: the whole 8-rank run within 15 s on 2 cores. Not a timed test: the numbers depend on the machine
and its load (the 1-minute load average is printed with each run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--global-batch", "8", "--wait", "1", "--warmup", "1"]


def run_once(launcher: str, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        load = os.getloadavg()[0]
        t0 = time.time()
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "profiler",
                "run",
                *PLAN,
                "--steps",
                str(steps),
                *extra,
                f"--launcher={launcher}",
                f"--out={out}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.time() - t0
        if r.returncode != 0:
            raise SystemExit(f"{launcher} failed:\n{r.stderr[-3000:]}")
        status = [json.loads(p.read_text()) for p in sorted((out / "status").glob("rank*.json"))]
        run = json.loads((out / "run.json").read_text())
    active = len(run["profile"]["profiled_steps"])
    first_recorded = run["profile"]["profiled_steps"][0]
    step_times = [max(s["step_time_s"][i] for s in status) for i in range(steps)]
    start0 = max(s["step_end"][0] - s["step_time_s"][0] for s in status)
    last_end = max(s["step_end"][-1] for s in status)
    return {
        "launcher": launcher,
        "wall_s": wall,
        "startup_s": start0 - t0,
        "first_step_s": step_times[0],
        "steady_unprofiled_s": statistics.median(step_times[1:first_recorded]) if first_recorded > 1 else None,
        "steady_profiled_s": statistics.median(step_times[first_recorded:]),
        "export_s": max(s["export_s"] for s in status),
        "exit_s": t0 + wall - last_end,
        "trace_kb_per_rank_step": statistics.mean(s["trace_bytes"] for s in status) / active / 1e3,
        "trace_json_kb_per_rank_step": statistics.mean(s["trace_json_bytes"] for s in status) / active / 1e3,
        "ranks": len(status),
        "loadavg": load,
    }


COLUMNS = [
    ("wall_s", "wall s"),
    ("startup_s", "start-up s"),
    ("first_step_s", "first step s"),
    ("steady_unprofiled_s", "steady s (wait)"),
    ("steady_profiled_s", "steady s (recorded)"),
    ("export_s", "export s"),
    ("exit_s", "exit s"),
    ("trace_kb_per_rank_step", "trace KB/rank/step (gz)"),
    ("trace_json_kb_per_rank_step", "JSON KB/rank/step"),
]


def table(samples: list[dict]) -> str:
    head = "| launcher | " + " | ".join(label for _, label in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for launcher in ("local", "torchrun"):
        rows = [s for s in samples if s["launcher"] == launcher]
        if not rows:
            continue
        cells = []
        for key, _ in COLUMNS:
            values = [s[key] for s in rows if s[key] is not None]
            cells.append(f"{statistics.median(values):.2f}" if values else "n/a")
        lines.append(f"| {launcher} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--launchers", default="local,torchrun")
    p.add_argument("--json", type=Path, default=None)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    launchers = args.launchers.split(",")
    samples = []
    for i in range(args.repeat):
        for launcher in launchers if i % 2 == 0 else launchers[::-1]:
            s = run_once(launcher, args.steps, extra)
            samples.append(s)
            print(
                f"{launcher:9s} wall {s['wall_s']:5.1f} s  start-up {s['startup_s']:4.1f}  first step "
                f"{s['first_step_s']:.2f}  steady {s['steady_profiled_s']:.2f} (recorded)  export {s['export_s']:.2f}"
                f"  exit {s['exit_s']:.2f}  trace {s['trace_kb_per_rank_step']:.0f} KB/rank/step  "
                f"load {s['loadavg']:.1f}",
                flush=True,
            )
    print(
        f"\nmedian of {args.repeat}: 8 ranks, DP2×TP2×PP2+SP, tiny, {args.steps} steps (wait 1, warmup 1), "
        f"{os.cpu_count()} CPUs\n"
    )
    print(table(samples))
    if args.json:
        args.json.write_text(json.dumps({"plan": PLAN, "steps": args.steps, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
