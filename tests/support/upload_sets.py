"""An uploaded trace set on disk, laid out as the Upload page stores one (UPLOADS/NAME/traces/, manifest.json,
plan.json when a plan is attached), for page tests that open it as `?run=upload:NAME`.

    write_upload(uploads, "dlrm")      # 8 ranks of a data-parallel job on V100s, no plan, no model

The default set is shaped like the DLRM upload a user tried: eight GPU ranks whose traces name the GPU
(deviceProperties: a 32 GB V100, which no cluster preset has) and one all-reduce over every rank, and
nothing that says which model the job trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import trace_samples as ts

V100 = {"id": 0, "name": "Tesla V100-SXM2-32GB", "totalGlobalMem": 34_089_730_048}


def _rank_trace(rank: int, world: int, device: dict) -> dict:
    """One step: a GEMM, then an all-reduce over every rank (the default group), as NCCL records it."""
    everyone = list(range(world))
    meta = {
        **ts.NCCL_META,
        "Group size": world,
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": str(everyone),
    }
    events = [
        ts.annotation("ProfilerStep#10", 0, 1000),
        ts.cpu("aten::mm", 40, 20),
        ts.runtime(50, 5, corr=1),
        ts.cpu("record_param_comms", 56, 18, **meta),
        ts.runtime(60, 5, corr=2),
        ts.kernel("volta_sgemm_128x64_nn", 100, 200, corr=1),
        ts.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 300, 300, corr=2, stream=20),
    ]
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world, "ranks": everyone}]
    trace = ts.trace(rank, world, events, pg_config=pg)
    trace["deviceProperties"] = [device]
    return trace


def write_upload(
    uploads: Path, name: str, *, world: int = 8, device: dict = V100, plan: dict | None = None, model=None
) -> str:
    """Write the set (see the module docstring); `plan` (Plan.to_dict()) and `model` (a preset's name or a
    whole shape) attach a plan as the Upload page does. Returns the set's id for `?run=`."""
    folder = Path(uploads) / name
    (folder / "traces").mkdir(parents=True)
    files = []
    for rank in range(world):
        data = json.dumps(_rank_trace(rank, world, device)).encode()
        (folder / "traces" / f"rank{rank}_trace.json").write_bytes(data)
        files.append({"name": f"rank{rank}_trace.json", "bytes": len(data), "ranks": [rank]})
    manifest = {
        "name": name,
        "created_at": "2026-01-01T00:00:00",
        "world_size": world,
        "ranks": list(range(world)),
        "files": files,
        "rejected": [],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if plan is not None:
        (folder / "plan.json").write_text(json.dumps({"plan": plan, "model": model}, indent=1))
    return "upload:" + name
