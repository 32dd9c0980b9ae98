"""Collective benchmark numbers: nccl-tests' bandwidths, and α-β fits in the plan model's own terms.

Conventions (nccl-tests, doc/PERFORMANCE.md):
    bytes   the collective's "size": the buffer of an all-reduce, the full (gathered) buffer of an
            all-gather, the full input of a reduce-scatter, the whole send buffer of an all-to-all,
            the message each rank sends in a send/recv ring shift
    time    the mean of `iters` back-to-back calls after warm-up, averaged over the group's ranks
            (nccl-tests' default `-a 1`; the slowest rank's is kept too)
    algbw   bytes / time
    busbw   algbw × factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
            send_recv 1 -- the rate each rank's link moves data at, comparable across n

Fits. The plan model (parallel/core/comm.py, ring α-β, Thakur et al. 2005) predicts one collective as

    t(op, n, S) = c_lat(op, n)·α + c_bw(op, n)·S / B       e.g. all_reduce: 2(n-1)·α + 2(n-1)/n·S/B

with B the link's bandwidth per GPU per direction. So a fitted B *is* an asymptotic busbw, and α a
per-hop latency. Two fits, both weighted least squares on relative error (weights 1/t², so that
1 KiB and 16 MiB points count alike, where plain least squares would let the largest sizes decide
the intercept):
    per (op, group size, link)   t = a + b·S            -> α = a / c_lat, B = c_bw / b
    per link (intra, inter)      t = c_lat·α + c_bw·S/B  over every op and group size measured on it
The per-link fit is what `links` holds -- `parallel.cli.args.links_from_commbench` reads it, and
`python -m parallel plan --links FILE` predicts with it. The coefficients come from
parallel.core.comm.collective_seconds itself, so the fit follows the model if the model changes.

Pure: stdlib (and parallel's pure modules).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from parallel.core.comm import bus_factor, collective_seconds
from parallel.core.specs import Link

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
CSV_COLUMNS = (
    "op",
    "group_size",
    "link",
    "ranks",
    "bytes",
    "iters",
    "time_us",
    "time_max_us",
    "algbw_gbps",
    "busbw_gbps",
    "model_time_us",
)


def coefficients(op: str, n: int) -> tuple[float, float]:
    """(c_lat, c_bw) of the plan model: t = c_lat·α + c_bw·S/B (read off collective_seconds)."""
    c_lat = collective_seconds(op, n, 0.0, Link(1.0, 1.0))
    c_bw = collective_seconds(op, n, 1.0, Link(1.0, 0.0))
    return c_lat, c_bw


def bandwidths(op: str, n: int, nbytes: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests)."""
    alg = nbytes / seconds / 1e9 if seconds > 0 else math.nan
    return alg, alg * bus_factor(op, n)


def _wls(features: list[tuple[float, float]], t: list[float]) -> tuple[float, float]:
    """Weighted least squares (weights 1/t²) of t ≈ x0·p + x1·q; returns (p, q)."""
    s00 = s01 = s11 = r0 = r1 = 0.0
    for (x0, x1), y in zip(features, t):
        w = 1.0 / (y * y)
        s00, s01, s11 = s00 + w * x0 * x0, s01 + w * x0 * x1, s11 + w * x1 * x1
        r0, r1 = r0 + w * x0 * y, r1 + w * x1 * y
    det = s00 * s11 - s01 * s01
    if det <= 1e-12 * s00 * s11:  # one size only: no way to split latency from bandwidth
        return 0.0, r1 / s11 if s11 else 0.0
    return (r0 * s11 - r1 * s01) / det, (s00 * r1 - s01 * r0) / det


def _fit_nonneg(features, t) -> tuple[float, float]:
    """_wls with both parameters kept >= 0 (a negative one is fixed at 0 and the other refitted)."""
    p, q = _wls(features, t)
    if p < 0:
        p, q = 0.0, _wls([(0.0, x1) for _, x1 in features], t)[1]
    if q < 0:
        p, q = _wls([(x0, 0.0) for x0, _ in features], t)[0], 0.0
    return max(p, 0.0), max(q, 0.0)


def _rel_rmse(features, t, p, q) -> float:
    errs = [((x0 * p + x1 * q) - y) / y for (x0, x1), y in zip(features, t)]
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else math.nan


