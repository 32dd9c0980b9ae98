"""Predicted = measured: calibrate the step-time model from two profiled runs, predict a
spread of held-back plans before they run, then run them and compare.

    .venv/bin/python -m bench.predict [--passes 3] [--seconds 4] [--cal-seconds 15] [--launches 4] [--recalibrate] [--json FILE] [--plans a,b]
    sudo .venv/bin/python -m bench.predict --lab    # + the two-node lab's plans (python -m profiler lab up first)

1. `python -m profiler run` the two calibration plans (CALIBRATE, or --calibrate a,b of
   CALIBRATION_PLANS): ~TRACED_S of traced steps (ACTIVE at least) with unprofiled steady steps on both
   sides of them, each side spanning --cal-seconds (step counts from a 3-step timing run), so the fit
   removes the tracing overhead against the run's own unprofiled steps and their median brackets the
   machine's drift; around it --launches unprofiled `parallel train` launches of the same plan (~LAUNCH_S
   each, half before, half after), whose median with the run's own sets the run's level (one launch can
   run 20-25% fast or slow throughout); `python -m profiler calibrate RUNS --unprofiled LAUNCHES`.
2. For every held-back plan (HELD_BACK): `python -m parallel plan --calibration calib.json --json` --
   the prediction, written down before any plan runs -- then `python -m parallel train` (no profiler)
   for about --seconds of steps (the count from the prediction, at least --steps), in --passes passes
   over all the plans; its steady step is the median of every pass's steps after its first.
   --recalibrate repeats step 1 before every pass, whose runs that calibration predicts (written down
   before the pass runs); a plan's prediction is then the median of the passes' (with its phases).
3. Print predicted vs measured per plan (and the predicted phases: compute, bubble, exposed comm per
   dimension, fixed), the error, and the mean absolute / worst error over the held-back plans; beside
   them the passes' spread and the repeatability floor (each pass's measured steps as the prediction of
   the other passes: what a model exact at one moment would score here); --json also keeps each pass's
   prediction and measured step.

--lab (root, the lab up): also bench.predict_lab's held-back plans, whose DP or PP groups cross the
lab's shaped link, the calibration's inter-node link from a `profiler commbench --lab` run first
(`calibrate --links`), each plan measured on the lab (see bench/predict_lab.py).

A benchmark, not a test (tests/integration/test_predict.py runs a small spread with a loose bound).
This 2-core VM's own speed drifts: one 1-rank job measured 28.7 to 50.8 ms a step over one minute,
steady within each 3-second run. A calibration run's traced samples are scaled to the median of its
unprofiled steps (the overhead factor), so unprofiled steps that span --cal-seconds on each side make
its level the drift's average, not a moment's; the passes do the same for the measured side. A
calibration before every pass (--recalibrate) was tried so that each one shares its runs' moment: it
did not predict better, since a calibration's own level moves as much as a
launch's. The load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench import predict_lab
from bench._subprocess import run_module
from bench.plans import MODEL
from runfiles.metrics import load_metrics

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
GOAL = (10.0, 25.0)  # mean and worst |error| over the held-back plans, in %
ACTIVE = 4  # fewest traced steps per calibration run
TRACED_S = 1.5  # ... and about this long a traced window: 4 steps of pp2 are 0.15 s, one moment of the drift
# unprofiled launches of each calibration plan beside its profiled run: one launch can run 20-25% fast
# or slow throughout (pp2: 26.5 ms in one of six back to back, 33.5-38.2 in the others), so the fit
# takes the median of theirs and the run's own as the calibration's level (calibrate --unprofiled)
LAUNCHES = 4
LAUNCH_S = 3.0  # ... each about this long
LAUNCH_STEPS = 6  # ... and at least this many steps
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


def calibrate(
    tmp: Path, names: tuple[str, ...], seconds: float, launches: int = LAUNCHES, links: Path | None = None
) -> Path:
    runs, plain = [], []
    for name in names:
        flags = CALIBRATION_PLANS[name]
        step = step_s(flags, tmp / f"time-{name}")
        side = max(4, round(seconds / step))  # unprofiled steps each side
        active = max(ACTIVE, round(TRACED_S / step))
        out = tmp / f"cal-{name}"
        steps = side + 1 + active + 1 + side  # wait, warm-up, traced, teardown, unprofiled again
        launch = [tmp / f"launch-{name}-{j}" for j in range(launches)]
        size = max(LAUNCH_STEPS, round(LAUNCH_S / step))
        half = launches // 2  # half the launches before the profiled run, half after: their median is its level
        for d in launch[:half]:
            measure(flags, size, d)
        profile(flags, steps, side, active, out)
        for d in launch[half:]:
            measure(flags, size, d)
        plain += launch
        runs.append(str(out))
    calib = tmp / "calib.json"
    given = [f"--links={links}"] if links else []  # the lab's inter-node link (bench.predict_lab)
    print(
        run_module("profiler", "calibrate", *runs, *(f"--unprofiled={d}" for d in plain), *given, f"--out={calib}"),
        end="",
    )
    return calib


def profile(flags: list[str], steps: int, side: int, active: int, out: Path) -> None:
    """`profiler run` of a calibration plan: `side` unprofiled steps, the traced ones, `side` more."""
    run_module(
        "profiler", "run", *MODEL, *flags, f"--steps={steps}", f"--wait={side}", "--warmup=1",
        f"--active={active}", f"--out={out}",
    )  # fmt: skip


def predict(flags: list[str], calib: Path, cluster: tuple[str, ...] = ("--cluster=local-cpu",)) -> dict:
    rep = json.loads(run_module("parallel", "plan", *MODEL, *flags, *cluster, f"--calibration={calib}", "--json"))
    return rep["step_time"]


def measure(flags: list[str], steps: int, out: Path) -> list[float]:
    """The steps after the first of one unprofiled run of the plan."""
    run_module("parallel", "train", *MODEL, *flags, f"--steps={steps}", f"--out={out}")
    return steady_steps(out)


def steady_steps(run: Path) -> list[float]:
    """A run's steps after its first (its metrics.json, read bounded)."""
    return load_metrics(run)["step_time_s"][1:]


