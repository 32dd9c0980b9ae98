"""Why did the job hang: PyTorch Flight Recorder dumps read across ranks.

    dumps = load_dumps(PATH)          # a run directory (its fr/), a folder, or a .zip / .tar(.gz) of dumps
    report = diagnose(dumps, plan=plan, gpus_per_node=8)

Reading, and its bounds: profiler.analyzers.hang_dumps. Per process group, over the sequence numbers
every member's ring buffer still holds (only those present are visited):
- collectives in order. Entries of one coalesced call share a sequence number; such a block is compared
  position by position, and a rank whose block is shorter made an empty coalesced call, which is no
  fault (as in PyTorch's analyzer). At the first sequence number where the members disagree: a member
  that never issued it (`missing`), another op (`op_mismatch`), other sizes (`size_mismatch`), other
  dtypes (`dtype_mismatch`), or an entry still pending where the others completed (`state_mismatch`).
  Sizes follow each op's contract, as torch.distributed.flight_recorder checks them: all_reduce's output
  is its input, all_gather's output holds group-size times its input, reduce_scatter's input
  group-size times its output; gather's root alone has outputs, scatter's root alone inputs, and
  all_to_all's differ by design. The odd ones out (the minority; on a tie, the one whose entry breaks
  its op's contract or is least usual in the group) are the suspects;
- point-to-point ops pair up per (sender, receiver) in order: the k-th send with the k-th receive. Their
  names give group-local ranks ("send 0->1" in a group [2, 3]), as NCCL writes them. An unpaired one
  names the rank that did not post its side (`missing`); a pair of other sizes `size_mismatch`;
- members that name the group with other ranks (`membership`), sequence numbers that go back (`order`).
The root cause: a definite fault (a mismatch, a membership) first, by the time it was issued; else the
rank whose own next operation never appears -- a suspect of a `missing` finding that is not itself
waiting in an operation its peers lack. A rank that stops receiving makes its sender wait: the sender is
seen waiting, the receiver is the cause. In a cycle of waits, the rank that issued an operation its
group never issues otherwise. The group's plan dimension: profiler.analyzers.labels (the plan's groups,
then the group's name, profiler.traces.group_names); the node is the rank's (a run's hosts, else rank //
gpus_per_node).

Pure: stdlib, orjson.
"""

from __future__ import annotations

import gc
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import orjson

from parallel.core.plan import Plan
from profiler.analyzers.hang_dumps import (
    MAX_GROUPS,
    MAX_RANKS,
    Dump,
    Dumps,
    Entry,
    HangInputError,
    clean,
    load_dumps,
    world_ranks,
)
from profiler.analyzers.labels import DimLabeler

__all__ = ["KINDS", "HangInputError", "MAX_RANKS", "diagnose", "load_dumps", "clean"]

KINDS = ("missing", "op_mismatch", "size_mismatch", "dtype_mismatch", "state_mismatch", "membership", "order")
DEFINITE = frozenset({"op_mismatch", "size_mismatch", "dtype_mismatch", "membership"})
STUCK_S = 5.0  # a missing rank whose last collective is this much older than the others' is stuck
_ALL_GATHER = frozenset({"all_gather", "_all_gather_base", "all_gather_base", "all_gather_into_tensor_coalesced"})
_REDUCE_SCATTER = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"})
_ALL_REDUCE = frozenset({"all_reduce", "allreduce_coalesced"})
_UNEVEN = ("all_to_all", "all_gather_v", "reduce_scatter_v")  # sizes differ across ranks by design


@dataclass
class _Group:
    name: str
    desc: str
    ranks: list[int]
    dim: str = ""
    seqs: dict[int, dict[int, list[Entry]]] = field(default_factory=lambda: defaultdict(dict))
    p2p: dict[int, list[Entry]] = field(default_factory=lambda: defaultdict(list))


# ---------------------------------------------------------------- groups


def _views(dumps: Dumps) -> dict[str, dict[int, tuple[int, ...]]]:
    """Group name -> rank -> the members that rank's pg_config names."""
    views: dict[str, dict[int, tuple[int, ...]]] = defaultdict(dict)
    for d in dumps.dumps.values():
        for name, c in d.pg_config.items():
            if c["ranks"]:
                views[name][d.rank] = tuple(sorted(c["ranks"]))
    return views


