"""The breakdown of many CPU-only ranks at once: the same numbers as breakdown's per-rank path (see
its docstring for each definition), computed as columns over every rank and step of a part.

Every interval is tagged with its group -- a (rank, thread), a rank, a (rank, step) window, or a
window and a dimension -- and the groups are laid side by side on one number line (group k shifted
by k x the widest group's span), so one union, one intersection or one difference serves every group:
a part of 200 small ranks is a few dozen numpy operations, not 200 rounds of them. When the shifted
values would not fit in int64, or a rank's step windows overlap, `cpu_breakdowns` returns None and
the caller takes the per-rank path.

Pure: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.traces import intervals as iv
from profiler.traces.patterns import KINDS

K = {k: i for i, k in enumerate(KINDS)}
LIMIT = 2**62


def _lifted(groups: np.ndarray, s: np.ndarray, e: np.ndarray, base: np.ndarray, span: int):
    """Intervals [s, e) of `groups` moved to group k's own range [k x span, (k + 1) x span), where
    `base[k]` is the group's first instant."""
    shift = groups.astype(np.int64) * span - base[groups]
    return s + shift, e + shift


def _per_group(pieces: tuple[np.ndarray, np.ndarray], span: int, n: int) -> np.ndarray:
    """Total length of lifted pieces in each of `n` groups (int64)."""
    s, e = pieces
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, s // span, e - s)
    return out


