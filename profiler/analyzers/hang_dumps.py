"""Flight Recorder dumps read, bounded: a run directory (its fr/ and run.json), a folder, or a .zip /
.tar(.gz) of per-rank JSON dumps, as `torch._C._distributed_c10d._dump_fr_trace_json()` writes them.

    dumps = load_dumps(PATH)        # Dumps: rank -> Dump (entries, pg_config), run.json, the world's ranks

The rank is the last number in a file's name (rank3.json, nccl_trace_rank_3.json), as torch's fr_trace
reads it. Pickles (PyTorch's default dump format) are refused, never read: reading one can run code.
Every cost is capped where it is read: bytes and entries per dump and per set, nesting depth, integer
width (sequence numbers within 64 bits, ranks below MAX_RANKS), the world taken from bounded evidence
(the dumps, `default_pg`'s ranks in pg_config, run.json's plan or world_size) and refused past
MAX_RANKS. Names, states and descriptions keep no control characters: each is written `\\x1b`-style
(a dump's text reaches terminals and pages).

Pure: stdlib, msgspec; profiler.traces.sources for bounded reading.
"""

from __future__ import annotations

import gc
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from profiler.traces.errors import NoTracesError, TraceError
from profiler.traces.sources import Limits, open_source, resolve, stream

MAX_DUMP_BYTES = 256 << 20  # one rank's dump: a 20k-entry buffer with stacks is ~100 MB
MAX_SET_BYTES = 512 << 20  # all dumps of a set, decompressed: ~10 s of parsing on one core
MAX_ENTRIES = 1_000_000  # per dump
MAX_SET_ENTRIES = 2_000_000  # per set: ~1 GB held; 256 ranks x 2,000 entries is 512k
MAX_RANKS = 1 << 17  # ranks and world size
MAX_GROUPS = 1 << 16  # distinct process groups in a set (a job has a few per rank at most)
MAX_SEQ = (1 << 63) - 1  # Flight Recorder's counters are 64-bit
MAX_NAME = 400  # characters of a name or description kept
_RANK = re.compile(r"(\d+)\D*$")
_P2P = re.compile(r"^(send|recv)\s+(\d{1,9})\s*(?:->|<-)\s*(\d{1,9})")


class HangInputError(TraceError):
    """Dumps that cannot be read: a pickle, not JSON, no rank in the name, too large, too deep."""


def clean(text: object, limit: int | None = MAX_NAME) -> str:
    """`text` with every control, format or separator character but space written as \\xNN / \\uNNNN
    (ESC, C1, U+202E, NUL), cut to `limit` characters: safe to print and to show."""
    s = text if isinstance(text, str) else str(text)
    s = s[:limit] if limit is not None else s
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}") for c in s)


class _Raw(msgspec.Struct):
    """The fields of a Flight Recorder entry the diagnosis reads (the rest are skipped while decoding);
    sizes and dtypes kept as their JSON text."""

    process_group: list = []
    is_p2p: bool = False
    collective_seq_id: int | str = 0
    p2p_seq_id: int | str = 0
    profiling_name: str = ""
    input_sizes: msgspec.Raw = msgspec.Raw(b"null")
    output_sizes: msgspec.Raw = msgspec.Raw(b"null")
    input_dtypes: msgspec.Raw = msgspec.Raw(b"null")
    output_dtypes: msgspec.Raw = msgspec.Raw(b"null")
    state: str = ""
    time_created_ns: int | float = 0
    pg_id: int | str | None = None


class _RawDump(msgspec.Struct):
    entries: list[_Raw] = []
    pg_config: dict = {}
    pg_status: dict = {}


_DECODER = msgspec.json.Decoder(_RawDump)


