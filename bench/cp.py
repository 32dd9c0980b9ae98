"""The three context-parallel exchanges side by side on this machine: tiny-llama at cp 2 and
4, several sequence lengths, all-gather vs ring vs Ulysses at the same plan.

For each (cp, length, kind) it runs
  * `python -m parallel train` (no profiler): the steady step time, median of the steps after the first;
  * `python -m profiler run` + `profiler analyze`: the CP bytes each rank moves per recorded step,
    from the trace's own `ps.comm` labels (sends for ring; all-gather / reduce-scatter / all-to-all
    buffers as nccl-tests count them),
and prints them beside parallel.core.comm's prediction for the same plan (calls × bytes per call of
its dim-cp rows) and the error, and the activation bytes the run measured per rank beside the
formula's.

    .venv/bin/python -m bench.cp [--lengths 256,1024,2048] [--cps 2,4] [--steps 5] [--json]

A benchmark, not a test: step times depend on the machine and on what else runs on it; the bytes
do not (the model must match them within 5%: `--check` exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from bench._subprocess import run_module
from parallel.core import comm
from parallel.core.plan import CP_KINDS, Plan
from parallel.core.specs import CLUSTERS, MODELS

MODEL = "tiny-llama"


def predicted_cp_bytes(seq_len: int, cp: int, kind: str, global_batch: int) -> float:
    """parallel.core.comm's CP bytes per step for one rank of the plan."""
    model = dataclasses.replace(MODELS[MODEL], seq_len=seq_len)
    plan = Plan(cp=cp, cp_kind=kind, global_batch=global_batch)
    return comm.bytes_per_step(comm.comm_per_step(model, plan, CLUSTERS["local-cpu"].sized_for(cp)), "cp")


def measure(seq_len: int, cp: int, kind: str, *, steps: int, global_batch: int, tmp: Path) -> dict:
    flags = ["--model", MODEL, "--seq-len", str(seq_len), "--cp", str(cp), "--cp-kind", kind]
    flags += ["--global-batch", str(global_batch)]
    plain = tmp / f"train-{cp}-{seq_len}-{kind}"
    run_module("parallel", "train", *flags, "--steps", str(steps), "--out", str(plain), timeout=1800)
    metrics = json.loads((plain / "metrics.json").read_text())
    steady = statistics.median(metrics["step_time_s"][1:])  # rank 0's steps: each ends with the loss all-reduce
    act = max(metrics["activation_bytes"].values())
    act_pred = max(metrics["predicted_activation_bytes"].values())

    run = tmp / f"prof-{cp}-{seq_len}-{kind}"
    active = 2
    run_module(
        "profiler", "run", *flags, "--steps", str(2 + active), "--active", str(active), "--out", str(run), timeout=1800
    )
    analysis = json.loads(run_module("profiler", "analyze", str(run), "--json", timeout=1800))
    moved = sum(
        c["bytes"]
        for c in analysis["collectives"]
        if c["dim"] == "cp" and c["op"] in ("send", "all_gather", "reduce_scatter", "all_to_all")
    )
    measured = moved / active / cp
    predicted = predicted_cp_bytes(seq_len, cp, kind, global_batch)
    return {
        "cp": cp,
        "seq_len": seq_len,
        "kind": kind,
        "step_s": steady,
        "cp_bytes_per_step_rank": measured,
        "predicted_cp_bytes": predicted,
        "bytes_error": (measured - predicted) / predicted if predicted else 0.0,
        "activation_bytes": act,
        "predicted_activation_bytes": act_pred,
    }


def table(rows: list[dict]) -> str:
    head = "| cp | tokens | exchange | step (s) | CP MiB/step/rank measured | predicted | error | activations MiB (= formula) |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "=" if r["activation_bytes"] == r["predicted_activation_bytes"] else "≠"
        lines.append(
            f"| {r['cp']} | {r['seq_len']:,} | {r['kind']} | {r['step_s']:.3f} | "
            f"{r['cp_bytes_per_step_rank'] / 2**20:,.2f} | {r['predicted_cp_bytes'] / 2**20:,.2f} | "
            f"{r['bytes_error']:+.1%} | {r['activation_bytes'] / 2**20:,.2f} {same} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cp", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="256,1024,2048")
    p.add_argument("--cps", default="2,4")
    p.add_argument("--kinds", default=",".join(CP_KINDS))
    p.add_argument("--steps", type=int, default=5, help="unprofiled steps (the first is dropped)")
    p.add_argument("--global-batch", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="exit 1 when measured bytes are off the model by > 5%%")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (int(c) for c in args.cps.split(",")):
            for s in (int(x) for x in args.lengths.split(",")):
                for kind in args.kinds.split(","):
                    row = measure(s, cp, kind, steps=args.steps, global_batch=args.global_batch, tmp=Path(tmp))
                    rows.append(row)
                    print(json.dumps(row) if args.json else table([row]).splitlines()[-1], flush=True)
    if not args.json:
        print()
        print(table(rows))
    worst = max(abs(r["bytes_error"]) for r in rows)
    print(f"\nworst CP bytes error: {worst:.2%}")
    return 1 if args.check and worst > 0.05 else 0


if __name__ == "__main__":
    raise SystemExit(main())
