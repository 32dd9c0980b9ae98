"""Launcher benchmark: one 8-rank job of the tiny GPT under torchrun and under the local launcher.

Run:
    .venv/bin/python -m bench.launch [--repeat 3] [--json FILE] [-- extra train flags]

Each repeat runs `python -m parallel train --dp 2 --tp 2 --pp 2 --sp --steps 3 --global-batch 8`
once per launcher (alternating which goes first) and records the wall time of the whole command,
the training steps (metrics.json step_time_s), and the rest: start-up (interpreters, imports,
rendezvous, process groups, model build) and shutdown. Prints a table of medians; --json writes
every sample. Not a timed test: numbers depend on the machine and its load (`uptime` is recorded).
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
PLAN = ["--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--steps", "3", "--global-batch", "8"]


def run_once(launcher: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "parallel", "train", *PLAN, *extra, f"--launcher={launcher}", f"--out={out}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if r.returncode != 0:
            raise SystemExit(f"{launcher} failed:\n{r.stderr[-3000:]}")
        m = json.loads((Path(out) / "metrics.json").read_text())
    steps = sum(m["step_time_s"])
    return {
        "launcher": launcher,
        "wall_s": wall,
        "steps_s": steps,
        "first_step_s": m["step_time_s"][0],
        "steady_step_s": statistics.median(m["step_time_s"][1:]) if len(m["step_time_s"]) > 1 else None,
        "other_s": wall - steps,
        "loadavg": os.getloadavg()[0],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    samples = []
    for i in range(args.repeat):
        for launcher in ("local", "torchrun") if i % 2 == 0 else ("torchrun", "local"):
            s = run_once(launcher, extra)
            samples.append(s)
            print(
                f"{launcher:9s} wall {s['wall_s']:6.1f} s   steps {s['steps_s']:5.1f} s   "
                f"start-up+exit {s['other_s']:5.1f} s   load {s['loadavg']:.1f}",
                flush=True,
            )
    print(f"\nmedian of {args.repeat}, 8 ranks, DP2×TP2×PP2+SP, tiny, 3 steps, {os.cpu_count()} CPUs:")
    for launcher in ("torchrun", "local"):
        rows = [s for s in samples if s["launcher"] == launcher]
        med = {k: statistics.median(s[k] for s in rows) for k in ("wall_s", "steps_s", "other_s", "first_step_s")}
        print(
            f"  {launcher:9s} wall {med['wall_s']:5.1f} s = start-up+exit {med['other_s']:5.1f} s + "
            f"steps {med['steps_s']:4.1f} s (first step {med['first_step_s']:.2f} s)"
        )
    if args.json:
        args.json.write_text(json.dumps({"plan": PLAN + extra, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
