"""The `Traces` data model: per-rank events in a columnar store, plus small per-rank tables.

Events live per rank (profiler.traces.store: Arrow IPC partitions on disk, or in memory when no
folder could be written); analyses read them rank by rank:

    traces.rank_events(rank)      one rank's events (RangeIndex: `row` in the rank), sorted by start
    traces.rank_arrays(rank)      the same as numpy arrays (ts, end, kind codes, thread, ...)
    traces.rank_comm_args(rank)   its collective metadata (event = row in the rank)
    traces.window(rank, lo, hi)   only the events that start in [lo, hi): rows read by binary search

Columns of a rank's events:

    ts_ns         int64   start, integer ns since the epoch (both Kineto time styles normalised)
    dur_ns        int64   duration, ns
    cat           category  Kineto category (kernel, cpu_op, user_annotation, cuda_runtime, ...)
    name          category  event name
    kind          category  our class of the event (see profiler.traces.patterns.KINDS)
    op            category  collective op of comm / cpu_comm / ps_comm events (patterns.OPS), else missing
    pid, tid      int64   process and thread (GPU events: device and stream); -1 when not a number
    correlation   int64   CUDA correlation id linking a kernel to its launch, -1 when absent
    external_id   int64   Kineto External id, -1 when absent

comm_args (one row per comm, cpu_comm or ps_comm event that carried collective metadata):
    event (row in the rank), in_nelems, out_nelems, group_size, seq, src_rank, dst_rank (p2p peers),
    input_bytes (Int64; input_bytes from Input Dims x Input type, when shown), and the categories
    coll_name, dtype, pg_name, pg_desc, pg_ranks ('0,1,2,3')

`traces.events` / `traces.comm_args` are the whole set concatenated (a `rank` column first): for small
sets and tests; the analyzers never ask for them.

`ranks` (one row per rank): rank, world_size, backend, device ('gpu' | 'cpu'), device_name, device_memory
    (bytes: deviceProperties' totalGlobalMem of the GPU its kernels ran on), host,
    source (file or archive member), rank_from ('distributedInfo' | 'file name' | 'given'),
    time_base ('epoch_us' | 'relative_us+baseTimeNanoseconds'), events, skipped, nccl_version
`pg_config`: rank, pg_name, pg_desc, pg_size, ranks ('0,1'), backend_config  (distributedInfo)
`threads`: rank, pid, tid, name  (thread_name metadata events)
`skipped`: rank, reason, count -- every event not in the events, and why
`step_windows`: rank, step, start_ns, end_ns -- one row per ProfilerStep#N range on the CPU
`shapes`: rank, op, dims ('[[4,128,64],[192,64],[192]]'), count -- how often each GEMM, attention or
    embedding operator (patterns.SHAPE_OP) ran with each recorded input shape (record_shapes=True);
    empty when the job did not record shapes

Pure: pandas, numpy, pyarrow (through the store).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api.types import union_categoricals

from profiler.traces.store import EVENT_COLUMNS, PartStore

# Columns of Traces.comm_args beside `event`: one collective's metadata as Kineto records it
# (record_param_comms or the kernel's args), written by the loader and read by the analyzers.
COMM_ARG_FIELDS = (
    "coll_name",
    "in_nelems",
    "out_nelems",
    "dtype",
    "group_size",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
    "src_rank",
    "dst_rank",
    "input_bytes",
)


SHAPE_COLUMNS = ("rank", "op", "dims", "count")


@dataclass(frozen=True, eq=False)
class Traces:
    ranks: pd.DataFrame
    pg_config: pd.DataFrame
    threads: pd.DataFrame
    skipped: pd.DataFrame
    step_windows: pd.DataFrame
    store: PartStore
    part_sizes: dict = field(default_factory=dict)  # rank -> [events, comm] file sizes (on disk)
    source: str = ""
    run: dict | None = None  # run.json of a run directory, when loaded from one
    key: str = ""  # content hash of the input (the cache key)
    from_cache: bool = False
    shapes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SHAPE_COLUMNS)))

    @property
    def rank_ids(self) -> list[int]:
        return sorted(int(r) for r in self.ranks["rank"])

    @property
    def n_events(self) -> int:
        return int(self.ranks["events"].sum()) if len(self.ranks) else 0

    @property
    def world_size(self) -> int:
        """distributedInfo.world_size (all files agree, the loader checked), else highest rank + 1."""
        sizes = self.ranks["world_size"].dropna()
        if len(sizes):
            return int(sizes.max())
        return int(self.ranks["rank"].max()) + 1 if len(self.ranks) else 0

    @property
    def steps(self) -> list[int]:
        """ProfilerStep numbers seen on any rank, ascending."""
        return sorted({int(s) for s in self.step_windows["step"]})

    def device_of(self, rank: int) -> str:
        return self._devices.get(rank, "cpu")

    @cached_property
    def _devices(self) -> dict[int, str]:
        return {int(r): str(d) for r, d in zip(self.ranks["rank"], self.ranks["device"])}

    def rank_events(self, rank: int) -> pd.DataFrame:
        """The events of one rank (read from the store; the last few ranks read are kept)."""
        return self.store.events(rank)

    def rank_comm_args(self, rank: int) -> pd.DataFrame:
        return self.store.comm_args(rank)

    def window(self, rank: int, start_ns: int, end_ns: int) -> pd.DataFrame:
        """The rank's events that start in [start_ns, end_ns); the index is their row in the rank."""
        return self.store.window(rank, start_ns, end_ns)

    def rank_arrays(self, rank: int) -> dict[str, np.ndarray]:
        """One rank's events as numpy arrays (see event_arrays)."""
        return event_arrays(self.store.arrow(rank, "events"))

    @cached_property
    def events(self) -> pd.DataFrame:
        """Every rank's events in one table (a `rank` column first, sorted by rank then start): the whole
        set in memory -- for small sets and tests; analyses read rank by rank."""
        frames = [self.rank_events(r).assign(rank=np.int32(r)) for r in self.rank_ids]
        if not frames:
            return pd.DataFrame(columns=["rank", *EVENT_COLUMNS])
        for col in ("name", "cat"):
            merged = union_categoricals([f[col] for f in frames])
            lo = 0
            for f in frames:
                f[col] = pd.Categorical.from_codes(merged.codes[lo : lo + len(f)], dtype=merged.dtype)
                lo += len(f)
        return pd.concat(frames, ignore_index=True)[["rank", *EVENT_COLUMNS]]

    @cached_property
    def comm_args(self) -> pd.DataFrame:
        """Every rank's comm_args, a `rank` column first (event: the row in that rank)."""
        frames = [self.rank_comm_args(r).assign(rank=np.int64(r)) for r in self.rank_ids]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["event", *COMM_ARG_FIELDS])
        for c in ("coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks"):
            frame[c] = pd.Categorical(frame[c].astype(object))
        return frame[["rank", "event", *COMM_ARG_FIELDS]]

    def hosts(self) -> dict[int, str | None]:
        """rank -> host name, from run.json's hosts when loaded from a run directory, else the trace."""
        out = {
            int(r): (h if isinstance(h, str) and h else None) for r, h in zip(self.ranks["rank"], self.ranks["host"])
        }
        hosts = (self.run or {}).get("hosts")
        if isinstance(hosts, dict):
            for r, info in hosts.items():
                if isinstance(info, dict) and str(r).isdigit() and isinstance(info.get("hostname"), str):
                    out[int(r)] = info["hostname"]
        return out

    def summary(self) -> str:
        """A few lines for a terminal: ranks, events, devices, what was skipped."""
        lines = [
            f"{self.source}: {len(self.ranks)} rank(s) of world size {self.world_size}, "
            f"{self.n_events:,} events" + (" (from cache)" if self.from_cache else "")
        ]
        shown = self.ranks if len(self.ranks) <= 64 else self.ranks.iloc[:32]
        for row in shown.itertuples():
            lines.append(
                f"  rank {row.rank}: {row.device} {row.device_name or ''} {row.backend or ''}, "
                f"{row.events:,} events, {row.skipped:,} skipped, from {row.source}".replace("  ,", ",")
            )
        if len(shown) < len(self.ranks):
            lines.append(f"  ... and {len(self.ranks) - len(shown):,} more ranks")
        if len(self.skipped):
            agg = self.skipped.groupby("reason", sort=False)["count"].sum().sort_values(ascending=False)
            lines.append("  skipped: " + "; ".join(f"{n:,} {reason}" for reason, n in agg.items()))
        return "\n".join(lines)


