"""Why did the job hang: PyTorch Flight Recorder dumps read across ranks.

    dumps = load_dumps(PATH)          # a run directory (its fr/), a folder, or a .zip / .tar(.gz) of dumps
    report = diagnose(dumps, plan=plan, gpus_per_node=8)

Each rank's dump (the JSON of `torch._C._distributed_c10d._dump_fr_trace_json()`; never a pickle:
PyTorch's default dump format executes code when read) holds its process groups' last collectives:
op, sizes, dtypes, the group's sequence number, the time each was issued. The rank is read from the
file name (rank3.json, nccl_trace_rank_3: the last number), as torch's fr_trace reads it.

Per process group, over the sequence numbers every member's ring buffer still holds:
- collectives in order: the first sequence number where the members disagree -- a member that never
  issued it (`missing`; "stuck in compute" when its last collective is far older than the others'
  arrival there), a different op (`op_mismatch`), other sizes (`size_mismatch`) or dtypes
  (`dtype_mismatch`); the odd ones out (the minority) are the suspects;
- point-to-point ops pair up per (sender, receiver) in order: the k-th send of a pair with the k-th
  receive; an unpaired one names the rank that did not post its side (`missing`), a pair of other
  sizes `size_mismatch`;
- members that name the group with other ranks (`membership`), and sequence numbers that do not rise
  with the record order (`order`).
The root cause is the earliest first disagreement by the time its collective was issued: the other
groups hang behind it. The group's plan dimension is its description (the engine's tp/cp/pp/dp;
Megatron-LM's TENSOR_MODEL_PARALLEL_GROUP, ...) or, with a plan, the dimension whose groups have its
ranks; the node is the rank's (a run's hosts, else rank // gpus_per_node).

Pure: stdlib, orjson; profiler.traces.sources for bounded reading.
"""

from __future__ import annotations

import gc
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from parallel.core.plan import Plan
from profiler.traces.errors import NoTracesError, TraceError
from profiler.traces.sources import Limits, open_source, resolve, stream

KINDS = ("missing", "op_mismatch", "size_mismatch", "dtype_mismatch", "membership", "order")
MAX_DUMP_BYTES = 256 << 20  # one rank's dump: a 20k-entry buffer with stacks is ~100 MB
MAX_ENTRIES = 1_000_000  # per dump
MAX_RANKS = 1 << 17
STUCK_S = 5.0  # a missing rank whose last collective is this much older than the others' is stuck
_RANK = re.compile(r"(\d+)\D*$")
_P2P = re.compile(r"(?:^|:)(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")
# process-group descriptions -> plan dimension (the engine's own; Megatron-LM's; torchtitan's mesh names)
_DESC = (
    (re.compile(r"^(tp|sp|cp|pp|dp|ep)$"), None),
    (re.compile(r"EXPERT"), "ep"),
    (re.compile(r"TENSOR|(^|_)tp($|_)"), "tp"),
    (re.compile(r"CONTEXT|(^|_)cp($|_)"), "cp"),
    (re.compile(r"PIPELINE|EMBEDDING|POSITION|(^|_)pp($|_)"), "pp"),
    (re.compile(r"DATA|(^|_)dp(_shard|_replicate)?($|_)|fsdp"), "dp"),
)


class HangInputError(TraceError):
    """Dumps that cannot be read: a pickle, not JSON, no rank in the name, too large."""


class _Raw(msgspec.Struct):
    """The fields of a Flight Recorder entry the diagnosis reads (the rest are skipped while decoding);
    sizes and dtypes kept as their JSON text."""

    process_group: list = []
    is_p2p: bool = False
    collective_seq_id: int = 0
    profiling_name: str = ""
    input_sizes: msgspec.Raw = msgspec.Raw(b"null")
    output_sizes: msgspec.Raw = msgspec.Raw(b"null")
    input_dtypes: msgspec.Raw = msgspec.Raw(b"null")
    output_dtypes: msgspec.Raw = msgspec.Raw(b"null")
    state: str = ""
    time_created_ns: int = 0
    pg_id: int | None = None


class _RawDump(msgspec.Struct):
    entries: list[_Raw] = []
    pg_config: dict = {}
    pg_status: dict = {}


