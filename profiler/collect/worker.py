"""One rank of `python -m profiler run`: the training job of parallel.cli.train under torch.profiler.

`profile_rank(spec, run_dir, rank=..., ...)` is what every rank runs, whatever started it: the local
agent (profiler/collect/local_agent.py) calls `prepare(FLAGS)` once and `rank(...)` in each forked worker;
under torchrun each rank is started as

    python -m profiler.collect.worker FLAGS --out DIR        # FLAGS: those of `profiler run`

What a rank writes (see runfiles/rundir.py for the layout), each file by this rank alone:
- logs/rank{r}.log: its stdout and stderr (file descriptors 1 and 2 point there from the start);
- status/rank{r}.json: pid, host, node (lab runs: lab_node, namespace), local rank, steps done, state (starting | running | done |
  failed | stopped) and, on failure, the error -- what the supervisor turns into run.json;
- traces/rank{r}_trace.json.gz: the Kineto trace of the schedule's active steps (ProfilerStep#N,
  distributedInfo, the engine's ps.comm / ps.phase annotations), exported to .partial/ and renamed
  into place. If the job fails while recording, the steps recorded so far are still exported.
- metrics.json (rank 0): the engine's metrics plus the profile's schedule and profiled steps.

SIGTERM (the launcher stopping a failed job, or a cancel) raises SystemExit in the rank, so a rank
that is not blocked inside a collective still exports what it recorded before it exits.

Runtime layer: imports torch.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record  # torchrun reports the traceback

from parallel.engine import flight
from parallel.engine.api import run_rank, torchrun_env
from profiler.collect.launchers import worker_args
from profiler.collect.spec import RunSpec, parse_run
from runfiles import rundir

GZIP_LEVEL = 6  # torch uses 9: on these traces 3x the time (190 vs 56 ms for 4.4 MB) for 9% smaller files


class RankStatus:
    """This rank's status file, rewritten atomically on each change."""

    def __init__(self, run_dir: Path, **fields):
        self.path = rundir.status_path(run_dir, fields["rank"])
        self.data = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "state": "starting",
            "step": 0,
            "torch_version": torch.__version__,
            "backend": None,
            "error": None,
            "time": time.time(),
            "started": time.time(),
            "step_time_s": [],
            "step_end": [],
            **fields,
        }
        self.write()

    def write(self, **changes) -> None:
        self.data.update(changes, time=time.time())
        try:
            rundir.write_json_atomic(self.path, self.data)
        except OSError as err:  # a full disk must not hide the rank's own error; the supervisor sees it
            print(f"[rank {self.data['rank']}] cannot write {self.path.name}: {rundir.os_error_text(err)}", flush=True)


