"""Interval arithmetic on numpy arrays of [start, end) in integer ns: union, length, overlap, and a
running maximum per segment (how far the events so far reach, restarting per thread or per lane).

A "set" here is a pair of sorted, disjoint arrays (starts, ends) as `union` returns them.

Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]  # (starts, ends), sorted and disjoint where a function says so

EMPTY = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted union of intervals [starts[i], ends[i]); empty ones dropped."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def length(iv: Intervals) -> int:
    s, e = iv
    return int((e - s).sum())


def clip(iv: Intervals, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = iv
    s2, e2 = np.clip(s, lo, hi), np.clip(e, lo, hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def merge(*sets: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """Union of several interval sets."""
    if not sets:
        return EMPTY
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def overlap(a: Intervals, b: Intervals) -> int:
    """Length of the intersection of two disjoint-sorted sets."""
    return length(intersect(a, b))


def intersect(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """a ∩ b for disjoint-sorted sets: for each interval of a, the intervals of b that overlap it are
    a contiguous run (two binary searches); the pieces come out sorted. No sort, no np.unique."""
    (a_s, a_e), (b_s, b_e) = a, b
    if len(a_s) == 0 or len(b_s) == 0:
        return EMPTY
    lo = np.searchsorted(b_e, a_s, side="right")  # the first of b ending after a starts
    hi = np.searchsorted(b_s, a_e, side="left")  # the first of b starting at or after a's end
    j, i = index_runs(lo, np.maximum(hi, lo))
    if len(j) == 0:
        return EMPTY
    s, e = np.maximum(a_s[i], b_s[j]), np.minimum(a_e[i], b_e[j])
    keep = e > s
    return _joined(s[keep], e[keep])


def index_runs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every index of the runs [a[k], b[k]) (b >= a) in order, and the k each comes from: the
    concatenation of arange(a[k], b[k]), and k repeated b[k] - a[k] times. No Python loop."""
    n = np.asarray(b, dtype=np.int64) - a
    total = int(n.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(n)), n)
    return np.repeat(a - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(total), owner


def minus(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """a \\ b for disjoint-sorted sets: a's pieces not covered by b (a ∩ the gaps of b)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    far = np.iinfo(np.int64)
    gaps = (np.concatenate([[far.min], b[1]]), np.concatenate([b[0], [far.max]]))
    return intersect(a, gaps)


def _joined(s, e) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, non-overlapping pieces with the touching ones joined (as `union` returns them)."""
    if len(s) < 2:
        return s, e
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    if new.all():
        return s, e
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def running_max(x: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Running maximum of integer `x` that restarts wherever `new` is True (segments of a sorted array,
    e.g. one thread's events by start). One numpy pass: each segment is lifted above the previous one
    (segment number x the span of x), unless that would overflow int64, then a loop over segments."""
    x = np.asarray(x, dtype=np.int64)
    if len(x) == 0:
        return x.copy()
    new = np.asarray(new, dtype=bool).copy()
    new[0] = True
    seg = np.cumsum(new) - 1
    base, span = int(x.min()), int(x.max()) - int(x.min()) + 1
    if (int(seg[-1]) + 1) * span < 2**62:
        lift = seg * np.int64(span)
        return np.maximum.accumulate((x - base) + lift) - lift + base
    out = np.empty_like(x)
    bounds = np.append(np.flatnonzero(new), len(x))
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = np.maximum.accumulate(x[a:b])
    return out
