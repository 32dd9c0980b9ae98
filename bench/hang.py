"""Flight Recorder dumps of a large hung job: `profiler hang` against PyTorch's own flight_recorder
(`fr_trace`'s builder) on the same dumps, side by side -- seconds and peak memory (VmHWM: ru_maxrss
would carry the generator's across exec) of each, in a process of its own.

    .venv/bin/python -m bench.hang [--ranks 1024] [--steps 667] [--tp 8]

The dumps are tests.support.fr_dumps' job (per step two TP all-reduces and one DP all-reduce per
rank; 667 steps fill PyTorch's default 2,000-entry buffer) with rank 777 stuck before a DP
collective; ours read JSON, the reference reads the same dumps pickled (the only format it reads).
Both must name rank 777.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.fr_dumps import Fault, job_dumps, write_dumps

OURS = """
import json, sys, time
from profiler.analyzers.hang import diagnose, load_dumps
t = time.perf_counter()
r = diagnose(load_dumps(sys.argv[1]))
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 1024
print(json.dumps({"s": time.perf_counter() - t, "rank": r["suspects"][0]["rank"], "peak_mb": peak}))
"""
REFERENCE = """
import json, logging, re, sys, time
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir
lines = []
h = logging.Handler(); h.emit = lambda rec: lines.append(rec.getMessage())
log = logging.getLogger("Flight Recorder"); log.addHandler(h); log.propagate = False
for other in list(log.handlers):
    if other is not h:
        log.removeHandler(other)
t = time.perf_counter()
args = JobConfig().parse_args([sys.argv[1]])
details, version = read_dir(args)
build_db(details, args, version)
m = re.search(r"missing ranks: \\{(\\d+)", "\\n".join(lines))
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 1024
print(json.dumps({"s": time.perf_counter() - t, "rank": int(m.group(1)) if m else None, "peak_mb": peak}))
"""


def _timed(code: str, folder: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hang")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=667)
    ap.add_argument("--tp", type=int, default=8)
    args = ap.parse_args(argv)
    stuck = min(777, args.ranks - 1)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        dumps = job_dumps(args.ranks, args.tp, args.steps, Fault("missing", stuck, "dp", args.steps))
        fr = write_dumps(Path(tmp) / "fr", dumps)
        pickles = Path(tmp) / "pickles"
        pickles.mkdir()
        for rank, dump in dumps.items():
            (pickles / f"rank{rank}").write_bytes(pickle.dumps(dump))
        entries = sum(len(d["entries"]) for d in dumps.values())
        del dumps
        size = sum(p.stat().st_size for p in fr.iterdir()) / 1e6
        print(
            f"{args.ranks:,} ranks, {entries:,} entries, {size:,.0f} MB of JSON (made in {time.perf_counter() - t:.0f} s)"
        )
        ours = _timed(OURS, fr)
        ref = _timed(REFERENCE, pickles)
    print(f"profiler hang          {ours['s']:7.2f} s  peak {ours['peak_mb']:7,.0f} MB  names rank {ours['rank']}")
    print(f"torch fr_trace builder {ref['s']:7.2f} s  peak {ref['peak_mb']:7,.0f} MB  names rank {ref['rank']}")
    print(f"ratio (reference / ours): time {ref['s'] / ours['s']:.2f}x")
    return 0 if ours["rank"] == stuck else 1


if __name__ == "__main__":
    sys.exit(main())
