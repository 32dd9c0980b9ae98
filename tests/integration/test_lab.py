"""The two-node lab: CLI round trips leave the machine as it was, clean-up after crashes,
the no-root path, and a real 2-node × 2-rank gloo job whose inter-node all_reduce is slower than
its intra-node one.

Tests that build labs need root (CI runs as root) and skip otherwise. Each uses its own prefix, and
they take a machine-wide lock, so two pytest-xdist workers never build labs at the same time (the
before/after snapshots compare the whole machine's namespaces, links and qdiscs).
"""

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler.cli.lab import parse_bandwidth
from profiler.lab import net as lab_net
from profiler.lab import probe as lab_probe
from profiler.lab import settings as lab

ROOT = Path(__file__).resolve().parents[2]
CAN_BUILD = lab.missing_privilege()
needs_root = pytest.mark.skipif(CAN_BUILD is not None, reason=f"builds a lab: {CAN_BUILD}")


def without_caps() -> list[str]:
    """A prefix that runs a command with no capabilities, as an unprivileged user has: as root, setpriv
    empties the bounding set (the uid stays 0, so a checkout only root may read still imports)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to drop root's capabilities for this test")
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


def cli(*args, prefix=None, run_as=(), env=None, timeout=60) -> subprocess.CompletedProcess:
    argv = [*run_as, sys.executable, "-m", "profiler", "lab", *args, *(["--prefix", prefix] if prefix else [])]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


# ---- pure: parsing, defaults, commands ----


@pytest.mark.parametrize(
    "text, bytes_per_s",
    [
        ("1gbit", 125e6),
        ("1Gbit/s", 125e6),
        ("25Gbps", 25e9 / 8),
        ("100Gb/s", 12.5e9),
        ("800mbit", 100e6),
        ("2.5GB/s", 2.5e9),
        ("250MB/s", 250e6),
        ("1GiB/s", 2**30),
        ("512KiB/s", 2**19),
        ("1e3B/s", 1e3),
    ],
)
def test_parse_bandwidth(text, bytes_per_s):
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text", ["12", "fast", "1 gigabit", "-1gbit", "0gbit", "1gbit/h"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bandwidth(text)


def test_like_keeps_the_presets_ratio():
    bw, latency, like = lab.like_defaults("dgx-h100", loopback_bytes_per_s=9e9)
    assert (bw, like["intra_inter_ratio"]) == (pytest.approx(1e9), pytest.approx(9.0))  # NVLink4 450 / NDR 50
    assert latency == pytest.approx(lab.LOOPBACK.latency_s * (8 / 3 - 1))
    bw, _, _ = lab.like_defaults("local-cpu")  # the preset that describes the lab itself: ~1 Gbit/s
    assert bw == pytest.approx(lab.CLUSTERS["local-cpu"].inter.bandwidth_bytes_per_s)
    with pytest.raises(lab.LabError, match="unknown cluster preset"):
        lab.like_defaults("dgx-z9")


@pytest.mark.parametrize("prefix", ["", "eth", "psl", "vethpsl-", "psl-node-", "PSL-", "psl_x-"])
def test_prefix_guards_clean_up(prefix):
    with pytest.raises(lab.LabError, match="prefix"):
        lab.down(prefix)


@pytest.mark.parametrize(
    "subnet, ok",
    [
        ("10.213.0.0/30", True),
        ("192.168.77.0/24", True),
        ("8.8.8.0/30", False),
        ("10.0.0.1/32", False),
        ("fd00::/64", False),
        ("10.0.0.8/29", False),
    ],
)
def test_lab_addresses(subnet, ok):
    if ok:
        (a, b), prefixlen = lab.lab_addresses(subnet)
        assert a != b and prefixlen == int(subnet.split("/")[1])
    else:
        with pytest.raises(lab.LabError, match="private IPv4|sort as text"):
            lab.lab_addresses(subnet)


def test_shaping_commands():
    """HTB at the rate, small TCP packets (ACKs) in their own class first, bulk in the default class;
    the leaves are byte FIFOs, or netem delays when a latency is asked for."""
    kw = dict(rate_bytes_per_s=125e6, burst_bytes=65536, limit_bytes=4 << 20)
    plain = lab_net.shaping_commands("psl-node0", "psl-veth0", latency_s=0, **kw)
    assert all(c[:3] == ["tc", "-n", "psl-node0"] and "psl-veth0" in c for c in plain)
    assert plain[0][-6:] == ["root", "handle", "1:", "htb", "default", "20"]
    parent = plain[1]
    assert parent[parent.index("classid") + 1] == "1:1"
    assert parent[parent.index("rate") + 1] == parent[parent.index("ceil") + 1] == "1000000000bit"
    assert [c[c.index("prio") + 1] for c in plain[2:4]] == ["0", "1"]  # 1:10 (small packets) before 1:20
    assert plain[4][-6:] == ["1:10", "handle", "10:", "bfifo", "limit", str(4 << 20)]
    assert plain[6][-2:] == ["flowid", "1:10"] and "u32" in plain[6]
    delayed = lab_net.shaping_commands("psl-node0", "psl-veth0", latency_s=50e-6, **kw)
    assert delayed[:4] == plain[:4] and delayed[6] == plain[6]
    for leaf in delayed[4:6]:
        assert leaf[leaf.index("netem") :] == ["netem", "delay", "50us", "limit", "100000"]


def _settings(prefix="psl-") -> lab.LabSettings:
    names = lab_net.Names(prefix)
    nodes = tuple(
        lab.LabNode(i, ns, dev, f"10.213.0.{i + 1}")
        for i, (ns, dev) in enumerate(zip(names.namespaces, names.interfaces))
    )
    return lab.LabSettings(
        prefix=prefix,
        nodes=nodes,
        prefixlen=30,
        bandwidth_bytes_per_s=125e6,
        latency_s=0.0,
        latency_requested_s=0.0,
        burst_bytes=65536,
        limit_bytes=4 << 20,
    )


def test_settings_round_trip_and_commands():
    s = _settings()
    assert lab.LabSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    cmd = s.node_command(1, ["python", "x.py"], {"A": "1"})
    assert cmd[:5] == ["ip", "netns", "exec", "psl-node1", "env"] and cmd[-2:] == ["python", "x.py"]
    assert {"GLOO_SOCKET_IFNAME=psl-veth1", "PARASCOPE_LAB_NODE=1", "A=1"} <= set(cmd)
    run0, run1 = (s.torchrun_command(n, 2, ["-m", "job"], port=29411) for n in (0, 1))
    for run, host in ((run0, "true"), (run1, "false")):
        assert run[run.index("--rdzv-endpoint") + 1] == "10.213.0.1:29411"
        assert run[run.index("--rdzv-conf") + 1] == f"is_host={host}"
    assert run1[run1.index("--local-addr") + 1] == "10.213.0.2"
    assert s.inter_link().bandwidth_bytes_per_s == 125e6
    with pytest.raises(lab.LabError, match="nodes 0 and 1"):
        s.node_command(2, ["true"])


# ---- without the privilege: a clear message and exit 2 ----


@pytest.mark.parametrize("args", [("up", "--bw", "1gbit"), ("down",), ("status",), ("status", "--json")])
def test_without_root_every_command_says_so(args):
    done = cli(*args, run_as=without_caps())
    assert done.returncode == 2, done.stderr
    assert "needs root" in done.stderr and "CAP_NET_ADMIN" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_iproute2_names_the_package():
    done = cli("status", env={**os.environ, "PATH": "/nonexistent"})
    assert done.returncode == 2 and "iproute2" in done.stderr


# ---- with root: real labs ----


@contextlib.contextmanager
def holding_lab_lock():
    """Machine-wide: one lab-building test at a time (an abstract socket; the kernel frees it on exit)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 600
    while True:
        try:
            sock.bind("\0parascope-lab-tests")
            break
        except OSError:
            assert time.monotonic() < deadline, "another test run held the lab lock for 10 minutes"
            time.sleep(0.2)
    try:
        yield
    finally:
        sock.close()