def _split(views: dict[int, tuple[int, ...]]) -> bool:
    """True when each rank's view of a name is a group of its own that its members agree on (split_group
    and per-rank subgroups reuse a name: PyTorch keys a group by name and ranks)."""
    return len(set(views.values())) > 1 and all(
        r in v and all(views.get(m, v) == v for m in v) for r, v in views.items()
    )


def _groups(dumps: Dumps, labeler: DimLabeler) -> tuple[dict[tuple, _Group], list[dict]]:
    issues: list[dict] = []
    views = _views(dumps)
    split = {name for name, v in views.items() if _split(v)}
    groups: dict[tuple, _Group] = {}
    for d in sorted(dumps.dumps.values(), key=lambda x: x.rank):
        last: dict[tuple, int] = {}
        for e in d.entries:
            key = (e.pg, views[e.pg].get(d.rank)) if e.pg in split else (e.pg, None)
            g = groups.get(key)
            if g is None:
                if len(groups) >= MAX_GROUPS:
                    raise HangInputError(f"{d.source}: more than {MAX_GROUPS:,} process groups in the dumps")
                g = groups[key] = _Group(e.pg, e.desc, list(key[1] or ()))
            if e.p2p:
                g.p2p[d.rank].append(e)
                continue
            before = last.get(key)
            if before is not None and e.seq < before:
                issues.append({"rank": d.rank, "group": key, "kind": "order", "seq": e.seq, "op": e.op, "t": e.t})
            last[key] = max(e.seq, before if before is not None else e.seq)
            g.seqs[d.rank].setdefault(e.seq, []).append(e)
    for key, g in groups.items():
        if key[1] is not None:
            continue
        users = set(g.seqs) | set(g.p2p)  # the dumped ranks that issued on it
        named = views.get(g.name, {})
        if not named:  # no pg_config (gloo without the engine's): the ranks that used it
            g.ranks = sorted(users)
            continue
        votes = Counter(named.values())  # the members most dumps name; on a tie, the view holding every user
        common = max(votes, key=lambda v: (votes[v], users <= set(v), -len(v)))
        g.ranks = list(common)
        for rank, view in named.items():
            if view != common:
                issues.append({"rank": rank, "group": key, "kind": "membership", "seq": None, "op": "", "t": 0})
    for g in groups.values():
        if g.name == "0" or g.desc == "default_pg":
            g.dim = "world"
        else:
            g.dim = labeler.label(ann_dim=None, ranks=tuple(g.ranks), op="", desc=g.desc)[0]
    return groups, issues


# ---------------------------------------------------------------- collectives


def _shape_numel(text: str) -> int | None:
    """Total elements of a sizes list's JSON text ([[4, 4], [8]] -> 24); None when it is not one."""
    try:
        sizes = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(sizes, list):
        return None
    total = 0
    for s in sizes:
        if not isinstance(s, list) or not all(isinstance(x, int) and 0 <= x < 1 << 62 for x in s):
            return None
        total += math.prod(s)
    return total


def _contract(e: Entry, n: int) -> str | None:
    """What the entry's own sizes or dtypes break of its op's contract (module docstring), or None."""
    inp, out = e.sizes.split("/", 1)
    if e.op in _ALL_REDUCE and inp != out:
        return "size"
    if e.op in _ALL_GATHER or e.op in _REDUCE_SCATTER:
        a, b = _shape_numel(inp), _shape_numel(out)
        if a is not None and b is not None and (b != a * n if e.op in _ALL_GATHER else a != b * n):
            return "size"
    if e.op not in ("scatter", "gather", "broadcast") and inp not in ("[[]]", "[]") and out not in ("[[]]", "[]"):
        di, do = e.dtypes.split("/", 1)
        if di != do and di not in ("null", '""') and do not in ("null", '""'):
            return "dtype"
    return None


