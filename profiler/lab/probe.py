"""Measures a running lab: raw TCP throughput and round trip between (or inside) its nodes, and gloo
all_reduce inside one node vs across the link, from a real 2-node torchrun job.

The drivers (`socket_throughput`, `socket_rtt`, `gloo_allreduce`) run as root beside the lab and start
this same file inside the namespaces in one of its worker modes:
    python -m profiler.lab.probe sink|source|echo|ping ...   # raw sockets (no torch)
    python -m profiler.lab.probe allreduce --sizes ... --out F  # a rank under torchrun
bench/lab_link.py prints all of it as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parallel.core.comm import bus_factor
from profiler.lab.settings import LabError, LabSettings

CHUNK = 4 * 2**20  # bytes per send/recv call: large enough that Python's loop costs nothing


def _start(lab: LabSettings, node: int, mode_args: list[str]) -> subprocess.Popen:
    argv = lab.node_command(node, [sys.executable, "-m", "profiler.lab.probe", *mode_args])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Waits for every process (killing all of them, process groups included, after `timeout_s`)."""
    deadline, outs = time.monotonic() + timeout_s, []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            if p.returncode:
                raise LabError(f"lab probe `{' '.join(p.args[-6:])}` exited {p.returncode}: {err.strip()[-2000:]}")
            outs.append(out)
    except subprocess.TimeoutExpired:
        raise LabError(f"lab probe did not finish within {timeout_s:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
    return outs


def _listening(lab: LabSettings, node: int, mode: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    p = _start(lab, node, [mode, "--bind", lab.nodes[node].address, *extra])
    ready, _, _ = select.select([p.stdout], [], [], 15.0)
    line = p.stdout.readline() if ready else ""  # "PORT n" once it listens
    if not line.startswith("PORT "):
        _finish([p], 5)
        raise LabError(f"lab probe {mode} on node {node} did not start")
    return p, int(line.split()[1])


def socket_throughput(lab: LabSettings, src: int, dst: int, nbytes: int = 64 * 2**20, timeout_s: float = 60) -> dict:
    """One TCP stream from node `src` to the address of node `dst` (src == dst: the local route)."""
    sink, port = _listening(lab, dst, "sink", [])
    source = _start(lab, src, ["source", "--to", f"{lab.nodes[dst].address}:{port}", "--bytes", str(nbytes)])
    sink_out, _ = _finish([sink, source], timeout_s)
    got = json.loads(sink_out.strip().splitlines()[-1])
    return {"src": src, "dst": dst, **got, "bytes_per_s": got["bytes"] / got["seconds"]}


def socket_rtt(lab: LabSettings, src: int, dst: int, iters: int = 500, timeout_s: float = 30) -> dict:
    """Median round trip of a 1-byte TCP ping-pong (TCP_NODELAY) from `src` to `dst`."""
    echo, port = _listening(lab, dst, "echo", [])
    ping = _start(lab, src, ["ping", "--to", f"{lab.nodes[dst].address}:{port}", "--iters", str(iters)])
    _, ping_out = _finish([echo, ping], timeout_s)
    return {"src": src, "dst": dst, **json.loads(ping_out.strip().splitlines()[-1])}


def gloo_allreduce(
    lab: LabSettings, sizes: list[int], *, nproc_per_node: int = 2, iters: int = 5, timeout_s: float = 180
) -> dict:
    """A 2-node torchrun job (nproc_per_node ranks per node) timing all_reduce on a group inside node
    0, on a pair across the link, and on the whole world. Returns rank 0's report: per (kind, bytes)
    the slowest member's median time, busbw, and `link_bytes`, the bytes the node's veth carried
    during one op (≈ 0 inside a node proves that traffic took the loopback path)."""
    port = lab.free_port(0)
    with tempfile.TemporaryDirectory(prefix="parascope-lab-probe-") as tmp:
        out = Path(tmp) / "allreduce.json"
        argv = [
            "-m",
            "profiler.lab.probe",
            "allreduce",
            "--sizes",
            ",".join(map(str, sizes)),
            "--iters",
            str(iters),
            "--out",
            str(out),
        ]
        procs = [
            subprocess.Popen(
                lab.torchrun_command(
                    node,
                    nproc_per_node,
                    argv,
                    port=port,
                    launcher_args=["--max-restarts", "0"],
                    env={"OMP_NUM_THREADS": "1"},
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for node in (0, 1)
        ]
        _finish(procs, timeout_s)
        return json.loads(out.read_text())


# ---- worker modes (run inside a namespace) ----


def _serve(bind: str) -> socket.socket:
    srv = socket.create_server((bind, 0))
    print(f"PORT {srv.getsockname()[1]}", flush=True)
    srv.settimeout(30)
    return srv


def _connect(to: str) -> socket.socket:
    host, port = to.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _sink(args) -> None:
    conn, _ = _serve(args.bind).accept()
    buf, total, t0 = bytearray(CHUNK), 0, None
    while n := conn.recv_into(buf):
        t0 = t0 or time.perf_counter()  # from the first byte: excludes connection set-up
        total += n
    print(json.dumps({"bytes": total, "seconds": time.perf_counter() - t0}))


def _source(args) -> None:
    with _connect(args.to) as s:
        data, left = memoryview(bytes(CHUNK)), args.bytes
        while left > 0:
            s.sendall(data[: min(left, CHUNK)])
            left -= CHUNK


def _echo(args) -> None:
    conn, _ = _serve(args.bind).accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while b := conn.recv(1):
        conn.sendall(b)


def _ping(args) -> None:
    with _connect(args.to) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            s.sendall(b"x")
            s.recv(1)
            rtts.append(time.perf_counter() - t0)
    print(json.dumps({"rtt_s": statistics.median(rtts), "iters": args.iters}))


def _allreduce(args) -> None:
    # lazy: torch (2 s) in the allreduce mode only; the socket modes and the root-side drivers run without it
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = [None] * world
    dist.all_gather_object(nodes, int(os.environ["PARASCOPE_LAB_NODE"]))
    on = {n: [r for r in range(world) if nodes[r] == n] for n in (0, 1)}
    groups = {"intra": on[0], "inter": [on[0][0], on[1][0]], "world": list(range(world))}
    handles = {k: dist.new_group(v) for k, v in groups.items()}  # every rank creates every group
    stats = Path("/sys/class/net") / os.environ["GLOO_SOCKET_IFNAME"] / "statistics"  # this namespace's /sys

    def link_bytes() -> int:  # both directions of this node's veth: what crossed the shaped link
        return sum(int((stats / f).read_text()) for f in ("tx_bytes", "rx_bytes"))

    rows = []
    for size in args.sizes:
        x = torch.ones(size // 4)  # fp32
        for kind, ranks in groups.items():
            times, crossed = [], []
            for _ in range(args.iters + 1):  # the first is a warm-up
                dist.barrier()
                if rank in ranks:
                    b0, t0 = link_bytes(), time.perf_counter()
                    dist.all_reduce(x, group=handles[kind])
                    times.append(time.perf_counter() - t0)
                    crossed.append(link_bytes() - b0)
            t = statistics.median(times[1:]) if times else None
            n = len(ranks)
            rows.append(
                {
                    "kind": kind,
                    "ranks": ranks,
                    "bytes": size,
                    "time_s": t,
                    "link_bytes": statistics.median(crossed[1:]) if crossed else None,
                    # nccl-tests conventions: algbw = bytes / time, busbw = algbw * bus factor
                    "algbw_bytes_per_s": size / t if t else None,
                    "busbw_bytes_per_s": size / t * bus_factor("all_reduce", n) if t else None,
                }
            )
    reports = [None] * world
    dist.all_gather_object(reports, rows)
    if rank == 0:
        merged = []
        for i, row in enumerate(rows):  # the slowest rank of each group is the collective's time
            times = [rep[i]["time_s"] for rep in reports if rep[i]["time_s"] is not None]
            n, t = len(row["ranks"]), max(times)
            crossed = [rep[i]["link_bytes"] for rep in reports if rep[i]["link_bytes"] is not None]
            merged.append(
                {
                    **row,
                    "time_s": t,
                    "link_bytes": max(crossed),
                    "algbw_bytes_per_s": row["bytes"] / t,
                    "busbw_bytes_per_s": row["bytes"] / t * bus_factor("all_reduce", n),
                }
            )
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps({"nodes": nodes, "world_size": world, "rows": merged}, indent=2))
        tmp.replace(args.out)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiler.lab.probe")
    sub = p.add_subparsers(dest="mode", required=True)
    for mode in ("sink", "echo"):
        sub.add_parser(mode).add_argument("--bind", required=True)
    src = sub.add_parser("source")
    src.add_argument("--to", required=True)
    src.add_argument("--bytes", type=int, required=True)
    ping = sub.add_parser("ping")
    ping.add_argument("--to", required=True)
    ping.add_argument("--iters", type=int, default=500)
    ar = sub.add_parser("allreduce")
    ar.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
    ar.add_argument("--iters", type=int, default=5)
    ar.add_argument("--out", required=True)
    args = p.parse_args(argv)
    {"sink": _sink, "source": _source, "echo": _echo, "ping": _ping, "allreduce": _allreduce}[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
