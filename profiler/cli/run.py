"""`python -m profiler run`: profile every rank of a parallel training job into a run directory.

    python -m profiler run --dp 2 --tp 2 --pp 2 --sp --steps 4 --global-batch 8 --out runs/a
    python -m profiler run ... --wait 1 --warmup 1 --active 2        # the profiler's schedule (steps)
    python -m profiler run ... --launcher torchrun                   # one torchrun agent, this node
    python -m profiler run ... --launcher torchrun --nnodes 2 --node-rank K --nproc-per-node 4 \\
        --rdzv-endpoint HOST:29500 --rdzv-id job7 --out /shared/runs/job7      # on each node K
    python -m profiler run --dp 2 --tp 2 --steps 4 --lab                   # both nodes of the lab

The plan, model, cluster and training flags are `python -m parallel train`'s; see run_args.py for
the rest. `--plan FILE` takes the plan from a plan JSON (bare, or {"plan", "model"} as `profiler
replan --json` and `parallel search --json` rows carry it; a Megatron-LM script or torchtitan TOML
too): its fields become the plan flags, written before the others so a flag given beside it wins;
the file's model is the job's unless --model is given (a preset, by name). The engine decides
attention and dropout itself (parallel.core.engine_plan): the file's are not flags here. Writes DIR/run.json (progress while it runs; see supervisor.py for its keys), one Kineto
trace per rank in DIR/traces/, DIR/metrics.json and DIR/logs/rank{r}.log (layout: rundir.py).
Without --out, DIR is a new `<UTC time>-<plan>` directory under $PARASCOPE_RUNS (default ./runs).

--lab: this one process starts a torchrun agent inside each of the lab's two network namespaces
(profiler/lab/settings.py), half the ranks each; run.json adds `lab` (the link as shaped, namespaces,
addresses) and each host's `lab_node` and `namespace`. Without a lab up, or without root: exit 2.

Exit codes: 0 completed; 1 the job failed (run.json names the rank, its error and its log's last
lines; a rank that raises or dies ends the job, a collective a peer never joins ends by --timeout,
the whole job by --job-timeout); 2 bad flags, a plan the plan model rejects, or an --out that
cannot be used -- reported before any process starts. SIGTERM / Ctrl-C stop the job (recorded as
failed) and leave no process behind.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from parallel.core.engine_plan import ENGINE_PLAN_FLAGS
from parallel.core.plan import PLAN_FIELDS, plan_values
from parallel.core.specs import MODELS, SpecError
from parallel.importers import import_plan
from profiler.collect.launchers import (
    RUN_MARKER,
    AgentLauncher,
    JobStopped,
    Outcome,
    kill_leftovers,
    local_commands,
    local_outcome,
    torchrun_commands,
    torchrun_root_cause,
)
from profiler.collect.spec import RunSpec, local_ranks_error, parse_run
from profiler.collect.supervisor import Supervisor, initial_record
from profiler.lab.settings import LabError, for_lab_flag
from runfiles import rundir


def _print_invalid(errors: list[str]) -> None:
    print("invalid plan:\n" + "\n".join(f"  error: {e}" for e in errors), file=sys.stderr)


def claim_dir(spec: RunSpec, record: dict) -> Path:
    """This run's directory, claimed (rundir.py's rules); RunDirError when it cannot be used."""
    if spec.node_rank > 0:
        out = spec.out or rundir.runs_root() / spec.rdzv_id
        return rundir.claim_node(out.resolve(), record, node=spec.node_rank, force=spec.force)
    if spec.out is None:
        out = rundir.new_run_dir(rundir.runs_root(), spec.plan.label())
        return rundir.claim(out, record, force=False).resolve()
    return rundir.claim(
        spec.out.resolve(), record, force=spec.force, run_id=record["run_id"] if spec.multinode else None
    )


def process_marker(spec: RunSpec, run_id: str) -> str:
    """The RUN_MARKER value of this supervisor's processes. Per node, not per run: the nodes of one
    multi-node run share its run_id, and on one host (loopback tests, the lab) node 0's clean-up must
    not kill node 1's agent while it is still finishing."""
    return f"{run_id}.node{spec.node_rank}"


