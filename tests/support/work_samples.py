"""A work sample as profiler.analyzers.calibrate._work_samples makes one per rank: zeros for every
regressor and time, so a test states only what its case is about."""

from __future__ import annotations


def work_sample(**fields) -> dict:
    base = {
        "layers_mb": 0.0,
        "head_mb": 0.0,
        "tp_layers_mb": 0.0,
        "sp_layers_mb": 0.0,
        "cp_layers_mb": 0.0,
        "call_weights": (0.0, 0.0, 0.0),
        "flops": 0.0,
        "gemm_s": 0.0,
        "elementwise_ops": 0.0,
        "elementwise_bytes": 0.0,
        "elementwise_s": 0.0,
        "pipeline_work_s": 0.0,
        "work_s": 0.0,
        "optim_s": 0.0,
        "microbatches": 1,
    }
    unknown = set(fields) - set(base)
    if unknown:
        raise KeyError(f"not a work sample's field: {', '.join(sorted(unknown))}")
    return {**base, **fields}