def _compared(e: Entry, kind: str) -> str:
    """The part of an entry its peers' must equal, for one kind of comparison."""
    if kind == "op":
        return e.op
    inp, out = (e.sizes if kind == "size" else e.dtypes).split("/", 1)
    if e.op.startswith(_UNEVEN) and kind == "size":
        return ""
    if e.op == "scatter":
        inp = ""  # only the root has inputs
    if e.op == "gather":
        out = ""  # only the root has outputs
    return f"{inp}/{out}"


def _odd(values: dict[int, str], usual: Counter, bad: dict[int, bool]) -> tuple[str, list[int]]:
    """The value most members hold (on a tie: the one whose holders keep their op's contract, then the
    most usual in the group) and the members that hold another."""
    votes = Counter(values.values())
    holders_ok = {v: not any(bad.get(r) for r, x in values.items() if x == v) for v in votes}
    common = max(votes, key=lambda v: (votes[v], holders_ok[v], usual[v]))
    return common, sorted(r for r, v in values.items() if v != common)


def _position(g: _Group, seq: int, at: dict[int, Entry], n: int, usual) -> dict | None:
    contract = {r: _contract(e, n) for r, e in at.items()}
    for kind in ("op", "size", "dtype"):
        values = {r: _compared(e, kind) for r, e in at.items()}
        if len(set(values.values())) > 1:
            bad = {r: contract[r] is not None for r in at}
            common, odd = _odd(values, usual(kind, lambda e, k=kind: _compared(e, k)), bad)
            ref = next(e for r, e in at.items() if values[r] == common)
            got = at[odd[0]]
            text = {"op": (ref.op, got.op), "size": (ref.sizes, got.sizes), "dtype": (ref.dtypes, got.dtypes)}[kind]
            return {"kind": f"{kind}_mismatch", "suspects": odd, "op": ref.op, "expected": text[0], "got": text[1]}
    broken = sorted(r for r, c in contract.items() if c is not None)
    if broken:
        e = at[broken[0]]
        return {"kind": f"{contract[broken[0]]}_mismatch", "suspects": broken, "op": e.op, "self": True}
    states = {r: e.state for r, e in at.items()}
    if len(set(states.values())) > 1 and "completed" in states.values():
        late = sorted(r for r, s in states.items() if s != "completed")
        return {"kind": "state_mismatch", "suspects": late, "op": at[late[0]].op, "got": states[late[0]]}
    return None


def _collective_findings(g: _Group, present: set[int]) -> dict | None:
    """The group's first collective sequence number where its dumped members disagree."""
    members = [r for r in g.ranks if r in present]
    have = {r: g.seqs.get(r, {}) for r in members}
    if not members or not any(have.values()):
        return None
    lo = max((min(s) for s in have.values() if s), default=0)
    n = len(g.ranks)
    counts: dict[str, Counter] = {}

    def usual(kind, key):  # how often the group issues each value: the tie-break, computed when needed
        if kind not in counts:
            counts[kind] = Counter(key(e) for s in have.values() for block in s.values() for e in block)
        return counts[kind]

    checked: dict[str, bool] = {}  # signature -> keeps its op's contract
    for seq in sorted({s for m in have.values() for s in m if s >= lo}):
        at = {r: s[seq] for r, s in have.items() if seq in s}
        if len(at) == len(members):
            sigs = {tuple(e.sig for e in block) for block in at.values()}
            if len(sigs) == 1:
                (sig,) = sigs
                if all(checked.setdefault(s, _contract(e, n) is None) for s, e in zip(sig, next(iter(at.values())))):
                    continue  # every member issued the same, keeping its contract: the common case
        lacking = [r for r in members if seq not in have[r]]
        first = {r: block[0] for r, block in at.items()}
        t = min(e.t for e in first.values())
        if lacking:
            ref = next(iter(first.values()))
            return {"seq": seq, "kind": "missing", "suspects": lacking, "waiters": sorted(at), "op": ref.op,
                    "entries": first, "time": t}  # fmt: skip
        for i in range(max(len(b) for b in at.values())):
            pos = {r: block[i] for r, block in at.items() if i < len(block)}
            if len(pos) < 2 and len(members) > 1:
                continue  # an empty coalesced call on the others
            found = _position(g, seq, pos, n, usual)
            if found is not None:
                return {"seq": seq, "waiters": [], "entries": pos, "time": t, **found}
    return None


