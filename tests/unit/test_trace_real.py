"""Every public trace set in ../shared/traces: ranks, steps, event counts and
per-op communication counts equal what a plain, independent scan of the raw JSON finds.

The scan below uses only gzip + json and its own small op table -- none of profiler's code -- so
the loader, the classifier and the kernel -> launch linking are checked against first principles.
Skips cleanly when ../shared/traces is absent (the `shared_traces` fixture of conftest.py).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from profiler import load_traces
from profiler.analyzers import collectives
from profiler.analyzers.front import TraceAnalysis

SETS = [
    "hta_cpu_only_gloo",
    "hta_df_index_resolver",
    "hta_distributed_info_unavailable",
    "hta_nccl_parser_config",
    "hta_trace_filter_sampled",
    "tracelens_b200_vllm",
]
# The op a collective name means, spelled as the traces spell it (CPU op suffixes and arg values).
OPS = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_": "all_reduce",
    "multimem_all_reduce_": "all_reduce",
    "_allgather_base": "all_gather",
    "_allgather_base_": "all_gather",
    "_all_gather_base": "all_gather",
    "allgather": "all_gather",
    "all_to_all": "all_to_all",
    "alltoall_base_": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "Broadcast": "broadcast",
    "SendRecv": "send_recv",
}
LAUNCHERS = re.compile(r"^(nccl:|c10d::|symm_mem::)(\w+)$")


def _raw(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _comm_kernel(name: str) -> bool:
    return name.startswith(("ncclKernel_", "ncclDevKernel_")) or "multimem_all_reduce_kernel" in name


def _scan(path: Path) -> dict:
    """What the file holds, found by brute force."""
    doc = _raw(path)
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    steps = sorted({int(m.group(1)) for e in xs if (m := re.match(r"^ProfilerStep#(\d+)$", e["name"]))})
    runtime = {
        e["args"]["correlation"]: e for e in xs if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    ops = Counter()
    kernels = [e for e in xs if e.get("cat") == "kernel" and _comm_kernel(e["name"])]
    launchers: dict[tuple, list] = {}  # CPU collective ops per thread, by start
    for e in sorted((e for e in xs if LAUNCHERS.match(e["name"])), key=lambda e: e["ts"]):
        launchers.setdefault((e["pid"], e["tid"]), []).append(e)
    starts = {key: [e["ts"] for e in on_thread] for key, on_thread in launchers.items()}
    for k in kernels:
        args = k.get("args", {})
        if "Collective name" in args:
            ops[OPS[args["Collective name"]]] += 1
            continue
        launch = runtime.get(args.get("correlation"))
        around = []
        if launch:
            on_thread = launchers.get((launch["pid"], launch["tid"]), [])
            i = bisect.bisect_right(starts.get((launch["pid"], launch["tid"]), []), launch["ts"])
            around = [e for e in on_thread[max(0, i - 8) : i] if launch["ts"] <= e["ts"] + e.get("dur", 0)]
        if around:
            ops[OPS[LAUNCHERS.match(min(around, key=lambda e: e["dur"])["name"]).group(2)]] += 1
        else:
            ops[OPS[re.match(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)", k["name"]).group(1)]] += 1
    if not kernels:  # CPU-only: count the calls -- c10d ops, else the nccl:/gloo: ops on the calling thread
        calls = [e for e in xs if e["name"].startswith("c10d::")] or [e for e in xs if e["name"].startswith("nccl:")]
        ops = Counter(OPS[e["name"].split(":")[-1]] for e in calls)
    info = doc.get("distributedInfo") or {}
    return {
        "rank": info.get("rank"),
        "world": info.get("world_size"),
        "steps": steps,
        "x_events": len(xs),
        "other_events": len(events) - len(xs),
        "ops": ops,
        "gpu": any(e.get("cat") == "kernel" for e in xs),
    }


@pytest.mark.parametrize("name", SETS)
def test_real_trace_set_matches_an_independent_scan(shared_traces, name, tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path))
    folder = shared_traces / name
    if not folder.is_dir():
        pytest.skip(f"{name} is not in ../shared/traces")
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    scans = {p.name: _scan(p) for p in files}
    given = {n: 0 for n, s in scans.items() if s["rank"] is None and not re.search(r"rank", n)}
    traces = load_traces(folder, ranks=given or None)
    expected_ranks = sorted(
        s["rank"] if s["rank"] is not None else given[n] if n in given else int(re.search(r"rank\D?(\d+)", n).group(1))
        for n, s in scans.items()
    )
    assert traces.rank_ids == expected_ranks
    worlds = {s["world"] for s in scans.values() if s["world"]}
    assert traces.world_size == (worlds.pop() if worlds else max(expected_ranks) + 1)
    assert traces.steps == sorted({st for s in scans.values() for st in s["steps"]})
    assert len(traces.events) == sum(s["x_events"] for s in scans.values())
    assert traces.skipped["count"].sum() == sum(s["other_events"] for s in scans.values())
    assert set(traces.ranks["device"]) == {"gpu" if any(s["gpu"] for s in scans.values()) else "cpu"}
    summary = TraceAnalysis(traces).summary()
    got = Counter()
    for row in summary["collectives"]:
        got[row["op"]] += row["count"]
    assert got == sum((s["ops"] for s in scans.values()), Counter())


def test_kernel_metadata_reaches_the_table(shared_traces, tmp_path, monkeypatch):
    """nccl_parser_config carries sizes and groups on kernels: bytes = nelems x 4 (Float), group 0,1."""
    monkeypatch.setenv("PARASCOPE_CACHE", str(tmp_path))
    folder = shared_traces / "hta_nccl_parser_config"
    if not folder.is_dir():
        pytest.skip("hta_nccl_parser_config absent")
    doc = _raw(next(folder.glob("*.json.gz")))
    raw = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_")]
    table = collectives(load_traces(folder))
    assert len(table) == len(raw)
    sizes = {"Float": 4, "Long": 8, "Int": 4, "Byte": 1}
    want = sorted(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * sizes[e["args"]["dtype"]] for e in raw)
    assert sorted(table["bytes"].astype(int)) == want
    assert set(table["group"]) == {"0,1"} and set(table["group_desc"]) == {"default_pg"}
    assert (table["busbw_gbps"] > 0).all()