def node_of_ranks(run: dict | None, hosts: dict[int, str | None]) -> dict[int, object]:
    """rank -> node: run.json's hosts[r].node when present, else the host name from the traces."""
    out: dict[int, object] = dict(hosts)
    for r, info in ((run or {}).get("hosts") or {}).items():
        if isinstance(info, dict) and str(r).isdigit():
            node = info.get("node", info.get("hostname"))
            if node is not None:
                out[int(r)] = node
    return out


def link_tier(group: str, nodes: dict[int, object]) -> str:
    """'intra' when the group's ranks ('0,1,2') sit on one node of `nodes` (node_of_ranks), 'inter' when
    they span nodes, 'unknown' when a rank's node is not known."""
    ranks = [int(r) for r in str(group).split(",") if r.strip().isdigit()]
    seen = {nodes.get(r) for r in ranks}
    if not ranks or None in seen:
        return "unknown"
    return "intra" if len(seen) == 1 else "inter"


def rank_columns(
    frame: pd.DataFrame, columns: tuple[str, ...]
) -> tuple[dict[int, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """(rank -> {column: that rank's values as a numpy array}, the piece of a rank without rows: each
    column empty, with its dtype). Rows keep their order in `frame`. The per-rank pieces of a small
    table that per-rank tasks take: a frame per rank from a groupby costs ~0.4 ms each to make and
    more to pickle; array slices cost neither."""
    empty = {c: frame[c].to_numpy()[:0] for c in columns}
    if not len(frame):
        return {}, empty
    ranks = frame["rank"].to_numpy(dtype=np.int64)
    order = np.argsort(ranks, kind="stable")
    ranks = ranks[order]
    cut = np.flatnonzero(np.diff(ranks)) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, len(ranks)]
    arrays = {c: frame[c].to_numpy()[order] for c in columns}
    pieces = {int(ranks[a]): {c: v[a:b] for c, v in arrays.items()} for a, b in zip(starts.tolist(), ends.tolist())}
    return pieces, empty


def event_arrays(ev: pd.DataFrame | pa.Table) -> dict[str, np.ndarray]:
    """One rank's events (a partition's frame, or its Arrow table as stored: nothing decoded but the
    columns asked for) as numpy arrays: ts, end, kind (index into patterns.KINDS, -1 if unknown),
    pid, tid, correlation, and `thread` numbering each distinct (pid, tid) 0, 1, 2, ... in order of
    first appearance."""
    if isinstance(ev, pa.Table):
        col = {c: ev.column(c).to_numpy() for c in ("ts_ns", "dur_ns", "pid", "tid", "correlation")}
        kind = ev.column("kind").to_numpy().astype(np.int16)  # stored as codes into KINDS
    else:
        col = {c: ev[c].to_numpy() for c in ("ts_ns", "dur_ns", "pid", "tid", "correlation")}
        kind = ev["kind"].cat.codes.to_numpy().astype(np.int16)  # categories are KINDS (store.events_frame)
    ts, pid, tid = col["ts_ns"], col["pid"], col["tid"]
    return {
        "ts": ts,
        "end": ts + col["dur_ns"],
        "kind": kind,
        "pid": pid,
        "tid": tid,
        "thread": _threads(np.zeros(len(ts), dtype=np.int64), pid, tid),
        "correlation": col["correlation"],
    }


def _threads(rank, pid, tid) -> np.ndarray:
    """A number per distinct (rank, pid, tid): the three packed into one int64 and hashed when they fit
    (17 + 23 + 23 bits, pid and tid from -1), else factorized level by level."""
    rank, pid, tid = (np.asarray(x, dtype=np.int64) for x in (rank, pid, tid))
    if not len(rank):
        return np.empty(0, dtype=np.int64)
    if rank.min() >= 0 and rank.max() < 2**17 and all(x.min() >= -1 and x.max() < 2**23 - 1 for x in (pid, tid)):
        return pd.factorize((rank << 46) | ((pid + 1) << 23) | (tid + 1))[0].astype(np.int64)
    codes = pd.MultiIndex.from_arrays([rank, pid, tid]).codes
    flat = np.ravel_multi_index([np.asarray(c, dtype=np.int64) for c in codes], [int(c.max()) + 1 for c in codes])
    return pd.factorize(flat)[0].astype(np.int64)
