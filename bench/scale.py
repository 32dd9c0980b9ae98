"""Trace sets of any size: cold and warm `profiler analyze --json` at 64 ... 4,096 ranks,
peak memory, and the ratio to a bare gzip + orjson parse of the same files, side by side.

    python -m bench.scale                          # 64, 256, 1024 ranks, the 5M-event file, workers, Dask
    python -m bench.scale --ranks 64 256 1024 4096 --work /big/disk
    python -m bench.scale --ranks 4096 --workers 2 --big-events 0 --no-dask   # one row

Sets are made from a real run of this machine (`profiler run`, DP2 x TP2 x PP2 + SP, 8 ranks, ~16k
events per rank) copied K times: copy k's ranks are shifted by 8k everywhere a rank is written
(distributedInfo, pg_config, `ps.comm ... ranks=` names, Process Group Ranks / Src / Dst args),
so each copy's collectives still match among themselves. The 5M-event file repeats rank 0's events
(shifted in time) into one gzip file.

Measured per row, each command in its own process with a fresh cache: wall time, peak RSS of the
analyzing process (`main MB`) and of all its processes together (`all MB`, sampled every 20 ms),
and `bare s`: one process gunzipping and orjson-parsing every file (no columns, no analysis).

Pure: stdlib, orjson, psutil (a dependency of dask.distributed).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
BASE_FLAGS = ["--dp", "2", "--tp", "2", "--pp", "2", "--sp", "--steps", "4", "--global-batch", "8"]
RANKS_IN_NAME = re.compile(r"ranks=([\d,]+)")


def base_run(work: Path) -> Path:
    run = work / "base"
    if not (run / "traces").is_dir() or len(list((run / "traces").glob("*.json.gz"))) < 8:
        shutil.rmtree(run, ignore_errors=True)
        cmd = [sys.executable, "-m", "profiler", "run", *BASE_FLAGS, "--out", str(run)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return run


def _shift_ranks(value, by: int):
    if isinstance(value, list):
        return [v + by if isinstance(v, int) else v for v in value]
    if isinstance(value, str) and value.startswith("["):
        return "[" + ", ".join(str(int(x) + by) for x in value.strip("[]").split(",") if x.strip()) + "]"
    return value


def _copy(doc: dict, k: int, base_world: int, world: int) -> bytes:
    by = k * base_world
    info = dict(doc["distributedInfo"], rank=doc["distributedInfo"]["rank"] + by, world_size=world)
    info["pg_config"] = [dict(pg, ranks=_shift_ranks(pg.get("ranks"), by)) for pg in info.get("pg_config", [])]
    events = []
    for e in doc["traceEvents"]:
        name = e.get("name")
        if isinstance(name, str) and name.startswith("ps.comm "):
            shifted = ",".join(str(int(r) + by) for r in RANKS_IN_NAME.search(name).group(1).split(","))
            e = dict(e, name=RANKS_IN_NAME.sub("ranks=" + shifted, name))
        args = e.get("args")
        if args and any(a in args for a in ("Process Group Ranks", "Src Rank", "Dst Rank")):
            args = dict(args)
            if "Process Group Ranks" in args:
                args["Process Group Ranks"] = _shift_ranks(args["Process Group Ranks"], by)
            for a in ("Src Rank", "Dst Rank"):
                if isinstance(args.get(a), int):
                    args[a] += by
            e = dict(e, args=args)
        events.append(e)
    return orjson.dumps(dict(doc, distributedInfo=info, traceEvents=events))


def replicate(traces: Path, out: Path, copies: int) -> Path:
    """`copies` copies of the per-rank traces in `traces` (rank*_trace.json.gz) into `out`, copy k's
    ranks shifted by k x the set's world size (see the module docstring)."""
    files = sorted(traces.glob("rank*_trace.json.gz"))
    out.mkdir(parents=True, exist_ok=True)
    docs = [orjson.loads(gzip.decompress(p.read_bytes())) for p in files]
    for k in range(copies):
        for doc in docs:
            rank = doc["distributedInfo"]["rank"] + k * len(docs)
            data = gzip.compress(_copy(doc, k, len(docs), copies * len(docs)), compresslevel=1)
            (out / f"rank{rank}_trace.json.gz").write_bytes(data)
    return out


