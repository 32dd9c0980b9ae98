"""Two-node lab on one machine: two network namespaces ("nodes") joined by a veth pair whose link is
shaped with tc (HTB at the rate, small packets first; netem latency where the kernel has it), so ranks
on one node talk over loopback and ranks on different nodes cross a slow link — the NVLink/InfiniBand
cliff in miniature. profiler/lab/net.py holds the ip/tc plumbing, lab_cli.py the CLI,
lab_probe.py the measurements (bench/lab_link.py prints them).

Run (as root; every command exits 2 with the reason when it is not):
    python -m profiler lab up [--like dgx-h100 | --bw 1gbit] [--latency-us 50] [--subnet 10.213.0.0/30]
    python -m profiler lab status [--json]     # exit 0 up, 1 half-built or crashed, 3 down
    python -m profiler lab down                # idempotent; also removes what a crash left behind
From Python (what `profiler run|commbench|tpsweep --lab` call):
    lab = profiler.lab.settings.settings()              # LabError when the lab is not up
    port = lab.free_port()                     # on node 0, where the c10d rendezvous store listens
    argv = lab.torchrun_command(node, 4, ["-m", "parallel", "train", ...], port=port)  # for node in 0, 1
    subprocess.Popen(argv)                     # inside that node's namespace, gloo bound to its veth

Settings live in /run/parascope/lab-<prefix>.json (written atomically), readable without root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import itertools
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from parallel.core.specs import CLUSTERS, Link, SpecError, cluster_preset
from profiler.lab import net as lab_net
from profiler.lab.net import (
    LabError,
    LabUnsupported,
    Names,
    create,
    destroy,
    inspect_namespace,
    missing_privilege,
    namespaces_with,
    root_links_with,
)

__all__ = [
    "LabError",
    "LabUnsupported",
    "LabNode",
    "LabSettings",
    "down",
    "for_job",
    "for_lab_flag",
    "like_defaults",
    "master_addr",
    "missing_privilege",
    "node_command",
    "settings",
    "settings_path",
    "status",
    "up",
]

DEFAULT_PREFIX = "psl-"
DEFAULT_SUBNET = "10.213.0.0/30"  # private; lives only inside the lab's two namespaces
DEFAULT_LIKE = "dgx-h100"
STATE_DIR = Path("/run/parascope")
# What "intra-node" means here: gloo all_reduce over loopback, measured on this machine (parallel/core/specs.py).
LOOPBACK = CLUSTERS["local-cpu"].intra


@dataclass(frozen=True)
class LabNode:
    node: int
    namespace: str
    interface: str  # the veth end inside `namespace`
    address: str  # on `interface`; the only address the lab adds anywhere


@dataclass(frozen=True)
class LabSettings:
    """One lab as built: where its nodes are and how its inter-node link is shaped (each direction)."""

    prefix: str
    nodes: tuple[LabNode, LabNode]
    prefixlen: int
    bandwidth_bytes_per_s: float  # HTB rate, each direction
    latency_s: float  # one-way delay netem adds on top of the veth's own (0 when the kernel has no netem)
    latency_requested_s: float
    burst_bytes: int  # HTB bucket: bytes that pass at full speed after an idle spell
    limit_bytes: int  # each class's bfifo: bytes that may wait before tc drops
    like: dict | None = None  # {"cluster", "intra_inter_ratio", "loopback_bytes_per_s"} when from --like
    created_at: str = ""

    @property
    def master_addr(self) -> str:
        return self.nodes[0].address

    def inter_link(self) -> Link:
        """The shaped link as the plan model's `Cluster.inter` (before commbench fits a real one)."""
        return Link(self.bandwidth_bytes_per_s, self.latency_s, f"lab veth ({self.prefix})")

    def node_env(self, node: int) -> dict[str, str]:
        """Environment for a process on `node`: gloo (and tensorpipe/NCCL) bind to the node's veth, so
        peers on the same node reach that address by local routing (loopback, unshaped) and peers on
        the other node across the shaped veth. PARASCOPE_LAB_* lets a rank record where it ran."""
        n = self.nodes[node]
        return {
            "GLOO_SOCKET_IFNAME": n.interface,
            "TP_SOCKET_IFNAME": n.interface,
            "NCCL_SOCKET_IFNAME": n.interface,
            "PARASCOPE_LAB_NODE": str(node),
            "PARASCOPE_LAB_NAMESPACE": n.namespace,
            "PARASCOPE_LAB_SETTINGS": str(settings_path(self.prefix)),
        }

    def node_command(self, node: int, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """`argv` wrapped to run inside `node`'s namespace with node_env(node) plus `env` (the caller's
        own environment is inherited as usual)."""
        if node not in (0, 1):
            raise LabError(f"the lab has nodes 0 and 1, not {node!r}")
        merged = {**self.node_env(node), **(env or {})}
        return [
            "ip",
            "netns",
            "exec",
            self.nodes[node].namespace,
            "env",
            *(f"{k}={v}" for k, v in merged.items()),
            *argv,
        ]

    def torchrun_command(
        self,
        node: int,
        nproc_per_node: int,
        argv: Sequence[str],
        *,
        port: int = 29400,
        rdzv_id: str = "parascope-lab",
        launcher: Sequence[str] | None = None,
        launcher_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """One torchrun agent of a 2-node job, run inside `node`'s namespace. Node 0 hosts the c10d
        rendezvous store on its veth address (named explicitly: the hostname is the same in both
        namespaces). The c10d rendezvous numbers agents by their --local-addr as text, which
        lab_addresses keeps in node order, so lab node i runs ranks i*nproc_per_node ... ; a rank can
        also read its node from PARASCOPE_LAB_NODE."""
        launcher = list(launcher or [sys.executable, "-m", "torch.distributed.run"])
        cmd = [
            *launcher,
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            str(nproc_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{self.master_addr}:{port}",
            "--rdzv-id",
            rdzv_id,
            "--rdzv-conf",
            f"is_host={'true' if node == 0 else 'false'}",
            "--local-addr",
            self.nodes[node].address,
            *launcher_args,
            *argv,
        ]
        return self.node_command(node, cmd, env)

    def free_port(self, node: int = 0) -> int:
        """A TCP port free on `node`'s address right now (for a rendezvous endpoint); each namespace has
        its own port space, so this asks inside it."""
        code = (
            f"import socket; s = socket.socket(); s.bind(({self.nodes[node].address!r}, 0)); print(s.getsockname()[1])"
        )
        return int(lab_net.sh(self.node_command(node, [sys.executable, "-c", code])).stdout)

    def record(self) -> dict:
        """What a job run on the lab records about it (run.json's and commbench's `lab`): the link as
        shaped (latency asked and applied: a kernel without netem applies none) and where the nodes are."""
        return {
            "prefix": self.prefix,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
            "latency_requested_s": self.latency_requested_s,
            "namespaces": [n.namespace for n in self.nodes],
            "interfaces": [n.interface for n in self.nodes],
            "addresses": [n.address for n in self.nodes],
            "like": self.like,
            "created_at": self.created_at,
            "settings_file": str(settings_path(self.prefix)),
        }

    def to_dict(self) -> dict:
        return {"version": 1, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "LabSettings":
        data = {k: v for k, v in data.items() if k != "version"}
        data["nodes"] = tuple(LabNode(**n) for n in data["nodes"])
        return cls(**data)


def settings_path(prefix: str = DEFAULT_PREFIX) -> Path:
    return STATE_DIR / f"lab-{Names(prefix).prefix.rstrip('-')}.json"


def settings(prefix: str = DEFAULT_PREFIX) -> LabSettings:
    """The running lab's settings; LabError saying what to do when it is not up (or was left half-made)."""
    path = settings_path(prefix)
    try:
        saved = LabSettings.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise LabError(f"the lab ({prefix}) is not up: run `python -m profiler lab up` as root") from None
    except (ValueError, TypeError, KeyError) as err:
        raise LabError(f"{path} is not a lab settings file ({err}); run `python -m profiler lab down`") from None
    missing = [n.namespace for n in saved.nodes if n.namespace not in namespaces_with(prefix)]
    if missing:
        raise LabError(
            f"{path} describes a lab whose namespaces {', '.join(missing)} are gone (a reboot or a "
            "crash); run `python -m profiler lab down` then `lab up`"
        )
    return saved


def for_job(prefix: str = DEFAULT_PREFIX) -> LabSettings:
    """The running lab, for a command that starts processes inside it (`profiler run|commbench|tpsweep
    --lab`): LabUnsupported when this process may not enter its namespaces, LabError when it is not
    up; each message says what to do (the commands exit 2 with it)."""
    why = missing_privilege()
    if why:
        raise LabUnsupported(f"--lab starts the ranks inside the lab's network namespaces (ip netns exec); {why}")
    return settings(prefix)


def for_lab_flag(prefix: str | None) -> tuple[LabSettings | None, str | None]:
    """What `--lab` asks of a job command (`profiler run|commbench`): (None, None) without the flag, else
    (the running lab, None) or (None, the error line the command prints before exiting 2)."""
    if prefix is None:
        return None, None
    try:
        return for_job(prefix), None
    except LabError as err:
        return None, f"error: {err}"


def master_addr(prefix: str = DEFAULT_PREFIX) -> str:
    return settings(prefix).master_addr


def node_command(
    node: int, argv: Sequence[str], env: Mapping[str, str] | None = None, *, prefix: str = DEFAULT_PREFIX
) -> list[str]:
    return settings(prefix).node_command(node, argv, env)


def like_defaults(cluster: str, loopback_bytes_per_s: float | None = None) -> tuple[float, float, dict]:
    """(bandwidth bytes/s, added latency s, provenance) that give the lab the intra/inter ratios of a
    preset cluster: inter bandwidth = this machine's loopback / (preset intra / inter); added latency =
    loopback latency × (preset inter / intra − 1), so the crossing path's total keeps the preset's ratio."""
    try:
        c = cluster_preset(cluster)
    except SpecError as err:
        raise LabError(f"--like: {err}") from None
    loopback = loopback_bytes_per_s or LOOPBACK.bandwidth_bytes_per_s
    ratio = c.intra.bandwidth_bytes_per_s / c.inter.bandwidth_bytes_per_s
    latency = LOOPBACK.latency_s * max(c.inter.latency_s / c.intra.latency_s - 1, 0.0)
    return loopback / ratio, latency, {"cluster": c.name, "intra_inter_ratio": ratio, "loopback_bytes_per_s": loopback}


def shaper_sizes(bandwidth_bytes_per_s: float) -> tuple[int, int]:
    """(burst, limit) of the shaper. Burst ≈ 250 µs at the rate, at least 64 KiB so that one GSO
    segment passes whole; limit ≈ 50 ms at the rate, at least 4 MiB, so gloo's TCP streams queue
    rather than drop (a drop costs a 200 ms retransmit timeout, which would swamp any timing; ACKs
    bypass this queue, see lab_net.shaping_commands)."""
    burst = max(64 * 1024, int(bandwidth_bytes_per_s * 250e-6))
    limit = max(4 * 2**20, int(bandwidth_bytes_per_s * 50e-3))
    return burst, limit


def lab_addresses(subnet: str) -> tuple[tuple[str, str], int]:
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as err:
        raise LabError(f"--subnet {subnet!r}: {err}") from None
    hosts = [str(h) for h in itertools.islice(net.hosts(), 2)]  # islice: a /8 has 16 M hosts
    if net.version != 4 or not net.is_private or len(hosts) < 2:
        raise LabError(
            f"--subnet {subnet!r} must be a private IPv4 network with two host addresses (e.g. 10.213.0.0/30)"
        )
    if hosts[0] > hosts[1]:  # as text, e.g. "10.0.0.9" > "10.0.0.10"
        raise LabError(
            f"--subnet {subnet!r}: its first two addresses {hosts} do not sort as text, and "
            "torchrun numbers the nodes in that order; pick one like 10.213.0.0/30"
        )
    return (hosts[0], hosts[1]), net.prefixlen


def status(prefix: str = DEFAULT_PREFIX) -> dict:
    """What the kernel and the settings file say about the lab: state "up", "down", or "partial" (a
    crashed `up`, a reboot, a hand edit) with the problems found; `down` clears any of them."""
    names, path = Names(prefix), settings_path(prefix)
    saved, problems = None, []
    try:
        saved = LabSettings.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        pass
    except (ValueError, TypeError, KeyError) as err:
        problems.append(f"{path} is not a lab settings file ({err})")
    found = sorted(namespaces_with(prefix))
    namespaces = {n: inspect_namespace(n) for n in found}
    stray_links = root_links_with(prefix)
    for i, (ns, dev) in enumerate(zip(names.namespaces, names.interfaces)):
        if ns not in namespaces:
            problems.append(f"namespace {ns} is missing")
            continue
        links = namespaces[ns]["links"]
        link = links.get(dev)
        if not links.get("lo", {}).get("up"):
            problems.append(f"loopback is down in {ns}")
        if link is None:
            problems.append(f"{dev} is missing from {ns}")
            continue
        want = f"{saved.nodes[i].address}/{saved.prefixlen}" if saved else None
        if not link["up"]:
            problems.append(f"{dev} in {ns} is down")
        if not link["addresses"] or (want and want not in link["addresses"]):
            problems.append(f"{dev} in {ns} has addresses {link['addresses']}, expected {want or 'one'}")
        if not any(q.get("kind") == "htb" and q.get("root") for q in link["qdiscs"]):
            problems.append(f"{dev} in {ns} is not shaped (no htb qdisc at its root)")
    problems += [f"stray namespace {n}" for n in found if n not in names.namespaces]
    problems += [f"stray link {link} in the root namespace" for link in stray_links]
    if saved is None and not path.exists():
        problems.append(f"no settings file {path} (a crashed `lab up`, or built by hand)")
    state = "down" if not (found or stray_links or path.exists()) else "partial" if problems else "up"
    return {
        "prefix": prefix,
        "state": state,
        "problems": [] if state == "down" else problems,
        "settings_file": str(path),
        "settings": saved.to_dict() if saved else None,
        "namespaces": namespaces,
        "root_links": stray_links,
    }


def up(
    *,
    bandwidth_bytes_per_s: float,
    latency_s: float = 0.0,
    latency_required: bool = True,
    like: dict | None = None,
    subnet: str = DEFAULT_SUBNET,
    prefix: str = DEFAULT_PREFIX,
    replace: bool = False,
) -> tuple[LabSettings, list[str]]:
    """Builds the lab and writes its settings; returns them with notes for the user. Refuses a lab that
    is already up unless `replace`; clears the remains of a crashed one first. All or nothing: on any
    failure, KeyboardInterrupt or SystemExit included, what was built is removed again."""
    names = Names(prefix)
    if not bandwidth_bytes_per_s > 0:
        raise LabError(f"link bandwidth must be > 0, got {bandwidth_bytes_per_s!r} bytes/s")
    if not latency_s >= 0:
        raise LabError(f"link latency must be >= 0, got {latency_s!r} s")
    addresses, prefixlen = lab_addresses(subnet)
    burst, limit = shaper_sizes(bandwidth_bytes_per_s)
    notes = []
    with _lock(prefix):
        before = status(prefix)
        if before["state"] == "up" and not replace:
            raise LabError(f"the lab ({prefix}) is already up; `python -m profiler lab down` first, or pass --replace")
        if before["state"] != "down":
            notes += destroy(prefix)
            settings_path(prefix).unlink(missing_ok=True)
        try:
            applied = create(
                names,
                addresses=addresses,
                prefixlen=prefixlen,
                rate_bytes_per_s=bandwidth_bytes_per_s,
                latency_s=latency_s,
                latency_required=latency_required,
                burst_bytes=burst,
                limit_bytes=limit,
            )
            if applied != latency_s:
                notes.append(f"{lab_net.NO_NETEM}: {latency_s * 1e6:.0f} us asked, 0 applied")
            lab = LabSettings(
                prefix=prefix,
                prefixlen=prefixlen,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                nodes=tuple(
                    LabNode(i, n, d, a)
                    for i, (n, d, a) in enumerate(zip(names.namespaces, names.interfaces, addresses))
                ),
                latency_s=applied,
                latency_requested_s=latency_s,
                burst_bytes=burst,
                limit_bytes=limit,
                like=like,
                created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            )
            _write_atomic(settings_path(prefix), lab.to_dict())
        except BaseException:
            with contextlib.suppress(LabError):  # the first error is the one to report
                destroy(prefix)
            settings_path(prefix).unlink(missing_ok=True)
            raise
    return lab, notes


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Removes the lab, whatever state it is in (processes inside it are ended first); idempotent."""
    with _lock(prefix):
        done = destroy(prefix)
        path = settings_path(prefix)
        for stale in [path, *path.parent.glob(f".{path.name}.*.tmp")]:  # a write cut short leaves a .tmp
            if stale.exists():
                stale.unlink()
                done.append(f"removed {stale}")
        with contextlib.suppress(OSError):
            STATE_DIR.rmdir()  # only when empty: another lab's settings keep it
    return done


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@contextlib.contextmanager
def _lock(prefix: str, timeout_s: float = 60.0):
    """One `up`/`down` at a time per lab: an abstract unix socket name, which the kernel frees when
    its holder exits or dies and which leaves no file behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.bind(f"\0parascope-lab-{prefix}")
            break
        except OSError:
            if time.monotonic() > deadline:
                sock.close()
                raise LabError(f"another `lab up`/`lab down` of {prefix} held the lock for > {timeout_s:g} s") from None
            time.sleep(0.1)
    try:
        yield
    finally:
        sock.close()
