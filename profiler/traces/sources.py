"""Where trace bytes come from: a run directory, a folder, a list of files, or a .zip / .tar(.gz).

`resolve(path)` finds the files without reading them; `TraceSet.digest()` hashes their on-disk
bytes (the cache key); `TraceSet.sources()` names each file (its path, or an archive `Member`) for
`open_source()` + `stream()` to decompress in pieces, where it is parsed, so neither a set, a big
file nor an archive member ever sits in memory all at once. Reading is hardened against hostile input:

- gzip is decompressed in bounded chunks; more than `Limits.max_file_bytes` out of one file, or a
  compression ratio above `Limits.max_ratio` past 16 MiB (a gzip or zip bomb), raises TooLargeError;
- archive members are streamed where they are parsed: a zip member or a plain tar's straight from
  the archive, a compressed tar's (which only reads front to back) spilled in pieces to a temporary
  file the parse then deletes; never extracted under its own name. A member whose path escapes the
  archive's folder (absolute, `..`), a symlink, hard link or device raises UnsafeArchiveError;
- truncated or corrupt gzip, zip and tar raise CompressionError.

Pure: stdlib only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import stat
import tarfile
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import orjson

from profiler.traces.errors import CompressionError, NoTracesError, TooLargeError, TraceError, UnsafeArchiveError

try:  # ISA-L's inflate (python-isal): ~2x zlib's on trace JSON (16 -> 8 ms per 4 MB rank); zlib without it
    from isal import isal_zlib as _inflate

    _INFLATE_ERRORS: tuple = (zlib.error, _inflate.error)
except ImportError:  # pragma: no cover - isal is pinned in requirements.txt
    _inflate = zlib
    _INFLATE_ERRORS = (zlib.error,)

GZIP_MAGIC = b"\x1f\x8b"
TRACE_SUFFIXES = (".json", ".json.gz")
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# JSON files a run directory or an upload folder holds next to traces; never traces themselves.
NOT_TRACES = frozenset({"run.json", "metrics.json", "plan.json", "commbench.json", "manifest.json"})
_CHUNK = 4 << 20  # decompress in 4 MiB pieces: a bomb is caught within one piece of the cap


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    """Caps on what reading may cost. Defaults: 4 GiB out of one trace file, 64 GiB out of one set,
    ratios above 200 (JSON traces compress 5-30x; a bomb of zeros ~1000x) past 16 MiB."""

    max_file_bytes: int = field(default_factory=lambda: _env_int("PARASCOPE_MAX_TRACE_BYTES", 4 << 30))
    max_total_bytes: int = field(default_factory=lambda: _env_int("PARASCOPE_MAX_SET_BYTES", 64 << 30))
    max_ratio: float = 200.0
    ratio_floor_bytes: int = 16 << 20
    max_members: int = 100_000


def is_trace_name(name: str) -> bool:
    low = name.lower()
    return low.endswith(TRACE_SUFFIXES) and PurePosixPath(low).name not in NOT_TRACES


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _too_large(name: str, out: int, raw: int, limits: Limits) -> TooLargeError | None:
    if out > limits.max_file_bytes:
        return TooLargeError(
            f"{name}: decompresses to more than {limits.max_file_bytes:,} bytes (the per-file cap); "
            "refusing to read it (raise PARASCOPE_MAX_TRACE_BYTES if the trace is genuine)",
            path=name,
        )
    if out > limits.ratio_floor_bytes and raw and out / raw > limits.max_ratio:
        return TooLargeError(
            f"{name}: decompresses more than {limits.max_ratio:.0f}x ({raw:,} bytes -> over {out:,}); "
            "that is a compression bomb, not a trace",
            path=name,
        )
    return None


def _over_cap(name: str, size: int, limits: Limits) -> TooLargeError:
    return TooLargeError(
        f"{name}: is {size:,} bytes, more than the per-file cap of {limits.max_file_bytes:,} "
        "(raise PARASCOPE_MAX_TRACE_BYTES if the trace is genuine)",
        path=name,
    )


def stream(f: BinaryIO, name: str, limits: Limits) -> Iterator[bytes]:
    """The decompressed bytes of the open file `f` in pieces of at most 4 MiB, gunzipped (all members)
    when it starts with the gzip magic, within the caps: the output so far and its
    ratio to the input read so far are checked after every piece, so memory stays one piece."""
    first = f.read(_CHUNK)
    if not first.startswith(GZIP_MAGIC):
        if first and str(name).lower().endswith(".gz") and first.lstrip()[:1] not in (b"{", b"["):
            # plain JSON named .gz is read as JSON; anything else is neither, and is said to be
            raise CompressionError(
                f"{name}: is not gzip data although it is named .gz (its first bytes are {first[:4].hex(' ')}), "
                "nor JSON",
                path=name,
            )
        out = 0
        while first:
            out += len(first)
            if out > limits.max_file_bytes:
                raise _over_cap(name, out, limits)
            yield first
            first = f.read(_CHUNK)
        return
    out = read = 0
    data = first
    d = _inflate.decompressobj(wbits=31)
    try:
        while True:
            if not data:
                data = f.read(_CHUNK)
                if not data:
                    break
            read += len(data)
            while data:
                piece = d.decompress(data, _CHUNK)
                out += len(piece)
                err = _too_large(name, out, read - len(d.unconsumed_tail) - len(d.unused_data), limits)
                if err:
                    raise err
                if piece:
                    yield piece
                data = d.unconsumed_tail
                if d.eof:
                    rest = d.unused_data
                    if not rest.startswith(GZIP_MAGIC):  # trailing zero padding is tolerated, as gzip does
                        return
                    d = _inflate.decompressobj(wbits=31)  # the next member (its bytes are counted in `read`)
                    data = rest
    except _INFLATE_ERRORS as exc:
        raise CompressionError(f"{name}: corrupt gzip data ({exc})", path=name) from None
    if not d.eof:
        raise CompressionError(
            f"{name}: gzip stream is truncated (it ends before its end marker); the file was cut "
            "off while being written or copied",
            path=name,
        )


def safe_member_name(archive: str, name: str) -> str:
    """The member's normalised relative path, or UnsafeArchiveError if it could escape the folder."""
    norm = name.replace("\\", "/")
    parts = PurePosixPath(norm).parts
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":") or ".." in parts:
        raise UnsafeArchiveError(
            f"{archive}: member {name!r} escapes the archive's folder (absolute path or '..'); "
            "refusing to read the archive",
            path=archive,
        )
    return "/".join(p for p in parts if p not in ("", "."))


RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(name: str) -> int | None:
    """The rank a file's name gives (rank3_trace.json, set.zip:traces/rank-3.json.gz), or None."""
    m = RANK_IN_NAME.search(PurePosixPath(name.split(":")[-1]).name)
    return int(m.group(1)) if m else None


MEMO_SETTLE_NS = 2_000_000_000  # a file this recently modified is not memoized (see TraceSet.digest)


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stat_key(path: Path) -> tuple[str, int]:
    """(the file's memo key, its newest of mtime and ctime in ns)."""
    st = os.stat(path)
    key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{os.path.abspath(path)}"
    return key, max(st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class TraceSet:
    """The trace files of one input, found but not yet read."""

    origin: str  # what the user passed, for messages
    files: tuple[Path, ...]  # plain trace files on disk
    archives: tuple[Path, ...]  # .zip / .tar(.gz) files on disk
    run: dict | None = None  # run.json of a run directory, when there is one
    limits: Limits = field(default_factory=Limits)
    only: frozenset[str] | None = None  # the names (of sources()) kept, for a part of the set; None: all

    def digest(self, memo: dict[str, str] | None = None) -> str:
        """sha256 over every input file's name and the sha256 of its bytes (hashlib.file_digest).

        `memo` ({stat key: file sha256}, read and updated) skips reading a file whose stat key is
        in it: path, device, inode, size, mtime and ctime in ns -- what git's index trusts. Any write
        moves mtime and ctime, and ctime cannot be set back (a tool that restores mtime still moves
        it). A file modified in the last MEMO_SETTLE_NS is hashed but not memoized: it may still be
        being written within one timestamp tick."""
        h = hashlib.sha256()
        now = time.time_ns()
        for path in sorted(self.files + self.archives, key=lambda p: p.name + str(p)):
            if memo is None:
                file_hash = _file_sha256(path)
            else:
                key, changed_ns = _stat_key(path)
                file_hash = memo.get(key) or _file_sha256(path)
                if key not in memo and now - changed_ns > MEMO_SETTLE_NS:
                    memo[key] = file_hash
            h.update(path.name.encode() + b"\0" + file_hash.encode() + b"\0")
        if self.only is not None:
            h.update(b"only\0" + "\0".join(sorted(self.only)).encode())
        return h.hexdigest()

    def sources(self, spill: Path | None = None) -> Iterator[tuple[str, Path | Member]]:
        """(name, path) of each plain trace file, then (name, Member) of each archive member, one
        member at a time; each is read by whoever parses it (open_source), streamed. A compressed
        tar's members are spilled into the folder `spill` (a temporary one of the caller's)."""
        for path in self.files:
            if self.only is not None and path.name not in self.only:
                continue
            size = path.stat().st_size
            if size > self.limits.max_file_bytes:
                raise _over_cap(path.name, size, self.limits)
            yield path.name, path
        for path in self.archives:
            members = (
                _zip_members(path, self.limits) if zipfile.is_zipfile(path) else _tar_members(path, self.limits, spill)
            )
            for name, member in members:
                if self.only is None or name in self.only:
                    yield name, member

    def count(self) -> int:
        """Trace files in the set, for progress: plain files and zip members exactly, a tar archive
        as one (counting its members would decompress it)."""
        if self.only is not None:
            return max(len(self.only), 1)
        n = len(self.files)
        for path in self.archives:
            try:
                with zipfile.ZipFile(path) as zf:
                    n += sum(1 for i in zf.infolist() if not i.is_dir() and is_trace_name(i.filename))
            except (zipfile.BadZipFile, OSError):
                n += 1
        return max(n, 1)

    def first_ranks(self, n: int) -> TraceSet | None:
        """The part of the set holding its first `n` ranks by file name (rank<k> in the name), for a
        preview while the whole set loads; None when every name cannot be listed cheaply (a tar
        archive), a name carries no rank, or the set is not much larger than `n`."""
        if self.only is not None or any(not zipfile.is_zipfile(p) for p in self.archives):
            return None
        names = [p.name for p in self.files]
        try:  # the names sources() gives (listing a zip opens none of its members)
            for path in self.archives:
                names += [name for name, _ in _zip_members(path, self.limits)]
        except (TraceError, zipfile.BadZipFile, OSError):  # the whole set's load says what is wrong
            return None
        ranked = [(rank_from_name(name), name) for name in names]
        if len(ranked) < 2 * n or any(r is None for r, _ in ranked):
            return None
        return dataclasses.replace(self, only=frozenset(name for _, name in sorted(ranked)[:n]))


@dataclass(frozen=True)
class Member:
    """An archive member, opened where it is parsed (a worker process) by open_source: a zip member
    (`inner`: its name in the archive), a plain tar's (`offset`, `size`: its bytes in the archive), or a
    compressed tar's spilled to the file `path` (`spilled`: the parse deletes it when done)."""

    path: str
    label: str
    inner: str | None = None
    offset: int = -1
    size: int = 0
    spilled: bool = False


class _Slice:
    """`size` bytes of an open file from `offset`: a plain tar's member, read in place."""

    def __init__(self, f: BinaryIO, offset: int, size: int):
        self._f, self._left = f, size
        f.seek(offset)

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n) if n > 0 else b""
        self._left -= len(data)
        return data


