"""`load_traces(path)`: every rank's Kineto trace into one `Traces`, parsed once into an on-disk
columnar store and cached.

    from profiler import load_traces
    traces = load_traces("runs/demo")            # a run directory (DIR/traces/rank{r}_trace.json.gz)
    traces = load_traces("traces.zip")           # a folder, a file, a list of files, .zip or .tar.gz
    traces = load_traces("job/", workers=8)      # files parsed by 8 processes
    traces = load_traces("job/", scheduler="tcp://10.0.0.5:8786")   # by the workers of a Dask cluster

The rank of a file is `distributedInfo.rank`, else the number in its name (`rank3_trace.json.gz`,
`rank-3.json.gz`, `trace_8_rank_3.json`), else `ranks={"name.json": 3}`; a file without any of them
is a RankError that says so.

Each file is parsed by one task (`parse_part`; small files a batch to a task, `parse_batch`): decompressed as a stream, decoded in chunks
(profiler.traces.kineto.parse_stream) and written as its own Arrow partition (profiler.traces.store)
before the next file is taken; only a summary (metadata, thread names, step windows, what was
skipped) comes back. So the peak memory of a load is the files in flight -- one per worker, and
at most 2 per worker queued -- never the set. Tasks run in this process (`workers=1`, the default),
in a process pool (`workers=N`; the CLI's default: the cores), or on a Dask distributed cluster (`scheduler=`; its
workers must see the trace files and the cache folder at the same paths). All three give the same
tables. The store sits in the cache (`$PARASCOPE_CACHE`, else ~/.cache/parascope) under the sha256
of the input files, so loading the same bytes again opens it instead; `cache=False` builds it in a
temporary folder removed with the Traces.

Pure: numpy, pandas, pyarrow, msgspec (dask.distributed only when a scheduler is given).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.plan import MAX_WORLD_SIZE
from profiler.traces import cache as trace_cache
from profiler.traces.errors import (
    DuplicateRankError,
    MixedJobError,
    NoTracesError,
    RankError,
    TooLargeError,
    TraceError,
)
from profiler.traces.kineto import RankPart, parse_stream
from profiler.traces.model import COMM_ARG_FIELDS, SHAPE_COLUMNS, Traces
from profiler.traces.patterns import KINDS, profiler_step
from profiler.traces.sources import Limits, Member, TraceSet, open_source, rank_from_name, resolve, stream
from profiler.traces.store import PartStore, batch_tables, write_table

LOADER_VERSION = "5"  # bump when the tables change: it is part of the cache key
Progress = Callable[[int, int, str], None]  # (files done, files in all, the file just done)


class Cancelled(Exception):
    """Raised by a progress callback to stop a load; nothing of the load is kept."""


def load_traces(
    path: Any,
    *,
    ranks: dict | int | None = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    limits: Limits | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    progress: Progress | None = None,
) -> Traces:
    """Load a trace set (see the module docstring). `ranks` maps file names to ranks (or is the
    rank of a single file); `cache=False` neither reads nor writes the cache; `workers` > 1 parses in
    that many processes (a script that asks for them needs the usual `if __name__ == "__main__":`
    guard of multiprocessing; `default_workers()` is the cores); `progress(done, total, name)` is
    called after each file (it may raise Cancelled)."""
    found = path if isinstance(path, TraceSet) else resolve(path, limits=limits)
    where = Path(cache_dir) if cache_dir is not None else trace_cache.default_dir()
    memo = trace_cache.read_digests(where) if cache else None  # files unchanged since hashed: not read
    known = len(memo) if memo is not None else 0
    key = _key(found, ranks, memo)
    if memo is not None and len(memo) > known:
        trace_cache.write_digests(where, memo)
    if cache:
        hit = trace_cache.read(where, key)
        if hit is not None:  # run.json is not part of the key (it changes while a run goes on): read it fresh
            return dataclasses.replace(hit, run=found.run, source=found.origin)
    folder = _build_folder(where if cache else None)
    try:
        summaries, tables = _parse_all(found, folder, workers=workers, scheduler=scheduler, progress=progress)
        if not summaries:
            raise NoTracesError(f"{found.origin}: no trace files (*.json, *.json.gz) inside", path=found.origin)
        traces = assemble(summaries, tables, folder, ranks=ranks, source=found.origin, run=found.run, key=key)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if folder is None:
        return traces
    if cache and trace_cache.publish(folder, where, traces) is not None:
        return traces
    weakref.finalize(traces.store, shutil.rmtree, str(folder), True)  # a temporary store: gone with its Traces
    return traces


def _build_folder(cache_dir: Path | None) -> Path | None:
    """A fresh temporary folder for the parts: inside the cache (renamed into place when done) or the
    system's temporary folder; None when neither can be written (the parts are then kept in memory)."""
    try:
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            trace_cache.remove_stale_temporaries(cache_dir)
            return Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir))
    except OSError:
        pass
    try:
        return Path(tempfile.mkdtemp(prefix="parascope-traces-"))
    except OSError:
        return None


