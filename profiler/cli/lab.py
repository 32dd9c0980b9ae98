"""`python -m profiler lab up|down|status`: argument parsing and printing for profiler/lab/settings.py.

Exit codes: 0 done (status: the lab is up); 1 an operation failed (status: half-built or crashed);
2 the lab cannot run here (not root, iproute2 missing, no netem for --latency-us) or bad
arguments; 3 status: the lab is down.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from collections.abc import Sequence

from parallel.cli.dispatch import prog_name
from profiler.lab import settings as lab

_BW = re.compile(
    r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<mult>[kKmMgGtT]?)(?P<bin>i?)"
    r"(?P<unit>bit|Bit|bps|B|b)(?:/s)?"
)


def parse_bandwidth(text: str) -> float:
    """ "1gbit", "10Gbit/s", "25Gbps", "100Gb/s" (bits) or "2.5GB/s", "250MB/s", "1.5GiB/s" (bytes) →
    bytes per second. The unit is required: "B" is bytes, "b"/"bit"/"bps" bits, as tc and datasheets use them."""
    m = _BW.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: give a bandwidth with its unit, e.g. 1gbit, 10Gbit/s, 2.5GB/s")
    scale = (1024 if m["bin"] else 1000) ** ("kmgt".index(m["mult"].lower()) + 1) if m["mult"] else 1
    value = float(m["num"]) * scale / (1 if m["unit"] == "B" else 8)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: bandwidth must be > 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("python -m profiler lab"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Two test nodes on this machine: network namespaces joined by a veth pair whose link is "
        "shaped with tc, so ranks on one node talk over loopback and ranks on different nodes "
        "cross a slow link. Needs root.",
        epilog=__doc__.split("\n\n")[1],
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--prefix",
        default=lab.DEFAULT_PREFIX,
        help="name prefix of the lab's namespaces and links (default %(default)s)",
    )
    u = sub.add_parser("up", parents=[common], help="build the two-node lab")
    u.add_argument(
        "--like",
        default=None,
        choices=list(lab.CLUSTERS),
        metavar="CLUSTER",
        help=f"shape the link so inter/intra mimics a preset cluster ({', '.join(lab.CLUSTERS)}); "
        f"the default when neither --bw nor --like is given is {lab.DEFAULT_LIKE}",
    )
    u.add_argument(
        "--bw", type=parse_bandwidth, default=None, help="inter-node bandwidth each way, e.g. 1gbit, 2.5GB/s"
    )
    u.add_argument("--latency-us", type=float, default=None, help="one-way latency added to the link, µs (needs netem)")
    u.add_argument(
        "--loopback-bw",
        type=parse_bandwidth,
        default=None,
        help="this machine's intra-node (gloo over loopback) bandwidth that --like scales "
        f"(default {lab.LOOPBACK.bandwidth_bytes_per_s / 2**30:.2f} GiB/s, the local-cpu preset)",
    )
    u.add_argument("--subnet", default=lab.DEFAULT_SUBNET, help="private IPv4 network for the veth pair (%(default)s)")
    u.add_argument("--replace", action="store_true", help="rebuild a lab that is already up")
    u.add_argument("--json", action="store_true", help="print the settings as JSON")
    d = sub.add_parser("down", parents=[common], help="remove the lab (idempotent)")
    d.add_argument("--json", action="store_true")
    s = sub.add_parser("status", parents=[common], help="show the lab: up, down, or half-built")
    s.add_argument("--json", action="store_true", help="machine-readable status")
    return p


def _up(args) -> tuple[lab.LabSettings, list[str]]:
    like = None
    bw, latency = args.bw, args.latency_us * 1e-6 if args.latency_us is not None else None
    if args.like or bw is None:
        like_bw, like_latency, like = lab.like_defaults(args.like or lab.DEFAULT_LIKE, args.loopback_bw)
        bw = bw if bw is not None else like_bw
        latency_required = latency is not None and latency > 0
        latency = latency if latency is not None else like_latency
    else:
        latency_required, latency = (latency or 0) > 0, latency or 0.0
    return lab.up(
        bandwidth_bytes_per_s=bw,
        latency_s=latency,
        latency_required=latency_required,
        like=like,
        subnet=args.subnet,
        prefix=args.prefix,
        replace=args.replace,
    )


def describe(st: dict) -> str:
    """status() as a few lines a person reads."""
    lines = [f"lab {st['prefix']}: {st['state']}"]
    s = st["settings"]
    if s:
        bw = s["bandwidth_bytes_per_s"]
        lat = f"+{s['latency_s'] * 1e6:.0f} µs"
        if s["latency_requested_s"] != s["latency_s"]:
            lat += f" ({s['latency_requested_s'] * 1e6:.0f} µs asked; no netem in this kernel)"
        like = s.get("like")
        like = f", like {like['cluster']} (intra/inter {like['intra_inter_ratio']:.1f}×)" if like else ""
        lines.append(f"  link: {bw / 2**20:,.0f} MiB/s = {bw * 8 / 1e9:.2f} Gbit/s each way, latency {lat}{like}")
    for ns, info in st["namespaces"].items():
        for dev, link in info["links"].items():
            if dev == "lo":
                continue
            qd = " ".join(q["kind"] for q in link["qdiscs"]) or "no qdisc"
            lines.append(
                f"  {ns:<16} {dev:<16} {' '.join(link['addresses']) or '-':<16} {'up' if link['up'] else 'DOWN'}  {qd}"
            )
            lines += [f"  {'':<16} {c}" for c in link.get("classes", [])]
        if info["pids"]:
            lines.append(f"  {ns:<16} processes: {' '.join(map(str, info['pids']))}")
    lines += [f"  problem: {p}" for p in st["problems"]]
    if st["state"] == "partial":
        lines.append("  `python -m profiler lab down` removes all of it")
    lines.append(f"  settings: {st['settings_file']}" + ("" if s else " (none)"))
    return "\n".join(lines)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)  # so `up` removes what it built when it is terminated


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    why = lab.missing_privilege()
    if why:
        print(f"lab {args.cmd}: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        if args.cmd == "up":
            settings, notes = _up(args)
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            st = lab.status(args.prefix)
            print(json.dumps(settings.to_dict(), indent=2) if args.json else describe(st))
            return 0 if st["state"] == "up" else 1
        if args.cmd == "down":
            done = lab.down(args.prefix)
            print(
                json.dumps({"done": done}) if args.json else "\n".join(done) or f"lab {args.prefix}: nothing to remove"
            )
            return 0
        st = lab.status(args.prefix)
        print(json.dumps(st, indent=2) if args.json else describe(st))
        return {"up": 0, "partial": 1, "down": 3}[st["state"]]
    except lab.LabUnsupported as err:
        print(f"lab {args.cmd}: {err}", file=sys.stderr)
        return 2
    except lab.LabError as err:
        print(f"lab {args.cmd}: {err}", file=sys.stderr)
        return 1