_DECODER = msgspec.json.Decoder(_RawDump)


class Entry:
    """One Flight Recorder entry, compact (a 1,024-rank job's 2M entries in a few hundred MB): what
    the diagnosis reads of it, `get` answering with PyTorch's key names."""

    __slots__ = ("pg", "desc", "p2p", "seq", "name", "sizes", "dtypes", "sig", "state", "t", "pg_id")

    def __init__(self, e: _Raw, shared: dict[str, str]):
        _shared = shared.setdefault  # one copy of each name / sizes / dtypes string across the dumps
        pg = e.process_group or ["", ""]
        name, desc = str(pg[0]), str(pg[1] if len(pg) > 1 else "")
        self.pg, self.desc = _shared(name, name), _shared(desc, desc)
        self.p2p, self.seq = e.is_p2p, e.collective_seq_id
        self.name = _shared(e.profiling_name, e.profiling_name)
        sizes = bytes(e.input_sizes).decode() + "/" + bytes(e.output_sizes).decode()
        dtypes = bytes(e.input_dtypes).decode() + "/" + bytes(e.output_dtypes).decode()
        self.sizes, self.dtypes = _shared(sizes, sizes), _shared(dtypes, dtypes)
        self.state = _shared(e.state, e.state)
        sig = f"{self.name}|{self.sizes}|{self.dtypes}"
        self.sig = _shared(sig, sig)  # equal signatures: the same op, sizes and dtypes
        self.t, self.pg_id = e.time_created_ns, e.pg_id

    _KEYS = {"profiling_name": "name", "time_created_ns": "t", "pg_id": "pg_id", "state": "state"}

    def get(self, key: str, default: Any = None) -> Any:
        if key in ("input_sizes", "input_dtypes"):  # kept as their JSON text: one shared string, not lists
            text = (self.sizes if key == "input_sizes" else self.dtypes).split("/", 1)[0]
            return orjson.loads(text) if text[:1] in ("[", "{") else None
        return getattr(self, self._KEYS[key], default)


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


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
    run: dict | None = None  # run.json when read from a run directory
    origin: str = ""
    skipped: list[str] = field(default_factory=list)


def _rank_of(name: str) -> int:
    stem = Path(name).name
    for suffix in (".gz", ".json", ".pkl", ".pickle"):
        stem = stem.removesuffix(suffix)
    m = _RANK.search(stem)
    if not m:
        raise HangInputError(f"{name}: no rank number in the file name (name dumps like rank3.json)")
    return int(m.group(1))


def _parse(name: str, raw: bytes, shared: dict[str, str] | None = None) -> Dump:
    head = raw[:2].lstrip()
    if raw[:1] == b"\x80" or head[:1] not in (b"{", b""):
        if raw[:1] == b"\x80":
            raise HangInputError(
                f"{name}: a pickle (PyTorch's default Flight Recorder format), which is never read: it can run "
                "code. Dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on each rank"
            )
        raise HangInputError(f"{name}: not a JSON Flight Recorder dump")
    try:
        doc = _DECODER.decode(raw)
    except msgspec.ValidationError as err:
        raise HangInputError(f"{name}: not a Flight Recorder dump ({err})") from None
    except msgspec.DecodeError as err:
        raise HangInputError(f"{name}: not valid JSON ({err})") from None
    if len(doc.entries) > MAX_ENTRIES:
        raise HangInputError(f"{name}: {len(doc.entries):,} entries, more than {MAX_ENTRIES:,}")
    shared = {} if shared is None else shared
    entries = [Entry(e, shared) for e in doc.entries]
    config = {}
    for key, value in doc.pg_config.items():
        if not isinstance(value, dict) or not key:
            continue
        ranks = value.get("ranks", [])
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                ranks = []
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            config[str(value.get("name") or key)] = {"desc": str(value.get("desc") or ""), "ranks": ranks}
    status = {str(k): v for k, v in doc.pg_status.items() if isinstance(v, dict)}
    return Dump(_rank_of(name), entries, config, status, name)


def load_dumps(path: Any, limits: Limits | None = None) -> Dumps:
    """Every rank's dump under `path` (module docstring); HangInputError / NoTracesError naming the problem."""
    gc_was = gc.isenabled()
    gc.disable()  # millions of small objects, no cycles: the collector's passes cost 4x the parse
    try:
        return _load_dumps(path, limits)
    finally:
        if gc_was:
            gc.enable()