@contextmanager
def _gc_paused():
    """Parsing allocates hundreds of thousands of acyclic objects; the cyclic GC would rescan them
    over and over (25-30% of the parse time). Paused while parsing, restored after, even on error."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _key(found: TraceSet, ranks, memo: dict | None = None) -> str:
    extra = repr(sorted(ranks.items()) if isinstance(ranks, dict) else ranks).encode()
    return hashlib.sha256(f"v{LOADER_VERSION}:{found.digest(memo)}:".encode() + extra).hexdigest()[:32]


# -- one file: a task -------------------------------------------------------------------------------


def parse_part(index: int, name: str, source: Any, limits: Limits, folder: str | None) -> dict:
    """Parse one trace file (`source`: its path, an archive Member, or raw bytes) and write its
    partition `part-<index>` into `folder` (None: return the Arrow tables instead). Returns the file's
    summary: everything the set's small tables need, nothing per event. Runs in a worker process or on
    a Dask worker; raises TraceError for a file that cannot be a trace."""
    return parse_batch([(index, name, source)], limits, folder)[0]


def parse_batch(items: list[tuple[int, str, Any]], limits: Limits, folder: str | None) -> list[dict]:
    """parse_part for each (index, name, source) of a batch of small files, written as one partition
    named after the first (each summary's `rows`: its file's rows in it): one task, one pair of Arrow
    files and one open for a batch, where per-file tasks and parts cost more than the parse of a
    file of a few events. A batch of one file is parse_part's partition exactly (no `rows`)."""
    summaries, files = [], []
    for index, name, source in items:
        read = [0]

        def counted(chunks, read=read):
            for chunk in chunks:
                read[0] += len(chunk)
                yield chunk

        with _gc_paused():
            with open_source(source) as f:
                part = parse_stream(counted(stream(f, name, limits)), name)
            summary = _summary(part, index, len(part.columns["ts_ns"]))
            files.append((part.columns, part.names, part.cats, part.comm_args))
            del part
        summary["bytes"] = read[0]
        summaries.append(summary)
    stem = f"part-{items[0][0]:06d}"
    with _gc_paused():
        events, comm, rows = batch_tables(files, COMM_ARG_FIELDS)
    del files
    if len(summaries) > 1:
        for summary, span in zip(summaries, rows):
            summary["rows"] = span
    for summary in summaries:
        summary["part"] = stem
    if folder is None:
        summaries[0]["tables"] = (events, comm)  # the batch's tables, once
        return summaries
    sizes = [write_table(events, Path(folder) / f"{stem}.events.arrow")]
    sizes.append(write_table(comm, Path(folder) / f"{stem}.comm.arrow"))
    for summary in summaries:
        summary["sizes"] = sizes
    return summaries


# Files smaller than this are parsed and stored in batches: up to BATCH_FILES of them, BATCH_BYTES in
# all (as stored: a batch's decoded tables stay well under the memory one large file's parse takes).
BATCH_BYTES = 1 << 20
BATCH_FILES = 256


