"""How fast trace sets load: load_traces cold and warm vs HolisticTraceAnalysis vs
a bare orjson.loads of the same bytes, in one process, as ratios.

    .venv/bin/pip install --no-deps -r bench/requirements.txt    # HTA, a bench-only dependency
    .venv/bin/python -m bench.ingest [--repeat 3] [--sets ours8,ours64,shared] [--memory] [--json]

Trace sets: ours at 8 ranks (DP2 x TP2 x PP2 + SP) and 64 ranks (DP8 x TP4 x PP2 + SP), made once
by `python -m profiler run` into .cache/bench-traces/; and every set in ../shared/traces. Timings exclude imports and are the best
of --repeat runs (HTA: of min(repeat, 2)):
    orjson   read + gunzip + orjson.loads of every file (decompression included, like the others); also
             with the cyclic GC paused, as load_traces pauses it while parsing
    cold     load_traces into an empty cache dir: parse, build the tables, write the Parquet cache
    warm     load_traces again: hash the files, read the cache
    HTA      hta.trace_analysis.TraceAnalysis(trace_dir=...)  (its default parser and worker pool)
Goals: HTA/cold >= 3, HTA/warm >= 20, cold/orjson <= 2. --memory adds peak Python-heap MB
(tracemalloc) of orjson.loads vs a cold load_traces.

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

from profiler import load_traces
from profiler.traces.sources import resolve

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / ".cache" / "bench-traces"
SHARED = ROOT.parent / "shared" / "traces"
OURS = {"ours8": dict(dp=2, tp=2, pp=2), "ours64": dict(dp=8, tp=4, pp=2)}
MICROBATCHES = 4  # per data-parallel rank and step


def ensure_ours(name: str) -> Path:
    """Generate (once) one of our trace sets with `python -m profiler run`, in its own processes."""
    out = DATA / name
    dims = OURS[name]
    world = dims["dp"] * dims["tp"] * dims["pp"]
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    if run.get("schema") and run.get("status") == "completed" and len(run.get("traces", [])) == world:
        return out  # made by the profiler (sets of the older tests/support/tracegen.py are made again)
    print(f"generating {name} (a {world}-rank profile run of the tiny GPT) ...", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = [
        "--dp",
        str(dims["dp"]),
        "--tp",
        str(dims["tp"]),
        "--pp",
        str(dims["pp"]),
        "--sp",
        "--global-batch",
        str(dims["dp"] * MICROBATCHES),
        "--steps",
        "4",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--timeout",
        "900",
    ]  # 64 ranks on 2 cores: a rank may wait minutes for its peers
    subprocess.run(
        [sys.executable, "-m", "profiler", "run", *flags, "--out", str(out), "--force"],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return out


def sets(selection: list[str]) -> dict[str, Path]:
    out = {}
    for name in selection:
        if name in OURS:
            out[name] = ensure_ours(name)
        elif name == "shared" and SHARED.is_dir():
            out.update({p.name: p for p in sorted(SHARED.iterdir()) if p.is_dir()})
    return out


def _ranks_for(path: Path) -> dict | None:
    """load_traces needs a rank for a file that carries none (hta_distributed_info_unavailable)."""
    if path.name != "hta_distributed_info_unavailable":
        return None
    return {p.name: 0 for p in resolve(path).files}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bare_orjson(files: list[Path]) -> None:
    for p in files:
        raw = p.read_bytes()
        orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def hta_load(trace_dir: Path) -> float | None:
    # lazy: HTA is this comparison's own install, not a dependency; bench.analyzers and bench.pages import us without it
    from hta.trace_analysis import TraceAnalysis

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        t = time.perf_counter()
        try:
            TraceAnalysis(trace_dir=str(trace_dir))
        except Exception:  # noqa: BLE001 -- HTA's own failure on a set is a result, not our bug
            return None
        return time.perf_counter() - t


def measure(name: str, path: Path, repeat: int, memory: bool) -> dict:
    found = resolve(path)
    files = list(found.files)
    trace_dir = files[0].parent
    ranks = _ranks_for(path)
    gz = sum(p.stat().st_size for p in files)
    raw = sum(
        len(gzip.decompress(p.read_bytes())) if p.read_bytes()[:2] == b"\x1f\x8b" else p.stat().st_size for p in files
    )
    row = {"set": name, "files": len(files), "gz_mb": gz / 1e6, "json_mb": raw / 1e6}
    row["orjson_s"] = best(lambda: bare_orjson(files), repeat)
    gc.disable()  # the same parse with the cyclic GC paused, as load_traces pauses it (for honesty)
    try:
        row["orjson_nogc_s"] = best(lambda: bare_orjson(files), repeat)
    finally:
        gc.enable()
    colds = []
    with tempfile.TemporaryDirectory() as keep:
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as cache:
                t = time.perf_counter()
                traces = load_traces(path, ranks=ranks, cache_dir=cache)
                colds.append(time.perf_counter() - t)
        load_traces(path, ranks=ranks, cache_dir=keep)
        row["warm_s"] = best(lambda: load_traces(path, ranks=ranks, cache_dir=keep), repeat)
    row["cold_s"] = min(colds)
    row["ranks"] = len(traces.rank_ids)
    row["events"] = traces.n_events
    hta = [hta_load(trace_dir) for _ in range(min(repeat, 2))]
    row["hta_s"] = min(hta) if all(h is not None for h in hta) else None
    if memory:
        tracemalloc.start()
        bare_orjson(files)
        row["orjson_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.reset_peak()
        load_traces(path, ranks=ranks, cache=False)
        row["load_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| set | ranks | events | gz MB | JSON MB | orjson s | orjson no-GC s | cold s | warm s | HTA s "
        "| HTA/cold | HTA/warm | cold/orjson | cold/orjson no-GC |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        hta = r["hta_s"]
        cells = [
            r["set"],
            r["ranks"],
            f"{r['events']:,}",
            f"{r['gz_mb']:.1f}",
            f"{r['json_mb']:.1f}",
            f"{r['orjson_s']:.3f}",
            f"{r['orjson_nogc_s']:.3f}",
            f"{r['cold_s']:.3f}",
            f"{r['warm_s']:.3f}",
            f"{hta:.2f}" if hta else "n/a",
            f"{hta / r['cold_s']:.1f}x" if hta else "n/a",
            f"{hta / r['warm_s']:.0f}x" if hta else "n/a",
            f"{r['cold_s'] / r['orjson_s']:.2f}",
            f"{r['cold_s'] / r['orjson_nogc_s']:.2f}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if rows and "load_peak_mb" in rows[0]:
        lines += ["", "| set | orjson peak MB | load_traces peak MB |", "|---|---|---|"]
        lines += [f"| {r['set']} | {r['orjson_peak_mb']:.0f} | {r['load_peak_mb']:.0f} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="ours8,ours64,shared", help="comma list of ours8, ours64, shared")
    ap.add_argument("--memory", action="store_true", help="also peak Python-heap MB (tracemalloc)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    # lazy: HTA is this comparison's own install (see hta_load); imported here before any timing
    import hta.trace_analysis  # noqa: F401

    rows = [measure(name, path, args.repeat, args.memory) for name, path in sets(args.sets.split(",")).items()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows))
        ok = [r for r in rows if r["hta_s"]]
        if ok:
            print(
                f"\nmedian HTA/cold {statistics.median(r['hta_s'] / r['cold_s'] for r in ok):.1f}x, "
                f"HTA/warm {statistics.median(r['hta_s'] / r['warm_s'] for r in ok):.0f}x, "
                f"cold/orjson {statistics.median(r['cold_s'] / r['orjson_s'] for r in rows):.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