def _load_dumps(path: Any, limits: Limits | None) -> Dumps:
    p = Path(path)
    run = None
    if p.is_dir() and (p / "fr").is_dir():
        try:
            run = json.loads((p / "run.json").read_text()) if (p / "run.json").is_file() else None
        except (OSError, ValueError):
            run = None
        p = p / "fr"
    limits = limits or Limits(max_file_bytes=MAX_DUMP_BYTES)
    try:
        found = resolve(p, limits=limits)
    except NoTracesError:
        raise NoTracesError(f"{path}: no Flight Recorder dumps (*.json) in it", path=str(path)) from None
    dumps: dict[int, Dump] = {}
    skipped: list[str] = []
    shared: dict[str, str] = {}
    for name, src in found.sources():
        if Path(name).name.startswith("."):
            continue
        with open_source(src) as f:
            raw = b"".join(stream(f, name, limits))
        d = _parse(name, raw, shared)
        if d.rank in dumps:
            raise HangInputError(f"{name} and {dumps[d.rank].source}: two dumps of rank {d.rank}")
        dumps[d.rank] = d
        if len(dumps) > MAX_RANKS:
            raise HangInputError(f"{path}: more than {MAX_RANKS:,} ranks")
    if not dumps:
        raise NoTracesError(f"{path}: no Flight Recorder dumps in it", path=str(path))
    return Dumps(dumps, run, str(path), skipped)


# ---------------------------------------------------------------- the diagnosis


def _op(entry: Entry) -> str:
    name = str(entry.get("profiling_name") or "")
    name = name.split(":", 1)[-1].strip()
    m = _P2P.search(name)
    if m:
        return m.group(1)
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "unknown"


def _sizes(entry: Entry) -> str:
    return entry.sizes


def _dtypes(entry: Entry) -> str:
    return entry.dtypes


def dim_of_desc(desc: str) -> str | None:
    """The plan dimension a process group's description names, or None."""
    for pattern, dim in _DESC:
        m = pattern.search(desc or "")
        if m:
            return dim or m.group(1)
    return None


def _dim_from_plan(ranks: list[int], plan, gpus_per_node: int) -> str | None:
    if plan is None or not ranks:
        return None
    topo = plan.topology(gpus_per_node)
    key = sorted(ranks)
    for dim in ("tp", "cp", "pp", "dp"):
        if getattr(plan, dim) == len(key) and any(sorted(int(r) for r in g) == key for g in topo.group_ranks(dim)):
            return dim
    return None


@dataclass
class _Group:
    name: str
    desc: str
    ranks: list[int]
    dim: str
    seqs: dict[int, dict[int, dict]]  # rank -> seq -> entry (collectives)
    p2p: dict[int, list[dict]]  # rank -> its point-to-point entries in order


def _groups(dumps: Dumps, plan, gpus_per_node: int) -> tuple[dict[str, _Group], list[dict]]:
    issues: list[dict] = []
    config: dict[str, list[tuple[int, list[int], str]]] = defaultdict(list)
    for d in dumps.dumps.values():
        for name, c in d.pg_config.items():
            config[name].append((d.rank, c["ranks"], c["desc"]))
    groups: dict[str, _Group] = {}
    for d in sorted(dumps.dumps.values(), key=lambda x: x.rank):
        last = defaultdict(lambda: -1)
        for e in d.entries:
            name, desc = e.pg, e.desc
            g = groups.get(name)
            if g is None:
                g = groups[name] = _Group(name, desc, [], "", defaultdict(dict), defaultdict(list))
            if e.p2p:
                g.p2p[d.rank].append(e)
                continue
            seq = e.seq
            if seq <= last[name]:
                issues.append(
                    {"rank": d.rank, "group": name, "kind": "order", "seq": seq, "op": _op(e), "after": last[name]}
                )
            last[name] = max(last[name], seq)
            g.seqs[d.rank][seq] = e
    for name, g in groups.items():
        users = tuple(sorted(set(g.seqs) | set(g.p2p)))  # the dumped ranks that issued on it
        views = [(rank, tuple(r)) for rank, r, _ in config.get(name, []) if r]
        if not views:  # no pg_config (gloo without the engine's): the ranks that used it
            g.ranks = list(users)
            continue
        # the members most dumps name; on a tie, the view that holds every rank that used the group
        votes = Counter(v for _, v in views)
        common = max(votes, key=lambda v: (votes[v], set(users) <= set(v), -len(v)))
        g.ranks = list(common)
        for rank, view in views:
            if view != common:
                issues.append(
                    {"rank": rank, "group": name, "kind": "membership", "seq": None, "op": "", "ranks": list(view)}
                )
    for g in groups.values():
        if g.name == "0" or g.desc == "default_pg":
            g.dim = "world"
        else:
            g.dim = dim_of_desc(g.desc) or _dim_from_plan(g.ranks, plan, gpus_per_node) or "unknown"
    return groups, issues