def step_s(flags: list[str], out: Path) -> float:
    """The plan's steady step from a 3-step unprofiled run (sizes the calibration run)."""
    return statistics.median(measure(flags, 3, out))


def _spread_pct(steps: list[float]) -> float:
    """How far apart a plan's passes measured: the slowest pass's step over the fastest's, less 1, in %."""
    return (max(steps) / min(steps) - 1) * 100 if steps and min(steps) > 0 else 0.0


def _spread(steps: list[float]) -> str:
    return "–".join(f"{x * 1e3:.1f}" for x in (min(steps), max(steps))) if len(steps) > 1 else "one"


def repeatability(passes: dict[str, list[list[float]]]) -> dict:
    """The machine's own floor under the predictions' error: each pass's measured step of a plan (the
    median of its steps) taken as the prediction of the same plan in the other passes (the median of their
    steps together) -- what a model that knew every plan's step exactly at one pass's moment would score,
    as the bench's calibration knows its moment. Per pass: the mean and worst |error| over the plans, and
    whether that meets GOAL; `mae_pct`/`worst_pct` are their means over the passes."""
    names = [n for n, runs in passes.items() if len(runs) > 1]
    if not names:
        return {}
    per_pass = []
    for i in range(min(len(passes[n]) for n in names)):
        errs = []
        for n in names:
            own = statistics.median(passes[n][i])
            rest = statistics.median(t for j, run in enumerate(passes[n]) if j != i for t in run)
            errs.append(abs(own / rest - 1) * 100)
        per_pass.append({"mae_pct": statistics.mean(errs), "worst_pct": max(errs)})
    return {
        "mae_pct": statistics.mean(p["mae_pct"] for p in per_pass),
        "worst_pct": statistics.mean(p["worst_pct"] for p in per_pass),
        "per_pass": per_pass,
        "goal_met": sum(p["mae_pct"] <= GOAL[0] and p["worst_pct"] <= GOAL[1] for p in per_pass),
    }