def redirect_output(path: Path) -> None:
    """Point this process's stdout and stderr (fds 1 and 2, so C++ output too) at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)


def _stop_on_sigterm() -> None:
    def handler(signum, frame):
        raise SystemExit(f"stopped by signal {signum} ({signal.Signals(signum).name}) from the launcher")

    signal.signal(signal.SIGTERM, handler)


def _exporter(run_dir: Path, rank: int, status: RankStatus):
    """on_trace_ready: Kineto JSON to .partial/, gzip beside it, rename into traces/."""

    def export(prof) -> None:
        t0 = time.perf_counter()
        partial = rundir.partial_dir(run_dir)
        partial.mkdir(parents=True, exist_ok=True)
        raw, gz = partial / f"rank{rank}_trace.json", partial / f"rank{rank}_trace.json.gz"
        prof.export_chrome_trace(str(raw))
        if not raw.exists():  # Kineto reports a failed write only in its log
            if rundir.disk_full(partial):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(raw))
            raise RuntimeError(f"the profiler wrote no trace to {raw}")
        json_bytes = raw.stat().st_size
        with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=GZIP_LEVEL) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        raw.unlink()
        final = rundir.trace_path(run_dir, rank)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(gz, final)
        status.write(
            trace_bytes=final.stat().st_size, trace_json_bytes=json_bytes, export_s=round(time.perf_counter() - t0, 4)
        )

    return export


def profile_rank(
    spec: RunSpec,
    run_dir: Path,
    *,
    rank: int,
    world_size: int,
    init_method: str = "env://",
    local_rank: int | None = None,
    node: int = 0,
    gpus_per_node: int | None = None,
) -> dict | None:
    """Train `spec.cfg` as rank `rank` under torch.profiler; returns the metrics on rank 0."""
    run_dir = Path(run_dir)
    local_rank = rank if local_rank is None else local_rank
    lab = {
        k: os.environ[v]
        for k, v in (("lab_node", "PARASCOPE_LAB_NODE"), ("namespace", "PARASCOPE_LAB_NAMESPACE"))
        if v in os.environ
    }  # a rank of `profiler run --lab` (profiler/lab/settings.py sets them)
    if "lab_node" in lab:
        lab["lab_node"] = int(lab["lab_node"])
    status = RankStatus(run_dir, rank=rank, node=node, local_rank=local_rank, steps=spec.cfg.steps, **lab)
    _stop_on_sigterm()
    flight.enable()  # before the process groups: every collective in the rank's ring buffer
    recorder = flight.Recorder(rundir.flight_dir(run_dir), rank, world_size).start()
    flight.configure(rank, recorder, spec.inject_hang)
    cfg = dataclasses.replace(spec.cfg, out=str(run_dir))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=spec.wait, warmup=spec.warmup, active=spec.active, repeat=1)
    try:
        with torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=_exporter(run_dir, rank, status),
            record_shapes=True,  # the GEMM and attention shapes tell the model (profiler.analyzers.identify)
        ) as prof:

            def on_step(step: int, info: dict) -> None:
                prof.step()
                backend = status.data["backend"] or torch.distributed.get_backend()
                status.write(
                    state="running",
                    step=step + 1,
                    backend=backend,
                    step_time_s=[*status.data["step_time_s"], info["step_time_s"]],
                    step_end=[*status.data["step_end"], time.time()],
                )

            metrics = run_rank(
                cfg,
                rank=rank,
                world_size=world_size,
                init_method=init_method,
                local_rank=local_rank,
                node=node,
                gpus_per_node=gpus_per_node,
                on_step=on_step,
            )
    except BaseException as err:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            first = rundir.os_error_text(err, run_dir)
        else:
            first = f"{type(err).__name__}: {err}".strip().split("\n")[0]
        stopped = isinstance(err, SystemExit) and "from the launcher" in str(err)
        if not stopped:
            traceback.print_exc()
        status.write(state="stopped" if stopped else "failed", error=first)
        if recorder.write() and not stopped:  # the first to fail asks its peers for theirs, before the stop
            recorder.request_all()
        raise
    finally:
        recorder.stop()
    if metrics is not None:  # rank 0: the engine's metrics.json plus the profile's schedule
        metrics["profile"] = {
            "wait": spec.wait,
            "warmup": spec.warmup,
            "active": spec.active,
            "profiled_steps": spec.profiled_steps,
        }
        rundir.write_json_atomic(run_dir / rundir.METRICS_JSON, metrics)
    status.write(state="done")
    return metrics


def prepare(argv) -> RunSpec:
    """The local agent's once-before-forking step: the flags, and the imports every rank needs."""
    spec, errors, _ = parse_run(argv)
    if errors or spec.out is None:
        raise SystemExit("profiler.collect.worker: " + ("; ".join(errors) or "--out is required"))
    # The profiler's first prepare_trace asks hasattr(torch, "_inductor"), which imports torch._inductor
    # (~2.5 s of CPU here, in every rank): once, before forking. It starts no thread.
    # lazy: loaded by the agent before it forks, not by every importer of this module (2.5 s)
    import torch._inductor.config  # noqa: F401

    if spec.plan.pp > 1:  # autograd.backward(grad_tensors=...) imports sympy on first use: once, here
        # lazy: sympy, which only a pipeline's backward needs
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    return spec


def rank(spec: RunSpec, **where) -> None:
    """One forked rank of the local agent: its log, then profile_rank."""
    redirect_output(rundir.log_path(spec.out, where["rank"]))
    profile_rank(spec, spec.out, **where)


def main(argv=None) -> int:
    """Entry point of one rank under torchrun (the supervisor validated the flags already)."""
    spec, errors, _ = parse_run(worker_args(sys.argv[1:] if argv is None else list(argv)))
    env = torchrun_env()
    if errors or env is None or spec.out is None:
        print("profiler.collect.worker: " + ("; ".join(errors) or "start it with torchrun and --out"), file=sys.stderr)
        return 2
    redirect_output(rundir.log_path(spec.out, env["rank"]))
    spec = dataclasses.replace(spec, cfg=dataclasses.replace(spec.cfg, launcher="torchrun"))
    try:  # record: torchrun's error file (its "Root Cause" names this rank and the error)
        record(profile_rank)(
            spec,
            spec.out,
            rank=env["rank"],
            world_size=env["world_size"],
            init_method="env://",
            local_rank=env["local_rank"],
            node=env["node"],
            gpus_per_node=env["gpus_per_node"],
        )
    except BaseException:  # noqa: BLE001 - profile_rank printed the traceback to this rank's log once
        return _exit(1)
    return _exit(0)


def _exit(code: int) -> int:
    """Leave at once: every file is written and closed, and tearing torch down costs ~1 s of CPU per
    rank (8 ranks on 2 cores: seconds of wall time between the last step and torchrun's return)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
