"""Uploaded trace sets: each file checked on its own with the trace loader, the good ones stored under a
name, each bad one reported with the loader's message (the others are kept).

    checked = check_files([("rank0_trace.json.gz", b"..."), ("junk.json", b"{")])
    checked.accepted    # [Accepted(name, data, ranks, world_size, events)]
    checked.rejected    # [(name, message)]  -- e.g. 'junk.json: not valid JSON: ...'
    path = store("llama-8k", checked.accepted, plan=plan, uploads=uploads_dir())

Layout: UPLOADS/NAME/traces/<files>, UPLOADS/NAME/manifest.json {name, created_at, world_size,
ranks, files [{name, bytes, ranks}], rejected [{name, message}]}, and UPLOADS/NAME/plan.json
{plan, model} when a plan is attached (for dimension labels; the model, its whole shape or a preset's
name, lets a calibration be fitted from the set). A set is written into a temporary
folder beside the others and renamed into place, so it is never half-written, and an existing name
is never overwritten.

Pure-ish: stdlib, parallel/, profiler.traces (the loader) and runfiles; no streamlit, no torch.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from parallel.core.plan import Plan
from parallel.core.specs import Model
from parallel.importers import import_text
from profiler.traces.errors import TraceError
from profiler.traces.loader import load_traces
from runfiles.lines import one_line, rank_span
from runfiles.rundir import now_iso

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TRACE_SUFFIXES = (".json", ".json.gz", ".zip", ".tar.gz", ".tgz", ".tar")
NOT_TRACES = frozenset({"run.json", "metrics.json", "plan.json", "manifest.json", "commbench.json"})


class UploadError(ValueError):
    """The set cannot be stored (its name, its plan, or no file left); the message says why."""


@dataclass(frozen=True)
class Accepted:
    name: str
    data: bytes = field(repr=False)
    ranks: tuple[int, ...]
    world_size: int | None
    events: int


@dataclass
class Checked:
    accepted: list[Accepted] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        sizes = [a.world_size for a in self.accepted if a.world_size]
        if sizes:
            return max(sizes)
        ranks = [r for a in self.accepted for r in a.ranks]
        return max(ranks) + 1 if ranks else None

    @property
    def ranks(self) -> list[int]:
        return sorted(r for a in self.accepted for r in a.ranks)

    def kept(self) -> str:
        """What was kept, counted as traces (one per rank) and the files that held them: 'Kept 8 rank
        traces (ranks 0–7) from 1 file', not 'Kept 1 file(s)' for an archive of 8."""
        n, files = len(self.ranks), len(self.accepted)
        traces = f"{n:,} rank trace{'s' if n != 1 else ''}"
        held = "" if files == n else f" from {files:,} file{'s' if files != 1 else ''}"
        return f"{traces} ({rank_span(self.ranks)}){held}"

    def rows(self) -> list[dict]:
        """The accepted files as table rows."""
        return [
            {
                "file": a.name,
                "ranks": rank_span(a.ranks).removeprefix("ranks ").removeprefix("rank "),
                "world size": a.world_size,
                "events": a.events,
                "MB": len(a.data) / 1e6,
            }
            for a in self.accepted
        ]


def _check_one(name: str, data: bytes, folder: Path) -> Accepted:
    path = folder / name
    path.write_bytes(data)
    traces = load_traces(path, cache=False)
    sizes = traces.ranks["world_size"].dropna()
    return Accepted(name, data, tuple(traces.rank_ids), int(sizes.max()) if len(sizes) else None, traces.n_events)


def _is_flight_recorder(data: bytes) -> bool:
    """A Flight Recorder dump's JSON (its keys, or its first entry's, near the top), not a Kineto trace."""
    head = data[:4096]
    keys = (b'"comm_lib_version"', b'"pg_status"', b'"collective_seq_id"')
    return head.lstrip()[:1] == b"{" and any(k in head for k in keys)


def check_files(files: list[tuple[str, bytes]]) -> Checked:
    """Load each file alone (TraceError -> rejected with its message), then reject files that clash
    with the ones kept before them: a rank seen twice, a different world size (another job)."""
    out = Checked()
    candidates: dict[str, bytes] = {}
    for raw_name, data in files:
        name = PurePosixPath(str(raw_name).replace("\\", "/")).name
        if name in candidates:
            out.rejected.append((name, f"{name}: uploaded twice; the first copy is kept"))
        elif name.lower() in NOT_TRACES or not name.lower().endswith(TRACE_SUFFIXES):
            out.rejected.append(
                (name, f"{name}: not a trace file; upload Kineto traces (.json, .json.gz) or a .zip / .tar.gz of them")
            )
        elif _is_flight_recorder(data):
            out.rejected.append(
                (name, f"{name}: a Flight Recorder dump, not a trace: open it on the 'Why did it hang' page")
            )
        else:
            candidates[name] = data
    if not candidates:
        return out
    together = _check_together(candidates)
    if together is not None:  # the common case: the set is decoded once, into the cache its views open
        out.accepted += together
        return out
    with tempfile.TemporaryDirectory(prefix="parascope-upload-") as tmp:
        for name, data in candidates.items():
            try:
                got = _check_one(name, data, Path(tmp))
            except TraceError as err:
                out.rejected.append((name, str(err)))
                continue
            except Exception as err:  # a loader bug must cost this file only, never the batch's good ones
                out.rejected.append((name, one_line(f"{name}: could not be read ({type(err).__name__}: {err})")))
                continue
            clash = _clash(out, got)
            if clash:
                out.rejected.append((name, clash))
                continue
            out.accepted.append(got)
    return out


