"""The lab's plumbing: `ip` and `tc` calls that build, inspect and remove two network namespaces
joined by a shaped veth pair. No policy here (see profiler/lab/settings.py for settings, CLI and API).

Every name this module creates or deletes starts with the lab's prefix (`psl-` by default), and the
prefix itself is checked, so nothing else on the machine is ever a target. Every subprocess has a
timeout. Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (`ip netns add` mounts under /run/netns).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

TIMEOUT_S = 10.0  # any single ip/tc call; they take milliseconds
PREFIX_RE = re.compile(r"^psl[a-z0-9]{0,5}-$")  # "psl-", "pslt3f2a-": at most 9 chars, so "<prefix>veth0" fits IFNAMSIZ
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # linux/capability.h


class LabError(RuntimeError):
    """A lab operation that cannot go on; the message says what to do."""


class LabUnsupported(LabError):
    """The lab cannot run here as asked: not root, iproute2 missing, a qdisc the kernel lacks."""


@dataclass(frozen=True)
class Names:
    """Every kernel object of one lab, derived from its prefix."""

    prefix: str

    def __post_init__(self):
        if not isinstance(self.prefix, str) or not PREFIX_RE.fullmatch(self.prefix):
            raise LabError(
                f"lab prefix {self.prefix!r} must match {PREFIX_RE.pattern} "
                "(it guards clean-up: only names starting with it are ever deleted)"
            )

    @property
    def namespaces(self) -> tuple[str, str]:
        return f"{self.prefix}node0", f"{self.prefix}node1"

    @property
    def interfaces(self) -> tuple[str, str]:
        return f"{self.prefix}veth0", f"{self.prefix}veth1"


def missing_privilege() -> str | None:
    """Why this process cannot build a lab, or None when it can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install the Debian package iproute2 (apt-get install iproute2)"
    try:
        with open("/proc/self/status") as f:
            caps = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration, ValueError):
        caps = -1 if os.geteuid() == 0 else 0
    lacking = [
        name
        for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
        if not caps >> bit & 1
    ]
    if lacking:
        return (
            f"the lab needs root: creating network namespaces and shaping links with tc takes "
            f"{' and '.join(lacking)}, which this process (uid {os.geteuid()}) lacks. "
            + (
                "Run it as root, e.g. `sudo .venv/bin/python -m profiler lab up`."
                if os.geteuid() != 0
                else "Root here has had them dropped (a container?): start it with --cap-add NET_ADMIN "
                "--cap-add SYS_ADMIN, or --privileged."
            )
        )
    return None


