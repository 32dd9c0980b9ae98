"""`load_traces(path)`: every rank's Kineto trace into one `Traces`, parsed once and cached.

    from profiler import load_traces
    traces = load_traces("runs/demo")            # a run directory (DIR/traces/rank{r}_trace.json.gz)
    traces = load_traces("traces.zip")           # a folder, a file, a list of files, .zip or .tar.gz

The rank of a file is `distributedInfo.rank`, else the number in its name (`rank3_trace.json.gz`,
`rank-3.json.gz`, `trace_8_rank_3.json`), else `ranks={"name.json": 3}`; a file without any of them
is a RankError that says so. Files are parsed one at a time (see profiler.traces.kineto), so the peak
memory is one file's decoded events plus the columns of the set. The result is stored in the
Arrow cache (profiler.traces.cache) under the sha256 of the input files; loading the same bytes again
reads it back instead.

Pure: numpy, pandas, pyarrow, msgspec.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import re
from collections import Counter
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from parallel.core.plan import MAX_WORLD_SIZE
from profiler.traces import cache as trace_cache
from profiler.traces.errors import DuplicateRankError, MixedJobError, NoTracesError, RankError
from profiler.traces.kineto import RankPart, parse
from profiler.traces.model import COMM_ARG_FIELDS, Traces
from profiler.traces.patterns import KINDS, OPS
from profiler.traces.sources import Limits, TraceSet, resolve

LOADER_VERSION = "3"  # bump when the tables change: it is part of the cache key
RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def load_traces(
    path: Any,
    *,
    ranks: dict | int | None = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    limits: Limits | None = None,
) -> Traces:
    """Load a trace set (see the module docstring). `ranks` maps file names to ranks (or is the
    rank of a single file); `cache=False` neither reads nor writes the cache."""
    found = resolve(path, limits=limits)
    key = _key(found, ranks)
    where = Path(cache_dir) if cache_dir is not None else trace_cache.default_dir()
    if cache:
        hit = trace_cache.read(where, key)
        if hit is not None:  # run.json is not part of the key (it changes while a run goes on): read it fresh
            return dataclasses.replace(hit, run=found.run, source=found.origin)
    with _gc_paused():
        parts = [parse(data, name) for name, data in found.blobs()]
        if not parts:
            raise NoTracesError(f"{found.origin}: no trace files (*.json, *.json.gz) inside", path=found.origin)
        traces = assemble(parts, ranks=ranks, source=found.origin, run=found.run, key=key)
    if cache:
        trace_cache.write(where, traces)
    return traces


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


def _key(found: TraceSet, ranks) -> str:
    extra = repr(sorted(ranks.items()) if isinstance(ranks, dict) else ranks).encode()
    return hashlib.sha256(f"v{LOADER_VERSION}:{found.digest()}:".encode() + extra).hexdigest()[:32]


def rank_from_name(name: str) -> int | None:
    m = RANK_IN_NAME.search(PurePosixPath(name.split(":")[-1]).name)
    return int(m.group(1)) if m else None


def _assign_ranks(parts: list[RankPart], ranks) -> list[tuple[int, str]]:
    given = ranks if isinstance(ranks, dict) else {}
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        if len(parts) != 1:
            raise RankError(
                f"ranks={ranks} names one rank but {len(parts)} files were given; pass a dict {{file name: rank}}"
            )
        given = {parts[0].source: ranks}
    out = []
    for part in parts:
        short = PurePosixPath(part.source.split(":")[-1]).name
        for key in (part.source, short):
            if key in given:
                out.append((int(given[key]), "given"))
                break
        else:
            if part.meta["rank_in_trace"] is not None:
                out.append((part.meta["rank_in_trace"], "distributedInfo"))
            elif (r := rank_from_name(part.source)) is not None:
                out.append((r, "file name"))
            else:
                raise RankError(
                    f"{part.source}: cannot tell which rank wrote it: the trace has no distributedInfo.rank "
                    f"and the file name has no rank number; rename it like rank0_trace.json.gz, or pass "
                    f"ranks={{'{short}': 0}} (CLI: --rank {short}=0)",
                    path=part.source,
                )
    return out


# Ranks and world sizes read from files are bounded before anything is sized by them (ranks are
# stored as int32; the dashboard lays out a world's ranks): the same bound as a plan's GPUs.
MAX_RANKS = MAX_WORLD_SIZE


def _check_job(parts: list[RankPart], assigned: list[tuple[int, str]]) -> None:
    seen: dict[int, str] = {}
    for part, (rank, _) in zip(parts, assigned):
        if rank >= MAX_RANKS:
            raise RankError(f"{part.source!r}: rank {rank:,} is beyond the {MAX_RANKS:,} ranks a set may hold")
        if (ws := part.meta["world_size"]) is not None and ws > MAX_RANKS:
            raise RankError(f"{part.source!r}: world_size {ws:,} is beyond the {MAX_RANKS:,} ranks a set may hold")
        if rank in seen:
            raise DuplicateRankError(
                f"rank {rank} appears twice: in {seen[rank]} and in {part.source}; a set holds one trace per rank",
                path=part.source,
            )
        seen[rank] = part.source
    sizes = {p.meta["world_size"]: p.source for p in parts if p.meta["world_size"] is not None}
    if len(sizes) > 1:
        desc = ", ".join(f"{w} in {s}" for w, s in sorted(sizes.items()))
        raise MixedJobError(f"files from different jobs are mixed: their world sizes differ ({desc})")
    if sizes:
        world = next(iter(sizes))
        bad = [(r, p.source) for p, (r, _) in zip(parts, assigned) if r >= world]
        if bad:
            raise MixedJobError(f"rank {bad[0][0]} ({bad[0][1]}) cannot belong to a job of world size {world}")


def assemble(
    parts: list[RankPart], *, ranks: dict | int | None = None, source: str = "", run: dict | None = None, key: str = ""
) -> Traces:
    """One Traces from parsed files: ranks assigned and checked, columns concatenated and sorted."""
    assigned = _assign_ranks(parts, ranks)
    _check_job(parts, assigned)
    names = pd.Index(np.concatenate([p.names for p in parts])).unique()
    cats = pd.Index(np.concatenate([p.cats for p in parts])).unique()
    cols: dict[str, list] = {
        k: []
        for k in ("rank", "ts_ns", "dur_ns", "name", "cat", "kind", "op", "pid", "tid", "correlation", "external_id")
    }
    offset, comm, rank_rows, pg_rows, thread_rows, skip_rows = 0, [], [], [], [], []
    for part, (rank, rank_from) in zip(parts, assigned):
        c = part.columns
        n = len(c["ts_ns"])
        cols["rank"].append(np.full(n, rank, dtype=np.int32))
        cols["name"].append(names.get_indexer(part.names)[c["name"]])
        cols["cat"].append(cats.get_indexer(part.cats)[c["cat"]])
        for k in ("ts_ns", "dur_ns", "kind", "op", "pid", "tid", "correlation", "external_id"):
            cols[k].append(c[k])
        comm += [{**rec, "event": rec["event"] + offset} for rec in part.comm_args]
        offset += n
        rank_rows.append(_rank_row(part, rank, rank_from, n))
        pg_rows += [_pg_row(rank, pg) for pg in part.meta["pg_config"]]
        thread_rows += [(rank, p, t, nm) for p, t, nm in part.threads]
        skip_rows += [(rank, reason, count) for reason, count in sorted(part.skipped.items())]
    flat = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.lexsort((flat["ts_ns"], flat["rank"]))
    where = np.empty_like(order)
    where[order] = np.arange(len(order))
    events = pd.DataFrame(
        {
            "rank": flat["rank"][order],
            "ts_ns": flat["ts_ns"][order],
            "dur_ns": flat["dur_ns"][order],
            "cat": pd.Categorical.from_codes(flat["cat"][order], categories=cats.astype(str)),
            "name": pd.Categorical.from_codes(flat["name"][order], categories=names.astype(str)),
            "kind": pd.Categorical.from_codes(flat["kind"][order].astype(np.int16), categories=list(KINDS)),
            "op": pd.Categorical.from_codes(flat["op"][order].astype(np.int16), categories=list(OPS)),
            "pid": flat["pid"][order],
            "tid": flat["tid"][order],
            "correlation": flat["correlation"][order],
            "external_id": flat["external_id"][order],
        }
    )
    comm_args = _comm_frame(comm, where)
    return Traces(
        events=events,
        comm_args=comm_args,
        ranks=pd.DataFrame(rank_rows)
        .sort_values("rank", ignore_index=True)
        .astype({"world_size": "Int64", "events": "int64", "skipped": "int64"}),
        pg_config=pd.DataFrame(
            pg_rows, columns=["rank", "pg_name", "pg_desc", "pg_size", "ranks", "backend_config"]
        ).astype({"pg_size": "Int64"}),
        threads=pd.DataFrame(thread_rows, columns=["rank", "pid", "tid", "name"]),
        skipped=pd.DataFrame(skip_rows, columns=["rank", "reason", "count"]),
        source=source,
        run=run,
        key=key,
    )


def _comm_frame(records: list[dict], where: np.ndarray) -> pd.DataFrame:
    columns = ["event", *COMM_ARG_FIELDS]
    data = {c: [r[c] for r in records] for c in columns}
    frame = pd.DataFrame(
        {
            "event": where[np.asarray(data["event"], dtype=np.int64)] if records else np.empty(0, dtype=np.int64),
            **{
                c: pd.array(data[c], dtype="Int64")
                for c in ("in_nelems", "out_nelems", "group_size", "seq", "src_rank", "dst_rank", "input_bytes")
            },
            **{c: pd.Categorical(data[c]) for c in ("coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks")},
        },
        columns=columns,
    )
    return frame.sort_values("event", ignore_index=True)


def _rank_row(part: RankPart, rank: int, rank_from: str, n: int) -> dict:
    kinds = part.columns["kind"]
    gpu_codes = [KINDS.index(k) for k in ("compute", "comm", "memcpy", "memset")]
    gpu = np.isin(kinds, gpu_codes)
    device_name = None
    if gpu.any():
        pids = Counter(part.columns["pid"][gpu].tolist()).most_common(1)[0][0]
        device_name = part.meta["device_names"].get(pids)
    return {
        "rank": rank,
        "world_size": part.meta["world_size"],
        "backend": part.meta["backend"],
        "device": "gpu" if gpu.any() else "cpu",
        "device_name": device_name,
        "host": part.meta["host"],
        "source": part.source,
        "rank_from": rank_from,
        "time_base": part.meta["time_base"],
        "events": n,
        "skipped": sum(part.skipped.values()),
        "nccl_version": part.meta["nccl_version"],
    }


def _pg_row(rank: int, pg: dict) -> tuple:
    ranks = pg.get("ranks")
    text = ",".join(str(r) for r in ranks) if isinstance(ranks, list) and all(type(r) is int for r in ranks) else None
    size = pg.get("pg_size") if type(pg.get("pg_size")) is int else None
    return (rank, str(pg.get("pg_name", "")), str(pg.get("pg_desc", "")), size, text, str(pg.get("backend_config", "")))