# ---------------------------------------------------------------- point to point


def _global_pair(e: Entry, rank: int, ordered: list[int]) -> tuple[int, int] | None:
    """(src, dst) in global ranks: the name's ranks are group-local (NCCL's, and ours); a name that
    only reads as global ranks (older dumps) is taken as such."""
    src, dst = e.peer
    me = src if e.op == "send" else dst
    if src < len(ordered) and dst < len(ordered) and ordered[me] == rank:
        return ordered[src], ordered[dst]
    if me == rank:
        return src, dst
    return None


def _p2p_findings(g: _Group, present: set[int]) -> list[dict]:
    """Per (sender, receiver) pair, its first unpaired or mismatched message."""
    ordered = sorted(g.ranks)
    sends: dict[tuple[int, int], list[Entry]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[Entry]] = defaultdict(list)
    for rank, entries in g.p2p.items():
        for e in entries:
            if e.peer is None:
                continue
            pair = _global_pair(e, rank, ordered)
            if pair is not None:
                (sends if e.op == "send" else recvs)[pair].append(e)
    found = []
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        if src not in present or dst not in present:
            continue
        s, r = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(s), len(r))):
            if k >= len(s) or k >= len(r):
                lacking, waiting, op = (dst, src, "recv") if k >= len(r) else (src, dst, "send")
                have = s[k] if k < len(s) else r[k]
                found.append({"seq": k + 1, "kind": "missing", "suspects": [lacking], "waiters": [waiting],
                              "op": op, "entries": {waiting: have}, "pair": pair, "time": have.t})  # fmt: skip
                break
            sent, received = s[k].sizes.split("/", 1)[0], r[k].sizes.split("/", 1)[1]
            if sent != received:
                usual = Counter(e.sizes.split("/", 1)[0] for e in s) + Counter(e.sizes.split("/", 1)[1] for e in r)
                odd, op = (src, "send") if usual[sent] <= usual[received] else (dst, "recv")
                found.append({"seq": k + 1, "kind": "size_mismatch", "suspects": [odd], "waiters": [], "op": op,
                              "entries": {src: s[k], dst: r[k]}, "pair": pair, "time": min(s[k].t, r[k].t),
                              "expected": received if odd == src else sent,
                              "got": sent if odd == src else received})  # fmt: skip
                break
    return found


# ---------------------------------------------------------------- the root cause


def _order(findings: list[dict], groups: dict[tuple, _Group]) -> list[dict]:
    """Findings, the root cause first (module docstring); each finding's root suspects first."""
    waiting = {r for f in findings if f["kind"] == "missing" for r in f["waiters"]}
    for f in findings:
        if f["kind"] == "missing":
            roots = [r for r in f["suspects"] if r not in waiting]
            f["root"] = bool(roots)
            f["suspects"] = roots + [r for r in f["suspects"] if r in waiting]
    if not any(f["kind"] in DEFINITE or f.get("root") for f in findings):
        for f in findings:  # a cycle of waits: the issuers of an operation their group never issues otherwise
            if f["kind"] == "missing" and "pair" not in f and f["waiters"]:
                g = f["group"]
                ops = Counter(e.op for s in g.seqs.values() for block in s.values() for e in block)
                if ops[f["op"]] <= len(f["waiters"]):
                    f.update(kind="op_mismatch", suspects=f["waiters"], waiters=[], got=f["op"], expected="")
    tier = {**dict.fromkeys(DEFINITE, 0), "missing": 2, "state_mismatch": 3, "order": 4}
    return sorted(findings, key=lambda f: (1 if f.get("root") else tier[f["kind"]], f["time"]))


def _node(rank: int, run: dict | None, gpus_per_node: int) -> int:
    info = ((run or {}).get("hosts") or {}).get(str(rank))
    if isinstance(info, dict) and isinstance(info.get("node"), int) and 0 <= info["node"] < MAX_RANKS:
        return info["node"]
    return rank // max(gpus_per_node, 1)


