"""Model-state memory, measured: the bytes of parameters, gradients and optimizer states a rank holds.

Counted from the tensors themselves, as the activation meter counts saved tensors: each *storage*
once (a parameter that is a view of a flat bucket, and a ZeRO shard that is a view of the same
bucket, cost the bucket once), at its allocated size (bucket padding included); a storage freed to
0 bytes (a ZeRO-3 layer between its all-gathers) counts nothing. Taken once per run, after the first
step's gradient reduction and before its optimizer step, when gradients, optimizer states and
parameters are all alive; what exists only for moments inside a step (ZeRO-3's gathered layers, the
full-size gradients before their reduce-scatter) is reported apart, as the step's transient peak.

The prediction is parallel.core.memory.model_state_bytes for this engine's dtypes
(`mixed_precision=False`: gradients and Adam's moments in the model's dtype, no master copy).
"""

from __future__ import annotations

import torch

from parallel.core import memory
from parallel.core.plan import Plan
from parallel.core.specs import Model


def storage_bytes(tensors) -> int:
    """The bytes of the distinct storages under `tensors` (None entries skipped)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        if st.nbytes():
            seen[(t.device, st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def held_bytes(params: list[torch.Tensor], reducer, optimizer) -> dict[str, int]:
    """{params, grads, optimizer}: what this rank stores for the model's parameters `params`, the
    reducer's optimizer-facing tensors (ZeRO shards) and the optimizer's states."""
    opt_params = reducer.optimizer_params()
    return {
        "params": storage_bytes([*params, *opt_params]),
        "grads": storage_bytes([p.grad for p in [*params, *opt_params]]),
        "optimizer": storage_bytes([*optimizer.exp_avg, *optimizer.exp_avg_sq]),
    }


def predicted_bytes(model: Model, plan: Plan, *, stage: int) -> dict[str, int]:
    """The plan model's {params, grads, optimizer} for one GPU of `stage` of this engine."""
    row = memory.model_state_bytes(model, plan, stage, mixed_precision=False)
    return {k: int(round(float(v))) for k, v in row.items()}