def _overlap_each(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For each interval of `a` (any order), the length it shares with the disjoint sorted set `b`."""
    (a_s, a_e), (b_s, b_e) = a, b
    out = np.zeros(len(a_s), dtype=np.int64)
    if not len(a_s) or not len(b_s):
        return out
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    j, i = iv.index_runs(lo, np.maximum(hi, lo))
    np.add.at(out, i, np.maximum(np.minimum(a_e[i], b_e[j]) - np.maximum(a_s[i], b_s[j]), 0))
    return out


def cpu_breakdowns(
    a: dict, at: np.ndarray, ranks: list[int], rows: dict, windows: dict
) -> tuple[list[tuple], list[tuple]] | None:
    """(breakdown rows, comm_by_dim rows) of CPU-only ranks, as breakdown._rank_breakdown gives them
    rank after rank; None when the ranks cannot be laid side by side (see the module docstring).
    `a`: the ranks' events as event_arrays of their joined table, `at` each event's index in `ranks`;
    `rows`, `windows`: the ranks' collectives rows and step windows as columns with an `at` column."""
    n_ranks = len(ranks)
    if not len(a["ts"]):
        return None
    t0 = int(min(a["ts"].min(), rows["start_ns"].min() if len(rows["at"]) else a["ts"].min()))
    t1 = int(max(a["end"].max(), rows["end_ns"].max() if len(rows["at"]) else a["end"].max()))
    if len(windows["at"]):
        t0, t1 = min(t0, int(windows["start_ns"].min())), max(t1, int(windows["end_ns"].max()))
    span = t1 - t0 + 1
    thread = pd.factorize(a["thread"] * np.int64(n_ranks) + at)[0]  # a (rank, thread) pair
    n_threads = int(thread.max()) + 1
    if max(n_threads, n_ranks) * span >= LIMIT:
        return None
    base = np.full(max(n_threads, n_ranks), t0, dtype=np.int64)
    # per rank and thread: CPU operators minus that thread's collective calls; then per rank, the union
    op = a["kind"] == K["cpu_op"]
    comm = (a["kind"] == K["cpu_comm"]) | (a["kind"] == K["ps_comm"])
    ops = iv.union(*_lifted(thread[op], a["ts"][op], a["end"][op], base, span))
    calls = iv.union(*_lifted(thread[comm], a["ts"][comm], a["end"][comm], base, span))
    free_s, free_e = iv.minus(ops, calls)
    owner = free_s // span  # the thread ...
    rank_of_thread = np.zeros(n_threads, dtype=np.int64)
    rank_of_thread[thread] = at
    r = rank_of_thread[owner]  # ... and its rank
    busy = iv.union(free_s - owner * span + r * span, free_e - owner * span + r * span)  # by rank
    # the step windows: each rank's ProfilerStep ranges by start; a rank without any: its events' span
    w_at, w_lo, w_hi, w_step = (np.asarray(windows[c], dtype=np.int64) for c in ("at", "start_ns", "end_ns", "step"))
    bare = np.setdiff1d(np.arange(n_ranks), w_at)
    if len(bare):
        first = np.full(n_ranks, np.iinfo(np.int64).max)
        last = np.full(n_ranks, np.iinfo(np.int64).min)
        np.minimum.at(first, at, a["ts"])
        np.maximum.at(last, at, a["end"])
        w_at, w_lo = np.r_[w_at, bare], np.r_[w_lo, first[bare]]
        w_hi, w_step = np.r_[w_hi, last[bare]], np.r_[w_step, np.full(len(bare), -1)]
    order = np.lexsort((w_lo, w_at))
    w_at, w_lo, w_hi, w_step = w_at[order], w_lo[order], w_hi[order], w_step[order]
    same = w_at[1:] == w_at[:-1]
    if (same & (w_lo[1:] < w_hi[:-1])).any():  # overlapping windows of a rank: not one per instant
        return None
    n_w = len(w_at)
    width = int((w_hi - w_lo).max()) + 1 if n_w else 1
    if n_w * width >= LIMIT:
        return None
    # rank-lifted coordinates of the windows; each piece of a rank's set cut into its windows
    r_lo, r_hi = w_lo - t0 + w_at * span, w_hi - t0 + w_at * span

    def into_windows(s, e):
        """Rank-lifted disjoint sorted pieces cut by the windows: window-lifted pieces (group = window)."""
        lo = np.searchsorted(r_hi, s, side="right")
        hi = np.searchsorted(r_lo, e, side="left")
        j, i = iv.index_runs(lo, np.maximum(hi, lo))
        cs, ce = np.maximum(s[i], r_lo[j]), np.minimum(e[i], r_hi[j])
        keep = ce > cs
        j, cs, ce = j[keep], cs[keep], ce[keep]
        shift = j * width - r_lo[j]
        return cs + shift, ce + shift

    compute = iv.union(*into_windows(*busy))
    # collectives rows: the window their issue falls in, clipped to it
    c_at = np.asarray(rows["at"], dtype=np.int64)
    c_issue = np.asarray(rows["issue_ns"], dtype=np.int64) - t0 + c_at * span
    k = np.searchsorted(r_lo, c_issue, side="right") - 1
    ok = k >= 0
    ok[ok] = (c_issue[ok] < r_hi[k[ok]]) & (w_at[k[ok]] == c_at[ok])
    k = k[ok]
    c_s = np.clip(np.asarray(rows["start_ns"], dtype=np.int64)[ok] - t0 + c_at[ok] * span, r_lo[k], r_hi[k])
    c_e = np.clip(np.asarray(rows["end_ns"], dtype=np.int64)[ok] - t0 + c_at[ok] * span, r_lo[k], r_hi[k])
    c_s, c_e = c_s + k * width - r_lo[k], c_e + k * width - r_lo[k]
    comm_set = iv.union(c_s, c_e)
    compute_ns = _per_group(compute, width, n_w)
    comm_ns = _per_group(comm_set, width, n_w)
    overlapped = _per_group(iv.intersect(comm_set, compute), width, n_w)
    busy_ns = _per_group(iv.merge(compute, comm_set), width, n_w)
    window_ns = np.maximum(w_hi - w_lo, busy_ns)
    # events starting in each window
    ev = a["ts"] - t0 + at * span  # sorted within a rank; ranks in order: sorted
    ev_sorted = np.sort(ev)
    events = np.searchsorted(ev_sorted, r_hi, side="left") - np.searchsorted(ev_sorted, r_lo, side="left")
    zeros = np.zeros(n_w, dtype=np.int64)
    bd = list(
        zip(
            [ranks[x] for x in w_at.tolist()],
            w_step.tolist(),
            ["cpu"] * n_w,
            w_lo.tolist(),
            w_hi.tolist(),
            window_ns.tolist(),
            compute_ns.tolist(),
            comm_ns.tolist(),
            overlapped.tolist(),
            (comm_ns - overlapped).tolist(),
            zeros.tolist(),
            zeros.tolist(),
            (window_ns - busy_ns).tolist(),
            events.tolist(),
        )
    )
    # per window and dimension: count, bytes, the union of its calls and what of it lies outside compute
    dims = np.asarray(rows["dim"], dtype=object)[ok]
    nbytes = np.asarray(rows["bytes"], dtype=np.int64)[ok]
    dim_rows: list[tuple] = []
    if len(k):
        codes, names = pd.factorize(dims, sort=True)
        g = k * len(names) + codes  # a (window, dim) group, in window then name order
        gs = iv.union(c_s - k * width + g * width, c_e - k * width + g * width)
        owner = gs[0] // width
        window_of = owner // len(names)
        back = (gs[0] - owner * width + window_of * width, gs[1] - owner * width + window_of * width)
        inside = _overlap_each(back, compute)
        keys, count = np.unique(g, return_counts=True)
        total_bytes = np.zeros(len(keys), dtype=np.int64)
        np.add.at(total_bytes, np.searchsorted(keys, g), nbytes)
        length = np.zeros(len(keys), dtype=np.int64)
        exposed = np.zeros(len(keys), dtype=np.int64)
        where = np.searchsorted(keys, owner)
        np.add.at(length, where, gs[1] - gs[0])
        np.add.at(exposed, where, (gs[1] - gs[0]) - inside)
        wk, dk = keys // len(names), keys % len(names)
        dim_rows = list(
            zip(
                [ranks[x] for x in w_at[wk].tolist()],
                w_step[wk].tolist(),
                [str(names[d]) for d in dk.tolist()],
                count.tolist(),
                total_bytes.tolist(),
                length.tolist(),
                exposed.tolist(),
            )
        )
    return bd, dim_rows
