"""A measured step replayed over its dependency graph: the cross-rank critical path, and what-if.

    g = build_graph(traces, per, bd, plan=plan, nodes=nodes)   # per: per_rank_wait; bd: breakdown
    r = replay(g, Scenario())                                 # the measured times, reproduced
    r = replay(g, Scenario(rank_speed={3: "median"}, link={"inter": 2.0}, overlap={"dp"}))
    path = critical_path(g, r, step)                          # one row per segment on the path

The graph. Each rank's traced steps are one chain of nodes in time order: a step's start, the
collectives and p2p ops the rank blocked on (per_rank_wait's rows on aligned clocks: arrival a, end
e), the step's end. Between two nodes lies *work*, the rank's own time (compute, host code, anything
that is not a matched collective): the gap from the latest end so far to the next arrival (ops that
overlap on one rank -- a backend's async collectives on its own threads -- end in any order, and the
time they cover is theirs, not the rank's work). A cross-rank edge joins every
participant of an instance: an op cannot complete before its last participant arrives, so an op that
ended at or after the last arrival A (it may have waited) ends at max(a, A) + x, x = e - max(a, A) its
transfer; one that ended before the last arrival (an eager send, a buffered recv) waited on no one and
ends at a + its duration. On GPU ranks a communication kernel that ran at least half under the
rank's compute kernels is *overlapped*: it does not hold the rank's chain and is left out -- an
assumption (its cost hides behind compute under every scenario).

Replay recomputes every node's times in dependency order from each rank's first step start,
changed by the scenario:
    rank_speed {R: f}    rank R's work inside its steps takes 1/f as long; f = "median" gives R the
                         median work of its peers (per step; peers: the ranks of its pipeline stage
                         under the plan, else all ranks)
    link {key: k}        transfers k x faster on a link tier ('intra', 'inter': the node boundary of
                         run.json / the host names) or of one dimension ('tp', 'dp', ...)
    overlap {dim}        that dimension's ops cost nothing and wait for no one (fully hidden)
With no scenario the replay reproduces the measured times exactly. A dependency the clocks make
circular (misaligned hosts) is cut, counted in `Replay.cut`, and the op keeps its own duration.

The step time, one definition everywhere (steps.measured_step_s): the median over traced steps of the
mean over ranks of the step's ProfilerStep#N window in the files; a replay moves it by what it changes
in the graph's windows (on GPU ranks, the span of the kernels a step launched).

Critical path: from the rank whose step ends last, back along whichever edge set each time -- the
rank's own previous work, or the last arrival at a collective (a switch of rank) -- to the step's
first start. HTA's critical path covers one rank's CPU-GPU graph; this one crosses ranks.

Pure: numpy, pandas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler.analyzers.breakdown import cpu_compute
from profiler.traces import intervals as iv
from profiler.traces.model import Traces, link_tier
from profiler.traces.patterns import KINDS

START, OP, END = 0, 1, 2  # node kinds
OWN_KINDS = ("compute", "host", "idle")  # a rank's own time: its device busy, its host only, neither
OVERLAPPED = 0.5  # a GPU comm kernel at least this much under compute does not block its rank
PATH_COLUMNS = ["step", "rank", "kind", "dim", "op", "instance", "start_ns", "end_ns", "dur_ns"]


@dataclass(frozen=True)
class Scenario:
    rank_speed: dict = field(default_factory=dict)  # rank -> speed factor (float) or "median"
    link: dict = field(default_factory=dict)  # 'intra' | 'inter' | dim -> k (transfers k x faster)
    overlap: frozenset = frozenset()  # dims whose ops are hidden

    @property
    def empty(self) -> bool:
        return not (self.rank_speed or self.link or self.overlap)


@dataclass
class Chain:
    """One rank's nodes, in time order (numpy arrays of one length)."""

    kind: np.ndarray  # START | OP | END
    step: np.ndarray
    a: np.ndarray  # arrival (start), ns, aligned
    e: np.ndarray  # end, ns
    inst: np.ndarray  # instance code (Graph.instances), -1 for step marks
    waits: np.ndarray  # bool: the op ended at/after the last arrival (it depends on the others)