def _first_disagreement(g: _Group, present: set[int]) -> dict | None:
    """The group's first collective sequence number where its dumped members disagree."""
    members = [r for r in g.ranks if r in present]
    if len(members) < 1:
        return None
    have = {r: g.seqs.get(r, {}) for r in members}
    lo = max((min(s) for s in have.values() if s), default=None)
    hi = max((max(s) for s in have.values() if s), default=None)
    if lo is None:
        return None
    for seq in range(lo, hi + 1):
        at = {r: s[seq] for r, s in have.items() if seq in s}
        if len(at) == len(members) and len({e.sig for e in at.values()}) == 1:
            continue  # every member issued the same: the common case, without a closer look
        lacking = [r for r in members if seq not in have[r]]
        if lacking:
            if len(lacking) == len(members):
                continue  # a gap in every buffer: nothing to compare
            ref = next(iter(at.values()))
            return {"seq": seq, "kind": "missing", "suspects": lacking, "op": _op(ref), "entries": at}
        for kind, key in (("op_mismatch", _op), ("size_mismatch", _sizes), ("dtype_mismatch", _dtypes)):
            values = {r: key(e) for r, e in at.items()}
            if len(set(values.values())) > 1:
                # the value most members hold; on a tie (two members) the one the group issues most often
                votes = Counter(values.values())
                usual = Counter(key(e) for s in have.values() for e in s.values())
                common = max(votes, key=lambda v: (votes[v], usual[v]))
                odd = sorted(r for r, v in values.items() if v != common)
                ref = next(e for r, e in at.items() if values[r] == common)
                found = {"seq": seq, "kind": kind, "suspects": odd, "op": _op(ref), "entries": at}
                return {**found, "expected": common.split("/")[0], "got": values[odd[0]].split("/")[0]}
    return None


def _p2p_disagreement(g: _Group, present: set[int]) -> dict | None:
    """The first unpaired or mismatched point-to-point op of the group: sends and receives pair per
    (sender, receiver) in order."""
    sends: dict[tuple[int, int], list[dict]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for entries in g.p2p.values():
        for e in entries:
            m = _P2P.search(str(e.get("profiling_name") or ""))
            if not m:
                continue
            kind, a, b = m.group(1), int(m.group(2)), int(m.group(3))
            (sends if kind == "send" else recvs)[(a, b)].append(e)
    worst = None
    for pair in set(sends) | set(recvs):
        src, dst = pair
        if src not in present or dst not in present:
            continue
        s, r = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(s), len(r))):
            if k >= len(s) or k >= len(r):
                have = s[k] if k < len(s) else r[k]
                who, op = (dst, "recv") if k >= len(r) else (src, "send")
                found = {"seq": k + 1, "kind": "missing", "suspects": [who], "op": op, "entries": {}, "pair": pair}
                found["time"] = int(have.get("time_created_ns") or 0)
            elif _sizes(s[k]).split("/")[0] != _sizes(r[k]).split("/")[0]:
                found = {"seq": k + 1, "kind": "size_mismatch", "suspects": [src], "op": "send", "entries": {}}
                found.update(pair=pair, time=int(s[k].get("time_created_ns") or 0))
            else:
                continue
            if worst is None or found["time"] < worst["time"]:
                worst = found
            break
    return worst