def _bounded_int(value: Any, lo: int = -MAX_SEQ, hi: int = MAX_SEQ) -> int | None:
    """An int within [lo, hi] from an int or a short decimal string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not 0 < len(value) <= 20:
            return None
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float):
        if value != value or abs(value) > 2**62:
            return None
        value = int(value)
    return value if isinstance(value, int) and lo <= value <= hi else None


class Entry:
    """One Flight Recorder entry, compact (a 1,024-rank job's 2M entries in a few hundred MB). `op` is
    the operation ('all_reduce', 'send', 'coalesced', ...), `sig` its name, sizes and dtypes in one
    shared string (equal signatures: the same call); `peer` a point-to-point op's (src, dst) as its name
    gives them (group-local ranks, as NCCL writes them)."""

    __slots__ = ("pg", "desc", "p2p", "seq", "name", "op", "sizes", "dtypes", "sig", "state", "t", "pg_id", "peer")

    def __init__(self, e: _Raw, shared: dict[str, str], where: str):
        _shared = shared.setdefault  # one copy of each name / sizes / dtypes string across the dumps
        pg = e.process_group if isinstance(e.process_group, list) else []
        name = clean(pg[0]) if pg else ""
        desc = clean(pg[1]) if len(pg) > 1 else ""
        self.pg, self.desc = _shared(name, name), _shared(desc, desc)
        self.p2p = bool(e.is_p2p)
        seq = _bounded_int(e.p2p_seq_id if self.p2p else e.collective_seq_id)
        if seq is None:
            raise HangInputError(f"{where}: a sequence number that is not an integer within 64 bits")
        self.seq = seq
        full = clean(e.profiling_name)
        self.name = _shared(full, full)
        op = full.split(":", 1)[-1].strip()
        m = _P2P.match(op)
        if m:
            src, dst = (int(m[2]), int(m[3])) if m[1] == "send" else (int(m[3]), int(m[2]))
            self.op, self.peer = m[1], (src, dst)
        else:
            op = op.split(" ", 1)[0] or "unknown"
            self.op, self.peer = _shared(op, op), None
        # kept as their JSON text, whole (compared across ranks), printable (they reach the paragraph)
        sizes = clean(bytes(e.input_sizes).decode() + "/" + bytes(e.output_sizes).decode(), None)
        dtypes = clean(bytes(e.input_dtypes).decode() + "/" + bytes(e.output_dtypes).decode(), None)
        self.sizes, self.dtypes = _shared(sizes, sizes), _shared(dtypes, dtypes)
        state = clean(e.state)
        self.state = _shared(state, state)
        sig = f"{self.name}|{self.sizes}|{self.dtypes}|{self.state}"
        self.sig = _shared(sig, sig)
        self.t = _bounded_int(e.time_created_ns, 0) or 0
        self.pg_id = _bounded_int(e.pg_id, 0)


@dataclass
class Dump:
    rank: int
    entries: list[Entry]
    pg_config: dict[str, dict]  # name -> {desc, ranks (list)}
    pg_status: dict[str, dict]
    source: str


@dataclass
class Dumps:
    dumps: dict[int, Dump]
    run: dict | None = None  # run.json when read from a run directory (checked: a dict)
    origin: str = ""
    skipped: list[str] = field(default_factory=list)
    world: list[int] = field(default_factory=list)  # every rank of the job, from bounded evidence

    def plan(self) -> Plan | None:
        """run.json's plan, if it has one that reads."""
        data = (self.run or {}).get("plan")
        if not isinstance(data, dict):
            return None
        try:
            return Plan.from_dict(data)
        except (SpecError, ValueError, TypeError, KeyError):
            return None


def rank_of(name: str) -> int:
    stem = Path(name).name
    for suffix in (".gz", ".json", ".pkl", ".pickle"):
        stem = stem.removesuffix(suffix)
    m = _RANK.search(stem)
    if not m:
        raise HangInputError(f"{clean(name)}: no rank number in the file name (name dumps like rank3.json)")
    if len(m.group(1)) > 7 or int(m.group(1)) >= MAX_RANKS:
        raise HangInputError(f"{clean(name)}: rank {m.group(1)[:12]} in the file name; ranks are below {MAX_RANKS:,}")
    return int(m.group(1))


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, str):
        if len(value) > 16 * MAX_RANKS:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        return None
    out = [_bounded_int(r, 0, MAX_RANKS - 1) for r in value]
    return None if any(r is None for r in out) else out


def parse_dump(name: str, raw: bytes, shared: dict[str, str] | None = None) -> Dump:
    rank = rank_of(name)
    head = raw[:2].lstrip()
    if raw[:1] == b"\x80":
        raise HangInputError(
            f"{clean(name)}: a pickle (PyTorch's default Flight Recorder format), which is never read: it can "
            "run code. Dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on each rank"
        )
    if head[:1] not in (b"{", b""):
        raise HangInputError(f"{clean(name)}: not a JSON Flight Recorder dump")
    try:
        doc = _DECODER.decode(raw)
    except msgspec.ValidationError as err:
        raise HangInputError(f"{clean(name)}: not a Flight Recorder dump ({clean(err)})") from None
    except msgspec.DecodeError as err:
        raise HangInputError(f"{clean(name)}: not valid JSON ({clean(err)})") from None
    except RecursionError:
        raise HangInputError(f"{clean(name)}: nested too deeply to be a Flight Recorder dump") from None
    if len(doc.entries) > MAX_ENTRIES:
        raise HangInputError(f"{clean(name)}: {len(doc.entries):,} entries, more than {MAX_ENTRIES:,}")
    shared = {} if shared is None else shared
    entries = [Entry(e, shared, clean(name)) for e in doc.entries]
    config = {}
    for key, value in doc.pg_config.items():
        if not isinstance(value, dict) or not key:
            continue
        ranks = _ranks(value.get("ranks", []))
        if ranks is not None:
            config[clean(value.get("name") or key)] = {"desc": clean(value.get("desc") or ""), "ranks": ranks}
    status = {}
    for key, value in doc.pg_status.items():
        if isinstance(value, dict):
            last = _bounded_int(value.get("last_completed_collective"), -1)
            status[clean(key)] = {"last_completed_collective": last}
    return Dump(rank, entries, config, status, clean(name))


