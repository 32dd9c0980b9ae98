"""Small hand-written Kineto traces for unit tests of the loader and analyzers.

Each builder returns a trace as a dict shaped like Kineto's output, with times in microseconds, so
a test can state exact expected numbers (overlap, skew, bytes). Real traces -- ours from
tests/support/tracegen.py and public ones from ../shared/traces -- are tested elsewhere; these pin the
arithmetic. `write(path, trace)` writes .json or .json.gz.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

BASE_NS = 1_700_000_000_000_000_000  # baseTimeNanoseconds of the 'relative' time style
EPOCH_US = 1_700_000_000_000_000  # where 'epoch' style timestamps start


def trace(rank, world, events, *, style="epoch", backend="nccl", pg_config=None, distributed=True, host="h0"):
    """A Kineto trace dict; event ts are given relative (us) and placed by `style`."""
    out = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU"}], "host_name": host}
    if distributed:
        info = {"backend": backend, "rank": rank, "world_size": world}
        if pg_config is not None:
            info["pg_config"] = pg_config
        out["distributedInfo"] = info
    shifted = []
    for e in events:
        e = dict(e)
        if "ts" in e:
            e["ts"] = (EPOCH_US + e["ts"]) if style == "epoch" else float(e["ts"])
        shifted.append(e)
    if style == "relative":
        out["baseTimeNanoseconds"] = BASE_NS
    out["traceEvents"] = shifted + [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "main"}},
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 0, "cat": "ac2g", "name": "flow"},
        {"ph": "i", "s": "t", "pid": 1, "tid": 1, "ts": 0, "name": "[memory]"},
    ]
    return out


def cpu(name, ts, dur, *, tid=1, cat="cpu_op", **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": args.pop("ext", 0), **args},
    }


def annotation(name, ts, dur, *, tid=1):
    return cpu(name, ts, dur, tid=tid, cat="user_annotation")


def runtime(ts, dur, corr, *, tid=1):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "External id": 0},
    }


def kernel(name, ts, dur, corr, *, stream=7, cat="kernel", **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "stream": stream, "device": 0, **args},
    }


NCCL_META = {
    "Collective name": "allreduce",
    "In msg nelems": 1000,
    "Out msg nelems": 1000,
    "dtype": "Float",
    "Group size": 2,
    "Process Group Name": "1",
    "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP",
    "Process Group Ranks": "[0, 1]",
}
PG_CONFIG = [
    {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]},
    {
        "pg_name": "1",
        "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP",
        "backend_config": "cuda:nccl",
        "pg_size": 2,
        "ranks": [0, 1],
    },
]


def gpu_pair(*, late_us=50, style="epoch"):
    """Two GPU ranks, one step [0, 1000) us: compute [100, 400), all-reduce [300|300+late, 600) on a
    TP group of ranks 0 and 1, memcpy [650, 700). Rank 1 arrives `late_us` later."""
    out = []
    for rank in (0, 1):
        start = 300 + (late_us if rank == 1 else 0)
        events = [
            annotation("ProfilerStep#1", 0, 1000),
            cpu("aten::mm", 40, 20),
            runtime(50, 5, corr=1),
            cpu("c10d::allreduce_", 55, 20),
            cpu("record_param_comms", 56, 18, **NCCL_META),
            cpu("nccl:all_reduce", 57, 16),
            runtime(60, 5, corr=2),
            kernel("volta_sgemm_128x64_nn", 100, 300, corr=1),
            kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                start,
                600 - start,
                corr=2,
                stream=20,
            ),
            kernel("Memcpy DtoD (Device -> Device)", 650, 50, corr=3, cat="gpu_memcpy"),
            runtime(70, 5, corr=3),
        ]
        out.append(trace(rank, 2, events, style=style, pg_config=PG_CONFIG))
    return out


def gloo_cpu(rank=0, world=2, *, annotated=False):
    """A CPU-only gloo rank: main thread computes [0, 200) and [210, 500); an all-reduce is issued at
    200 (c10d, 10 us) and runs on a gloo worker thread [220, 600) with a 100-float input."""
    events = [annotation("ProfilerStep#3", 0, 1000), cpu("aten::mm", 0, 200), cpu("aten::add", 210, 290)]
    if annotated:
        events.append(annotation("ps.comm dim=dp op=reduce_scatter bytes=800 ranks=0,1 seq=0", 195, 20))
    events += [
        cpu("c10d::allreduce_", 200, 10),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": 1,
            "tid": 9,
            "ts": 220,
            "dur": 380,
            "args": {"Input Dims": [[100]], "Input type": ["float"]},
        },
        cpu("aten::copy_", 300, 50, tid=9),
    ]
    return trace(rank, world, events, backend="gloo")


def write(path, data) -> Path:
    path = Path(path)
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path