def _size_hint(source: Any) -> int | None:
    """The bytes `source` holds as stored (a file's size, a member's), None when not known cheaply."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    if isinstance(source, Member):
        return source.size if source.size > 0 else None
    try:
        return Path(source).stat().st_size
    except OSError:
        return None


def _batches(jobs, total: int) -> Iterator[list[tuple[int, str, Any]]]:
    """The (index, name, source) jobs in batches of small files (BATCH_BYTES, BATCH_FILES), each batch
    at most an eighth of the set so several workers get work; a large or unsized file alone. The
    batches depend on the files only, never on the workers: every way of loading a set stores it alike."""
    cap = max(1, min(BATCH_FILES, total // 8))
    batch: list = []
    held = 0
    for job in jobs:
        size = _size_hint(job[2])
        if size is None or size >= BATCH_BYTES or cap == 1:
            if batch:
                yield batch
                batch, held = [], 0
            yield [job]
            continue
        if batch and (len(batch) >= cap or held + size > BATCH_BYTES):
            yield batch
            batch, held = [], 0
        batch.append(job)
        held += size
    if batch:
        yield batch


_GPU_KINDS = [KINDS.index(k) for k in ("compute", "comm", "memcpy", "memset")]


def _summary(part: RankPart, index: int, n: int) -> dict:
    kinds = part.columns["kind"]
    gpu = np.isin(kinds, _GPU_KINDS)
    device_name = device_memory = None
    if gpu.any():
        pid = Counter(part.columns["pid"][gpu].tolist()).most_common(1)[0][0]
        device_name = part.meta["device_names"].get(pid)
        device_memory = part.meta.get("device_memory", {}).get(pid)
    step = kinds == KINDS.index("step")
    steps = [
        (profiler_step(str(part.names[c])), int(t), int(t + d))
        for c, t, d in zip(part.columns["name"][step], part.columns["ts_ns"][step], part.columns["dur_ns"][step])
    ]
    meta = {k: v for k, v in part.meta.items() if k not in ("device_names", "device_memory")}
    return {
        "index": index,
        "source": part.source,
        "meta": meta,
        "device": "gpu" if gpu.any() else "cpu",
        "device_name": device_name if isinstance(device_name, str) else None,
        "device_memory": device_memory,
        "events": n,
        "skipped": dict(part.skipped),
        "threads": part.threads,
        "steps": [s for s in steps if s[0] is not None],
    }


# -- every file: local processes or a Dask cluster -----------------------------------------------------


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def _spill_folder(target: str | None) -> Iterator[Path | None]:
    """A temporary folder for a compressed tar's members, or None where nothing is writable (the
    members are then read into memory, one at a time)."""
    try:
        folder = tempfile.TemporaryDirectory(prefix=".spill-", dir=target)
    except OSError:
        yield None
        return
    with folder as name:
        yield Path(name)


def _parse_all(found: TraceSet, folder: Path | None, *, workers, scheduler, progress) -> tuple[list[dict], dict]:
    total = found.count()
    out: list[dict] = []
    target = str(folder) if folder is not None else None
    done = size = 0

    def finished(summary: dict) -> None:
        nonlocal done, size
        done += 1
        size += summary["bytes"]
        out.append(summary)
        if size > found.limits.max_total_bytes:
            raise TooLargeError(
                f"{found.origin}: the traces decompress to more than {found.limits.max_total_bytes:,} "
                "bytes in all (PARASCOPE_MAX_SET_BYTES)",
                path=found.origin,
            )
        if progress is not None:
            progress(done, max(total, done), summary["source"])

    # (index, name, path or Member): the task opens and streams each; a compressed tar's members are
    # spilled to files beside the parts (the task deletes each), bounded by the tasks in flight
    with _spill_folder(target) as spill:
        jobs = ((i, name, source) for i, (name, source) in enumerate(found.sources(spill)))
        n_workers = max(1, int(workers))
        batches = _batches(jobs, total)
        if scheduler:
            _on_dask(scheduler, batches, found.limits, target, finished)
        elif n_workers == 1 or total <= 1:
            for batch in batches:
                for summary in parse_batch(batch, found.limits, target):
                    finished(summary)
        else:
            _on_processes(min(n_workers, total), batches, found.limits, target, finished)
    out.sort(key=lambda s: s["index"])
    tables = {s["part"]: s.pop("tables") for s in out if "tables" in s}
    return out, tables


_SHARED = threading.local()  # per thread (the dashboard runs a session per thread): the open pools


@contextmanager
def shared_workers(n: int, preload: str = "profiler.analyzers.front") -> Iterator[None]:
    """Within the block, the parse and every per-rank analysis of up to `n` workers reuse one pool of
    `n` processes instead of a pool per stage (each start is ~1 s of two cores: the processes and
    their imports). The pool starts when first needed -- a load from the cache starts none."""
    if n <= 1:
        yield
        return
    stack = _SHARED.__dict__.setdefault("pools", [])
    slot: dict = {"n": n, "preload": preload, "pool": None}
    stack.append(slot)
    try:
        yield
    finally:
        stack.pop()
        if slot["pool"] is not None:
            slot["pool"].shutdown(wait=True, cancel_futures=True)


@contextmanager
def _pool(n: int, preload: str):
    """The enclosing shared_workers pool when it has `n` workers or more, else a pool of our own."""
    stack = _SHARED.__dict__.get("pools") or []
    if stack and stack[-1]["n"] >= n:
        slot = stack[-1]
        if slot["pool"] is None:
            slot["pool"] = process_pool(slot["n"], slot["preload"])
        yield slot["pool"]
        return
    with process_pool(n, preload) as pool:
        yield pool


def process_pool(n: int, preload: str = __name__) -> Any:
    """A ProcessPoolExecutor of `n` workers started by a forkserver (never forked from a process with
    threads, such as the dashboard's) that imports `preload` once -- not the caller's script."""
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([preload])
    return ProcessPoolExecutor(max_workers=n, mp_context=ctx)


def _on_processes(n: int, batches, limits: Limits, folder: str | None, finished) -> None:
    """A pool of `n` worker processes, at most 2n batches queued (bounded memory for archive members)."""
    with _pool(n, __name__) as pool:
        pending: set = set()
        try:
            for batch in batches:
                pending.add(pool.submit(parse_batch, batch, limits, folder))
                if len(pending) >= 2 * n:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        for summary in f.result():
                            finished(summary)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    for summary in f.result():
                        finished(summary)
        except BaseException:
            # cancelled or failed: drop the queued files and let the running ones finish before the
            # caller removes the folder they write into (the pool may be shared: it stays up)
            for f in pending:
                f.cancel()
            wait(pending)
            raise


def map_ranks(
    task: Callable, args: list[tuple], *, workers: int = 1, scheduler: str | None = None, preload: str = __name__
) -> Any:
    """`task(*a)` for each tuple of `args`, in order: here (one worker or one task), in a pool of
    `workers` processes that import `preload`, or as tasks of the Dask cluster at `scheduler`. The
    per-rank analyses use it; each task reads its own rank's partition, so only results travel."""
    if scheduler and len(args) > 1:
        with dask_client(scheduler) as client:
            yield from client.gather(client.map(task, *zip(*args), pure=False))
    elif workers > 1 and len(args) > 1:
        with _pool(min(workers, len(args)), preload) as pool:
            yield from pool.map(task, *zip(*args), chunksize=max(1, len(args) // (8 * workers)))
    else:
        for a in args:
            yield task(*a)


def map_rank_tasks(
    traces: Traces,
    task: Callable,
    per_rank: Callable[[int], tuple],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    preload: str = __name__,
) -> Any:
    """`task(store, rank, gpu, *per_rank(rank))` for every rank of `traces`, in rank order; the ranks
    of one part are one task (map_part_tasks)."""
    parts = map_part_tasks(traces, _each_rank, per_rank, task, workers=workers, scheduler=scheduler, preload=preload)
    for outs in parts:
        yield from outs


def _each_rank(store, rank_args: list[tuple], task: Callable) -> list:
    return [task(store, *a) for a in rank_args]


def part_groups(traces: Traces) -> list[list[int]]:
    """The set's ranks grouped by the part that holds them (a batch of small files: many; else one),
    ascending within a group, groups by their first rank."""
    by_part: dict[str, list[int]] = {}
    for r in traces.rank_ids:
        by_part.setdefault(traces.store.parts[r], []).append(r)
    return sorted(by_part.values())


def map_part_tasks(
    traces: Traces,
    task: Callable,
    per_rank: Callable[[int], tuple],
    *extra: Any,
    workers: int = 1,
    scheduler: str | None = None,
    preload: str = __name__,
) -> Any:
    """`task(store, [(rank, gpu, *per_rank(rank)) for its ranks], *extra)` for each group of ranks that
    share a part (part_groups), in order: a task works on its ranks' columns together, opening their
    part once (a part of hundreds of small ranks is one read and a few array operations, not hundreds).
    Each task gets only its ranks' part of the store (PartStore.narrowed), so a worker process or a
    Dask task opens its own partition; parts held in memory are worked on here (map_ranks)."""
    store = traces.store
    on_disk = store.on_disk
    args = [
        (store.narrowed(ranks), [(r, traces.device_of(r) == "gpu", *per_rank(r)) for r in ranks], *extra)
        for ranks in part_groups(traces)
    ]
    return map_ranks(
        task, args, workers=workers if on_disk else 1, scheduler=scheduler if on_disk else None, preload=preload
    )


def dask_client(address: str) -> Any:  # a distributed.Client (imported only when asked for)
    """A dask.distributed Client of the scheduler at `address` (tcp://HOST:PORT); TraceError when
    distributed is missing or the scheduler cannot be reached."""
    try:
        from distributed import Client  # lazy: the optional 'cluster' extra (0.5 s), only with --scheduler
    except ImportError:  # pragma: no cover - distributed is pinned in requirements.txt
        raise TraceError("--scheduler needs dask.distributed: pip install 'distributed'") from None
    try:
        return Client(address, timeout=10, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise TraceError(f"cannot reach the Dask scheduler at {address} ({err})") from None


def _on_dask(address: str, batches, limits: Limits, folder: str | None, finished) -> None:
    """The same tasks on a Dask distributed cluster: `address` is its scheduler (tcp://HOST:PORT)."""
    from distributed import as_completed  # lazy: the optional 'cluster' extra (0.5 s), only with --scheduler

    with dask_client(address) as client:
        n = max(1, len(client.scheduler_info().get("workers", {})))
        queue = as_completed(loop=client.loop)
        try:
            for batch in batches:
                queue.add(client.submit(parse_batch, batch, limits, folder, key=f"parse-{batch[0][0]}", pure=False))
                if queue.count() >= 2 * n:
                    for summary in next(queue).result():
                        finished(summary)
            for future in queue:
                for summary in future.result():
                    finished(summary)
        except BaseException:
            client.cancel(list(queue.futures))
            raise


def _assign_ranks(parts: list[dict], ranks) -> list[tuple[int, str]]:
    given = ranks if isinstance(ranks, dict) else {}
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        if len(parts) != 1:
            raise RankError(
                f"ranks={ranks} names one rank but {len(parts)} files were given; pass a dict {{file name: rank}}"
            )
        given = {parts[0]["source"]: ranks}
    out = []
    for part in parts:
        source = part["source"]
        short = PurePosixPath(source.split(":")[-1]).name
        for key in (source, short):
            if key in given:
                out.append((int(given[key]), "given"))
                break
        else:
            if part["meta"]["rank_in_trace"] is not None:
                out.append((part["meta"]["rank_in_trace"], "distributedInfo"))
            elif (r := rank_from_name(source)) is not None:
                out.append((r, "file name"))
            else:
                raise RankError(
                    f"{source}: cannot tell which rank wrote it: the trace has no distributedInfo.rank "
                    f"and the file name has no rank number; rename it like rank0_trace.json.gz, or pass "
                    f"ranks={{'{short}': 0}} (CLI: --rank {short}=0)",
                    path=source,
                )
    return out


# Ranks and world sizes read from files are bounded before anything is sized by them (ranks are
# stored as int32; the dashboard lays out a world's ranks): the same bound as a plan's GPUs.
MAX_RANKS = MAX_WORLD_SIZE


def _check_job(parts: list[dict], assigned: list[tuple[int, str]]) -> None:
    seen: dict[int, str] = {}
    for part, (rank, _) in zip(parts, assigned):
        source = part["source"]
        if rank >= MAX_RANKS:
            raise RankError(f"{source!r}: rank {rank:,} is beyond the {MAX_RANKS:,} ranks a set may hold")
        if (ws := part["meta"]["world_size"]) is not None and ws > MAX_RANKS:
            raise RankError(f"{source!r}: world_size {ws:,} is beyond the {MAX_RANKS:,} ranks a set may hold")
        if rank in seen:
            raise DuplicateRankError(
                f"rank {rank} appears twice: in {seen[rank]} and in {source}; a set holds one trace per rank",
                path=source,
            )
        seen[rank] = source
    sizes = {p["meta"]["world_size"]: p["source"] for p in parts if p["meta"]["world_size"] is not None}
    if len(sizes) > 1:
        desc = ", ".join(f"{w} in {s}" for w, s in sorted(sizes.items()))
        raise MixedJobError(f"files from different jobs are mixed: their world sizes differ ({desc})")
    if sizes:
        world = next(iter(sizes))
        bad = [(r, p["source"]) for p, (r, _) in zip(parts, assigned) if r >= world]
        if bad:
            raise MixedJobError(f"rank {bad[0][0]} ({bad[0][1]}) cannot belong to a job of world size {world}")


STEP_COLUMNS = ["rank", "step", "start_ns", "end_ns"]


def assemble(
    parts: list[dict],
    tables: dict,
    folder: Path | None,
    *,
    ranks: dict | int | None = None,
    source: str = "",
    run: dict | None = None,
    key: str = "",
) -> Traces:
    """One Traces from the parsed files' summaries: ranks assigned and checked, small tables built, each
    rank pointed at its partition."""
    assigned = _assign_ranks(parts, ranks)
    _check_job(parts, assigned)
    rank_rows, pg_rows, thread_rows, skip_rows, step_rows, shape_rows, where, rows = [], [], [], [], [], [], {}, {}
    for part, (rank, rank_from) in zip(parts, assigned):
        rank_rows.append(_rank_row(part, rank, rank_from))
        pg_rows += [_pg_row(rank, pg) for pg in part["meta"]["pg_config"]]
        thread_rows += [(rank, p, t, nm) for p, t, nm in part["threads"]]
        skip_rows += [(rank, reason, count) for reason, count in sorted(part["skipped"].items())]
        step_rows += [(rank, *s) for s in part["steps"]]
        shape_rows += [(rank, *s) for s in part["meta"].get("shapes", ())]
        where[rank] = (part["part"], part.get("sizes"))
        if "rows" in part:
            rows[rank] = part["rows"]
    store = PartStore(
        {r: p for r, (p, _) in where.items()}, folder=folder if not tables else None, tables=tables, rows=rows
    )
    return Traces(
        ranks=pd.DataFrame(rank_rows)
        .sort_values("rank", ignore_index=True)
        .astype({"world_size": "Int64", "events": "int64", "skipped": "int64"}),
        pg_config=pd.DataFrame(
            pg_rows, columns=["rank", "pg_name", "pg_desc", "pg_size", "ranks", "backend_config"]
        ).astype({"pg_size": "Int64"}),
        threads=pd.DataFrame(thread_rows, columns=["rank", "pid", "tid", "name"]),
        skipped=pd.DataFrame(skip_rows, columns=["rank", "reason", "count"]),
        step_windows=_step_windows(step_rows),
        shapes=pd.DataFrame(shape_rows, columns=list(SHAPE_COLUMNS)).astype({"rank": "int64", "count": "int64"}),
        store=store,
        part_sizes={r: s for r, (_, s) in where.items() if s is not None},
        source=source,
        run=run,
        key=key,
    )


def _step_windows(rows: list[tuple]) -> pd.DataFrame:
    """One window per (rank, step): a step recorded twice (nested exports) keeps its widest span."""
    frame = pd.DataFrame(rows, columns=STEP_COLUMNS).astype("int64")
    frame = frame.groupby(["rank", "step"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    return frame.sort_values(["rank", "start_ns"], ignore_index=True)[STEP_COLUMNS]


def _rank_row(part: dict, rank: int, rank_from: str) -> dict:
    meta = part["meta"]
    return {
        "rank": rank,
        "world_size": meta["world_size"],
        "backend": meta["backend"],
        "device": part["device"],
        "device_name": part["device_name"],
        "device_memory": part.get("device_memory"),
        "host": meta["host"],
        "source": part["source"],
        "rank_from": rank_from,
        "time_base": meta["time_base"],
        "events": part["events"],
        "skipped": sum(part["skipped"].values()),
        "nccl_version": meta["nccl_version"],
    }


def _pg_row(rank: int, pg: dict) -> tuple:
    ranks = pg.get("ranks")
    text = ",".join(str(r) for r in ranks) if isinstance(ranks, list) and all(type(r) is int for r in ranks) else None
    size = pg.get("pg_size") if type(pg.get("pg_size")) is int else None
    return (rank, str(pg.get("pg_name", "")), str(pg.get("pg_desc", "")), size, text, str(pg.get("backend_config", "")))