def _last(g: _Group, d: Dump) -> int | None:
    """The group's last completed collective sequence number on the rank: its pg_status where the
    backend keeps it, else the last one its buffer holds."""
    seqs = g.seqs.get(d.rank, {})
    pg_id = next((str(b[0].pg_id) for b in seqs.values() if b[0].pg_id is not None), None)
    value = d.pg_status.get(pg_id or "", {}).get("last_completed_collective")
    if value is not None and value >= 0:
        return value
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
    plan = plan if plan is not None else dumps.plan()
    world = world_ranks(dumps, plan)
    if plan is not None and plan.world_size < max(dumps.dumps) + 1:
        plan = None  # the dumps come from a larger job than the plan: its groups say nothing
    present = set(dumps.dumps)
    groups, issues = _groups(dumps, DimLabeler(plan))
    findings = []
    for g in groups.values():
        found = _collective_findings(g, present)
        for f in ([found] if found else []) + _p2p_findings(g, present):
            findings.append({**f, "group": g})
    for issue in issues:
        findings.append({"seq": issue["seq"], "kind": issue["kind"], "suspects": [issue["rank"]], "waiters": [],
                         "op": issue["op"], "entries": {}, "group": groups[issue["group"]], "time": issue["t"]})  # fmt: skip
    findings = _order(findings, groups)
    run = dumps.run
    suspects, seen = [], set()
    for f in findings:
        for r in f["suspects"]:
            if (r, id(f["group"])) in seen:
                continue
            seen.add((r, id(f["group"])))
            g = f["group"]
            suspects.append({"rank": int(r), "dim": g.dim, "kind": f["kind"], "op": f["op"], "seq": f["seq"],
                             "node": _node(int(r), run, gpus_per_node), "group": g.name})  # fmt: skip
    missing_dumps = sorted(set(world) - present)
    group_rows = [
        {
            "name": g.name,
            "desc": g.desc,
            "dim": g.dim,
            "ranks": g.ranks,
            "last_completed": {str(r): _last(g, dumps.dumps[r]) for r in g.ranks if r in present},
        }
        for g in sorted(groups.values(), key=lambda x: (x.dim, x.name, x.ranks))
    ]
    dim = suspects[0]["dim"] if suspects else None
    progress = {}  # each rank's last completed collective in its group of the root cause's dimension
    for row in group_rows:
        if row["dim"] == dim:
            progress.update(row["last_completed"])
    return {
        "progress": {"dim": dim, "last_completed": progress},
        "diagnosis": _paragraph(findings, suspects, dumps, missing_dumps),
        "suspects": suspects,
        "groups": group_rows,
        "ranks": sorted(present),
        "world_size": len(world),
        "missing_dumps": missing_dumps,
        "evidence": _evidence(findings[0]) if findings else [],
    }


# ---------------------------------------------------------------- the paragraph


def _stuck_note(f: dict, dumps: Dumps) -> str:
    if f["kind"] != "missing" or not f["entries"] or "pair" in f:
        return ""
    g = f["group"]
    arrived = min(e.t for e in f["entries"].values())
    notes = []
    for r in f["suspects"][:4]:
        seqs = g.seqs.get(r, {})
        if not seqs or not arrived:
            continue
        gap = (arrived - seqs[max(seqs)][-1].t) / 1e9
        later = max((e.t for e in dumps.dumps[r].entries), default=0)
        if later > arrived:
            notes.append(f"rank {r} went on to other operations after the others arrived: it skipped this one")
        elif gap > STUCK_S:
            notes.append(
                f"rank {r}'s last collective was issued {gap:,.1f} s before the others arrived here: it was stuck "
                "before this collective (in compute, data loading, or a hang of its own)"
            )
        else:
            notes.append(f"rank {r} issued nothing after its collective #{max(seqs)}")
    return "; ".join(notes)


def _sizes_text(text: str) -> str:
    """'in/out' JSON texts as one when they are equal (most ops), else 'in in, out out'."""
    inp, _, out = text.partition("/")
    return inp if out in (inp, "null", "") else f"{inp} in, {out} out"