def _node(rank: int, run: dict | None, gpus_per_node: int) -> int:
    hosts = (run or {}).get("hosts") or {}
    info = hosts.get(str(rank))
    if isinstance(info, dict) and isinstance(info.get("node"), int):
        return info["node"]
    return rank // max(gpus_per_node, 1)


def _last(g: _Group, d: Dump) -> int | None:
    """The group's last completed collective sequence number on the rank: its pg_status where the
    backend keeps it, else the last one its buffer holds."""
    seqs = g.seqs.get(d.rank, {})
    pg_id = next((str(e.get("pg_id")) for e in seqs.values() if e.get("pg_id") is not None), None)
    status = d.pg_status.get(pg_id or "", {})
    try:
        value = int(status.get("last_completed_collective"))
        if value >= 0:
            return value
    except (TypeError, ValueError):
        pass
    return max(seqs) if seqs else None


def diagnose(dumps: Dumps, *, plan: Plan | None = None, gpus_per_node: int = 8) -> dict:
    """{diagnosis, suspects, groups, evidence, ranks, missing_dumps, progress}: see the module docstring."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        return _diagnose(dumps, plan, gpus_per_node)
    finally:
        if gc_was:
            gc.enable()


def _diagnose(dumps: Dumps, plan, gpus_per_node: int) -> dict:
    run = dumps.run
    if plan is None and run and isinstance(run.get("plan"), dict):
        try:
            plan = Plan.from_dict(run["plan"])
        except (ValueError, TypeError, KeyError):
            plan = None
    world = plan.world_size if plan is not None else (run or {}).get("world_size")
    present = set(dumps.dumps)
    groups, issues = _groups(dumps, plan, gpus_per_node)
    findings = []
    for g in groups.values():
        for found in (_first_disagreement(g, present), _p2p_disagreement(g, present)):
            if found is None:
                continue
            if "time" not in found:
                found["time"] = min((int(e.get("time_created_ns") or 0) for e in found["entries"].values()), default=0)
            findings.append({**found, "group": g})
    for issue in issues:
        g = groups.get(issue["group"])
        findings.append(
            {
                "seq": issue["seq"],
                "kind": issue["kind"],
                "suspects": [issue["rank"]],
                "op": issue["op"],
                "entries": {},
                "group": g,
                "time": 0,
            }
        )
    # the root cause first: membership and order faults, then the earliest issued disagreement
    findings.sort(key=lambda f: (f["kind"] not in ("membership", "order"), f["time"]))
    suspects, seen = [], set()
    for f in findings:
        for r in f["suspects"]:
            if (r, f["group"].name) in seen:
                continue
            seen.add((r, f["group"].name))
            suspects.append(
                {
                    "rank": int(r),
                    "dim": f["group"].dim,
                    "kind": f["kind"],
                    "op": f["op"],
                    "seq": f["seq"],
                    "node": _node(int(r), run, gpus_per_node),
                    "group": f["group"].name,
                }
            )
    missing_dumps = sorted(set(range(world)) - present) if isinstance(world, int) else []
    group_rows = [
        {
            "name": g.name,
            "desc": g.desc,
            "dim": g.dim,
            "ranks": g.ranks,
            "last_completed": {str(r): _last(g, dumps.dumps[r]) for r in g.ranks if r in present},
        }
        for g in sorted(groups.values(), key=lambda x: (x.dim, x.name))
    ]
    text = _paragraph(findings, suspects, dumps, missing_dumps, groups)
    dim = suspects[0]["dim"] if suspects else None
    progress = {}  # each rank's last completed collective in its group of the root cause's dimension
    for row in group_rows:
        if row["dim"] == dim:
            progress.update(row["last_completed"])
    return {
        "progress": {"dim": dim, "last_completed": progress},
        "diagnosis": text,
        "suspects": suspects,
        "groups": group_rows,
        "ranks": sorted(present),
        "missing_dumps": missing_dumps,
        "evidence": _evidence(findings[0]) if findings else [],
    }


def _stuck_note(f: dict, dumps: Dumps) -> str:
    if f["kind"] != "missing" or not f["entries"]:
        return ""
    g = f["group"]
    arrived = min(int(e.get("time_created_ns") or 0) for e in f["entries"].values())
    notes = []
    for r in f["suspects"]:
        seqs = g.seqs.get(r, {})
        if not seqs or not arrived:
            continue
        last = seqs[max(seqs)]
        gap = (arrived - int(last.get("time_created_ns") or 0)) / 1e9
        later = max((int(e.get("time_created_ns") or 0) for e in dumps.dumps[r].entries), default=0)
        if later > arrived:
            notes.append(f"rank {r} went on to other collectives after the others arrived: it skipped this one")
        elif gap > STUCK_S:
            notes.append(
                f"rank {r}'s last collective was issued {gap:,.1f} s before the others arrived here: it was stuck "
                "before this collective (in compute, data loading, or a hang of its own)"
            )
        else:
            notes.append(f"rank {r} issued nothing after its collective #{max(seqs)}")
    return "; ".join(notes)


def _paragraph(findings, suspects, dumps: Dumps, missing_dumps: list[int], groups) -> str:
    n = len(dumps.dumps)
    if not findings:
        head = f"The {n} ranks' Flight Recorder dumps agree: every process group's members issued the same collectives"
        if missing_dumps:
            head += f"; no dump from rank(s) {_ranks_text(missing_dumps)} (their processes may have died first)"
        return head + "."
    f = findings[0]
    g = f["group"]
    who = _ranks_text(f["suspects"])
    where = (
        f"{g.dim.upper() if g.dim not in ('world', 'unknown') else g.dim} group {g.name} (ranks {_ranks_text(g.ranks)})"
    )
    nodes = sorted({s["node"] for s in suspects if s["rank"] in f["suspects"]})
    node = f" on node {', '.join(map(str, nodes))}" if nodes else ""
    what = {
        "missing": f"never issued {f['op']} #{f['seq']}, which the other members of the {where} did",
        "op_mismatch": f"issued {f.get('got')} as collective #{f['seq']} of the {where}, where its peers issued "
        f"{f['op']}",
        "size_mismatch": f"issued {f['op']} #{f['seq']} of the {where} with sizes {f.get('got')} where its peers "
        f"used {f.get('expected')}",
        "dtype_mismatch": f"issued {f['op']} #{f['seq']} of the {where} in {f.get('got')} where its peers used "
        f"{f.get('expected')}",
        "membership": f"names the {where} with other ranks than its peers do",
        "order": f"issued the {where}'s collectives out of sequence order",
    }[f["kind"]]
    if f.get("pair"):
        src, dst = f["pair"]
        what = (
            f"never posted the {f['op']} of message #{f['seq']} from rank {src} to rank {dst} in the {where}, "
            f"which rank {dst if f['op'] == 'send' else src} did"
            if f["kind"] == "missing"
            else f"sent message #{f['seq']} to rank {dst} in the {where} with other sizes than rank {dst} receives"
        )
    text = f"Rank {who}{node} {what}: the job hangs there"
    note = _stuck_note(f, dumps)
    if note:
        text += f" ({note})"
    others = [x for x in findings[1:] if x["group"].name != g.name]
    if others:
        text += f". {len(others)} other group(s) wait behind it"
    if missing_dumps:
        text += f". No dump from rank(s) {_ranks_text(missing_dumps)}: look at their logs"
    return text + f". Read from {n} rank dump(s)."


def _ranks_text(ranks) -> str:
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) > 6:
        return ", ".join(map(str, ranks[:5])) + f" and {len(ranks) - 5} more"
    return ", ".join(map(str, ranks))


def _evidence(f: dict) -> list[dict]:
    """The root cause's entries, one row per rank: op, sequence number, sizes, dtypes, state."""
    rows = []
    for rank, e in sorted(f["entries"].items()):
        rows.append(
            {
                "rank": rank,
                "group": f["group"].name,
                "seq": f["seq"],
                "op": _op(e),
                "input_sizes": e.get("input_sizes"),
                "dtypes": e.get("input_dtypes"),
                "state": e.get("state"),
                "issued_ns": e.get("time_created_ns"),
            }
        )
    for r in f["suspects"]:
        if r not in f["entries"]:
            rows.append({"rank": r, "group": f["group"].name, "seq": f["seq"], "op": "(not issued)"})
    return rows
