"""`python -m profiler tpsweep --lab`: TP scaling measured across the lab's node boundary.

    sudo python -m profiler lab up --like dgx-h100        # two nodes, link shaped like NVLink4 vs NDR
    python -m profiler tpsweep --lab [--out DIR] [--steps 4] [--unprofiled-steps 3] [--tps 1,2,4,8] [--sp both|on|off]
    python -m profiler tpsweep --lab --quick              # seconds-scale: TP 2 inside, TP 4 across (tests)

Runs one model at each TP degree, SP off and on: TP <= --gpus-per-node (default 4) inside lab node 0
(`profiler run --launcher local` in its namespace: ranks talk over its local route), larger TP across
both nodes (`profiler run --lab`, TP/2 ranks per node: the TP group spans the shaped veth). First a
`profiler commbench --lab` fits the lab's intra and inter links. Then, per run, from its traces (the
analyzers, profiler/lab/sweep_model.py): TP/SP communication per layer per microbatch, busbw of the TP
collectives, step time; and beside them the plan model's prediction for the lab's own fitted links.

Writes DIR (default $PARASCOPE_RUNS/tpsweep-<UTC time>, where the TP-scaling page finds it):
    DIR/sweep.json      schema below; rewritten (atomically) after every run, `status` last
    DIR/sweep.csv       one row per point: measured, predicted, error %
    DIR/commbench.json  the lab's collectives and fitted links (+ .csv)
    DIR/tp{T}[-sp]/     each run's own run directory (run.json, traces/, metrics.json, logs/)

sweep.json: schema 1, kind "parascope-tpsweep", status (running | completed | failed), created_at,
finished_at, command, machine {cpus, hostname}, lab (profiler.lab.settings.LabSettings.record), model,
micro_batch, steps, profile {wait, warmup, active, steps: the runs' schedule}, gpus_per_node, tps, sp,
commbench {path, links, attempts, error}, compute (the CPU rate the prediction uses, and where it came from), cluster (the lab as the
plan model's Cluster), points: [{tp, sp, nodes, ranks_per_node, link (intra | inter), run_dir,
status, error, wall_s, measured {step_time_s (the untraced steps' median when the run has them:
step_unprofiled), tp_comm_s, tp_comm_lo_s, tp_comm_hi_s,
tp_comm_with_wait_s, busbw_bytes_per_s, tp_comm_step_s, calls {op: ...}}, predicted {tp_comm_s,
busbw_bytes_per_s, step_s}, error_pct {tp_comm, busbw, step}}] (seconds, bytes/s; sweep_model.py
defines each measure).

The default model (SHAPE) is chosen so that TP communication is measurable on 2 CPU cores: one TP
collective moves b·s·h = 1024·256 fp32 = 1 MiB, whose bytes take 2(n-1)/n · 1 MiB / B ≈ 15 ms across
a 1 Gbit/s link (≈ 7 ms at the dgx-h100-like 2.1 Gbit/s), the same order as the per-hop latency that
ranks sharing two cores add (commbench on the lab fits α ≈ 0.6-1.6 ms, 2(n-1) hops per all-reduce),
so both terms of the α-β model show; while h = 256 keeps a layer's compute (≈ 8 GFLOP forward +
backward at TP 1) near 0.5 s on one core, and 2 layers and 4 steps keep the 7 runs and the commbench
within about 3 minutes. Heads 8 and seq 1024 divide by every TP degree up to 8 (SP shards the
sequence). Measured here (2 cores): busbw of the TP collectives ≈ 0.10-0.20 GB/s inside a node,
≈ 0.035 GB/s for TP 8 across; TP comm per layer ≈ 3-4.5× from TP 4 to TP 8.

Exit codes: 0 every run completed; 1 a run or the commbench failed (recorded in sweep.json, the sweep
goes on); 2 bad flags, no lab up, not root.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from parallel.cli.args import model_from_args
from parallel.cli.dispatch import prog_name
from parallel.cli.train import parser as train_parser
from parallel.core.specs import Model, SpecError
from parallel.core.validate import _shape_errors
from profiler.lab import settings as lab_mod
from profiler.lab.sweep_model import (
    COMPARE_COLUMNS,
    calibrate_sweep,
    compare,
    measure_run,
    sweep_plan,
    with_predictions,
)
from runfiles import rundir

ROOT = Path(__file__).resolve().parents[2]  # the project: profiler/cli/ is two below it
SHAPE = {"model": "tiny", "layers": 2, "hidden": 256, "heads": 8, "seq_len": 1024, "vocab": 512}
# The quick sweep's commbench sizes: 128 KiB, 512 KiB, 2 MiB. Across the shaped link every one of them is
# transfer-bound (128 KiB at the tests' 50 Mbit/s: 21 ms, against a few ms of scheduling on two busy cores),
# so the link's bandwidth is a slope that noise cannot flatten; commbench's own quick sizes start at 1 KiB.
QUICK_COMMBENCH_SIZES = "128KiB..2MiB"
COMMBENCH_TRIES = 3  # a link left without a fitted bandwidth is measured again, up to this many times in all

QUICK_SHAPE = {"model": "tiny", "layers": 1, "hidden": 128, "heads": 4, "seq_len": 256, "vocab": 256}


@dataclass(frozen=True)
class SweepSpec:
    lab_prefix: str
    out: Path | None
    force: bool
    shape: dict
    micro_batch: int
    tps: tuple[int, ...]
    sps: tuple[bool, ...]
    gpus_per_node: int
    steps: int  # the profiler's schedule: one untraced, one warm-up, then steps - 2 recorded
    unprofiled: int  # untraced steps on each side of those (the model predicts an unprofiled step)
    commbench_args: tuple[str, ...]
    run_timeout_s: float
    argv: tuple[str, ...]

    def schedule(self) -> dict:
        """The profiler's schedule of every run: `unprofiled` untraced steps (after the first) before the
        warm-up, the recorded ones, the teardown step, `unprofiled` more -- the steps the measured step
        and the calibration's overhead factors come from (profiler.analyzers.calibrate._unprofiled)."""
        wait, active = 1 + self.unprofiled, self.steps - 2
        after = 1 + self.unprofiled if self.unprofiled else 0
        return {"wait": wait, "warmup": 1, "active": active, "steps": wait + 1 + active + after}

    def points(self) -> list[tuple[int, bool]]:
        return [(tp, sp) for sp in self.sps for tp in self.tps if not (sp and tp == 1)]

    def nodes(self, tp: int) -> int:
        return 1 if tp <= self.gpus_per_node else 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("python -m profiler tpsweep"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lab", action="store_true", help="run on the two-node lab (required: the boundary is the lab's)")
    p.add_argument("--lab-prefix", default="psl-", help="the lab's name prefix (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="sweep directory (default: a new one under the runs dir)")
    p.add_argument("--force", action="store_true", help="reuse a non-empty --out that holds a previous sweep")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small model, TP 2 inside a node and 4 across (2 ranks per node), SP off, quick commbench",
    )
    p.add_argument("--model", default=None, help=f"model preset (default: {SHAPE['model']} reshaped, see SHAPE)")
    for flag in ("layers", "hidden", "heads", "seq-len", "vocab"):
        p.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--tps", default=None, help="TP degrees, comma list (default 1,2,4,8)")
    p.add_argument("--sp", choices=("both", "on", "off"), default=None, help="sequence parallelism (default both)")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="ranks per lab node (default 4): larger TP runs across both nodes, TP/2 ranks each",
    )
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 4: 2 profiled)")
    p.add_argument(
        "--unprofiled-steps",
        type=int,
        default=None,
        help="untraced steps on each side of the profiled ones (default 3, --quick 1): the measured step",
    )
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds one run may take (default 300)")
    return p


