"""Measures the two-node lab: raw TCP across the shaped link and on one node's local route,
1-byte round trips, and gloo all_reduce inside one node vs across the link from a real 2-node × 2-rank
torchrun job (with the bytes the veth carried per op, which shows which path each took).

    sudo .venv/bin/python -m bench.lab_link                  # on the lab that is up (`profiler lab up`)
    sudo .venv/bin/python -m bench.lab_link --bw 1gbit       # builds a lab of its own, then removes it

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import sys
from pathlib import Path

from profiler.cli.lab import parse_bandwidth
from profiler.lab import probe as lab_probe
from profiler.lab import settings as lab

MiB = 2**20


def measure(s: lab.LabSettings, sizes: list[int], iters: int) -> dict:
    out = {"settings": s.to_dict(), "socket": [], "rtt": []}
    for src, dst, nbytes in ((1, 0, 64 * MiB), (0, 1, 64 * MiB), (0, 0, 256 * MiB)):
        out["socket"].append(lab_probe.socket_throughput(s, src, dst, nbytes=nbytes))
    for src, dst in ((1, 0), (0, 0)):
        out["rtt"].append(lab_probe.socket_rtt(s, src, dst))
    out["gloo"] = lab_probe.gloo_allreduce(s, sizes, iters=iters)
    return out


def report(m: dict) -> str:
    s = m["settings"]
    lines = [
        f"lab {s['prefix']}: shaped to {s['bandwidth_bytes_per_s'] / MiB:,.0f} MiB/s "
        f"({s['bandwidth_bytes_per_s'] * 8 / 1e9:.2f} Gbit/s) each way, +{s['latency_s'] * 1e6:.0f} µs",
        "",
        "raw TCP (one stream)             MiB/s",
    ]
    for r in m["socket"]:
        path = "node0 local route" if r["src"] == r["dst"] else f"node{r['src']} -> node{r['dst']} (link)"
        lines.append(f"  {path:<30} {r['bytes_per_s'] / MiB:>7,.0f}")
    lines += ["", "1-byte TCP round trip            µs"]
    for r in m["rtt"]:
        path = "node0 local route" if r["src"] == r["dst"] else f"node{r['src']} <-> node{r['dst']} (link)"
        lines.append(f"  {path:<30} {r['rtt_s'] * 1e6:>7.0f}")
    lines += [
        "",
        f"gloo all_reduce, 2 nodes x 2 ranks (nodes by rank: {m['gloo']['nodes']})",
        f"  {'group':<22} {'MiB':>6} {'ms':>8} {'busbw MiB/s':>12} {'veth bytes/op':>14}",
    ]
    for r in m["gloo"]["rows"]:
        group = f"{r['kind']} {r['ranks']}"
        lines.append(
            f"  {group:<22} {r['bytes'] / MiB:>6g} {r['time_s'] * 1e3:>8.1f} "
            f"{r['busbw_bytes_per_s'] / MiB:>12,.0f} {r['link_bytes']:>14,.0f}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bw", type=parse_bandwidth, help="build a temporary lab with this link bandwidth")
    p.add_argument("--prefix", default=lab.DEFAULT_PREFIX, help="the lab to measure (default %(default)s)")
    p.add_argument("--sizes-mib", default="0.25,1,4,16", help="all_reduce sizes in MiB (%(default)s)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args()
    why = lab.missing_privilege()
    if why:
        print(why, file=sys.stderr)
        return 2
    sizes = [int(float(x) * MiB) for x in args.sizes_mib.split(",")]
    prefix = "pslb-" if args.bw else args.prefix
    try:
        s = lab.up(bandwidth_bytes_per_s=args.bw, prefix=prefix)[0] if args.bw else lab.settings(prefix)
        m = measure(s, sizes, args.iters)
    finally:
        if args.bw:
            lab.down(prefix)
    print(report(m))
    if args.json:
        args.json.write_text(json.dumps(m, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
