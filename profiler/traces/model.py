"""The `Traces` data model: one events table for every rank, plus per-rank metadata.

`events` (one row per complete 'X' event, sorted by rank then start):

    rank          int32   the global rank that wrote the event
    ts_ns         int64   start, integer ns since the epoch (both Kineto time styles normalised)
    dur_ns        int64   duration, ns
    cat           category  Kineto category (kernel, cpu_op, user_annotation, cuda_runtime, ...)
    name          category  event name
    kind          category  our class of the event (see profiler.traces.patterns.KINDS)
    op            category  collective op of comm / cpu_comm / ps_comm events (patterns.OPS), else missing
    pid, tid      int64   process and thread (GPU events: device and stream); -1 when not a number
    correlation   int64   CUDA correlation id linking a kernel to its launch, -1 when absent
    external_id   int64   Kineto External id, -1 when absent

`comm_args` (one row per comm, cpu_comm or ps_comm event that carried collective metadata):
    event (row of `events`), in_nelems, out_nelems, group_size, seq, src_rank, dst_rank (p2p peers),
    input_bytes (Int64; input_bytes from Input Dims x Input type, when shown), and the categories
    coll_name, dtype, pg_name, pg_desc, pg_ranks ('0,1,2,3')

`ranks` (one row per rank): rank, world_size, backend, device ('gpu' | 'cpu'), device_name, host,
    source (file or archive member), rank_from ('distributedInfo' | 'file name' | 'given'),
    time_base ('epoch_us' | 'relative_us+baseTimeNanoseconds'), events, skipped, nccl_version
`pg_config`: rank, pg_name, pg_desc, pg_size, ranks ('0,1'), backend_config  (distributedInfo)
`threads`: rank, pid, tid, name  (thread_name metadata events)
`skipped`: rank, reason, count -- every event not in `events`, and why

Pure: pandas only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from profiler.traces.patterns import KINDS, profiler_step

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


@dataclass(frozen=True, eq=False)
class Traces:
    events: pd.DataFrame
    comm_args: pd.DataFrame
    ranks: pd.DataFrame
    pg_config: pd.DataFrame
    threads: pd.DataFrame
    skipped: pd.DataFrame
    source: str = ""
    run: dict | None = None  # run.json of a run directory, when loaded from one
    key: str = ""  # content hash of the input (the cache key)
    from_cache: bool = False

    @property
    def rank_ids(self) -> list[int]:
        return sorted(int(r) for r in self.ranks["rank"])

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
        names = self.events.loc[self.events["kind"] == "step", "name"].unique()
        return sorted({s for s in (profiler_step(str(n)) for n in names) if s is not None})

    def device_of(self, rank: int) -> str:
        return self._devices.get(rank, "cpu")

    @cached_property
    def _devices(self) -> dict[int, str]:
        return {int(r): str(d) for r, d in zip(self.ranks["rank"], self.ranks["device"])}

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """The events' columns as numpy arrays, for analyzers that slice by rank (`rank_slices`).
        `kind` is the index into patterns.KINDS (-1 if unknown); `thread` numbers each distinct
        (rank, pid, tid) 0, 1, 2, ... in order of first appearance."""
        ev = self.events
        kind = ev["kind"].cat
        index = np.array([KINDS.index(c) if c in KINDS else -1 for c in kind.categories] + [-1], dtype=np.int16)
        ts = ev["ts_ns"].to_numpy()
        rank, pid, tid = ev["rank"].to_numpy(), ev["pid"].to_numpy(), ev["tid"].to_numpy()
        return {
            "rank": rank,
            "ts": ts,
            "end": ts + ev["dur_ns"].to_numpy(),
            "kind": index[kind.codes.to_numpy()],
            "pid": pid,
            "tid": tid,
            "thread": _threads(rank, pid, tid),
            "correlation": ev["correlation"].to_numpy(),
        }

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

    def rank_slices(self) -> dict[int, tuple[int, int]]:
        """rank -> (first row, end row) of its events: they are contiguous (sorted by rank)."""
        return dict(self._slices)

    @cached_property
    def _slices(self) -> dict[int, tuple[int, int]]:
        ranks = self.events["rank"].to_numpy()
        ids = np.array(self.rank_ids, dtype=ranks.dtype)  # as the column's dtype: no int64 copy of it per rank
        lo, hi = np.searchsorted(ranks, ids, side="left"), np.searchsorted(ranks, ids, side="right")
        return {int(r): (int(a), int(b)) for r, a, b in zip(ids, lo, hi)}

    def rank_events(self, rank: int) -> pd.DataFrame:
        """The events of one rank (a slice, no copy)."""
        lo, hi = self.rank_slices()[rank]
        return self.events.iloc[lo:hi]

    def summary(self) -> str:
        """A few lines for a terminal: ranks, events, devices, what was skipped."""
        lines = [
            f"{self.source}: {len(self.ranks)} rank(s) of world size {self.world_size}, "
            f"{len(self.events):,} events" + (" (from cache)" if self.from_cache else "")
        ]
        for row in self.ranks.itertuples():
            lines.append(
                f"  rank {row.rank}: {row.device} {row.device_name or ''} {row.backend or ''}, "
                f"{row.events:,} events, {row.skipped:,} skipped, from {row.source}".replace("  ,", ",")
            )
        if len(self.skipped):
            agg = self.skipped.groupby("reason", sort=False)["count"].sum().sort_values(ascending=False)
            lines.append("  skipped: " + "; ".join(f"{n:,} {reason}" for reason, n in agg.items()))
        return "\n".join(lines)


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
