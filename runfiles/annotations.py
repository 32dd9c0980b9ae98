"""The annotation format: how a job names its collectives and phases in a Kineto trace.

On CPU, gloo's own trace events say almost nothing (no sizes, no group ranks, and a reduce-scatter
shows up as ``gloo:all_reduce``), so every collective the engine issues runs inside a
``torch.profiler.record_function`` whose *name* carries everything the analyzer needs. Names, not
args: ``record_function``'s optional args string does not reach the exported trace.

Collective::

    ps.comm dim=tp op=all_reduce bytes=65536 ranks=0,1 seq=12

    dim    tp | sp | cp | pp | dp   the parallel dimension the collective serves
    op     all_reduce | all_gather | reduce_scatter | all_to_all | send | recv | broadcast
    bytes  the collective's buffer size in bytes (nccl-tests' "size": the full output of an
           all-gather, the full input of a reduce-scatter, the message of a send/recv)
    ranks  the global ranks of the process group, ascending (for send/recv: the two peers,
           sender first)
    seq    the per-group sequence number of this collective on this rank (0, 1, 2, ...); the
           same collective instance has the same seq on every rank of its group

Phase::

    ps.phase kind=fwd mb=3 stage=1 chunk=0
    ps.phase kind=bwd mb=3 stage=1 chunk=0
    ps.phase kind=optim

This module is pure (stdlib only); the engine formats, the analyzer parses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

COMM_PREFIX = "ps.comm "
PHASE_PREFIX = "ps.phase "

DIMS = ("tp", "sp", "cp", "pp", "dp")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast")
PHASES = ("fwd", "bwd", "optim")

COMM_RE = re.compile(
    r"^ps\.comm dim=(?P<dim>[a-z]+) op=(?P<op>[a-z_]+) bytes=(?P<bytes>\d+)"
    r" ranks=(?P<ranks>\d+(?:,\d+)*) seq=(?P<seq>\d+)$"
)
PHASE_RE = re.compile(
    r"^ps\.phase kind=(?P<kind>[a-z]+)(?: mb=(?P<mb>\d+))?(?: stage=(?P<stage>\d+))?"
    r"(?: chunk=(?P<chunk>\d+))?$"
)


@dataclass(frozen=True)
class CommLabel:
    dim: str
    op: str
    bytes: int
    ranks: tuple[int, ...]
    seq: int

    def __post_init__(self):
        if self.dim not in DIMS:
            raise ValueError(f"dim must be one of {DIMS}, got {self.dim!r}")
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {self.op!r}")


@dataclass(frozen=True)
class PhaseLabel:
    kind: str
    mb: int | None = None
    stage: int | None = None
    chunk: int | None = None

    def __post_init__(self):
        if self.kind not in PHASES:
            raise ValueError(f"kind must be one of {PHASES}, got {self.kind!r}")


def comm_name(dim: str, op: str, nbytes: int, ranks: Iterable[int], seq: int) -> str:
    """The record_function name of one collective (see the module docstring)."""
    CommLabel(dim, op, int(nbytes), tuple(ranks), int(seq))  # validates
    return f"ps.comm dim={dim} op={op} bytes={int(nbytes)} ranks={','.join(map(str, ranks))} seq={int(seq)}"


def phase_name(kind: str, mb: int | None = None, stage: int | None = None, chunk: int | None = None) -> str:
    """The record_function name of one phase (forward/backward of a microbatch, optimizer step)."""
    PhaseLabel(kind, mb, stage, chunk)  # validates
    parts = [f"ps.phase kind={kind}"]
    for key, value in (("mb", mb), ("stage", stage), ("chunk", chunk)):
        if value is not None:
            parts.append(f"{key}={int(value)}")
    return " ".join(parts)


def parse_comm(name: str) -> CommLabel | None:
    """The label of a ``ps.comm`` name, or None for any other name."""
    m = COMM_RE.match(name)
    if m is None or m["dim"] not in DIMS or m["op"] not in OPS:
        return None
    return CommLabel(m["dim"], m["op"], int(m["bytes"]), tuple(int(r) for r in m["ranks"].split(",")), int(m["seq"]))


def parse_phase(name: str) -> PhaseLabel | None:
    """The label of a ``ps.phase`` name, or None for any other name."""
    m = PHASE_RE.match(name)
    if m is None or m["kind"] not in PHASES:
        return None
    ints = {k: (int(m[k]) if m[k] is not None else None) for k in ("mb", "stage", "chunk")}
    return PhaseLabel(m["kind"], **ints)
