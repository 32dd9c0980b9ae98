"""Flight Recorder dumps in PyTorch's JSON format, written by a test for a job it describes: the
groups of a DP x TP layout, a few steps of collectives on each, and one fault (a rank that stops
before a collective, or issues it with another op, size or dtype). Real dumps of real hangs come from
`profiler run --inject-hang` (tests/integration/test_hang_runs.py); these pin the arithmetic and the
scale (1,024 ranks) without launching a job.

    dumps = job_dumps(world=8, tp=2, steps=3, fault=Fault("missing", rank=5, dim="tp", seq=4))
    write_dumps(tmp_path, dumps)                  # rank{r}.json per rank
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

T0 = 1_700_000_000_000_000_000
STEP_NS = 50_000_000  # 50 ms between a rank's collectives


@dataclass(frozen=True)
class Fault:
    kind: str  # missing | op_mismatch | size_mismatch | dtype_mismatch | membership
    rank: int
    dim: str  # tp | dp
    seq: int  # the group's collective sequence number (1-based, as PyTorch counts)


def layout(world: int, tp: int) -> dict[str, tuple[str, list[int]]]:
    """Process-group name -> (description, ranks): the world, TP groups of consecutive ranks, DP groups across."""
    groups = {"0": ("default_pg", list(range(world)))}
    for i in range(world // tp):
        groups[str(1 + i)] = ("tp", list(range(i * tp, (i + 1) * tp)))
    base = 1 + world // tp
    for j in range(tp):
        groups[str(base + j)] = ("dp", list(range(j, world, tp)))
    return groups


def job_dumps(world: int, tp: int, steps: int = 3, fault: Fault | None = None) -> dict[int, dict]:
    """Each rank's dump: per step 2 TP all-reduces of 4096 floats and one DP all-reduce of 65536."""
    groups = layout(world, tp)
    dumps = {}
    for rank in range(world):
        mine = {name: (desc, ranks) for name, (desc, ranks) in groups.items() if rank in ranks and name != "0"}
        tp_name = next(n for n, (d, _) in mine.items() if d == "tp")
        dp_name = next(n for n, (d, _) in mine.items() if d == "dp")
        calls = []
        for _ in range(steps):
            calls += [(tp_name, "all_reduce", 4096), (tp_name, "all_reduce", 4096), (dp_name, "all_reduce", 65536)]
        entries, seqs, t, stopped = [], {}, T0, False
        for i, (name, op, numel) in enumerate(calls):
            seq = seqs.get(name, 0) + 1
            seqs[name] = seq
            desc = groups[name][0]
            dtype = "Float"
            hit = fault is not None and fault.rank == rank and fault.dim == desc and fault.seq == seq
            if hit and fault.kind == "missing":
                stopped = True
            if stopped:
                break
            if hit and fault.kind == "op_mismatch":
                op = "broadcast"
            elif hit and fault.kind == "size_mismatch":
                numel *= 2
            elif hit and fault.kind == "dtype_mismatch":
                dtype = "BFloat16"
            entries.append(
                {
                    "record_id": i,
                    "pg_id": int(name),
                    "process_group": [name, desc],
                    "collective_seq_id": seq,
                    "p2p_seq_id": 0,
                    "op_id": seq,
                    "profiling_name": f"nccl:{op}",
                    "time_created_ns": t + rank * 1000,
                    "input_sizes": [[numel]],
                    "output_sizes": [[numel]],
                    "input_dtypes": [dtype],
                    "output_dtypes": [dtype],
                    "state": "scheduled",
                    "is_p2p": False,
                    "retired": False,
                    "timeout_ms": 600000,
                }
            )
            t += STEP_NS
        config = {}
        for name, (desc, ranks) in groups.items():
            if rank in ranks:
                shown = ranks
                if fault is not None and fault.kind == "membership" and fault.rank == rank and desc == fault.dim:
                    shown = sorted({*ranks, (max(ranks) + 1) % world})
                config[name] = {"name": name, "desc": desc, "ranks": str(shown)}
        dumps[rank] = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}
    return dumps


def write_dumps(folder: Path, dumps: dict[int, dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, dump in dumps.items():
        (folder / f"rank{rank}.json").write_text(json.dumps(dump))
    return folder