@pytest.fixture
def lab_lock():
    with holding_lab_lock():
        yield


def machine() -> dict:
    """What a lab may change: namespaces, and the root namespace's links and qdiscs."""
    run = lambda *a: subprocess.run(a, capture_output=True, text=True, timeout=10, check=True).stdout  # noqa: E731
    links = [line.split()[0] for line in run("ip", "-br", "link").splitlines()]
    return {"netns": run("ip", "netns", "list"), "links": links, "qdiscs": run("tc", "qdisc", "show")}


@pytest.fixture
def prefix(lab_lock):
    """A fresh prefix; whatever the test leaves, the finaliser removes, then checks the machine is as it was."""
    p = f"pslt{os.getpid() % 0xFFFF:04x}-"
    lab.down(p)
    before = machine()
    yield p
    lab.down(p)
    assert machine() == before
    assert not lab.settings_path(p).exists()


@needs_root
def test_cli_round_trip_leaves_nothing_behind(prefix):
    before = machine()
    up = cli("up", "--bw", "1gbit", prefix=prefix)
    assert up.returncode == 0, up.stderr
    st = json.loads(cli("status", "--json", prefix=prefix).stdout)
    assert st["state"] == "up" and st["problems"] == []
    s = st["settings"]
    assert s["bandwidth_bytes_per_s"] == 125e6 and [n["address"] for n in s["nodes"]] == ["10.213.0.1", "10.213.0.2"]
    for node in s["nodes"]:
        link = st["namespaces"][node["namespace"]]["links"][node["interface"]]
        assert link["addresses"] == [f"{node['address']}/30"] and link["up"]
        assert [q["kind"] for q in link["qdiscs"]] == ["htb", "bfifo", "bfifo"]
        assert any(c.startswith("class htb 1:1 root rate 1Gbit ceil 1Gbit") for c in link["classes"])
        every = lab_net.sh(["ip", "-j", "-n", node["namespace"], "addr", "show", "dev", node["interface"]]).stdout
        assert [a["local"] for a in json.loads(every)[0]["addr_info"]] == [node["address"]]  # no IPv6 link-local
    assert machine()["links"] == before["links"]  # nothing new in the root namespace, only namespaces
    assert cli("up", "--bw", "1gbit", prefix=prefix).returncode == 1  # already up
    assert cli("up", "--like", "dgx-a100", "--replace", prefix=prefix).returncode == 0
    assert lab.settings(prefix).like["cluster"] == "dgx-a100"
    assert cli("down", prefix=prefix).returncode == 0
    assert machine() == before
    assert cli("status", prefix=prefix).returncode == 3
    assert cli("down", prefix=prefix).returncode == 0  # idempotent


