"""`python -m profiler calibrate RUN [RUN ...] --out calib.json`: fit the step-time model to measured runs.

    python -m profiler run --pp 2 --global-batch 4 --wait 3 --steps 7 --out runs/cal-a
    python -m profiler run --dp 2 --tp 2 --pp 2 --sp --global-batch 8 --wait 3 --steps 7 --out runs/cal-b
    python -m profiler calibrate runs/cal-a runs/cal-b --out calib.json
    python -m parallel plan --model tiny --dp 4 --cluster local-cpu --calibration calib.json --json

Each RUN is a `profiler run` directory (its run.json names the plan and model; its metrics.json's
unprofiled steps -- `--wait 2` or more, or steps left after `--active` -- and the engine's timing of
its communication calls let the fit remove the tracing overhead from work and from transfers each)
or a folder of traces (then the overhead stays in, and the JSON says so) whose plan and model come from
`--plan` -- a plan JSON, a Megatron-LM launch script or a torchtitan TOML (parallel.importers) -- or
from the folder's plan.json (an uploaded set's), and `--model` (a preset or a model JSON) where the plan
file names none. `--unprofiled DIR` (repeatable): a `parallel train` run of one RUN's plan and model; the
median of their steady steps and the RUN's own unprofiled one is the level the fit gives that RUN
(a launch can run 20-25% fast or slow throughout; `level_factor` and `unprofiled_launches` in its source).
`--links COMMBENCH.json` (`profiler commbench` across nodes): when no RUN's groups crossed nodes, the
inter-node link is the traces' intra one plus the latency per hop and seconds per byte commbench
measured the inter link to add over the intra one (`inter_source` commbench); a RUN that crossed
nodes wins (`inter_source` traces).
`--kernels`: fit instead the GPU device model's efficiencies (GEMM, attention, HBM) to the traces'
kernel times (profiler.analyzers.device_fit); the device is `--gpu` or the traces' own
(deviceProperties); `python -m parallel plan|search --device-fit OUT` then times operators with it.
`--cores` is the machine's cores the ranks shared (default: this machine's). The JSON is
parallel.core.calibrated.Calibration: fitted terms, `sources` (each run, its overhead factor and
the step the fit gives it back), `assumptions`. Bad input exits 2 with one line on stderr.
Pure: no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

import orjson

from parallel.cli.args import links_from_commbench
from parallel.cli.dispatch import prog_name
from parallel.core.calibrated import CalibrationError, contention_line
from parallel.core.devices import DEVICES, device_for_name
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, Model, SpecError
from profiler.analyzers.calibrate import _unprofiled, fit, traced_device
from profiler.analyzers.device_fit import DeviceFitError, fit_device
from profiler.analyzers.run_inputs import measured_run, read_run_json
from profiler.traces.errors import NoTracesError, PlanMismatchError, TraceError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog_name("python -m profiler calibrate"), description="fit the step-time model to runs"
    )
    ap.add_argument("path", nargs="+", help="profiler run directories (or trace folders with --plan and --model)")
    ap.add_argument("--out", required=True, help="where to write calib.json")
    ap.add_argument(
        "--plan",
        help="for trace folders without a run.json: a plan JSON, a Megatron-LM launch script or a torchtitan TOML "
        "(default: the folder's plan.json, as an uploaded set has)",
    )
    ap.add_argument("--model", help="a model preset or a model JSON file (default: the plan file's model)")
    ap.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="cores the ranks shared (default: this machine's)"
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default=None,
        help="gpu: a device per rank, no contention (default: the traces', GPU when they have kernels)",
    )
    ap.add_argument(
        "--unprofiled",
        action="append",
        default=[],
        metavar="DIR",
        help="a `parallel train` run of a RUN's plan and model: its steady step joins that RUN's level (repeatable)",
    )
    ap.add_argument(
        "--links",
        metavar="COMMBENCH.json",
        help="`profiler commbench` output: its fitted inter-node link when no run crossed nodes",
    )
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="fit the GPU device model's efficiencies to the traces' kernel times (for plan/search --device-fit)",
    )
    ap.add_argument("--gpu", default=None, help="with --kernels: the device preset (default: the traces' GPU)")
    return ap


def fit_kernels(args) -> int:
    """--kernels: the device fit of one trace folder or run directory, written to --out."""
    if len(args.path) != 1:
        raise PlanMismatchError("--kernels fits one job's traces: give one folder")
    run = measured_run(args.path[0], args.plan, args.model)
    traces = run.analysis.traces
    names = [n for n in traces.ranks["device_name"].dropna().unique()] if "device_name" in traces.ranks else []
    gpu = args.gpu or next((device_for_name(n) for n in names if device_for_name(n)), None)
    if gpu is None:
        said = f"the traces' GPU {names[0]!r} is no preset" if names else "the traces name no GPU"
        raise PlanMismatchError(f"{said}: give --gpu, one of {', '.join(DEVICES)}")
    if gpu not in DEVICES:
        raise PlanMismatchError(f"--gpu {gpu}: one of {', '.join(DEVICES)}")
    base = next((c for c in CLUSTERS.values() if c.gpu == gpu), CLUSTERS["dgx-h100"])
    cluster = dataclasses.replace(base, gpu=gpu).sized_for(run.plan.world_size)
    fit = fit_device(traces, run.model, run.plan, cluster, ActivationOptions())
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(orjson.dumps(fit.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    tmp.replace(out)
    for r in fit.rows.to_dict("records"):
        how = f"x{r['ratio']:.2f} of the model's efficiency" if r["fitted"] else "not fitted (no time on one side)"
        print(
            f"{r['class']:<12} measured {r['measured_s'] * 1e3:10.2f} ms  modelled {r['modelled_s'] * 1e3:10.2f} ms  {how}"
        )
    d = fit.device
    print(
        f"{fit.base.name} fitted from {fit.ranks} rank(s), {fit.steps} step(s): GEMM {d.gemm_efficiency:.3f}, "
        f"attention {d.attention_efficiency:.3f}, HBM {d.memory_efficiency:.3f}"
    )
    print(f"wrote {out}")
    return 0


def _with_launches(runs: list, dirs: list[str]) -> list:
    """The runs with each unprofiled launch's steady step (median after the first) attached to the
    run of its plan and model; a launch that matches none, or has no steady steps, is refused."""
    steps: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    for d in dirs:
        path = Path(d) / "metrics.json"
        if not path.is_file():
            raise NoTracesError(f"--unprofiled {d}: no metrics.json (give a `parallel train` run directory)")
        m = read_run_json(path)
        try:
            plan, model = Plan.from_dict(m["plan"]), Model.from_dict(m["model"])
        except (KeyError, TypeError, ValueError) as err:
            raise PlanMismatchError(f"--unprofiled {d}: its metrics.json names no plan and model ({err})") from None
        profile = m.get("profile")  # a profiled run given here too: its traced steps and their neighbours left out
        traced = profile.get("profiled_steps") if isinstance(profile, dict) else None
        steps_s = m.get("step_time_s") if isinstance(m.get("step_time_s"), list) else []
        kept = _unprofiled(steps_s, traced) if isinstance(traced, list) and traced else steps_s[1:]
        times = [t for t in kept if isinstance(t, (int, float)) and t > 0]
        if not times:
            raise PlanMismatchError(f"--unprofiled {d}: no steady steps (it ran one step or none)")
        match = [i for i, r in enumerate(runs) if r.plan == plan and r.model == model]
        if not match:
            raise PlanMismatchError(
                f"--unprofiled {d}: its plan {plan.label()} (model {model.name}) matches none of the runs calibrated"
            )
        for i in match:
            steps[i].append(statistics.median(times))
    return [dataclasses.replace(r, launches_s=tuple(steps[i])) if steps[i] else r for i, r in enumerate(runs)]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.cores < 1:
        print(f"error: --cores {args.cores}: expected 1 or more", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():  # said before the fit, not after it
        where = "is a folder" if out.is_dir() else f"is in {out.parent}, which is not a folder"
        print(f"error: --out {args.out} {where}: give a file path in an existing folder", file=sys.stderr)
        return 2
    if args.kernels:
        try:
            return fit_kernels(args)
        except (TraceError, DeviceFitError, SpecError, KeyError, orjson.JSONDecodeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        links = links_from_commbench(Path(args.links)) if args.links else None
        if links is not None and "inter" not in links:
            raise CalibrationError(
                f"--links {args.links}: no fitted inter-node link in it (run commbench across nodes)"
            )
        runs = _with_launches([measured_run(p, args.plan, args.model) for p in args.path], args.unprofiled)
        cal = fit(runs, cores=args.cores, device=args.device or traced_device(runs), commbench=links)
    except (TraceError, CalibrationError, SpecError, KeyError, orjson.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(orjson.dumps(cal.to_dict(), option=orjson.OPT_INDENT_2))
    tmp.replace(out)  # never a half-written calibration
    for s in cal.sources:
        if not s["overhead_removed"]:
            removed = "overhead NOT removed (no unprofiled step)"
        elif s["overhead_split"]:
            removed = (
                f"overhead removed: work /{s['work_overhead_factor']:.2f}, transfers /{s['comm_overhead_factor']:.2f}"
            )
        else:
            removed = f"overhead x{s['overhead_factor']:.2f} removed (one factor: no communication timers)"
        if s.get("unprofiled_launches"):
            n = s["unprofiled_launches"]
            removed += f", level x{s['level_factor']:.2f} from {n} unprofiled launch{'es' if n > 1 else ''}"
        if s.get("work_stretch") and s["ranks"] > cal.cores > 0:
            removed += f", work waited for a core: x{s['work_stretch']:.2f}"
        print(
            f"{s['path']}: {s['plan']}, traced {s['traced_step_s'] * 1e3:,.1f} ms, {removed}, fit gives {s['fitted_step_s'] * 1e3:,.1f} ms"
        )
    if line := contention_line(cal):
        print(line)
    if cal.inter_source == "commbench":
        beta = cal.inter_beta_s_per_byte
        rate = f"{1 / beta / 1e9:.3f} GB/s" if beta else "no per-byte cost"
        print(f"inter-node link from {args.links}: alpha {cal.inter_alpha_s * 1e6:,.0f} us a hop, {rate} "
              "(the traces' intra link + commbench's inter over intra)")  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
