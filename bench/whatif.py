"""What-if and pipeline-bubble checks against real runs on this machine.

    .venv/bin/python -m bench.whatif [--steps 6] [--repeat 2] [--no-lab] [--json FILE]

1. Straggler: the same plan profiled with `--straggler R:MS` and without; `profiler whatif` on the first
   with `--rank-speed R=median` predicts the second's measured step (goal: within 10%).
2. Link (root only, the two-node lab): DP2 x TP2 over the shaped link at B and at 2B; `--link inter=2`
   on the slower predicts the faster (goal: within 15%).
3. Bubble: per stage, bubble fraction (pipeline idle / work) beside (p-1)/(v m) on uniform-stage runs
   (8 layers so the output layer is a small share of a stage), GPipe and 1F1B; and P2P wait on the
   stages next to one slowed stage.

Every step time is the trace's own (profiler.analyzers.steps.steady_step_s); both sides of a comparison
are profiled the same way. A benchmark, not a test: a loaded machine moves the numbers; the runs of one
comparison are made back to back, `--repeat` times, alternating their order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._subprocess import ROOT, run_module

PREFIX = "pslwi-"


def profile(out: Path, flags: list[str], steps: int) -> Path:
    run_module("profiler", "run", *flags, f"--steps={steps}", f"--out={out}", "--force")
    return out


def whatif(path: Path, *flags: str) -> dict:
    return json.loads(run_module("profiler", "whatif", str(path), *flags, "--json"))


def straggler(tmp: Path, steps: int, repeat: int) -> list[dict]:
    rows = []
    for name, plan, rank, ms in (
        ("dp2", ["--dp=2", "--global-batch=8"], 1, 15),
        ("dp2-pp2", ["--dp=2", "--pp=2", "--global-batch=8"], 3, 10),
    ):
        for k in range(repeat):
            order = ("slow", "base") if k % 2 == 0 else ("base", "slow")
            runs = {}
            for which in order:
                extra = [f"--straggler={rank}:{ms}"] if which == "slow" else []
                runs[which] = profile(tmp / f"{name}-{which}-{k}", plan + extra, steps)
            base = whatif(runs["base"])["measured_step_time_s"]
            pred = whatif(runs["slow"], f"--rank-speed={rank}=median")
            rows.append(
                {
                    "plan": name,
                    "straggler": f"{rank}:{ms} ms",
                    "slow_s": pred["measured_step_time_s"],
                    "predicted_s": pred["predicted_step_time_s"],
                    "measured_s": base,
                    "error_pct": round((pred["predicted_step_time_s"] / base - 1) * 100, 1),
                }
            )
    return rows


def link(tmp: Path, steps: int, repeat: int) -> list[dict]:
    if os.geteuid() != 0:
        return []
    rows = []
    try:
        for k in range(repeat):
            runs = {}
            for bw in ("20mbit", "40mbit") if k % 2 == 0 else ("40mbit", "20mbit"):
                run_module("profiler", "lab", "up", f"--bw={bw}", f"--prefix={PREFIX}", "--replace")
                runs[bw] = profile(
                    tmp / f"lab-{bw}-{k}", ["--dp=2", "--tp=2", "--lab", f"--lab-prefix={PREFIX}"], steps
                )
            fast = whatif(runs["40mbit"])["measured_step_time_s"]
            pred = whatif(runs["20mbit"], "--link=inter=2")
            rows.append(
                {
                    "plan": "dp2-tp2 on 2 lab nodes",
                    "link": "20 → 40 Mbit/s",
                    "slow_s": pred["measured_step_time_s"],
                    "predicted_s": pred["predicted_step_time_s"],
                    "measured_s": fast,
                    "error_pct": round((pred["predicted_step_time_s"] / fast - 1) * 100, 1),
                }
            )
    finally:
        subprocess.run(
            [sys.executable, "-m", "profiler", "lab", "down", f"--prefix={PREFIX}"], cwd=ROOT, capture_output=True
        )
    return rows


def bubbles(tmp: Path, steps: int) -> list[dict]:
    runs = {
        "pp2 gpipe m4": ["--pp=2", "--layers=8", "--global-batch=4", "--schedule=gpipe"],
        "pp2 1f1b m4": ["--pp=2", "--layers=8", "--global-batch=4"],
        "pp2 1f1b m8": ["--pp=2", "--layers=8", "--global-batch=8"],
        "pp4 1f1b m8": ["--pp=4", "--layers=8", "--global-batch=8"],
        "pp2 1f1b m8, stage 1 slowed 10 ms/mb": ["--pp=2", "--layers=8", "--global-batch=8", "--straggler=1:10"],
    }
    rows = []
    for name, flags in runs.items():
        out = whatif(profile(tmp / name.replace(" ", "_").replace(",", "").replace("/", ""), flags, steps))
        for st in out["pipeline"]:
            rows.append({"run": name, **st})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.whatif")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-lab", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = {
            "load": os.getloadavg()[0],
            "straggler": straggler(tmp, args.steps, args.repeat),
            "link": [] if args.no_lab else link(tmp, args.steps, args.repeat),
            "bubble": bubbles(tmp, args.steps),
        }
    for key in ("straggler", "link"):
        if out[key]:
            print(f"\n{key}: predicted (what-if on the slow run) vs measured (the real change)")
            for r in out[key]:
                print(
                    f"  {r['plan']:<24} {r.get('straggler', r.get('link')):<16} slow {r['slow_s'] * 1e3:8.1f} ms  "
                    f"predicted {r['predicted_s'] * 1e3:8.1f}  measured {r['measured_s'] * 1e3:8.1f}  error {r['error_pct']:+.1f}%"
                )
            print(f"  mean |error| {statistics.mean(abs(r['error_pct']) for r in out[key]):.1f}%")
    print("\nbubble: per stage, pipeline idle / work beside (p-1)/(v m)")
    for r in out["bubble"]:
        print(
            f"  {r['run']:<40} stage {r['stage']}  work {r['work_ms']:7.1f} ms  bubble {r['bubble_ms']:6.1f}  "
            f"p2p wait {r['p2p_wait_ms']:6.1f}  xfer {r['p2p_transfer_ms']:5.1f}  "
            f"measured {r['bubble_fraction']:.3f}  theory {r['theory_fraction']:.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
