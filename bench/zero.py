"""ZeRO stages 0-3 side by side on this machine: model-state memory per rank measured against the
plan model, what ZeRO-2/3 hold for moments inside a step, the data-parallel bytes moved per step, and
the step time.

For each plan and ZeRO stage it runs
  * `python -m parallel train` (no profiler): steady step time (median of the steps after the first),
    `model_state_bytes` beside `predicted_model_state_bytes` (the most loaded rank), and
    `model_state_transient_bytes` (gathered layers, full-size gradients before their reduce-scatter);
  * `python -m profiler run` + `profiler analyze`: the dp-dimension bytes each rank moves per recorded
    step (all-reduce, reduce-scatter, all-gather buffers as nccl-tests count them, the loss's 4-byte
    all-reduce included) beside parallel.core.comm's prediction.

    .venv/bin/python -m bench.zero [--plans dp4,dp2-tp2-sp] [--stages 0,1,2,3] [--steps 5] [--json]

A benchmark, not a test: step times depend on the machine; the bytes do not (`--check` exits 1 when
model state is off the formula by more than 1% or dp bytes by more than 5%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench._subprocess import run_module
from parallel.core import comm
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS

MODEL = "tiny"
PLANS = {
    "dp4": {"dp": 4},
    "dp2-tp2-sp": {"dp": 2, "tp": 2, "sp": True},
    "dp2-pp2": {"dp": 2, "pp": 2},
}
STATES = ("params", "grads", "optimizer")


def measure(name: str, zero: int, *, steps: int, global_batch: int, tmp: Path) -> dict:
    shape = PLANS[name]
    plan = Plan(**shape, zero=zero, global_batch=global_batch)
    flags = [f"--{k}={v}" for k, v in shape.items() if k != "sp"] + (["--sp"] if shape.get("sp") else [])
    flags += [f"--zero={zero}", f"--global-batch={global_batch}", f"--model={MODEL}"]
    plain = tmp / f"train-{name}-z{zero}"
    run_module("parallel", "train", *flags, "--steps", str(steps), "--out", str(plain), timeout=1800)
    m = json.loads((plain / "metrics.json").read_text())
    total = {r: sum(v[k] for k in STATES) for r, v in m["model_state_bytes"].items()}
    worst = max(total, key=total.get)  # the most loaded rank
    held, predicted = m["model_state_bytes"][worst], m["predicted_model_state_bytes"][worst]
    transient = m["model_state_transient_bytes"].get(worst) or {}

    run = tmp / f"prof-{name}-z{zero}"
    active = 1
    run_module(
        "profiler", "run", *flags, "--steps", str(2 + active), "--active", str(active), "--out", str(run), timeout=1800
    )
    analysis = json.loads(run_module("profiler", "analyze", str(run), "--json", timeout=1800))
    moved = sum(c["bytes"] for c in analysis["collectives"] if c["dim"] == "dp") / active / plan.world_size
    cluster = CLUSTERS["local-cpu"].sized_for(plan.world_size)
    predicted_dp = comm.bytes_per_step(comm.comm_per_step(MODELS[MODEL], plan, cluster), "dp")
    return {
        "plan": name,
        "zero": zero,
        "step_s": statistics.median(m["step_time_s"][1:]),
        "rank": int(worst),
        **{f"{k}_bytes": held[k] for k in STATES},
        **{f"predicted_{k}_bytes": predicted[k] for k in STATES},
        "state_error": max(abs(held[k] - predicted[k]) / predicted[k] for k in STATES),
        "gathered_params_peak": transient.get("gathered_params", 0),
        "unsharded_grads_peak": transient.get("unsharded_grads", 0),
        "dp_bytes_per_step_rank": moved,
        "predicted_dp_bytes": predicted_dp,
        "dp_bytes_error": (moved - predicted_dp) / predicted_dp if predicted_dp else 0.0,
    }


def _kib(n: float) -> str:
    return f"{n / 2**10:,.0f}"


def table(rows: list[dict]) -> str:
    head = (
        "| plan | ZeRO | step (s) | params KiB | grads KiB | optimizer KiB | model state vs formula | "
        "transient: gathered / full grads KiB | dp KiB/step/rank | predicted | error |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['plan']} | {r['zero']} | {r['step_s']:.3f} | {_kib(r['params_bytes'])} | {_kib(r['grads_bytes'])} | "
            f"{_kib(r['optimizer_bytes'])} | {r['state_error']:+.2%} | {_kib(r['gathered_params_peak'])} / "
            f"{_kib(r['unsharded_grads_peak'])} | {_kib(r['dp_bytes_per_step_rank'])} | "
            f"{_kib(r['predicted_dp_bytes'])} | {r['dp_bytes_error']:+.1%} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.zero", description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", default=",".join(PLANS))
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--steps", type=int, default=5, help="unprofiled steps (the first is dropped)")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="exit 1 when off the model (model state 1%%, dp bytes 5%%)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.plans.split(","):
            if name not in PLANS:
                raise SystemExit(f"--plans: {name!r} is not one of {', '.join(PLANS)}")
            for zero in (int(z) for z in args.stages.split(",")):
                row = measure(name, zero, steps=args.steps, global_batch=args.global_batch, tmp=Path(tmp))
                rows.append(row)
                print(json.dumps(row) if args.json else table([row]).splitlines()[-1], flush=True)
    if not args.json:
        print()
        print(table(rows))
    state, dp = max(r["state_error"] for r in rows), max(abs(r["dp_bytes_error"]) for r in rows)
    print(f"\nworst model-state error: {state:.2%}; worst dp bytes error: {dp:.2%}")
    return 1 if args.check and (state > 0.01 or dp > 0.05) else 0


if __name__ == "__main__":
    raise SystemExit(main())