def make_launcher(spec: RunSpec, run_dir: Path, run_id: str, lab=None) -> AgentLauncher:
    """This node's agent(s); with `lab` (a profiler.lab.settings.LabSettings) one torchrun agent per lab node,
    each in its namespace, rendezvous on node 0's veth address."""
    env = {RUN_MARKER: process_marker(spec, run_id)}
    log = run_dir / "logs" / f"launcher-node{spec.node_rank}.log"
    if lab is not None:
        try:
            port = lab.free_port(0)
        except LabError as err:  # the lab went down since main() checked it
            raise JobStopped(f"--lab: {err}") from None
        worker = ["-m", "profiler.collect.worker", "--", *spec.worker_argv(run_dir)]
        commands = [
            lab.torchrun_command(
                node, spec.nproc_per_node, worker, port=port, rdzv_id=run_id, launcher_args=["--max-restarts=0"]
            )
            for node in (0, 1)
        ]
        return AgentLauncher(
            "torchrun", commands, log=run_dir / "logs" / "launcher-lab.log", env=env, outcome=torchrun_root_cause
        )
    if spec.launcher == "local":
        outcome = run_dir / "status" / "launcher.json"
        commands = local_commands(
            "profiler.collect.worker", spec.worker_argv(run_dir), nproc=spec.plan.world_size, outcome=outcome
        )
        return AgentLauncher("local", commands, log=log, env=env, outcome=local_outcome(outcome))
    commands = torchrun_commands(
        "profiler.collect.worker",
        spec.worker_argv(run_dir),
        nproc_per_node=spec.nproc_per_node,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        rdzv_backend=spec.rdzv_backend,
        rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_id=spec.rdzv_id,
    )
    if not spec.multinode:
        env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")  # one machine: loopback
    return AgentLauncher("torchrun", commands, log=log, env=env, outcome=torchrun_root_cause)


def _stop_on_signals() -> None:
    def handler(signum, frame):
        raise JobStopped(f"stopped by signal {signum} ({signal.Signals(signum).name}) sent to `profiler run`")

    signal.signal(signal.SIGTERM, handler)


def supervise(spec: RunSpec, run_dir: Path, record: dict, lab=None) -> dict:
    """Launch the ranks, keep the record current, and write the final one; returns it."""
    sup = Supervisor(spec, run_dir, record)
    _stop_on_signals()
    try:
        outcome = make_launcher(spec, run_dir, record["run_id"], lab).run(on_tick=sup.tick, tick_s=0.25)
    except JobStopped as stop:
        outcome = Outcome(False, None, str(stop))
    except KeyboardInterrupt:
        outcome = Outcome(False, None, "interrupted (Ctrl-C)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    kill_leftovers(process_marker(spec, record["run_id"]))
    return sup.finish(outcome)


def plan_file_flags(path: str, *, model_given: bool) -> list[str]:
    """The plan flags (and --model) of the plan in `path`; SpecError (ImportFailed) in one line."""
    imported = import_plan(path)
    values = plan_values(imported.plan)
    flags: list[str] = []
    for spec in PLAN_FIELDS:
        value = values[spec.name]
        if spec.name not in ENGINE_PLAN_FLAGS or value is None:
            continue
        if isinstance(value, bool):
            flags.append(spec.knob.flag if value else "--no-" + spec.knob.flag[2:])
        else:
            flags += [spec.knob.flag, str(value)]
    if imported.model is not None and not model_given:
        if MODELS.get(imported.model.name) != imported.model:
            raise SpecError(f"--plan {path}: its model {imported.model.name} is no preset; give --model")
        flags += ["--model", imported.model.name]
    return flags


def _with_plan_file(argv: list[str]) -> list[str]:
    """argv with `--plan FILE` replaced by the file's plan flags, put first (a flag given beside it wins)."""
    rest, path = [], None
    i = 0
    while i < len(argv):
        if argv[i] == "--plan" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--plan="):
            path = argv[i].partition("=")[2]
        else:
            rest.append(argv[i])
        i += 1
    if path is None:
        return argv
    given = any(a == "--model" or a.startswith("--model=") for a in rest)
    return plan_file_flags(path, model_given=given) + rest


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _with_plan_file(argv)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spec, errors, warnings = parse_run(argv)
    if spec is not None and not errors and (too_many := local_ranks_error(spec, spec.max_local_ranks)):
        errors = [too_many]
    if errors:
        _print_invalid(errors)
        return 2
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    lab, lab_error = for_lab_flag(spec.lab)
    if lab_error:
        print(lab_error, file=sys.stderr)
        return 2
    record = initial_record(spec)
    if lab is not None:
        record["lab"] = lab.record()
    try:
        run_dir = claim_dir(spec, record)
    except rundir.RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"run directory: {run_dir}", flush=True)
    final = supervise(spec, run_dir, record, lab)
    if final.get("write_error"):  # run.json could not be written: say so, do not leave it silent
        print(f"error: cannot record the run's end in {run_dir}: {final['write_error']}", file=sys.stderr)
    if final["status"] == "completed":
        print(f"completed: {len(final['traces'])} traces in {run_dir / 'traces'}; python -m profiler analyze {run_dir}")
        return 0
    err = final["error"]
    who = f"rank {err['rank']}" if err.get("rank") is not None else "the job"
    print(f"error: {who} failed: {err['message']}", file=sys.stderr)
    if err.get("log_tail"):
        print(
            f"last lines of {run_dir / err['log']}:\n" + "\n".join("  " + ln for ln in err["log_tail"].split("\n")),
            file=sys.stderr,
        )
    return 1