# what reading a damaged zip member raises (bad CRC, bad deflate data, cut short); opening one that
# is encrypted or uses a method zipfile lacks raises RuntimeError / NotImplementedError
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError)
_OPEN_ERRORS = (*_MEMBER_ERRORS, RuntimeError, NotImplementedError, OSError)


_ZIPS: dict[tuple, zipfile.ZipFile] = {}  # per process: the archives its parses read members of
_ZIPS_LOCK = threading.Lock()
_ZIPS_KEPT = 4


def _open_zip(path: str) -> zipfile.ZipFile:
    """The open ZipFile of `path`, kept per process (and file version): opening one reads its whole
    central directory, which a 10,000-member archive would otherwise pay once per member."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    with _ZIPS_LOCK:
        zf = _ZIPS.get(key)
        if zf is None:
            while len(_ZIPS) >= _ZIPS_KEPT:
                _ZIPS.pop(next(iter(_ZIPS))).close()
            zf = _ZIPS[key] = zipfile.ZipFile(path)
        return zf


@contextmanager
def open_source(source: Path | str | bytes | Member) -> Iterator[BinaryIO]:
    """A binary file of a source of TraceSet.sources() (or raw bytes), closed after the block; a
    spilled member's file is deleted then. A corrupt archive member raises CompressionError."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield io.BytesIO(source)
        return
    if not isinstance(source, Member):
        with open(source, "rb") as f:
            yield f
        return
    try:
        if source.inner is None:
            with open(source.path, "rb") as f:
                yield f if source.spilled else _Slice(f, source.offset, source.size)
            return
        try:
            f = _open_zip(source.path).open(source.inner)
        except _OPEN_ERRORS as exc:
            raise CompressionError(f"{source.label}: unreadable zip member ({exc})", path=source.path) from None
        with f:
            try:
                yield f
            except _MEMBER_ERRORS as exc:
                raise CompressionError(f"{source.label}: corrupt zip member ({exc})", path=source.path) from None
    finally:
        if source.spilled:
            Path(source.path).unlink(missing_ok=True)


