"""Predicted = measured, offline: the data sets README's "offline" figures come from, and their
scoring. A change to the step-time model is judged by scoring the same data set before and after it,
so the machine's drift between runs is the same for both.

    .venv/bin/python -m bench.predict_offline collect DIR [--calibration pp2,spcp] [--repeats 2] [--seconds 4]
    .venv/bin/python -m bench.predict_offline score DIR [--calibrate pp2,spcp] [--plan "cp2 ring"]

collect: per repetition, a profiled run of each calibration plan (bench.predict's CALIBRATION_PLANS:
  ~TRACED_S traced, ~SIDE_S unprofiled on each side) into DIR/cal-NAME-REP, then one unprofiled
  `parallel train` of every held-back plan (HELD_BACK, ~--seconds of steps) into DIR/mII-REP, II its
  index in HELD_BACK. A run already there is kept, so an interrupted collection resumes.
score: for every combination of repetitions of the calibration runs, a fit (profiler.analyzers.calibrate,
  in this process: the traces are read once per run) whose predictions are scored against every
  repetition of each held-back plan (the median of its steps after the first): each combination's
  mean and worst |error| over the plans, and the mean over the combinations. --plan lists one plan's
  predictions and errors per combination.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
from pathlib import Path

from bench.plans import plan_model
from bench.predict import (
    ACTIVE,
    CALIBRATE,
    CALIBRATION_PLANS,
    HELD_BACK,
    measure,
    profile,
    repeatability,
    steady_steps,
    step_s,
)
from parallel.core.calibrated import predict
from profiler.analyzers.calibrate import fit
from profiler.analyzers.run_inputs import measured_run

TRACED_S = 1.5  # a calibration run's traced window
SIDE_S = 5.0  # ... and its unprofiled steps on each side


def collect(out: Path, names: list[str], repeats: int, seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    held_step = {n: step_s(flags, out / f"probe-{i:02d}") for i, (n, flags) in enumerate(HELD_BACK.items())}
    for rep in range(repeats):
        for name in names:
            d = out / f"cal-{name}-{rep}"
            if not (d / "metrics.json").is_file():
                flags = CALIBRATION_PLANS[name]
                s = step_s(flags, out / f"probe-{name}")
                side, active = max(8, round(SIDE_S / s)), max(ACTIVE, round(TRACED_S / s))
                profile(flags, side + 1 + active + 1 + side, side, active, d)
            print(f"calibration run {name} #{rep}: {d}", flush=True)
        for i, (n, flags) in enumerate(HELD_BACK.items()):
            d = out / f"m{i:02d}-{rep}"
            if not (d / "metrics.json").is_file():
                measure(flags, min(2000, max(10, round(seconds / held_step[n]))), d)
            print(f"held-back {n} #{rep}: {statistics.median(steady_steps(d)) * 1e3:.1f} ms", flush=True)


def repetitions(out: Path, name: str) -> list[int]:
    """The repetitions REP of DIR/cal-NAME-REP (not another plan's whose name extends NAME: cal-spcp-ring-0
    is no repetition of spcp)."""
    pattern = re.compile(rf"cal-{re.escape(name)}-(\d+)")
    return sorted(int(m[1]) for p in out.iterdir() if p.is_dir() and (m := pattern.fullmatch(p.name)))


def score(out: Path, names: list[str], plan: str | None) -> float:
    reps = {n: repetitions(out, n) for n in names}
    if not all(reps.values()):
        raise SystemExit(f"{out}: no calibration runs of {', '.join(n for n in names if not reps[n])} (collect first)")
    measured = {}
    for i, (n, flags) in enumerate(HELD_BACK.items()):
        runs = sorted(p for p in out.glob(f"m{i:02d}-*") if (p / "metrics.json").is_file())
        if runs:
            measured[n] = (plan_model(flags), [statistics.median(steady_steps(p)) for p in runs])
    if plan is not None and plan not in measured:
        raise SystemExit(f"--plan {plan!r}: not a held-back plan measured in {out} ({', '.join(measured)})")
    loaded = {(n, r): measured_run(str(out / f"cal-{n}-{r}")) for n in names for r in reps[n]}
    means = []
    for combo in itertools.product(*(reps[n] for n in names)):
        cal = fit([loaded[n, r] for n, r in zip(names, combo)], cores=2)
        errs = {}
        for n, ((model, p), steps) in measured.items():
            pred = predict(model, p, cal)["step_time_s"]
            errs[n] = [(pred / m - 1) * 100 for m in steps]
            if n == plan:
                shown = "/".join(f"{e:+.1f}%" for e in errs[n])
                print(f"  {n}: predicted {pred * 1e3:.1f} ms, measured "
                      + "/".join(f"{m * 1e3:.1f}" for m in steps) + f" ms, error {shown}")  # fmt: skip
        per_plan = [statistics.mean(abs(e) for e in v) for v in errs.values()]
        means.append(statistics.mean(per_plan))
        label = " + ".join(f"{n} #{r}" for n, r in zip(names, combo))
        print(f"{label}: mean |error| {means[-1]:.2f}%, worst {max(per_plan):.1f}% ({len(per_plan)} plans)")
    print(f"over {len(means)} calibrations: mean |error| {statistics.mean(means):.2f}%")
    floor = repeatability({n: [[m] for m in steps] for n, (_, steps) in measured.items()})
    if floor:  # the machine's own floor: one repetition of every held-back run as the prediction of the others
        print(f"repeatability floor over {len(floor['per_pass'])} repetitions: mean |error| {floor['mae_pct']:.2f}%, "
              f"worst {floor['worst_pct']:.1f}%")  # fmt: skip
    return statistics.mean(means)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.predict_offline")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="profiled calibration runs and unprofiled held-back runs into DIR")
    c.add_argument("dir", type=Path)
    c.add_argument("--calibration", default=",".join(CALIBRATE), help=f"of {', '.join(CALIBRATION_PLANS)}")
    c.add_argument("--repeats", type=int, default=2, help="repetitions of every run")
    c.add_argument("--seconds", type=float, default=4.0, help="wall time of each held-back run's steps")
    s = sub.add_parser("score", help="fit from DIR's calibration runs and score its held-back runs")
    s.add_argument("dir", type=Path)
    s.add_argument("--calibrate", default=",".join(CALIBRATE), help="the calibration plans fitted together")
    s.add_argument("--plan", default=None, help="a held-back plan whose predictions and errors to list")
    args = ap.parse_args(argv)
    if args.command == "collect":
        names = args.calibration.split(",")
        unknown = [n for n in names if n not in CALIBRATION_PLANS]
        if unknown:
            ap.error(f"--calibration: {', '.join(unknown)} not in {', '.join(CALIBRATION_PLANS)}")
        collect(args.dir, names, args.repeats, args.seconds)
    else:
        score(args.dir, args.calibrate.split(","), args.plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
