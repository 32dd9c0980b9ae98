"""PyTorch's Flight Recorder on every rank, its JSON dumps, and reproducible hangs.

The Flight Recorder keeps each process group's last TORCH_FR_BUFFER_SIZE collectives (op, sizes,
dtypes, sequence numbers, state, times) in a ring buffer; `torch._C._distributed_c10d.
_dump_fr_trace_json()` returns it as JSON. `enable()` sets the buffer before the process groups are
made. A Recorder writes this rank's dump to DIR/rank{r}.json (atomically) when asked: by its own
failure, or by the trigger file DIR/.dump that the first failing rank or the supervisor creates --
a daemon thread watches for it, so a rank whose main thread waits inside a collective (the GIL
released) still dumps. Each dump's `pg_config` lists this rank's groups with their ranks and
plan dimension (NCCL fills it itself; gloo leaves it empty), so a dump reads on its own.

`PARASCOPE_INJECT_HANG=RANK:STEP[:KIND]` (`profiler run --inject-hang`) makes RANK misbehave at the
first collective of STEP and then stop issuing any (it sleeps until the job is stopped), so every
failure mode is reproducible: `skip` never issues it (the peers wait: the rank "never arrived"),
`size` issues it with twice the elements, `op` issues a broadcast of one element instead. The
mismatched call is issued asynchronously and never waited; gloo aborts a process that receives more
than it expected, so before a size mismatch every rank is asked to dump (its peers wait inside the
collective by then) and the evidence outlives them.

Runtime layer: imports torch.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist

from parallel.engine.injection import INJECT_ENV, Injection, parse_injection
from runfiles import rundir

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER = 2000  # entries per rank: a few steps of a large plan's collectives
PEERS_ARRIVE_S = 2.0  # an injected size mismatch waits this long for its peers to block in the collective
TRIGGER = rundir.FLIGHT_TRIGGER
GROUPS: list = []  # the engine's groups with a process group (parallel.engine.collectives.Group), as made


def enable(entries: int = FR_BUFFER) -> None:
    """Turn the Flight Recorder on for process groups made after this (the user's setting wins)."""
    os.environ.setdefault(FR_BUFFER_ENV, str(entries))


class P2PLedger:
    """This rank's point-to-point ops as Flight Recorder entries: gloo's recorder leaves sends and
    receives out (NCCL's records them itself), so the engine keeps the last FR_BUFFER of them and adds
    them to its dumps ("recorded_by": "parascope"), named as NCCL names them: "send SRC->DST",
    "recv DST<-SRC" with ranks within the group (torch.distributed.flight_recorder reads them so)."""

    def __init__(self, size: int = FR_BUFFER):
        self.entries: deque = deque(maxlen=size)
        self.seq: dict[str, int] = {}

    def add(self, group, op: str, src: int, dst: int, t: torch.Tensor) -> None:
        if group.pg is None or group.pg.name() == "nccl":
            return
        name = group.pg.group_name
        seq = self.seq.get(name, 0) + 1
        self.seq[name] = seq
        local = {r: i for i, r in enumerate(sorted(group.ranks))}  # a group's ranks: its members, ascending
        s, d = local.get(src, src), local.get(dst, dst)
        arrow = f"{s}->{d}" if op == "send" else f"{d}<-{s}"
        dtype = str(t.dtype).removeprefix("torch.").capitalize()
        self.entries.append(
            {
                "process_group": [name, group.dim],
                "is_p2p": True,
                "collective_seq_id": 0,
                "p2p_seq_id": seq,
                "op_id": seq,
                "profiling_name": f"gloo:{op} {arrow}",
                "input_sizes": [list(t.shape)],
                "output_sizes": [list(t.shape)],
                "input_dtypes": [dtype],
                "output_dtypes": [dtype],
                "state": "scheduled",
                "time_created_ns": time.time_ns(),
                "frames": [],
                "recorded_by": "parascope",
            }
        )


P2P = P2PLedger()


def dump(rank: int) -> dict | None:
    """This rank's Flight Recorder as PyTorch writes it, with `pg_config` filled from the engine's
    groups (GROUPS); None before any process group exists."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    data = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True))
    world = dist.get_world_size()
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for g in GROUPS:
        if g.pg is not None and rank in g.ranks:
            name = g.pg.group_name
            config[name] = {"name": name, "desc": g.dim, "ranks": str(list(g.ranks))}
    data["pg_config"] = config
    if P2P.entries:
        entries = sorted([*data.get("entries", []), *P2P.entries], key=lambda e: e.get("time_created_ns", 0))
        first = next((e["record_id"] for e in entries if isinstance(e.get("record_id"), int)), 0)
        # one record_id sequence in the merged order, from the recorder's first (its ring buffer's start)
        data["entries"] = [{**e, "record_id": first + i} for i, e in enumerate(entries)]
    return data


class Recorder:
    """Writes this rank's dump to `folder`/rank{rank}.json on request (module docstring)."""

    def __init__(self, folder: Path, rank: int, world_size: int):
        self.folder, self.rank, self.world_size = Path(folder), rank, world_size
        self.path = self.folder / f"rank{rank}.json"
        self._done = threading.Event()
        self._lock = threading.Lock()

    def start(self, poll_s: float = 0.1) -> Recorder:
        threading.Thread(target=self._watch, args=(poll_s,), name="flight-recorder", daemon=True).start()
        return self

    def _watch(self, poll_s: float) -> None:
        trigger, seen = self.folder / TRIGGER, None
        while not self._done.is_set():
            try:
                stamp = trigger.stat().st_mtime_ns
            except OSError:
                stamp = None
            if stamp is not None and stamp != seen:  # each new request: a fresh dump holds more
                seen = stamp
                self.write()
            time.sleep(poll_s)

    def write(self) -> bool:
        """Dump now (again if asked again: a later dump holds more); False when there is nothing yet."""
        with self._lock:
            try:
                data = dump(self.rank)
            except RuntimeError:  # the recorder is off (no buffer) or the backend has none
                return False
            if data is None:
                return False
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
            return True

    def request_all(self, wait_s: float = 5.0) -> None:
        """Ask every rank to dump (the trigger file) and wait up to `wait_s` for their files."""
        rundir.request_flight_dumps(self.folder, self.world_size, wait_s)

    def stop(self) -> None:
        self._done.set()


# ---------------------------------------------------------------- injected hangs


class Injector:
    """Fires the injection at this rank's first collective of its step (then never returns)."""

    def __init__(self, injection: Injection | None, rank: int):
        self.injection = injection if injection is not None and injection.rank == rank else None
        self.step = -1
        self.recorder: Recorder | None = None

    def at(self, group, op: str, tensor: torch.Tensor | None, peer: int | None = None) -> None:
        inj = self.injection
        if inj is None or self.step != inj.step or group.pg is None:
            return
        self.injection = None
        print(f"[inject-hang] rank {inj.rank} step {inj.step}: {inj.kind} at {group.dim} {op}", flush=True)
        if inj.kind == "size" and tensor is not None:
            # gloo aborts a process that receives more than it expects: the peers, waiting inside this
            # collective by now, dump first; then the larger call, never waited
            time.sleep(PEERS_ARRIVE_S)
            if self.recorder is not None:
                self.recorder.request_all()
            _larger(op, tensor, group, peer)
        elif inj.kind == "op" and tensor is not None:  # a broadcast of one element where the peers run `op`
            dist.broadcast(tensor.reshape(-1)[:1].clone(), src=dist.get_rank(), group=group.pg, async_op=True)
        if self.recorder is not None:
            self.recorder.write()
        while True:  # the rank stops issuing collectives; the launcher stops it with the job
            time.sleep(3600)


def _larger(op: str, t: torch.Tensor, group, peer: int | None):
    """Issue `op` on twice `t`'s elements: the size mismatch (a send or receive is entered in the
    ledger, as the recorder enters a collective, so that it reaches the dump)."""
    big = torch.cat([t.reshape(-1), t.reshape(-1)])
    pg, n = group.pg, group.size
    if op in ("send", "recv"):
        me = dist.get_rank()
        P2P.add(group, op, me if op == "send" else peer, peer if op == "send" else me, big)
        return (dist.isend if op == "send" else dist.irecv)(big, peer, group=pg)
    if op == "all_gather":
        return dist.all_gather_into_tensor(torch.empty(big.numel() * n, dtype=t.dtype), big, group=pg, async_op=True)
    if op == "reduce_scatter":
        out = torch.empty(big.numel() // n, dtype=t.dtype)
        return dist.reduce_scatter_tensor(out, big[: out.numel() * n], group=pg, async_op=True)
    if op == "all_to_all":
        return dist.all_to_all_single(torch.empty_like(big), big, group=pg, async_op=True)
    return dist.all_reduce(big, group=pg, async_op=True)


INJECTOR = Injector(None, -1)  # configure() arms it in a rank of `profiler run`


def configure(rank: int, recorder: Recorder | None = None, injection: str | None = None) -> Injector:
    """Arm this rank's injector from `injection` (RANK:STEP[:KIND]) or PARASCOPE_INJECT_HANG (ValueError
    when malformed), with the recorder it dumps to before it stops."""
    global INJECTOR
    INJECTOR = Injector(parse_injection(injection or os.environ.get(INJECT_ENV)), rank)
    INJECTOR.recorder = recorder
    return INJECTOR