def _paragraph(findings, suspects, dumps: Dumps, missing_dumps: list[int]) -> str:
    n = len(dumps.dumps)
    if not findings:
        head = f"The {n} ranks' Flight Recorder dumps agree: every process group's members issued the same operations"
        if missing_dumps:
            head += f"; no dump from rank(s) {_ranks_text(missing_dumps)} (their processes may have died first)"
        return head + "."
    f = findings[0]
    g = f["group"]
    who = _ranks_text(f["suspects"])
    dim = g.dim.upper() if g.dim not in ("world", "unknown") else g.dim
    where = f"{dim} group {g.name} (ranks {_ranks_text(g.ranks)})"
    nodes = sorted({s["node"] for s in suspects if s["rank"] in f["suspects"]})
    node = f" on node {', '.join(map(str, nodes))}" if nodes else ""
    kind = f["kind"]
    if kind == "missing":
        what = f"never issued {f['op']} #{f['seq']}, which the other members of the {where} did"
    elif kind == "op_mismatch":
        what = f"issued {f.get('got')} as collective #{f['seq']} of the {where}" + (
            f", where its peers issued {f['expected']}" if f.get("expected") else ", which its peers never issue"
        )
    elif kind in ("size_mismatch", "dtype_mismatch"):
        what = f"issued {f['op']} #{f['seq']} of the {where} " + ("with sizes " if kind == "size_mismatch" else "in ")
        if "got" in f:
            what += f"{_sizes_text(f['got'])} where its peers used {_sizes_text(f['expected'])}"
        else:  # its own entry breaks the op's contract
            e = f["entries"][f["suspects"][0]]
            inp, out = (e.sizes if kind == "size_mismatch" else e.dtypes).split("/", 1)
            what += f"{inp} in and {out} out, which {f['op']} does not allow"
    elif kind == "state_mismatch":
        what = f"still shows {f['op']} #{f['seq']} of the {where} as {f.get('got')!r} where its peers completed it"
    elif kind == "membership":
        what = f"names the {where} with other ranks than its peers do"
    else:
        what = f"issued the {where}'s collectives out of sequence order"
    if f.get("pair"):
        src, dst = f["pair"]
        if f["kind"] == "missing":
            peer = dst if f["op"] == "send" else src
            what = (
                f"never posted the {f['op']} of message #{f['seq']} from rank {src} to rank {dst} in the {where}, "
                f"whose other side rank {peer} posted"
            )
        else:
            what = (
                f"posted the {f['op']} of message #{f['seq']} from rank {src} to rank {dst} in the {where} with "
                f"sizes {f['got']} where the other side has {f['expected']}"
            )
    text = f"Rank {who}{node} {what}: the job hangs there"
    note = _stuck_note(f, dumps)
    if note:
        text += f" ({note})"
    others = [x for x in findings[1:] if x["group"] is not g]
    if others:
        text += f". {len(others)} other finding(s) in other groups follow from it"
    if missing_dumps:
        text += f". No dump from rank(s) {_ranks_text(missing_dumps)}: look at their logs"
    return text + f". Read from {n} rank dump(s)."


def _ranks_text(ranks) -> str:
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) > 6:
        return ", ".join(map(str, ranks[:5])) + f" and {len(ranks) - 5} more"
    return ", ".join(map(str, ranks))


def _json(text: str):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _evidence(f: dict) -> list[dict]:
    """The root cause's entries, one row per rank: op, sequence number, sizes, dtypes, state."""
    rows = []
    for rank, e in sorted(f["entries"].items()):
        rows.append(
            {
                "rank": rank,
                "group": f["group"].name,
                "seq": f["seq"],
                "op": e.op,
                "input_sizes": _json(e.sizes.split("/", 1)[0]),
                "output_sizes": _json(e.sizes.split("/", 1)[1]),
                "dtypes": _json(e.dtypes.split("/", 1)[0]),
                "state": e.state,
                "issued_ns": e.t,
            }
        )
    for r in f["suspects"]:
        if r not in f["entries"]:
            rows.append({"rank": r, "group": f["group"].name, "seq": f["seq"], "op": "(not issued)"})
    return rows