def parse(argv) -> tuple[SweepSpec | None, list[str]]:
    argv = list(argv)
    a = parser().parse_args(argv)
    errors = []
    if not a.lab:
        errors.append(
            "tpsweep measures TP across the lab's node boundary: pass --lab (after "
            "`sudo python -m profiler lab up --like dgx-h100`)"
        )
    shape = dict(QUICK_SHAPE if a.quick else SHAPE) if a.model is None else {"model": a.model}
    shape.update(
        {
            k: v
            for k, v in (
                ("layers", a.layers),
                ("hidden", a.hidden),
                ("heads", a.heads),
                ("seq_len", a.seq_len),
                ("vocab", a.vocab),
            )
            if v is not None
        }
    )
    gpn = a.gpus_per_node or (2 if a.quick else 4)
    try:
        tps = tuple(int(x) for x in (a.tps or ("2,4" if a.quick else "1,2,4,8")).split(","))
    except ValueError:
        tps = ()
        errors.append(f"--tps {a.tps!r}: a comma list of integers, e.g. 1,2,4,8")
    for tp in tps:
        if tp < 1 or (tp > gpn and (tp % 2 or tp // 2 > gpn)):
            errors.append(
                f"--tps {tp}: TP <= --gpus-per-node {gpn} runs inside one node, 2 × (1..{gpn}) "
                "across both; other degrees do not fit the two-node lab"
            )
    sp = a.sp or ("off" if a.quick else "both")
    sps = {"both": (False, True), "on": (True,), "off": (False,)}[sp]
    steps = a.steps or (3 if a.quick else 4)
    if steps < 3:
        errors.append(f"--steps {steps}: at least 3 (one untraced, one warm-up, then the recorded steps)")
    unprofiled = (1 if a.quick else 3) if a.unprofiled_steps is None else a.unprofiled_steps
    if unprofiled < 0:
        errors.append(f"--unprofiled-steps {unprofiled}: 0 or more")
    if gpn < 1 or a.micro_batch < 1:
        errors.append("--gpus-per-node and --micro-batch must be >= 1")
    cb = (
        ["--quick", "--sizes", QUICK_COMMBENCH_SIZES, "--size-factor", "4"]
        if a.quick
        else [
            "--ops",
            "all_reduce,all_gather,reduce_scatter",
            "--sizes",
            "16KiB..4MiB",
            "--size-factor",
            "4",
            "--iters",
            "5",
        ]
    )
    group_sizes = sorted({t for t in tps if t > 1})
    if group_sizes and not a.quick:
        cb += ["--group-sizes", ",".join(map(str, group_sizes))]
    spec = SweepSpec(
        lab_prefix=a.lab_prefix,
        out=a.out,
        force=a.force,
        shape=shape,
        micro_batch=a.micro_batch,
        tps=tps,
        sps=sps,
        gpus_per_node=gpn,
        steps=steps,
        unprofiled=unprofiled,
        commbench_args=tuple(cb),
        run_timeout_s=a.run_timeout,
        argv=tuple(argv),
    )
    if not errors and not spec.points():
        errors.append("nothing to run: --tps 1 with --sp on")
    if not errors:
        try:
            model = sweep_model_of(spec)
            errors += sorted(
                {e for tp, sp in spec.points() for e in _shape_errors(sweep_plan(tp, sp, a.micro_batch), model)}
            )
        except SpecError as err:
            errors.append(str(err))
    return (None if errors else spec), errors


def _shape_flags(shape: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]


def sweep_model_of(spec: SweepSpec):
    """The Model every run of the sweep trains: `profiler run`'s own reading of the shape flags."""
    return model_from_args(train_parser().parse_args(_shape_flags(spec.shape)))


def claim_out(spec: SweepSpec) -> Path:
    """The sweep directory: new under the runs root, or --out (empty, or a previous sweep with --force)."""
    if spec.out is None:
        return rundir.new_run_dir(rundir.runs_root(), "tpsweep").resolve()
    out = spec.out.resolve()
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if out.exists() and not out.is_dir():
        raise rundir.RunDirError(f"--out {out}: exists and is not a directory")
    if entries and not (spec.force and (out / "sweep.json").exists()):
        raise rundir.RunDirError(
            f"--out {out}: not empty; choose a new directory"
            + (", or --force to replace the sweep in it" if (out / "sweep.json").exists() else "")
        )
    for e in entries:  # --force on a previous sweep: its own files only (checked above)
        shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _run(argv: list[str], log: Path, timeout_s: float) -> tuple[int, float]:
    """Run a `python -m profiler ...` command from the project root; (exit code, seconds)."""
    t0 = time.monotonic()
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout_s)
        except BaseException:  # a timeout, Ctrl-C: `profiler run` stops its job on SIGTERM
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    return code, time.monotonic() - t0


def run_commbench(spec: SweepSpec, out: Path) -> dict:
    """`profiler commbench --lab` into out/commbench.json: {path, links, attempts} or {path, error}. A
    measured link whose times showed no size dependence (no bandwidth fitted: the machine's load swamped
    the transfers) is measured again, up to COMMBENCH_TRIES runs in all; the last run is kept."""
    path = out / "commbench.json"
    argv = [
        sys.executable,
        "-m",
        "profiler",
        "commbench",
        "--lab",
        f"--lab-prefix={spec.lab_prefix}",
        f"--nproc={spec.gpus_per_node}",
        f"--out={path}",
        *spec.commbench_args,
    ]
    attempts = 0
    while attempts < COMMBENCH_TRIES:
        attempts += 1
        try:
            code, wall = _run(argv, out / "commbench.log", spec.run_timeout_s)
        except subprocess.TimeoutExpired:
            return {"path": path.name, "error": f"commbench ran past {spec.run_timeout_s:g} s"}
        data = rundir.read_json(path)
        if code or data is None:
            log = rundir.log_tail(out / "commbench.log", 3)
            return {"path": path.name, "error": f"commbench exited {code}: {log}"}
        links = data.get("links", {})
        if all(link.get("bandwidth_bytes_per_s") for link in links.values()):
            break
    return {"path": path.name, "links": links, "wall_s": round(wall, 1), "attempts": attempts}


def run_point(spec: SweepSpec, out: Path, tp: int, sp: bool) -> dict:
    """One profiled run at (tp, sp): inside lab node 0, or across both nodes; measured from its traces."""
    name = f"tp{tp}{'-sp' if sp else ''}"
    nodes = spec.nodes(tp)
    sched = spec.schedule()
    run_dir = out / name
    flags = [
        *_shape_flags(spec.shape),
        f"--tp={tp}",
        *(["--sp"] if sp else []),
        f"--micro-batch={spec.micro_batch}",
        f"--steps={sched['steps']}",
        f"--wait={sched['wait']}",
        "--warmup=1",
        f"--active={sched['active']}",
        f"--out={run_dir}",
        f"--job-timeout={spec.run_timeout_s:g}",
    ]
    profiler_run = [sys.executable, "-m", "profiler", "run", *flags]
    if nodes == 1:  # inside node 0's namespace: its ranks reach each other by the local route
        argv = lab_mod.settings(spec.lab_prefix).node_command(0, [*profiler_run, "--launcher=local"])
    else:
        argv = [*profiler_run, "--lab", f"--lab-prefix={spec.lab_prefix}"]
    point = {
        "tp": tp,
        "sp": sp,
        "nodes": nodes,
        "ranks_per_node": tp // nodes,
        "link": "intra" if nodes == 1 else "inter",
        "run_dir": name,
        "status": "failed",
        "error": None,
    }
    try:
        code, wall = _run(argv, out / f"{name}.log", spec.run_timeout_s + 60)
    except subprocess.TimeoutExpired:
        return {**point, "error": f"ran past {spec.run_timeout_s + 60:g} s"}
    point["wall_s"] = round(wall, 1)
    run = rundir.read_json(run_dir / rundir.RUN_JSON) or {}
    if code or run.get("status") != "completed":
        err = (run.get("error") or {}).get("message") or rundir.log_tail(out / f"{name}.log", 3)
        return {**point, "error": f"profiler run exited {code}: {err}"}
    model = Model.from_dict(run["model"])
    try:
        measured = measure_run(run_dir, model, sweep_plan(tp, sp, spec.micro_batch))
    except Exception as err:  # noqa: BLE001 - an unreadable trace is recorded, the sweep goes on
        return {**point, "error": f"measuring {name}: {type(err).__name__}: {err}"}
    return {**point, "status": "completed", "measured": measured}


def write(out: Path, sweep: dict) -> None:
    """sweep.json (atomically) and, once points have predictions, sweep.csv."""
    rundir.write_json_atomic(out / "sweep.json", sweep)
    if sweep.get("points"):
        frame = compare(sweep)
        tmp = out / ".sweep.csv.tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COMPARE_COLUMNS)
            for row in frame[list(COMPARE_COLUMNS)].itertuples(index=False):
                w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
        os.replace(tmp, out / "sweep.csv")


def commbench_lines(links: dict) -> list[str]:
    """commbench's fitted links, one line each. A link whose times showed no size dependence (loopback on
    busy shared cores can) has no bandwidth: the line says so, and the plan model keeps the shaped link."""
    lines = []
    for name, link in links.items():
        bw = link.get("bandwidth_bytes_per_s")
        beta = f"β {bw / 1e9:.3f} GB/s per rank per direction" if bw else "β not fitted (no size dependence measured)"
        lines.append(
            f"commbench {name}: α {(link.get('latency_s') or 0.0) * 1e6:.0f} µs, {beta} "
            f"(rel err {link.get('rel_rmse', float('nan')):.2f})"
        )
    return lines


def table(sweep: dict) -> str:
    """The sweep as lines a person reads."""
    frame = compare(sweep)
    ms, gb = 1e3, 1e9
    lines = [
        f"{'TP':>3} {'SP':<3} {'link':<5} {'TP comm ms/layer':>17} {'pred':>7} {'err':>6} "
        f"{'busbw GB/s':>10} {'pred':>7} {'err':>6} {'step s':>7} {'pred':>7} {'err':>6}"
    ]
    for r in frame.itertuples():
        if r.status != "completed":
            lines.append(f"{r.tp:>3} {'on' if r.sp else 'off':<3} {r.link or '':<5} failed")
            continue
        lines.append(
            f"{r.tp:>3} {'on' if r.sp else 'off':<3} {r.link:<5} {r.measured_tp_comm_s * ms:>17.2f} "
            f"{r.predicted_tp_comm_s * ms:>7.2f} {r.tp_comm_error_pct:>+5.0f}% "
            f"{r.measured_busbw_bytes_per_s / gb:>10.3f} {r.predicted_busbw_bytes_per_s / gb:>7.3f} "
            f"{r.busbw_error_pct:>+5.0f}% {r.measured_step_s:>7.3f} {r.predicted_step_s:>7.3f} "
            f"{r.step_error_pct:>+5.0f}%"
        )
    lines += commbench_lines((sweep.get("commbench") or {}).get("links") or {})
    rate = (sweep.get("compute") or {}).get("flops_per_s")
    if rate:
        lines.append(
            f"compute: {rate / 1e9:.1f} GFLOP/s per core (TP {sweep['compute']['tp']} run), "
            f"{sweep['machine']['cpus']} cores shared by the ranks"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    spec, errors = parse(sys.argv[1:] if argv is None else argv)
    if errors:
        print("\n".join(f"error: {e}" for e in errors), file=sys.stderr)
        return 2
    try:
        lab = lab_mod.for_job(spec.lab_prefix)
        out = claim_out(spec)
    except (lab_mod.LabError, rundir.RunDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model = sweep_model_of(spec)
    sweep = {
        "schema": 1,
        "kind": "parascope-tpsweep",
        "status": "running",
        "created_at": rundir.now_iso(),
        "finished_at": None,
        "command": ["python", "-m", "profiler", "tpsweep", *spec.argv],
        "machine": {"cpus": os.cpu_count(), "hostname": socket.gethostname()},
        "lab": lab.record(),
        "model": model.to_dict(),
        "micro_batch": spec.micro_batch,
        "steps": spec.steps,
        "profile": spec.schedule(),
        "gpus_per_node": spec.gpus_per_node,
        "tps": list(spec.tps),
        "sp": list(spec.sps),
        "commbench": None,
        "points": [],
    }
    print(f"sweep directory: {out}", flush=True)
    write(out, sweep)
    ok = True
    try:
        sweep["commbench"] = run_commbench(spec, out)
        ok &= "error" not in sweep["commbench"]
        print(f"commbench: {sweep['commbench'].get('error') or 'links fitted'}", flush=True)
        write(out, sweep)
        for tp, sp in spec.points():
            point = run_point(spec, out, tp, sp)
            ok &= point["status"] == "completed"
            sweep["points"].append(point)
            print(
                f"TP {tp}{' + SP' if sp else ''} ({point['link']}, {point['nodes']} node(s)): {point['status']}"
                + (f" -- {point['error']}" if point.get("error") else f" in {point['wall_s']:.0f} s"),
                flush=True,
            )
            write(out, with_predictions(sweep))
    except KeyboardInterrupt:
        ok = False
        sweep["error"] = "interrupted"
    sweep = with_predictions(sweep) if sweep["points"] else sweep
    if sweep["points"]:
        sweep["calibrated"] = calibrate_sweep(sweep, out)
    sweep.update(status="completed" if ok else "failed", finished_at=rundir.now_iso())
    write(out, sweep)
    if sweep["points"]:
        print(table(sweep))
    print(f"wrote {out / 'sweep.json'} and {out / 'sweep.csv'}")
    return 0 if ok else 1
