"""`python -m profiler commbench`: time the collectives of this machine (or cluster) and fit its links.

    python -m profiler commbench --nproc 4 --out commbench.json          # one node, forked ranks
    python -m profiler commbench --nproc 4 --out cb.json --sizes 1KiB..64MiB --size-factor 2 --iters 20
    python -m profiler commbench --nproc 4 --quick --out cb.json         # seconds: 3 sizes, groups 2 and N
    python -m profiler commbench --launcher torchrun --nnodes 2 --node-rank K --nproc 8 \\
        --rdzv-endpoint HOST:29500 --out /shared/cb.json                 # on each node K
    python -m profiler commbench --lab --nproc 4 --out cb.json          # the two-node lab, as root
    python -m parallel plan ... --links commbench.json                  # plan with the fitted links

Times all_reduce, all_gather, reduce_scatter, all_to_all and send/recv (a ring shift) over message
sizes (default 1 KiB..16 MiB, every 4x) and group sizes 2..N, with torch.distributed (gloo on CPU,
NCCL on GPUs). Writes FILE (JSON) and FILE with .csv: one row per (op, group size, link, bytes) with
time, algbw and busbw by the nccl-tests conventions; α-β fits per op and group size; and `links`,
{intra, inter: {latency_s, bandwidth_bytes_per_s, name, ...}}, the one α and B per link that make the
plan model's formulas (parallel/core/comm.py) reproduce the measurements (commbench_fit.py explains the
conventions and the fit). Across nodes, groups inside node 0 and groups spread over the nodes are
measured separately: `intra` and `inter`. With all ranks on one node only `intra` can be measured,
and only `intra` is written (with a `links_note` saying so); the lab gives a second node:
with `--lab` this process starts a torchrun agent with --nproc ranks in each lab namespace, and the
result adds `lab` (the link as shaped: profiler.lab.settings.LabSettings.record). No lab, no root: exit 2.

Exit codes: 0 written; 1 a rank failed (named); 2 bad flags. Launchers: profiler/collect/launchers.py.
Pure here (the ranks run profiler/commbench/worker.py in their own processes).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

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
from profiler.commbench.spec import CommbenchSpec, parse_commbench
from profiler.lab.settings import LabError, for_lab_flag
from runfiles.rundir import write_json_atomic


def make_launcher(spec: CommbenchSpec, tmp: Path, run_id: str, lab=None) -> AgentLauncher:
    env = {RUN_MARKER: run_id}
    log = tmp / "launcher.log"
    if lab is not None:  # one agent per lab node, each in its namespace
        try:
            port = lab.free_port(0)
        except LabError as err:
            raise JobStopped(f"--lab: {err}") from None
        worker = ["-m", "profiler.commbench.worker", "--", *spec.worker_argv()]
        commands = [
            lab.torchrun_command(
                node, spec.nproc, worker, port=port, rdzv_id=run_id, launcher_args=["--max-restarts=0"]
            )
            for node in (0, 1)
        ]
        return AgentLauncher("torchrun", commands, log=log, env=env, outcome=torchrun_root_cause)
    if spec.launcher == "local":
        outcome = tmp / "outcome.json"
        commands = local_commands("profiler.commbench.worker", spec.worker_argv(), nproc=spec.nproc, outcome=outcome)
        return AgentLauncher("local", commands, log=log, env=env, outcome=local_outcome(outcome))
    commands = torchrun_commands(
        "profiler.commbench.worker",
        spec.worker_argv(),
        nproc_per_node=spec.nproc,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        rdzv_backend=spec.rdzv_backend,
        rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_id=spec.rdzv_id,
    )
    if spec.nnodes == 1:
        env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return AgentLauncher("torchrun", commands, log=log, env=env, outcome=torchrun_root_cause)


def run(spec: CommbenchSpec, lab=None) -> Outcome:
    """Run the benchmark's ranks (on `lab`, a profiler.lab.settings.LabSettings, when given); the result file
    is written by rank 0."""
    run_id = uuid.uuid4().hex
    deadline = time.monotonic() + spec.job_timeout_s if spec.job_timeout_s else None

    def tick():
        if deadline is not None and time.monotonic() > deadline:
            raise JobStopped(f"commbench ran past --job-timeout {spec.job_timeout_s:g} s")

    with tempfile.TemporaryDirectory(prefix="parascope-commbench-") as tmp:
        try:
            outcome = make_launcher(spec, Path(tmp), run_id, lab).run(on_tick=tick)
        except JobStopped as stop:
            outcome = Outcome(False, None, str(stop))
        finally:
            kill_leftovers(run_id)
        if not outcome.ok:
            log = (Path(tmp) / "launcher.log").read_text(errors="replace")
            sys.stderr.write(log[-4000:])
    return outcome


def summary(result: dict) -> str:
    lines = [
        f"{result['world_size']} ranks, {result['backend']} on {result['device']}; {len(result['results'])} points"
    ]
    lines.append(f"  {'op':<15}{'n':>3} {'link':<6}{'alpha us':>10}{'busbw GB/s':>12}{'rel err':>9}")
    for f in result["fits"]:
        bw = f["bandwidth_bytes_per_s"]
        lines.append(
            f"  {f['op']:<15}{f['group_size']:>3} {f['link']:<6}{f['alpha_s'] * 1e6:>10.1f}"
            f"{(bw / 1e9 if bw else float('nan')):>12.2f}{f['rel_rmse']:>9.2f}"
        )
    for name, link in result["links"].items():
        bw = link["bandwidth_bytes_per_s"]
        lines.append(
            f"links.{name}: latency {link['latency_s'] * 1e6:.1f} us, bandwidth "
            f"{(bw or float('nan')) / 1e9:.2f} GB/s per rank per direction (rel err {link['rel_rmse']:.2f})"
        )
    if result.get("links_note"):
        lines.append(result["links_note"])
    return "\n".join(lines)


def main(argv=None) -> int:
    spec, errors = parse_commbench(sys.argv[1:] if argv is None else argv)
    if errors:
        print("\n".join(f"error: {e}" for e in errors), file=sys.stderr)
        return 2
    lab, lab_error = for_lab_flag(spec.lab)
    if lab_error:
        print(lab_error, file=sys.stderr)
        return 2
    try:
        spec.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"error: --out {spec.out}: {err}", file=sys.stderr)
        return 2
    outcome = run(spec, lab)
    if not outcome.ok:
        who = f"rank {outcome.rank}" if outcome.rank is not None else "commbench"
        print(
            f"error: {who} failed: {(outcome.message or '').strip().splitlines()[0] if outcome.message else ''}",
            file=sys.stderr,
        )
        return 1
    if spec.out.is_file():
        result = json.loads(spec.out.read_text())
        if lab is not None:  # rank 0 wrote it on this filesystem; this process knows the link
            result["lab"] = lab.record()
            write_json_atomic(spec.out, result)
        print(summary(result))
        print(f"wrote {spec.out} and {spec.csv_path}")
    else:
        print(f"done; the result is on the node that ran rank 0 ({spec.out})")
    return 0