@needs_root
def test_down_after_a_crash_half_built_lab_and_orphan_process(prefix):
    before = machine()
    ns0 = lab_net.Names(prefix).namespaces[0]
    lab_net.sh(["ip", "netns", "add", ns0])  # a crashed `up`: one namespace, a veth left in the root
    lab_net.sh(["ip", "link", "add", f"{prefix}veth0", "type", "veth", "peer", "name", f"{prefix}veth1"])
    orphan = subprocess.Popen(["ip", "netns", "exec", ns0, "sleep", "300"])  # a rank that outlived its job
    try:
        for _ in range(50):
            if lab_net.pids_in(ns0):
                break
            time.sleep(0.05)
        st = lab.status(prefix)
        assert st["state"] == "partial" and st["namespaces"][ns0]["pids"] == [orphan.pid]
        assert any("missing" in p for p in st["problems"]) and any("stray link" in p for p in st["problems"])
        assert cli("status", prefix=prefix).returncode == 1
        done = cli("down", prefix=prefix)
        assert done.returncode == 0 and f"pid {orphan.pid}" in done.stdout
        assert orphan.wait(10) is not None
    finally:
        if orphan.poll() is None:
            orphan.kill()
    assert machine() == before and lab.status(prefix)["state"] == "down"


@needs_root
def test_up_clears_what_a_crash_left(prefix):
    ns1 = lab_net.Names(prefix).namespaces[1]
    lab_net.sh(["ip", "netns", "add", ns1])
    path = lab.settings_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(f".{path.name}.999.tmp").write_text("{")  # a settings write cut short
    with pytest.raises(lab.LabError, match="not up|gone"):
        lab.settings(prefix)
    s, notes = lab.up(bandwidth_bytes_per_s=125e6, prefix=prefix)
    assert f"deleted namespace {ns1}" in notes and lab.status(prefix)["state"] == "up"
    assert lab.settings(prefix) == s
    assert any(".tmp" in line for line in lab.down(prefix))