def make_set(work: Path, base: Path, ranks: int) -> Path:
    out = work / f"set{ranks}"
    if out.is_dir() and len(list(out.glob("*.json.gz"))) == ranks:
        return out
    shutil.rmtree(out, ignore_errors=True)
    return replicate(base / "traces", out, ranks // len(list((base / "traces").glob("rank*_trace.json.gz"))))


def make_big_file(work: Path, base: Path, events: int) -> Path:
    out = work / f"big{events}" / "rank0_trace.json.gz"
    if out.is_file():
        return out.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = orjson.loads(gzip.decompress((base / "traces" / "rank0_trace.json.gz").read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - min(e["ts"] for e in xs) + 1000
    tmp = out.with_suffix(".tmp")
    with gzip.open(tmp, "wb", compresslevel=1) as f:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        f.write(orjson.dumps(head)[:-1] + b',"traceEvents":[')
        written, copy = 0, 0
        while written < events:
            block = [dict(e, ts=e["ts"] + copy * span) for e in xs[: events - written]]
            f.write((b"," if copy else b"") + orjson.dumps(block)[1:-1])
            written += len(block)
            copy += 1
        f.write(b"]}")
    tmp.rename(out)
    return out.parent


def measure(cmd: list[str], env: dict) -> tuple[float, float, float]:
    """(wall s, peak RSS MB of the process, peak RSS MB of it and its children together)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    main_peak = all_peak = 0
    ps = psutil.Process(proc.pid)
    children, listed = [], 0.0
    while proc.poll() is None:
        # Listing the children scans every process (~3 ms): every 0.5 s, not on each 50 ms sample --
        # sampling that often took ~10% of a core from the 2 being measured.
        now = time.perf_counter()
        try:
            if now - listed > 0.5:
                children, listed = ps.children(recursive=True), now
            rss = ps.memory_info().rss
        except psutil.Error:
            rss = 0
        kids = 0
        for c in children:
            try:
                kids += c.memory_info().rss
            except psutil.Error:
                pass
        main_peak, all_peak = max(main_peak, rss), max(all_peak, rss + kids)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-2000:]}")
    return wall, main_peak / 1e6, all_peak / 1e6


def bare_parse(folder: Path) -> float:
    code = (
        "import gzip, orjson, pathlib, sys\n"
        "for p in sorted(pathlib.Path(sys.argv[1]).glob('*.json.gz')): orjson.loads(gzip.decompress(p.read_bytes()))\n"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True)
    return time.perf_counter() - t0


def analyze(folder: Path, workers: int, scheduler: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "profiler", "analyze", str(folder), "--json", "--workers", str(workers)]
    return cmd + (["--scheduler", scheduler] if scheduler else [])


def row(label: str, folder: Path, workers: int, bare: float, scheduler: str | None = None) -> str:
    cache = Path(tempfile.mkdtemp(prefix="scale-cache-"))
    env = {**os.environ, "PARASCOPE_CACHE": str(cache)}
    try:
        cold, main_mb, all_mb = measure(analyze(folder, workers, scheduler), env)
        warm, warm_mb, _ = measure(analyze(folder, workers), env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    gz = sum(p.stat().st_size for p in folder.glob("*.json.gz")) / 1e6
    return (
        f"| {label} | {gz:,.0f} | {workers if not scheduler else 'dask 2'} | {cold:.1f} | {main_mb:,.0f} | "
        f"{all_mb:,.0f} | {warm:.2f} ({100 * warm / cold:.0f}%) | {warm_mb:,.0f} | {bare:.1f} | {cold / bare:.2f} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--big-events", type=int, default=5_000_000)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "parascope-scale")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker counts per set (default: 1 and 2 on the largest)"
    )
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    base = base_run(args.work)
    print(
        "| set | MB gz | workers | cold s | main MB | all MB | warm s | warm MB | bare parse s | cold / bare |\n"
        "|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for n in args.ranks:
        folder = make_set(args.work, base, n)
        bare = bare_parse(folder)
        counts = args.workers or ((1, 2) if n == max(args.ranks) else (2,))
        for workers in counts:
            print(row(f"{n:,} ranks", folder, workers, bare), flush=True)
        if n == max(args.ranks) and not args.no_dask:
            from distributed import LocalCluster  # lazy: the optional 'cluster' extra, only for the Dask row

            with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cl:
                print(row(f"{n:,} ranks", folder, 2, bare, scheduler=cl.scheduler_address), flush=True)
    if args.big_events > 0:  # 0: no single-file row
        big = make_big_file(args.work, base, args.big_events)
        print(row(f"1 rank, {args.big_events / 1e6:.0f}M events", big, 1, bare_parse(big)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