@dataclass
class Graph:
    chains: dict[int, Chain]
    instances: pd.DataFrame  # code -> instance, op, dim, group, tier, n (participants in the graph)
    members: list[list[tuple[int, int]]]  # code -> [(rank, node index)]
    last_arrival: np.ndarray  # code -> measured last arrival (ns)
    stage: dict[int, int]  # rank -> pipeline stage (0 without a plan)
    dropped_overlapped: int = 0
    files_windows: pd.DataFrame | None = None  # the files' ProfilerStep windows (Traces.step_windows)
    traces: Traces | None = None  # for a rank's busy sets (own_time), read when first asked for
    offsets: dict[int, int] = field(default_factory=dict)  # rank -> its clock offset (ns)
    _busy: dict = field(default_factory=dict)

    def busy(self, rank: int) -> tuple[iv.Intervals, iv.Intervals]:
        """(device, host) busy sets of a rank on the aligned clock: on a GPU rank its kernels (any
        stream) and its CPU operators and launches; on a CPU-only rank its CPU compute (breakdown's:
        operators minus the thread's collective calls), host empty."""
        if rank not in self._busy:
            self._busy[rank] = _busy_sets(self.traces, rank, self.offsets.get(rank, 0))
        return self._busy[rank]

    def own_time(self, rank: int, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """The rank's measured time [lo, hi) outside its ops, split in time order into OWN_KINDS pieces:
        'compute' under its device work, 'host' on its CPU with the device idle, 'idle' neither."""
        if hi <= lo:
            return []
        if self.traces is None:
            return [("compute", lo, hi)]
        device, host = self.busy(rank)
        return _own_pieces(device, host, lo, hi)


@dataclass
class Replay:
    a: dict[int, np.ndarray]
    e: dict[int, np.ndarray]
    last_rank: np.ndarray  # code -> the participant whose replayed arrival was last
    last_a: np.ndarray  # code -> that arrival
    speed: dict[tuple[int, int], float]  # (rank, step) -> work factor applied (1 = unchanged)
    cut: int = 0


def _gpu_overlapped(traces: Traces, rank: int, rows: pd.DataFrame) -> np.ndarray:
    """Per row: True when at least OVERLAPPED of its span ran under the rank's compute kernels."""
    ev = traces.rank_events(rank)
    compute = (ev["kind"] == "compute").to_numpy()
    ts = ev["ts_ns"].to_numpy()[compute]
    busy = iv.union(ts, ts + ev["dur_ns"].to_numpy()[compute])
    off = rows["offset_ns"].to_numpy()
    out = np.zeros(len(rows), dtype=bool)
    for i, (s, e, o) in enumerate(zip(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(), off)):
        if e > s:
            out[i] = iv.length(iv.clip(busy, int(s - o), int(e - o))) >= OVERLAPPED * (e - s)
    return out


_DEVICE = [KINDS.index(k) for k in ("compute", "comm", "memcpy", "memset")]
_HOST = [KINDS.index(k) for k in ("cpu_op", "runtime")]


def _busy_sets(traces: Traces, rank: int, offset: int) -> tuple[iv.Intervals, iv.Intervals]:
    a = traces.rank_arrays(rank)
    ts, end = a["ts"] + offset, a["end"] + offset
    if traces.device_of(rank) == "gpu":
        dev, host = np.isin(a["kind"], _DEVICE), np.isin(a["kind"], _HOST)
        return iv.union(ts[dev], end[dev]), iv.union(ts[host], end[host])
    s, e = cpu_compute(a, 0, len(ts))
    return (s + offset, e + offset), iv.EMPTY


JOIN_NS = 20_000  # gaps within a busy set shorter than this (or 1% of the span split) count as busy


def _closed(busy: iv.Intervals, join: int) -> iv.Intervals:
    """`busy` with its gaps shorter than `join` filled."""
    s, e = busy
    if len(s) < 2:
        return busy
    keep = np.r_[True, (s[1:] - e[:-1]) >= join]
    first = np.flatnonzero(keep)
    return s[first], np.maximum.reduceat(e, first)


def _own_pieces(device: iv.Intervals, host: iv.Intervals, lo: int, hi: int) -> list[tuple[str, int, int]]:
    """[lo, hi) cut into (kind, start, end) pieces in time order: compute where `device` covers it, host
    where only `host` does, idle elsewhere; touching pieces of one kind joined. Gaps shorter than
    JOIN_NS or 1% of [lo, hi) inside a busy set are counted busy: the microseconds between one
    operator and the next are the rank at work, and a path of thousands of slivers says nothing more."""
    join = max(JOIN_NS, (hi - lo) // 100)
    dev = _closed(iv.clip(device, lo, hi), join)
    only_host = iv.minus(_closed(iv.clip(host, lo, hi), join), dev)
    marks = [(int(s), int(e), "compute") for s, e in zip(*dev)] + [(int(s), int(e), "host") for s, e in zip(*only_host)]
    out: list[tuple[str, int, int]] = []
    at = lo
    for s, e, kind in sorted(marks):
        if s > at:
            out.append(("idle", at, s))
        out.append((kind, s, e))
        at = max(at, e)
    if at < hi:
        out.append(("idle", at, hi))
    joined: list[tuple[str, int, int]] = []
    for kind, s, e in out:
        if joined and joined[-1][0] == kind and joined[-1][2] >= s:
            joined[-1] = (kind, joined[-1][1], max(e, joined[-1][2]))
        else:
            joined.append((kind, s, e))
    return joined


def _mapped(pieces: list[tuple[str, int, int]], lo_m: int, hi_m: int, lo: int, hi: int) -> list[tuple[str, int, int]]:
    """Measured pieces of [lo_m, hi_m) laid over the replayed [lo, hi) in proportion (a replay that
    stretches or shrinks a rank's own time keeps its mix of compute, host and idle)."""
    if (lo_m, hi_m) == (lo, hi) or hi_m <= lo_m:
        return pieces if (lo_m, hi_m) == (lo, hi) else [("idle", lo, hi)]  # no measured time to split
    k = (hi - lo) / (hi_m - lo_m)
    return [(kind, lo + int(round((s - lo_m) * k)), lo + int(round((e - lo_m) * k))) for kind, s, e in pieces]


def build_graph(
    traces: Traces,
    per: pd.DataFrame,
    bd: pd.DataFrame,
    offsets: pd.DataFrame,
    *,
    stage: dict[int, int] | None = None,
    nodes: dict[int, object] | None = None,
) -> Graph:
    """The dependency graph of the traced steps (see the module docstring). `per`: per_rank_wait;
    `bd`: breakdown (its windows, on each rank's own clock); `offsets`: clock_offsets (the same align)."""
    off = dict(zip(offsets["rank"].astype(int), offsets["offset_ns"].astype("int64")))
    keep = per
    dropped = 0
    gpu = [r for r in traces.rank_ids if traces.device_of(r) == "gpu"]
    if gpu and len(per):
        mask = np.ones(len(per), dtype=bool)
        for r in gpu:
            sel = np.flatnonzero(per["rank"].to_numpy() == r)
            if len(sel):
                mask[sel] = ~_gpu_overlapped(traces, r, per.iloc[sel])
        dropped = int((~mask).sum())
        keep = per[mask]
    codes, names = pd.factorize(keep["instance"], sort=False) if len(keep) else (np.empty(0, int), [])
    keep = keep.assign(code=codes)
    nodes = nodes or {}
    chains: dict[int, Chain] = {}
    members: list[list[tuple[int, int]]] = [[] for _ in range(len(names))]
    by_rank = {int(r): g for r, g in keep.groupby("rank", sort=False)}
    for rank, w in bd.groupby("rank", sort=True):
        rank = int(rank)
        w = w.sort_values("start_ns")
        o = int(off.get(rank, 0))
        rows = by_rank.get(rank)
        rows = rows.sort_values("start_ns", kind="stable") if rows is not None else keep.iloc[:0]
        ra, re_, rc = (rows[c].to_numpy(dtype=np.int64) for c in ("start_ns", "end_ns", "code"))
        kind, step, a, e, inst = [], [], [], [], []
        for s, lo, hi in zip(w["step"].to_numpy(), w["start_ns"].to_numpy() + o, w["end_ns"].to_numpy() + o):
            i, j = np.searchsorted(ra, lo, side="left"), np.searchsorted(ra, hi, side="left")
            n = j - i
            kind += [START, *([OP] * n), END]
            step += [int(s)] * (n + 2)
            a += [int(lo), *ra[i:j].tolist(), int(hi)]
            e += [int(lo), *np.minimum(re_[i:j], max(hi, lo)).tolist(), int(hi)]
            inst += [-1, *rc[i:j].tolist(), -1]
        chain = Chain(
            kind=np.array(kind, dtype=np.int8),
            step=np.array(step, dtype=np.int64),
            a=np.array(a, dtype=np.int64),
            e=np.array(e, dtype=np.int64),
            inst=np.array(inst, dtype=np.int64),
            waits=np.zeros(len(kind), dtype=bool),
        )
        for idx in np.flatnonzero(chain.inst >= 0):
            members[int(chain.inst[idx])].append((rank, int(idx)))
        chains[rank] = chain
    last = np.zeros(len(members), dtype=np.int64)
    for c, mem in enumerate(members):
        last[c] = max((chains[r].a[i] for r, i in mem), default=0)
        for r, i in mem:
            chains[r].waits[i] = len(mem) > 1 and chains[r].e[i] >= last[c]
    first = keep.drop_duplicates("code").set_index("code").sort_index() if len(keep) else keep
    table = pd.DataFrame(
        {
            "instance": list(names),
            "op": first["op"].astype(str).to_numpy() if len(keep) else [],
            "dim": first["dim"].astype(str).to_numpy() if len(keep) else [],
            "group": first["group"].astype(str).to_numpy() if len(keep) else [],
            "tier": [link_tier(g, nodes) for g in first["group"]] if len(keep) else [],
            "n": [len(m) for m in members],
        }
    )
    return Graph(
        chains=chains,
        instances=table,
        members=members,
        last_arrival=last,
        stage=stage or {r: 0 for r in chains},
        dropped_overlapped=dropped,
        files_windows=traces.step_windows,
        traces=traces,
        offsets=off,
    )


def op_wait(ch: Chain, i: int, a: np.ndarray, e: np.ndarray, last: np.ndarray) -> int:
    """How long op i of a chain waited for its last participant (times a, e; last arrivals `last`):
    none when it did not depend on the others, never more than its duration."""
    if not ch.waits[i]:
        return 0
    return min(int(e[i] - a[i]), max(0, int(last[int(ch.inst[i])]) - int(a[i])))


def _step_parts(ch: Chain, i0: int, j: int, a: np.ndarray, e: np.ndarray, last: np.ndarray, gaps: list | None = None):
    """(work_ns, [(node i, wait_ns, transfer_ns) per op]) of the step from START node i0 to END node j:
    the rank's time split so that the parts add up to the window even where its ops overlap (async
    collectives on a backend's own threads, as gloo's): each op counts only past the time already
    covered by the ops before it, its wait first (until the last arrival), and work is the time no op
    covers -- the rank's own time (`gaps`, when given, gets each piece of it: (node i, start, end))."""
    front = int(a[i0])  # the time covered so far
    work, ops = 0, []
    for i in range(i0 + 1, j + 1):
        ai, ei = int(a[i]), int(e[i])
        if ai > front:
            work += ai - front
            if gaps is not None:
                gaps.append((i, front, ai))
        if ch.kind[i] == OP:
            lo = max(ai, front)
            seen = max(0, ei - lo)  # the op's time not already covered
            waited_until = ai + op_wait(ch, i, a, e, last)
            wait = max(0, min(waited_until, ei) - lo)
            ops.append((i, wait, seen - wait))
        front = max(front, ai, ei)
    return work, ops


def _own_split(g: Graph, rank: int, measured: list, replayed: list) -> dict[str, int]:
    """ns of OWN_KINDS in a step's replayed own-time pieces (i, lo, hi), each split as the measured
    piece before the same node was (Graph.own_time), in proportion; a piece the measurement lacks
    takes the measured step's overall mix."""
    by_node = {i: (lo, hi) for i, lo, hi in measured}
    out = dict.fromkeys(OWN_KINDS, 0)
    split = {i: g.own_time(rank, lo, hi) for i, (lo, hi) in by_node.items()}
    total = dict.fromkeys(OWN_KINDS, 0)
    for pieces in split.values():
        for kind, s, e in pieces:
            total[kind] += e - s
    whole = sum(total.values())
    for i, lo, hi in replayed:
        if i in by_node:
            pieces = _mapped(split[i], *by_node[i], lo, hi)
            for kind, s, e in pieces:
                out[kind] += e - s
        elif whole:
            for kind in OWN_KINDS:
                out[kind] += int(round((hi - lo) * total[kind] / whole))
        else:
            out["idle"] += hi - lo
    return out


def work_per_step(g: Graph) -> pd.DataFrame:
    """One row per (rank, step): work_ns (the time inside the step no op covers), comm_ns (the time
    its ops cover): they add up to the step's window (_step_parts)."""
    rows = []
    for rank, ch in g.chains.items():
        for i0 in np.flatnonzero(ch.kind == START):
            j = i0 + int(np.argmax(ch.kind[i0:] == END))
            work, ops = _step_parts(ch, i0, j, ch.a, ch.e, g.last_arrival)
            rows.append(
                {
                    "rank": rank,
                    "step": int(ch.step[i0]),
                    "work_ns": work,
                    "comm_ns": sum(w + x for _, w, x in ops),
                }
            )
    return pd.DataFrame(rows, columns=["rank", "step", "work_ns", "comm_ns"])


def _speeds(g: Graph, sc: Scenario) -> dict[tuple[int, int], float]:
    """(rank, step) -> factor on the rank's work (durations x factor)."""
    if not sc.rank_speed:
        return {}
    work = work_per_step(g)
    out = {}
    for rank, speed in sc.rank_speed.items():
        if rank not in g.chains:
            raise KeyError(f"rank {rank} is not in the traces (ranks {min(g.chains)}..{max(g.chains)})")
        mine = work[work["rank"] == rank]
        for step, w in zip(mine["step"], mine["work_ns"]):
            if speed == "median":
                peers = [r for r in g.chains if r != rank and g.stage.get(r) == g.stage.get(rank)] or [
                    r for r in g.chains if r != rank
                ]
                pw = work[(work["step"] == step) & work["rank"].isin(peers)]["work_ns"]
                out[(rank, int(step))] = float(pw.median()) / w if len(pw) and w > 0 else 1.0
            else:
                out[(rank, int(step))] = 1.0 / float(speed)
    return out


def replay(g: Graph, sc: Scenario = Scenario()) -> Replay:
    """Every node's replayed (arrival, end) under the scenario (see the module docstring)."""
    speed = _speeds(g, sc)
    n_inst = len(g.members)
    tier = g.instances["tier"].to_numpy() if n_inst else np.empty(0, object)
    dim = g.instances["dim"].to_numpy() if n_inst else np.empty(0, object)
    link_k = np.ones(n_inst)
    for key, k in sc.link.items():
        link_k = np.where((tier == key) | (dim == key), link_k * float(k), link_k)
    hidden = np.isin(dim, list(sc.overlap)) if n_inst else np.zeros(0, bool)
    A = {r: np.zeros(len(ch.a), dtype=np.int64) for r, ch in g.chains.items()}
    E = {r: np.zeros(len(ch.a), dtype=np.int64) for r, ch in g.chains.items()}
    arrived = np.zeros(n_inst, dtype=np.int64)
    last_a = np.full(n_inst, np.iinfo(np.int64).min, dtype=np.int64)
    last_rank = np.full(n_inst, -1, dtype=np.int64)
    size = np.array([len(m) for m in g.members], dtype=np.int64)
    ptr = {r: 0 for r in g.chains}
    has_a = {r: -1 for r in g.chains}  # the last node whose arrival is computed
    # the time a rank's nodes so far cover (their latest end), measured and replayed: its own work is
    # what lies beyond it (_step_parts' split; ops that overlap, async ones, end in any order)
    covered = {r: np.maximum.accumulate(ch.e) if len(ch.e) else ch.e for r, ch in g.chains.items()}
    front = {r: np.iinfo(np.int64).min for r in g.chains}
    waiting: dict[int, list[int]] = {}
    todo = list(g.chains)
    cut = 0

    def arrive(r: int, i: int) -> None:
        ch = g.chains[r]
        if i == 0:
            t = int(ch.a[0])
        else:
            gap = int(ch.a[i] - covered[r][i - 1])
            if ch.kind[i] != START:  # work inside a step; between steps it is left alone
                gap = int(round(gap * speed.get((r, int(ch.step[i])), 1.0))) if gap > 0 else gap
            t = max(int(A[r][i - 1]), int(front[r]) + gap)
        A[r][i] = t
        has_a[r] = i
        c = int(ch.inst[i])
        if c >= 0:
            arrived[c] += 1
            if t > last_a[c]:
                last_a[c], last_rank[c] = t, r
            if arrived[c] == size[c]:
                todo.extend(waiting.pop(c, []))

    def finish(r: int, i: int, force: bool = False) -> bool:
        ch = g.chains[r]
        c = int(ch.inst[i])
        t = int(A[r][i])
        if c < 0:
            E[r][i] = t
            return True
        if hidden[c]:
            E[r][i] = t
            return True
        if ch.waits[i] and not force:
            if arrived[c] < size[c]:
                return False
            x = int(ch.e[i] - max(ch.a[i], g.last_arrival[c]))
            E[r][i] = max(t, int(last_a[c])) + int(round(x / link_k[c]))
        else:
            E[r][i] = t + int(round(int(ch.e[i] - ch.a[i]) / link_k[c]))
        return True

    while True:
        while todo:
            r = todo.pop()
            ch = g.chains[r]
            i = ptr[r]
            while i < len(ch.a):
                if has_a[r] < i:
                    arrive(r, i)
                if not finish(r, i):
                    waiting.setdefault(int(ch.inst[i]), []).append(r)
                    break
                front[r] = max(front[r], int(E[r][i]))
                i += 1
            ptr[r] = i
        stuck = [(int(A[r][ptr[r]]), r) for r, ch in g.chains.items() if ptr[r] < len(ch.a)]
        if not stuck:
            break
        _, r = min(stuck)  # a circular wait (clocks that disagree): cut the earliest one's dependency
        c = int(g.chains[r].inst[ptr[r]])
        waiting[c] = [x for x in waiting.get(c, []) if x != r]
        finish(r, ptr[r], force=True)
        front[r] = max(front[r], int(E[r][ptr[r]]))
        cut += 1
        ptr[r] += 1
        todo.append(r)
    return Replay(a=A, e=E, last_rank=last_rank, last_a=last_a, speed=speed, cut=cut)


def step_windows(g: Graph, rp: Replay | None = None) -> pd.DataFrame:
    """One row per (rank, step): start_ns, end_ns of the step, measured (rp None) or replayed."""
    rows = []
    for rank, ch in g.chains.items():
        a = ch.a if rp is None else rp.a[rank]
        for i in np.flatnonzero(ch.kind == START):
            j = i + int(np.argmax(ch.kind[i:] == END))
            rows.append({"rank": rank, "step": int(ch.step[i]), "start_ns": int(a[i]), "end_ns": int(a[j])})
    return pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns"])


def phases(g: Graph, rp: Replay | None = None) -> pd.DataFrame:
    """One row per (rank, step): work_ns (the rank's own time, split into compute_ns, host_ns and idle_ns:
    under its device work, on its host alone, neither -- Graph.own_time), wait_ns (blocked until the last
    arrival), transfer_ns per op (column transfer_<dim>_ns), measured or replayed; work + wait +
    transfers = the window, also where a rank's ops overlap (_step_parts). A replayed rank's own time
    keeps its measured mix of compute, host and idle."""
    rows = []
    for rank, ch in g.chains.items():
        a = ch.a if rp is None else rp.a[rank]
        e = ch.e if rp is None else rp.e[rank]
        last = g.last_arrival if rp is None else rp.last_a
        dims = g.instances["dim"].to_numpy() if len(g.instances) else np.empty(0, object)
        for i0 in np.flatnonzero(ch.kind == START):
            j = i0 + int(np.argmax(ch.kind[i0:] == END))
            gaps: list = []
            work, ops = _step_parts(ch, i0, j, a, e, last, gaps)
            measured = gaps
            if rp is not None:
                measured = []
                _step_parts(ch, i0, j, ch.a, ch.e, g.last_arrival, measured)
            row = {"rank": rank, "step": int(ch.step[i0]), "window_ns": int(a[j] - a[i0]), "work_ns": work}
            row.update({f"{k}_ns": v for k, v in _own_split(g, rank, measured, gaps).items()})
            row["wait_ns"] = sum(w for _, w, _ in ops)
            for i, _, x in ops:
                key = f"transfer_{dims[int(ch.inst[i])]}_ns"
                row[key] = row.get(key, 0) + x
            rows.append(row)
    out = pd.DataFrame(rows).fillna(0)
    for c in out.columns:
        if c.endswith("_ns"):
            out[c] = out[c].astype("int64")
    return out


def critical_path(g: Graph, rp: Replay, step: int) -> pd.DataFrame:
    """The segments on the step's critical path, earliest first (PATH_COLUMNS): kind 'comm' (a transfer,
    after the last arrival) or a rank's own time between its ops, split as OWN_KINDS -- 'compute' (its
    device busy), 'host' (its CPU busy, the device not), 'idle' (neither): a gap with no kernels is
    idle, not work (Graph.own_time; a replayed gap keeps its measured mix). The durations add up to
    the path."""
    ends = [
        (int(rp.a[r][i]), r, int(i))
        for r, ch in g.chains.items()
        for i in np.flatnonzero((ch.kind == END) & (ch.step == step))
    ]
    starts = [
        int(rp.a[r][i]) for r, ch in g.chains.items() for i in np.flatnonzero((ch.kind == START) & (ch.step == step))
    ]
    if not ends:
        return pd.DataFrame(columns=PATH_COLUMNS)
    floor = min(starts)
    _, r, i = max(ends)
    dims = g.instances["dim"].to_numpy() if len(g.instances) else np.empty(0, object)
    ops = g.instances["op"].to_numpy() if len(g.instances) else np.empty(0, object)
    names = g.instances["instance"].to_numpy() if len(g.instances) else np.empty(0, object)
    segs = []
    cursor = int(rp.a[r][i])  # the path so far starts here: earlier segments end at or before it

    def add(rank, kind, c, lo, hi):
        nonlocal cursor
        hi = min(hi, cursor)  # ops that overlap on one rank (async ones) must not count twice
        if hi > lo:
            segs.append(
                (rank, kind, dims[c] if c >= 0 else "", ops[c] if c >= 0 else "", names[c] if c >= 0 else "", lo, hi)
            )
            cursor = lo

    guard = sum(len(ch.a) for ch in g.chains.values()) + 1
    while guard > 0:
        guard -= 1
        ch = g.chains[r]
        A, E = rp.a[r], rp.e[r]
        if ch.kind[i] == OP:
            c = int(ch.inst[i])
            q = int(rp.last_rank[c])
            if ch.waits[i] and q != r and rp.last_a[c] > A[i] and E[i] > A[i]:
                add(r, "comm", c, int(rp.last_a[c]), int(E[i]))
                r, i = q, next(j for rr, j in g.members[c] if rr == q)
                cursor = min(cursor, int(rp.a[r][i]))
                continue
            add(r, "comm", c, int(A[i]), int(E[i]))
        if ch.kind[i] == START or i == 0 or A[i] <= floor:
            break
        if A[i] > E[i - 1]:
            lo_m, hi_m = int(ch.e[i - 1]), int(ch.a[i])
            pieces = _mapped(g.own_time(r, lo_m, hi_m), lo_m, hi_m, int(E[i - 1]), int(A[i]))
            for kind, lo, hi in reversed(pieces):  # latest first: the path is walked backwards
                add(r, kind, -1, lo, hi)
        i -= 1
    out = pd.DataFrame(segs[::-1], columns=["rank", "kind", "dim", "op", "instance", "start_ns", "end_ns"])
    out.insert(0, "step", step)
    out["dur_ns"] = out["end_ns"] - out["start_ns"]
    return out[PATH_COLUMNS]