def sh(argv: list[str], *, timeout: float = TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    """Runs one command with a timeout; failures become a LabError quoting the command and stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LabUnsupported(f"`{argv[0]}` not found: install the Debian package iproute2") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if check and done.returncode:
        raise LabError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _json(argv: list[str]) -> list:
    out = sh(argv).stdout.strip()
    return json.loads(out) if out else []


def namespaces_with(prefix: str) -> list[str]:
    return [n["name"] for n in _json(["ip", "-j", "netns", "list"]) if n["name"].startswith(prefix)]


def root_links_with(prefix: str) -> list[str]:
    """Links in the root namespace carrying the prefix: only a crash of an older `up` leaves any."""
    return [link["ifname"] for link in _json(["ip", "-j", "link", "show"]) if link["ifname"].startswith(prefix)]


def pids_in(namespace: str) -> list[int]:
    out = sh(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def inspect_namespace(namespace: str) -> dict:
    """Links (state, addresses) and qdiscs inside one namespace, plus the processes running in it."""
    links = {}
    for link in _json(["ip", "-j", "-n", namespace, "addr", "show"]):
        links[link["ifname"]] = {
            "up": "UP" in link.get("flags", []),
            "addresses": [
                f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"
            ],
            "qdiscs": [],
        }
    for q in _json(["tc", "-j", "-n", namespace, "qdisc", "show"]):
        if q.get("dev") in links and q.get("kind") not in ("noqueue",):
            links[q["dev"]]["qdiscs"].append(
                {k: q[k] for k in ("kind", "handle", "parent", "root", "options") if k in q}
            )
    for dev, link in links.items():  # tc has no JSON for htb classes: keep its lines
        if link["qdiscs"]:
            out = sh(["tc", "-n", namespace, "class", "show", "dev", dev]).stdout
            link["classes"] = sorted(line.strip() for line in out.splitlines() if line.strip())
    return {"links": links, "pids": pids_in(namespace)}


def shaping_commands(
    namespace: str, dev: str, *, rate_bytes_per_s: float, latency_s: float, burst_bytes: int, limit_bytes: int
) -> list[list[str]]:
    """tc calls that shape one direction of the link (each veth end shapes its own egress): an HTB
    class at the rate, split into small TCP packets (ACKs, gloo's control messages) served first and
    the bulk after; each queue a bfifo, or netem's delay when a latency is asked for.

    Why not one tbf FIFO: gloo drives both directions of a connection at once, and a FIFO queues one
    direction's ACKs behind the other's data, so the sender stalls waiting for them. Measured here,
    16 MiB all_reduce between two nodes over 2.1 Gbit/s: 245 ms through a tbf, 77 ms with ACKs first
    (64 ms is the wire time)."""
    rate = f"{int(round(rate_bytes_per_s * 8))}bit"
    small = f"{int(round(rate_bytes_per_s * 8 / 10))}bit"  # guaranteed to the small packets; they may borrow all
    tc = ["tc", "-n", namespace]
    qdisc, cls = [*tc, "qdisc", "add", "dev", dev], [*tc, "class", "add", "dev", dev]
    bucket = ["burst", str(burst_bytes), "cburst", str(burst_bytes)]
    leaf = (
        ["netem", "delay", f"{latency_s * 1e6:.0f}us", "limit", "100000"]
        if latency_s > 0
        else ["bfifo", "limit", str(limit_bytes)]
    )
    return [
        [*qdisc, "root", "handle", "1:", "htb", "default", "20"],
        [*cls, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate, *bucket],
        [
            *cls,
            "parent",
            "1:1",
            "classid",
            "1:10",
            "htb",
            "rate",
            small,
            "ceil",
            rate,
            *bucket,
            "prio",
            "0",
            "quantum",
            "65536",
        ],
        [
            *cls,
            "parent",
            "1:1",
            "classid",
            "1:20",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            *bucket,
            "prio",
            "1",
            "quantum",
            "65536",
        ],
        [*qdisc, "parent", "1:10", "handle", "10:", *leaf],
        [*qdisc, "parent", "1:20", "handle", "20:", *leaf],
        # IPv4 TCP packets shorter than 128 bytes (total length at offset 2) go to 1:10.
        [
            *tc,
            "filter",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "protocol",
            "6",
            "0xff",
            "match",
            "u16",
            "0x0000",
            "0xff80",
            "at",
            "2",
            "flowid",
            "1:10",
        ],
    ]


NO_NETEM = (
    "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM is off), so the lab link cannot add "
    "latency; only its bandwidth is shaped"
)


def has_netem(namespace: str) -> bool:
    """Probes for sch_netem on the loopback of one of the lab's own namespaces."""
    added = sh(["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"], check=False)
    if added.returncode == 0:
        sh(["tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"])
    return added.returncode == 0


def create(
    names: Names,
    *,
    addresses: tuple[str, str],
    prefixlen: int,
    rate_bytes_per_s: float,
    latency_s: float,
    latency_required: bool,
    burst_bytes: int,
    limit_bytes: int,
) -> float:
    """Builds the lab and returns the latency actually added (0 when the kernel has no netem and the
    latency was only a default). The caller removes the remains on any failure."""
    ns, dev = names.namespaces, names.interfaces
    for n in ns:
        sh(["ip", "netns", "add", n])
    # Both ends are born inside their namespaces: the root namespace never holds a lab interface.
    sh(["ip", "link", "add", "name", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1]])
    for n, d, addr in zip(ns, dev, addresses):
        sh(["ip", "-n", n, "link", "set", "lo", "up"])
        # No IPv6 link-local either: the pair carries exactly one address per end, the one gloo binds.
        sh(["ip", "-n", n, "link", "set", "dev", d, "addrgenmode", "none"])
        sh(["ip", "-n", n, "addr", "add", f"{addr}/{prefixlen}", "dev", d])
        sh(["ip", "-n", n, "link", "set", d, "up"])
    if latency_s > 0 and not has_netem(ns[0]):
        if latency_required:
            raise LabUnsupported(f"{NO_NETEM}: pass --latency-us 0")
        latency_s = 0.0
    for n, d in zip(ns, dev):
        for cmd in shaping_commands(
            n,
            d,
            rate_bytes_per_s=rate_bytes_per_s,
            latency_s=latency_s,
            burst_bytes=burst_bytes,
            limit_bytes=limit_bytes,
        ):
            sh(cmd)
    return latency_s


def destroy(prefix: str, *, grace_s: float = 5.0) -> list[str]:
    """Removes every namespace and root-namespace link whose name starts with `prefix`, first ending
    the processes still inside those namespaces (a namespace with live processes outlives `ip netns
    del`, and its veth with it). Idempotent; returns what it did, one line per action."""
    Names(prefix)  # refuses a prefix that could match something not ours
    done = []
    namespaces = namespaces_with(prefix)
    pids = {n: pids_in(n) for n in namespaces}
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        live = [p for ps in pids.values() for p in ps if _alive(p)]
        if not live:
            break
        for p in live:
            try:
                os.kill(p, sig)
                done.append(f"sent {sig.name} to pid {p} (still running in a lab namespace)")
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in live):
            time.sleep(0.05)
    for n in namespaces:
        sh(["ip", "netns", "del", n], check=False)
        done.append(f"deleted namespace {n}")
    for link in root_links_with(prefix):
        sh(["ip", "link", "del", link], check=False)
        done.append(f"deleted link {link}")
    left = namespaces_with(prefix) + root_links_with(prefix)
    if left:
        raise LabError(f"could not remove {', '.join(left)}; see `ip netns pids <name>` and `ip link`")
    return done


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