def _median_prediction(preds: list[dict]) -> dict:
    """The prediction whose step is the median of the passes' (the lower middle one of an even count),
    so its phases add up to the step shown."""
    ranked = sorted(preds, key=lambda q: q["step_time_s"])
    return ranked[(len(ranked) - 1) // 2]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.predict")
    ap.add_argument("--passes", type=int, default=3, help="runs of each held-back plan, one per pass over them")
    ap.add_argument("--seconds", type=float, default=4.0, help="wall time of each held-back run's steps")
    ap.add_argument("--steps", type=int, default=10, help="fewest steps of a held-back run")
    ap.add_argument("--plans", default=None, help="comma-separated names of HELD_BACK (default: all)")
    ap.add_argument("--calibrate", default=",".join(CALIBRATE), help=f"two of {', '.join(CALIBRATION_PLANS)}")
    ap.add_argument(
        "--cal-seconds",
        type=float,
        default=15.0,
        help="wall time of a calibration run's unprofiled steps on each side of the traced ones",
    )
    ap.add_argument(
        "--launches",
        type=int,
        default=LAUNCHES,
        help="unprofiled launches of each calibration plan that set its level with its profiled run (0: none)",
    )
    ap.add_argument(
        "--recalibrate", action="store_true", help="a calibration before every pass, not one before the first"
    )
    ap.add_argument("--lab", action="store_true", help="also the two-node lab's plans (root, lab up)")
    ap.add_argument("--lab-prefix", default="psl-", help="the lab's name prefix (default %(default)s)")
    ap.add_argument("--json", default=None)
    return ap


def main(argv=None) -> int:
    """Calibrate, predict every held-back plan before it runs, run the passes, and score them."""
    ap = _parser()
    args = ap.parse_args(argv)
    plans = dict(HELD_BACK)
    if args.lab:
        if why := predict_lab.lab_error(args.lab_prefix):
            ap.error(f"--lab: {why}")
        plans.update(predict_lab.LAB_HELD_BACK)
    names = args.plans.split(",") if args.plans else list(plans)
    unknown = [n for n in names if n not in plans]
    if unknown:
        ap.error(f"--plans: {', '.join(unknown)} not among {', '.join(plans)}")
    with tempfile.TemporaryDirectory() as tmp:
        predicted, runs, cals = _passes(args, plans, names, Path(tmp))
    rows = [_row(n, predicted[n], runs[n]) for n in names]
    summary = _summary(rows, runs, args.passes)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows, "calibrations": cals}, indent=1))
    return 0


def _passes(args, plans: dict, names: list[str], tmp: Path) -> tuple[dict, dict, list]:
    """Each pass: calibrate (the first, or every one with --recalibrate), write every plan's prediction
    down, then run every plan. Returns per plan each pass's prediction and steps, and the calibrations."""
    links = predict_lab.commbench(tmp, args.lab_prefix) if args.lab else None

    def plan_prediction(n: str, calib: Path) -> dict:
        if n in predict_lab.LAB_HELD_BACK:
            return predict(plans[n], calib, tuple(predict_lab.cluster_flags(plans[n])))
        return predict(plans[n], calib)

    def plan_steps(n: str, count: int, out: Path) -> list[float]:
        if n in predict_lab.LAB_HELD_BACK:
            return predict_lab.measure(plans[n], count, out, args.lab_prefix)
        return measure(plans[n], count, out)

    cals = []
    predicted: dict[str, list[dict]] = {n: [] for n in names}  # per plan, each pass's prediction
    runs: dict[str, list[list[float]]] = {n: [] for n in names}  # ... and each pass's steps after the first
    steps: dict[str, int] = {}
    for k in range(args.passes):
        if k == 0 or args.recalibrate:
            (tmp / f"pass-{k}").mkdir()
            calib = calibrate(
                tmp / f"pass-{k}", tuple(args.calibrate.split(",")), args.cal_seconds, args.launches, links
            )
            cals.append(json.loads(calib.read_text()))
            pass_pred = {n: plan_prediction(n, calib) for n in names}  # written down before the pass runs
        for n in names:
            predicted[n].append(pass_pred[n])
        if not steps:  # every pass runs the same steps, sized by the first prediction
            steps = {n: min(2000, max(args.steps, round(args.seconds / pass_pred[n]["step_time_s"]))) for n in names}
        for i, n in enumerate(names):
            runs[n].append(plan_steps(n, steps[n], tmp / f"train-{k}-{i}"))
        print(
            f"pass {k + 1}/{args.passes}: "
            + ", ".join(
                f"{n} {(predicted[n][-1]['step_time_s'] / statistics.median(runs[n][-1]) - 1) * 100:+.0f}%"
                for n in names
            ),
            flush=True,
        )
    return predicted, runs, cals