def load_dumps(path: Any, limits: Limits | None = None) -> Dumps:
    """Every rank's dump under `path` (module docstring); HangInputError / NoTracesError naming the problem."""
    gc_was = gc.isenabled()
    gc.disable()  # millions of small objects, no cycles: the collector's passes cost 4x the parse
    try:
        return _load_dumps(path, limits)
    finally:
        if gc_was:
            gc.enable()


def read_run_json(path: Path) -> dict | None:
    """run.json as a dict with its `hosts` a dict (else dropped); None when absent or unreadable."""
    try:
        if not path.is_file() or path.stat().st_size > 64 << 20:
            return None
        run = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(run, dict):
        return None
    if not isinstance(run.get("hosts"), dict):
        run.pop("hosts", None)
    return run


def _load_dumps(path: Any, limits: Limits | None) -> Dumps:
    p = Path(path)
    run = None
    if p.is_dir() and (p / "fr").is_dir():
        run = read_run_json(p / "run.json")
        p = p / "fr"
    limits = limits or Limits(max_file_bytes=MAX_DUMP_BYTES, max_total_bytes=MAX_SET_BYTES)
    try:
        found = resolve(p, limits=limits)
    except NoTracesError:
        raise NoTracesError(f"{clean(path)}: no Flight Recorder dumps (*.json) in it", path=str(path)) from None
    dumps: dict[int, Dump] = {}
    shared: dict[str, str] = {}
    total_bytes = total_entries = 0
    for name, src in found.sources():
        if Path(name).name.startswith("."):
            continue
        rank_of(name)  # a bad name is refused before its bytes are read
        with open_source(src) as f:
            raw = b"".join(stream(f, name, limits))
        total_bytes += len(raw)
        if total_bytes > MAX_SET_BYTES:
            raise HangInputError(f"{clean(path)}: the dumps hold more than {MAX_SET_BYTES:,} bytes")
        d = parse_dump(name, raw, shared)
        del raw
        total_entries += len(d.entries)
        if total_entries > MAX_SET_ENTRIES:
            raise HangInputError(f"{clean(path)}: the dumps hold more than {MAX_SET_ENTRIES:,} entries")
        if d.rank in dumps:
            raise HangInputError(f"{d.source} and {dumps[d.rank].source}: two dumps of rank {d.rank}")
        dumps[d.rank] = d
    if not dumps:
        raise NoTracesError(f"{clean(path)}: no Flight Recorder dumps in it", path=str(path))
    out = Dumps(dumps, run, clean(path))
    out.world = world_ranks(out)
    return out


def world_ranks(dumps: Dumps, plan: Plan | None = None) -> list[int]:
    """Every rank of the job: the plan's (or run.json's) world, else `default_pg`'s ranks in the dumps'
    pg_config, with the dumped ranks; HangInputError past MAX_RANKS."""
    world = None
    if plan is None:
        plan = dumps.plan()
    if plan is not None:
        world = plan.world_size
    elif dumps.run is not None and "world_size" in dumps.run:
        world = _bounded_int(dumps.run["world_size"], 0, MAX_SEQ)
        if world is None:
            raise HangInputError("run.json: world_size is not a whole number of ranks")
    if world is not None and world > MAX_RANKS:
        raise HangInputError(f"a world of {world:,} ranks; the hang diagnosis reads at most {MAX_RANKS:,}")
    ranks = set(dumps.dumps) | set(range(world or 0))
    for d in dumps.dumps.values():
        for name, c in d.pg_config.items():
            if name == "0" or c["desc"] == "default_pg":
                ranks.update(c["ranks"])
    return sorted(ranks)