@needs_root
def test_up_is_all_or_nothing(prefix, monkeypatch):
    before = machine()
    real = lab.create

    def create_then_crash(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # Ctrl-C after the kernel objects exist, before settings are written

    monkeypatch.setattr(lab, "create", create_then_crash)
    with pytest.raises(KeyboardInterrupt):
        lab.up(bandwidth_bytes_per_s=125e6, prefix=prefix)
    assert machine() == before and not lab.settings_path(prefix).exists()


@needs_root
def test_labs_with_other_prefixes_are_left_alone(prefix):
    other = prefix.replace("pslt", "pslu")
    try:
        lab.up(bandwidth_bytes_per_s=125e6, prefix=prefix)
        lab.up(bandwidth_bytes_per_s=250e6, prefix=other)  # same subnet: it lives in other namespaces
        lab.down(prefix)
        assert lab.status(other)["state"] == "up" and lab.status(prefix)["state"] == "down"
    finally:
        lab.down(other)


SHAPED_RATE = 31.25e6  # bytes/s = 0.25 Gbit/s


def best_of(measure, tries: int = 3):
    """The highest of `tries` measurements: the measurement is retried (a busy machine only ever
    slows a transfer down), the assertion made once on what the best of them shows."""
    return max(measure() for _ in range(tries))


def check_shaped_link(prefix: str, rate: float = SHAPED_RATE) -> None:
    """What the shaped link guarantees, whatever else the machine runs: no transfer across it beats its
    rate (the bucket's burst aside), and an all_reduce of S bytes between the two nodes moves at least
    S bytes each way across it (each node needs the other's contribution to every element), so it takes
    at least S / rate. Loopback inside a node never touches the link. Sizes are large enough (8 MiB:
    0.27 s at the rate) that scheduling noise of a loaded machine cannot reach the bound."""
    s, _ = lab.up(bandwidth_bytes_per_s=rate, prefix=prefix)
    burst, _ = lab.shaper_sizes(rate)
    nbytes = 8 * 2**20
    across = best_of(lambda: lab_probe.socket_throughput(s, 1, 0, nbytes=nbytes)["bytes_per_s"])
    assert across < 1.15 * rate * (1 + burst / nbytes), across  # the shaper counts headers too: ~0.95 of it
    local = best_of(lambda: lab_probe.socket_throughput(s, 0, 0, nbytes=4 * nbytes)["bytes_per_s"])
    assert local > across, (local, across)
    report = lab_probe.gloo_allreduce(s, [nbytes], iters=3)
    assert report["nodes"] == [0, 0, 1, 1]  # ranks follow the lab nodes (see LabSettings.torchrun_command)
    rows = {row["kind"]: row for row in report["rows"]}
    assert rows["intra"]["link_bytes"] < 0.01 * nbytes  # loopback path: only stray barrier bytes
    assert rows["inter"]["link_bytes"] > nbytes  # each member sends and receives ~size
    assert rows["inter"]["time_s"] >= (nbytes - burst) / (1.15 * rate), rows  # the rate bounds the transfer
    assert rows["inter"]["time_s"] > rows["intra"]["time_s"], rows


@pytest.mark.slow
@needs_root
def test_inter_node_link_is_shaped_and_slower_than_intra(prefix):
    """Raw TCP across the link runs at most at the shaped rate, the local route faster; in a real
    2-node × 2-rank torchrun/gloo job, all_reduce inside a node never touches the veth, and across it
    takes at least its bytes over the rate (check_shaped_link)."""
    check_shaped_link(prefix)