def _row(n: str, predicted: list[dict], runs: list[list[float]]) -> dict:
    """One plan's line: the median prediction against all its steady steps, its phases and passes."""
    p = _median_prediction(predicted)
    meas = statistics.median(t for run in runs for t in run)  # all its steady steps
    row = {
        "plan": n,
        "measured_s": meas,
        "predicted_s": p["step_time_s"],
        "error_pct": (p["step_time_s"] / meas - 1) * 100,
        "phases_s": {k: v for k, v in p.items() if k.endswith("_s") and k != "step_time_s" and v},
        "contention": p["contention_factor"],
        "steps": sum(len(run) for run in runs),
        "passes": {  # each pass's prediction and measured step (the median of its steps)
            "predicted_s": [q["step_time_s"] for q in predicted],
            "measured_s": [statistics.median(run) for run in runs],
        },
    }
    print(
        f"  {n:<16} predicted {p['step_time_s'] * 1e3:7.1f} ms  measured {meas * 1e3:7.1f} ms "
        f"(passes {_spread(row['passes']['measured_s'])})  "
        f"error {row['error_pct']:+6.1f}%   "
        + ", ".join(f"{k[:-2]} {v * 1e3:.1f}" for k, v in row["phases_s"].items())
        + f", contention x{p['contention_factor']:.2f}",
        flush=True,
    )
    return row


def _summary(rows: list[dict], runs: dict, passes: int) -> dict:
    """Mean and worst |error|, the passes' spread and the repeatability floor, printed and returned."""
    errs = [abs(r["error_pct"]) for r in rows]
    # how far the passes of one plan spread: a miss within that is within the machine's own noise
    spread = [_spread_pct(r["passes"]["measured_s"]) for r in rows]
    summary = {
        "mae_pct": statistics.mean(errs),
        "worst_pct": max(errs),
        "plans": len(rows),
        "load": os.getloadavg()[0],
        "pass_spread_pct": statistics.median(spread) if spread else 0.0,
        "repeatability": repeatability(runs),
    }
    print(f"\nheld-back plans {len(rows)}: mean |error| {summary['mae_pct']:.1f}%, worst {summary['worst_pct']:.1f}%")
    if passes > 1:
        print(
            f"a plan's passes measured up to {max(spread):.0f}% apart (max over min), {summary['pass_spread_pct']:.0f}% "
            "in the median plan: the machine's own spread, beside which the errors are read"
        )
        floor = summary["repeatability"]
        print(
            f"repeatability floor (each pass's measured steps as the prediction of the other passes): mean |error| "
            f"{floor['mae_pct']:.1f}%, worst {floor['worst_pct']:.1f}% ("
            + ", ".join(f"{p['mae_pct']:.1f}% / {p['worst_pct']:.1f}%" for p in floor["per_pass"])
            + f"); the goal ({GOAL[0]:g}% / {GOAL[1]:g}%) met from {floor['goal_met']} of {len(floor['per_pass'])} passes"
        )
    return summary


if __name__ == "__main__":
    sys.exit(main())
