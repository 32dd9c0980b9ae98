"""The run's metrics.json object (its schema: runfiles.metrics), and the run's parameters
gathered back to the serial model's full shapes."""

from __future__ import annotations

from pathlib import Path

import torch

from parallel.engine.tensor_parallel import unshard_tensor


def build_metrics(cfg, results: list[dict], *, backend: str) -> dict:
    """The metrics.json object from every rank's result (index = rank)."""
    by_rank = {str(r["rank"]): r for r in results}
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    n_steps = len(results[0]["step_time_s"])
    return {
        "world_size": len(results),
        "plan": cfg.plan.to_dict(),
        "model": cfg.model.to_dict(),
        "steps": cfg.steps,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "dropout": cfg.dropout,
        "loss": loss,
        "step_time_s": [max(r["step_time_s"][i] for r in results) for i in range(n_steps)],
        "step_time_s_per_rank": {k: r["step_time_s"] for k, r in by_rank.items()},
        # the part of each step a rank spent inside its communication calls (collectives.BLOCKED)
        "comm_time_s_per_rank": {k: r["comm_time_s"] for k, r in by_rank.items()},
        # the CPU seconds of the rank's process in each step, and in its communication calls
        "cpu_time_s_per_rank": {k: r["cpu_time_s"] for k, r in by_rank.items()},
        "comm_cpu_time_s_per_rank": {k: r["comm_cpu_time_s"] for k, r in by_rank.items()},
        "init_s": {k: r["init_s"] for k, r in by_rank.items()},
        "activation_bytes": {k: r["activation_bytes"] for k, r in by_rank.items()},
        "activation_breakdown": {k: r["activation_breakdown"] for k, r in by_rank.items()},
        "activation_bytes_per_layer": {
            k: {str(lay): n for lay, n in r["activation_bytes_per_layer"].items()} for k, r in by_rank.items()
        },
        "predicted_activation_bytes": {
            k: sum(r["predicted_activation_breakdown"].values()) for k, r in by_rank.items()
        },
        "predicted_activation_breakdown": {k: r["predicted_activation_breakdown"] for k, r in by_rank.items()},
        "model_state_bytes": {k: r["model_state_bytes"] for k, r in by_rank.items()},
        "predicted_model_state_bytes": {k: r["predicted_model_state_bytes"] for k, r in by_rank.items()},
        "model_state_transient_bytes": {k: r["model_state_transient_bytes"] for k, r in by_rank.items()},
        "live_microbatches": {k: r["live_microbatches"] for k, r in by_rank.items()},
        "coords": {k: r["coords"] for k, r in by_rank.items()},
        "hosts": {
            k: {"hostname": r["hostname"], "node": r["node"], "local_rank": r["local_rank"]} for k, r in by_rank.items()
        },
        "nodes": len({r["node"] for r in results}),
        "backend": backend,
        "torch_version": torch.__version__,
        "launcher": cfg.launcher,
    }


def load_shards(run_dir) -> dict[int, dict]:
    """Every rank's saved parameter shards ({rank: {coords, tp, params, tp_shard}}), from --save-params."""
    files = sorted((Path(run_dir) / "params").glob("rank*.pt"))
    return {int(f.stem[4:]): torch.load(f, weights_only=False) for f in files}


def full_state_dict(run_dir, *, key: str = "params") -> dict:
    """The serial model's parameters (full shapes, serial names) from a run's shards: TP shards
    concatenated (tensor_parallel.unshard_tensor), stages merged, the dp = cp = 0 replica.
    key="grads": the first step's reduced gradients instead (runs without ZeRO)."""
    shards = load_shards(run_dir)
    out = {}
    replicas = [s for s in shards.values() if s["coords"]["dp"] == 0 and s["coords"]["cp"] == 0]
    for s in sorted(replicas, key=lambda s: (s["coords"]["pp"], s["coords"]["tp"])):
        if s["coords"]["tp"] != 0:
            continue
        peers = sorted((r for r in replicas if r["coords"]["pp"] == s["coords"]["pp"]), key=lambda r: r["coords"]["tp"])
        for name, tensor in s[key].items():
            if name in out:  # the last stage's tied copy of wte
                continue
            if name in s["tp_shard"]:
                out[name] = unshard_tensor([r[key][name] for r in peers], *s["tp_shard"][name])
            else:
                out[name] = tensor
    return out
