"""Predicted = measured (#16 item 2): calibrate the step-time model from two profiled runs, predict a
spread of held-back plans before they run, then run them and compare.

    .venv/bin/python -m bench.predict [--steps 10] [--json FILE] [--plans name,...]

1. `python -m profiler run` the two calibration plans (CALIBRATE, or --calibrate a,b of CALIBRATION_PLANS) with --wait 8, so each run has
   unprofiled steady steps the fit uses to remove the tracing overhead; `python -m profiler calibrate`.
2. For every held-back plan (HELD_BACK): `python -m parallel plan --calibration calib.json --json` --
   the prediction, written down before the plan runs -- then `python -m parallel train` (no profiler)
   and its steady step: the median of the steps after the first.
3. Print predicted vs measured per plan (and the predicted phases: compute, bubble, exposed comm per
   dimension, fixed), the error, and the mean absolute / worst error over the held-back plans.

A benchmark, not a test (tests/integration/test_predict.py runs a small spread with a loose bound):
the measured side moves by ±10-15% from run to run on this 2-core machine; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench._subprocess import run_module

MODEL = ["--model", "tiny"]
CALIBRATION_PLANS = {
    "pp2": ["--pp", "2", "--global-batch", "4"],  # 2 ranks, a core each: the layers, the head, p2p
    "demo": ["--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--global-batch", "8"],  # 8 ranks, 4 a core
    "all": ["--tp", "2", "--sp", "--cp", "2", "--pp", "2", "--global-batch", "4"],  # every dimension but DP
    # TP+SP and CP on 4 ranks (2 per core): less sharing than 8 ranks, so their costs carry over
    "spcp": ["--tp", "2", "--sp", "--cp", "2", "--global-batch", "4"],
    # the same with ring CP: its K/V blocks go round by send/recv, so the p2p fit sees lock-step shifts too
    "spcp-ring": ["--tp", "2", "--sp", "--cp", "2", "--cp-kind", "ring", "--global-batch", "4"],
}
CALIBRATE = ("pp2", "spcp")
HELD_BACK = {
    "1 rank": ["--dp", "1"],
    "1 rank, m 4": ["--dp", "1", "--global-batch", "4"],
    "dp2": ["--dp", "2", "--global-batch", "4"],
    "dp4": ["--dp", "4", "--global-batch", "8"],
    "tp2": ["--tp", "2", "--global-batch", "2"],
    "tp2+sp": ["--tp", "2", "--sp", "--global-batch", "2"],
    "tp4": ["--tp", "4", "--global-batch", "2"],
    "pp2 gpipe": ["--pp", "2", "--global-batch", "4", "--schedule", "gpipe"],
    "pp2 1f1b m8": ["--pp", "2", "--global-batch", "8"],
    "pp4 m8": ["--pp", "4", "--global-batch", "8"],
    "cp2 all-gather": ["--cp", "2", "--global-batch", "2"],
    "cp2 ring": ["--cp", "2", "--cp-kind", "ring", "--global-batch", "2"],
    "dp2 tp2": ["--dp", "2", "--tp", "2", "--global-batch", "4"],
    "dp2 pp2": ["--dp", "2", "--pp", "2", "--global-batch", "8"],
    "tp2+sp pp2": ["--tp", "2", "--sp", "--pp", "2", "--global-batch", "4"],
    "dp2 zero1": ["--dp", "2", "--global-batch", "4", "--zero", "1"],
}


def calibrate(tmp: Path, steps: int, names: tuple[str, ...], wait: int) -> Path:
    runs = []
    for name in names:
        flags = CALIBRATION_PLANS[name]
        out = tmp / f"cal-{name}"
        run_module(
            "profiler", "run", *MODEL, *flags, f"--steps={steps}", f"--wait={wait}", "--warmup=1", f"--out={out}"
        )
        runs.append(str(out))
    calib = tmp / "calib.json"
    print(run_module("profiler", "calibrate", *runs, f"--out={calib}"), end="")
    return calib


def predict(flags: list[str], calib: Path) -> dict:
    rep = json.loads(
        run_module("parallel", "plan", *MODEL, *flags, "--cluster=local-cpu", f"--calibration={calib}", "--json")
    )
    return rep["step_time"]


def measure(flags: list[str], steps: int, out: Path) -> float:
    run_module("parallel", "train", *MODEL, *flags, f"--steps={steps}", f"--out={out}")
    times = json.loads((out / "metrics.json").read_text())["step_time_s"]
    return statistics.median(times[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.predict")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--plans", default=None, help="comma-separated names of HELD_BACK (default: all)")
    ap.add_argument("--calibrate", default=",".join(CALIBRATE), help=f"two of {', '.join(CALIBRATION_PLANS)}")
    ap.add_argument(
        "--wait",
        type=int,
        default=8,
        help="unprofiled steps before tracing in each calibration run: their median (after the first) is "
        "the step the overhead is measured against -- a median of 3 moved by 30%% between runs here",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = args.plans.split(",") if args.plans else list(HELD_BACK)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        calib = calibrate(tmp, max(args.steps, 8), tuple(args.calibrate.split(",")), args.wait)
        predicted = {n: predict(HELD_BACK[n], calib) for n in names}  # all written down before any runs
        for n in names:
            measured = measure(HELD_BACK[n], args.steps, tmp / f"train-{len(rows)}")
            p = predicted[n]
            rows.append(
                {
                    "plan": n,
                    "measured_s": measured,
                    "predicted_s": p["step_time_s"],
                    "error_pct": (p["step_time_s"] / measured - 1) * 100,
                    "phases_s": {k: v for k, v in p.items() if k.endswith("_s") and k != "step_time_s" and v},
                    "contention": p["contention_factor"],
                }
            )
            print(
                f"  {n:<16} predicted {p['step_time_s'] * 1e3:7.1f} ms  measured {measured * 1e3:7.1f} ms  "
                f"error {rows[-1]['error_pct']:+6.1f}%   "
                + ", ".join(f"{k[:-2]} {v * 1e3:.1f}" for k, v in rows[-1]["phases_s"].items())
                + f", contention x{p['contention_factor']:.2f}",
                flush=True,
            )
        cal = json.loads(calib.read_text())
    errs = [abs(r["error_pct"]) for r in rows]
    summary = {"mae_pct": statistics.mean(errs), "worst_pct": max(errs), "plans": len(rows), "load": os.getloadavg()[0]}
    print(f"\nheld-back plans {len(rows)}: mean |error| {summary['mae_pct']:.1f}%, worst {summary['worst_pct']:.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows, "calibration": cal}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
