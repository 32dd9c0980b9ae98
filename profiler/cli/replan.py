"""`python -m profiler replan PATH`: your job, re-planned -- from its own traces to the plan that would
run it faster, and by how much.

    python -m profiler replan runs/demo                                   # our run directory
    python -m profiler replan traces/ --launch pretrain_gpt.sh            # your job, its launch script
    python -m profiler replan traces.zip --plan plan.json --model llama3-8b --cluster dgx-h100 --gpus 128
    python -m profiler replan runs/demo --calibration calib.json --json   # a CPU job: this machine's model

PATH is anything `profiler analyze` opens. The job's plan and model come from --launch (a Megatron-LM
script or torchtitan TOML), --plan (a plan JSON) and --model (a preset), else from the set itself
(run.json, an upload's plan.json, the process groups, the recorded shapes: analyzers.identify).
--gpus N re-plans on N GPUs instead of the job's own count. A CPU job is modelled with --calibration
(`profiler calibrate`), else a calibration fitted to this run alone (its --cores).

With --json, one object: job {plan, model, device, cluster, evidence, inferred}, measured {step_s,
components}, modelled {step_s, components, error}, device_fit, plans [{label, plan, step_s, gain,
memory_gib, why}], export {megatron, torchtitan} (profiler.analyzers.replan). Each `plan` is a plan
JSON object: `parallel plan --import FILE --model M` and `profiler run --plan FILE` take it.
Bad input exits 2 with one line on stderr. Pure: no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from parallel.cli.dispatch import prog_name
from parallel.core.calibrated import CalibrationError, read_calibration
from parallel.core.specs import SpecError
from profiler.analyzers.front import TraceAnalysis
from profiler.analyzers.identify import IdentifyError
from profiler.analyzers.replan import ReplanError, gap_lines, replan
from profiler.analyzers.split import COMPONENTS
from profiler.traces.errors import TraceError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog_name("python -m profiler replan"), description="re-plan a job from its own traces"
    )
    ap.add_argument("path", help="run directory, folder, trace file(s) archive (.zip/.tar.gz)")
    given = ap.add_mutually_exclusive_group()
    given.add_argument("--launch", metavar="FILE", help="the job's Megatron-LM launch script or torchtitan TOML")
    given.add_argument("--plan", metavar="FILE", help="the job's plan JSON (with its model, or give --model)")
    ap.add_argument("--model", help="the job's model preset (default: the launch file's, the set's, the shapes')")
    ap.add_argument("--cluster", help="the cluster preset (default: the one built of the traces' GPU)")
    ap.add_argument("--gpus", type=int, default=None, help="re-plan on this many GPUs (default: the job's)")
    ap.add_argument("--calibration", metavar="CALIB.json", help="a CPU job's calibrated step model")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores a CPU job's ranks shared")
    ap.add_argument("--top", type=int, default=5, help="plans to list (default 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (see the module docstring)")
    return ap


def _text(r) -> str:
    job = r.job
    lines = [
        f"job: {job.model.name} under {job.plan.label() or 'DP1'} on {job.plan.world_size} × {job.device['name']}",
    ]
    for k, f in job.facts.items():
        lines.append(f"  {k:<14}{str(f.value):<28}{f.source}: {f.evidence}")
    for k, why in job.missing.items():
        lines.append(f"  {k:<14}{'(missing)':<28}{why}")
    lines += [
        "",
        f"step: {r.measured['step_s'] * 1e3:.2f} ms measured ({r.measured['source']}), "
        f"{r.modelled['step_s'] * 1e3:.2f} ms modelled ({r.modelled['how']}; error {r.modelled['error']:.0%})",
        f"  {'part':<16}{'measured ms':>12}{'modelled ms':>13}",
    ]
    for c in COMPONENTS:
        m, p = r.measured["components"].get(c, 0.0), r.modelled["components"].get(c, 0.0)
        if m or p:
            lines.append(f"  {c:<16}{m * 1e3:>12.2f}{p * 1e3:>13.2f}")
    gaps = gap_lines(r.gaps)
    lines += ["", "gaps beyond the model's error:" if gaps else "no part differs by more than the model's error"]
    lines += [f"  {g}" for g in gaps]
    lines += ["", f"re-planned: {r.verdict}"]
    for p in r.plans:
        lines.append(
            f"  {p['gain']:>+6.0%}  {p['step_s'] * 1e3:9.2f} ms  {p['memory_gib']:7.2f} GiB  {p['label']}  ({p['why']})"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    for flag, value in (("--gpus", args.gpus), ("--top", args.top), ("--cores", args.cores)):
        if value is not None and value < 1:
            print(f"error: {flag} {value}: expected 1 or more", file=sys.stderr)
            return 2
    try:
        cal = None
        if args.calibration:
            try:
                cal = read_calibration(args.calibration)
            except CalibrationError as err:
                raise ReplanError(f"--calibration {args.calibration}: {err}") from None
        for flag, f in (("--launch", args.launch), ("--plan", args.plan)):
            if f and not Path(f).is_file():
                raise ReplanError(f"{flag} {f}: no such file")
        analysis = TraceAnalysis.load(args.path)
        r = replan(
            analysis,
            launch=Path(args.launch or args.plan) if (args.launch or args.plan) else None,
            model=args.model,
            cluster=args.cluster,
            gpus=args.gpus,
            calibration=cal,
            cores=args.cores,
            top=args.top,
        )
    except (TraceError, IdentifyError, ReplanError, SpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncancelled", file=sys.stderr)
        return 130
    if args.json:
        sys.stdout.write(orjson.dumps(r.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    else:
        print(_text(r))
    return 0