def _zip_members(path: Path, limits: Limits) -> Iterator[tuple[str, Member]]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CompressionError(f"{path.name}: not a readable zip archive ({exc})", path=str(path)) from None
    with zf:
        infos = zf.infolist()
        if len(infos) > limits.max_members:
            raise TooLargeError(f"{path.name}: more than {limits.max_members:,} members", path=str(path))
        total = 0
        for info in infos:
            name = safe_member_name(path.name, info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise UnsafeArchiveError(
                    f"{path.name}: member {info.filename!r} is a symbolic link; archives of traces must "
                    "hold plain files only",
                    path=str(path),
                )
            if info.is_dir() or not is_trace_name(name):
                continue
            label = f"{path.name}:{name}"
            total += info.file_size
            err = _too_large(label, info.file_size, info.compress_size, limits)
            if err or total > limits.max_total_bytes:
                raise err or TooLargeError(
                    f"{path.name}: members add up to more than {limits.max_total_bytes:,} bytes", path=str(path)
                )
            # the declared size bounds what the member's stream gives (zipfile reads no further)
            yield label, Member(str(path), label, inner=info.filename, size=info.file_size)


_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz: a tar only readable front to back


def _tar_members(path: Path, limits: Limits, spill: Path | None) -> Iterator[tuple[str, Member | bytes]]:
    try:
        raw = path.open("rb")  # our own handle: its position is the compressed bytes read so far
        compressed = raw.read(6).startswith(_COMPRESSED)
        raw.seek(0)
        tf = tarfile.open(fileobj=raw, mode="r:*")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise CompressionError(f"{path.name}: not a readable tar archive ({exc})", path=str(path)) from None
    with raw, tf:
        total = count = 0
        try:
            for member in tf:
                count += 1
                if count > limits.max_members:
                    raise TooLargeError(f"{path.name}: more than {limits.max_members:,} members", path=str(path))
                name = safe_member_name(path.name, member.name)
                if member.issym() or member.islnk():
                    raise UnsafeArchiveError(
                        f"{path.name}: member {member.name!r} is a {'symbolic' if member.issym() else 'hard'} "
                        f"link (to {member.linkname!r}); archives of traces must hold plain files only",
                        path=str(path),
                    )
                if member.isdev():
                    raise UnsafeArchiveError(f"{path.name}: member {member.name!r} is a device or FIFO", path=str(path))
                if not member.isfile() or not is_trace_name(name):
                    continue
                label = f"{path.name}:{name}"
                total += member.size
                if member.size > limits.max_file_bytes or total > limits.max_total_bytes:
                    raise _too_large(label, member.size, 0, limits) or TooLargeError(
                        f"{path.name}: members add up to more than {limits.max_total_bytes:,} bytes", path=str(path)
                    )
                if not compressed:
                    yield label, Member(str(path), label, offset=member.offset_data, size=member.size)
                elif spill is None:
                    yield label, _read_member(tf, member, raw, label, limits, bytearray())
                else:
                    yield label, _spill_member(tf, member, raw, label, limits, spill / f"member-{count:06d}")
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise CompressionError(f"{path.name}: corrupt or truncated tar archive ({exc})", path=str(path)) from None


def _spill_member(tf: tarfile.TarFile, member: tarfile.TarInfo, raw: Any, label: str, limits: Limits, to: Path):
    """A compressed tar's member written in pieces to the file `to` (the parse deletes it)."""
    try:
        with open(to, "wb") as out:
            _read_member(tf, member, raw, label, limits, out)
    except BaseException:
        to.unlink(missing_ok=True)
        raise
    return Member(str(to), label, spilled=True)


def _read_member(tf: tarfile.TarFile, member: tarfile.TarInfo, raw: Any, label: str, limits: Limits, out) -> bytes:
    """A tar member's bytes, read in chunks into `out` (a bytearray, returned as bytes, or a file)
    under the same caps as a .json.gz: the ratio of the tar stream decompressed so far to the
    archive's bytes read so far is checked after every chunk, so a small .tar.gz holding a huge
    member stops at the ratio, not at the end of the member."""
    f = tf.extractfile(member)
    if f is None:
        return b""
    n = 0
    while piece := f.read(_CHUNK):
        if isinstance(out, bytearray):
            out.extend(piece)
        else:
            out.write(piece)
        n += len(piece)
        err = _too_large(label, member.offset_data + n, raw.tell(), limits)
        if err:
            raise err
    return bytes(out) if isinstance(out, bytearray) else b""


def _read_run_json(folder: Path) -> dict | None:
    run = folder / "run.json"
    if not run.is_file():
        return None
    try:
        data = orjson.loads(run.read_bytes())
    except (orjson.JSONDecodeError, OSError):
        return None  # a run.json being rewritten is not a reason to refuse its traces
    return data if isinstance(data, dict) else None


def resolve(path: Any, *, limits: Limits | None = None) -> TraceSet:
    """The TraceSet for a run directory, a folder, a trace file, an archive, or a list of these."""
    limits = limits or Limits()
    items = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not items:
        raise NoTracesError("no trace files given", path=None)
    origin = str(items[0]) if len(items) == 1 else f"{len(items)} paths"
    files: list[Path] = []
    archives: list[Path] = []
    run = None
    for item in items:
        p = Path(item)
        if p.is_dir():
            folder = p / "traces" if (p / "traces").is_dir() else p
            run = run or _read_run_json(p)
            found = sorted(q for q in folder.iterdir() if q.is_file() and is_trace_name(q.name))
            found += sorted(q for q in folder.iterdir() if q.is_file() and is_archive_name(q.name))
            if not found:
                raise NoTracesError(
                    f"{p}: no trace files (*.json, *.json.gz, or .zip/.tar.gz of them) in {folder}", path=str(p)
                )
            for q in found:
                (archives if is_archive_name(q.name) else files).append(q)
        elif p.is_file():
            (archives if is_archive_name(p.name) or zipfile.is_zipfile(p) else files).append(p)
        else:
            raise NoTracesError(f"{p}: no such file or directory", path=str(p))
    return TraceSet(origin=origin, files=tuple(files), archives=tuple(archives), run=run, limits=limits)