def fit_rows(rows: list[dict]) -> dict:
    """t = a + b·S for the rows of one (op, group size, link), as α and B of the plan model."""
    op, n = rows[0]["op"], rows[0]["group_size"]
    feats = [(1.0, float(r["bytes"])) for r in rows]
    t = [r["time_us"] * 1e-6 for r in rows]
    a, b = _fit_nonneg(feats, t)
    c_lat, c_bw = coefficients(op, n)
    return {
        "op": op,
        "group_size": n,
        "link": rows[0]["link"],
        "points": len(rows),
        "intercept_s": a,
        "slope_s_per_byte": b,
        "alpha_s": a / c_lat if c_lat else a,
        "bandwidth_bytes_per_s": c_bw / b if b > 0 else None,
        "rel_rmse": _rel_rmse(feats, t, a, b),
    }


def fit_link(rows: list[dict], *, name: str) -> dict:
    """One Link (α, B) for every row measured on it: t = c_lat·α + c_bw·S/B."""
    feats = [coefficients(r["op"], r["group_size"]) for r in rows]
    feats = [(c_lat, c_bw * r["bytes"]) for (c_lat, c_bw), r in zip(feats, rows)]
    t = [r["time_us"] * 1e-6 for r in rows]
    alpha, inv_b = _fit_nonneg(feats, t)
    return {
        "latency_s": alpha,
        "bandwidth_bytes_per_s": 1.0 / inv_b if inv_b > 0 else None,
        "name": name,
        "ops": sorted({r["op"] for r in rows}),
        "group_sizes": sorted({r["group_size"] for r in rows}),
        "points": len(rows),
        "rel_rmse": _rel_rmse(feats, t, alpha, inv_b),
    }


def fits(rows: list[dict], *, names: dict[str, str]) -> tuple[list[dict], dict]:
    """(per-(op, group, link) fits, links {intra|inter: Link fields}) of measured rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["group_size"], r["link"]), []).append(r)
    per = [
        fit_rows(g)
        for _, g in sorted(groups.items(), key=lambda kv: (OPS.index(kv[0][0]), kv[0][1], kv[0][2]))
        if len(g) >= 2
    ]
    links = {}
    for link in ("intra", "inter"):
        on = [r for r in rows if r["link"] == link]
        if len(on) >= 2:
            links[link] = fit_link(on, name=names.get(link, f"fitted {link}"))
    for r in rows:  # how well the link's one (α, B) reproduces each point
        fitted = links.get(r["link"])
        if fitted and fitted["bandwidth_bytes_per_s"]:
            sec = collective_seconds(
                r["op"], r["group_size"], r["bytes"], Link(fitted["bandwidth_bytes_per_s"], fitted["latency_s"])
            )
            r["model_time_us"] = sec * 1e6
    return per, links


def write_csv(path: Path, rows: list[dict]) -> None:
    """The measured rows as CSV (CSV_COLUMNS), written whole and renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    tmp.replace(path)


def parse_size(text: str) -> int:
    """'1KiB' -> 1024, '16MiB', '4MB' (1e6), '512' (bytes)."""
    units = {
        "": 1,
        "B": 1,
        "KIB": 1 << 10,
        "MIB": 1 << 20,
        "GIB": 1 << 30,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "K": 1 << 10,
        "M": 1 << 20,
        "G": 1 << 30,
    }
    s = text.strip().upper()
    num = s.rstrip("KMGIB")
    unit = s[len(num) :]
    if not num or unit not in units:
        raise ValueError(f"not a size: {text!r} (e.g. 1KiB, 16MiB, 4096)")
    return int(float(num) * units[unit])


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """'1KiB..16MiB' (every `factor`-fold step, both ends included) or '1KiB,64KiB,16MiB'."""
    if ".." in text:
        lo, hi = (parse_size(x) for x in text.split("..", 1))
        if lo < 1 or hi < lo or factor < 2:
            raise ValueError(f"--sizes {text!r}: need 1 <= low <= high (and --size-factor >= 2)")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    sizes = sorted({parse_size(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--sizes {text!r}: give sizes >= 1 byte, e.g. 1KiB..16MiB or 1KiB,64KiB")
    return sizes