def _check_together(candidates: dict[str, bytes]) -> list[Accepted] | None:
    """Load the files as one set, with the parse cache on: the set's cache key is its files' names and
    bytes, so the views of the stored set open this parse instead of decoding the files again. None
    when the set does not load whole or a file adds no rank of its own: each file is then checked
    alone, to keep the good ones and say what is wrong with each of the others."""
    with tempfile.TemporaryDirectory(prefix="parascope-upload-") as tmp:
        for name, data in candidates.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            traces = load_traces(Path(tmp), cache=True)
        except TraceError:
            return None
    ranks = traces.ranks
    source = ranks["source"].astype(str)
    accepted: list[Accepted] = []
    for name, data in candidates.items():
        mine = ranks[(source == name) | source.str.startswith(name + ":")]
        if mine.empty:
            return None
        sizes = mine["world_size"].dropna()
        got = Accepted(
            name,
            data,
            tuple(sorted(int(r) for r in mine["rank"])),
            int(sizes.max()) if len(sizes) else None,
            int(mine["events"].sum()),
        )
        if _clash(Checked(accepted=accepted), got):
            return None
        accepted.append(got)
    return accepted


def _clash(kept: Checked, new: Accepted) -> str | None:
    for other in kept.accepted:
        both = sorted(set(other.ranks) & set(new.ranks))
        if both:
            return (
                f"{new.name}: rank {both[0]} appears twice: in {other.name} and in {new.name}; a set holds one "
                "trace per rank, so the first is kept"
            )
        if other.world_size and new.world_size and other.world_size != new.world_size:
            return (
                f"{new.name}: comes from a job of world size {new.world_size}, but {other.name} from one of "
                f"{other.world_size}; files from different jobs cannot be mixed"
            )
    return None


def check_name(name: str, uploads: Path) -> str:
    name = (name or "").strip()
    if not NAME_RE.match(name):
        raise UploadError(f"name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if (Path(uploads) / name).exists():
        raise UploadError(f"a set named {name!r} already exists; choose another name (sets are never overwritten)")
    return name


def check_plan(plan: Plan | None, world_size: int | None) -> None:
    if plan is not None and world_size and plan.world_size != world_size:
        raise UploadError(
            f"the plan is dp×tp×pp×cp = {plan.dp}×{plan.tp}×{plan.pp}×{plan.cp} = {plan.world_size} ranks, but the "
            f"traces come from a job of world size {world_size}; fix the plan or store the set without one"
        )


def store(
    name: str,
    accepted: list[Accepted],
    *,
    uploads: Path,
    plan: Plan | None = None,
    model: Model | str | None = None,
    rejected: list[tuple[str, str]] = (),
) -> Path:
    """Write the accepted files as set `name` (see the module docstring); returns its folder."""
    uploads = Path(uploads)
    uploads.mkdir(parents=True, exist_ok=True)
    name = check_name(name, uploads)
    if not accepted:
        raise UploadError("no trace file was accepted; nothing to store")
    checked = Checked(accepted=list(accepted))
    check_plan(plan, checked.world_size)
    tmp = Path(tempfile.mkdtemp(dir=uploads, prefix=f".tmp-{name}-"))
    try:
        (tmp / "traces").mkdir()
        for a in accepted:
            (tmp / "traces" / a.name).write_bytes(a.data)
        manifest = {
            "name": name,
            "created_at": now_iso("seconds"),
            "world_size": checked.world_size,
            "ranks": checked.ranks,
            "files": [{"name": a.name, "bytes": len(a.data), "ranks": list(a.ranks)} for a in accepted],
            "rejected": [{"name": n, "message": m} for n, m in rejected],
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if plan is not None:
            # the model's whole shape (a launch script's is no preset): a calibration can be fitted from the set
            spec = model.to_dict() if isinstance(model, Model) else model
            (tmp / "plan.json").write_text(json.dumps({"plan": plan.to_dict(), "model": spec}, indent=1))
        final = uploads / name
        try:
            tmp.rename(final)  # fails on an existing non-empty folder: never overwrites a set
        except OSError:
            raise UploadError(f"a set named {name!r} was just stored by someone else; choose another name") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def plan_from_file(name: str, text: str, world_size: int | None) -> tuple[Plan, Model | None]:
    """A plan (and the model, when the file says it) from a plan file -- ParaScope plan/run/review JSON,
    a Megatron-LM launch script, a torchtitan TOML -- resolved for the traces' world size."""
    imported = import_text(text, name)
    if world_size and imported.plan.world_size != world_size:
        imported = imported.with_world_size(world_size, "the traces' world size")
    return imported.plan, imported.model
