"""Bad input: each case raises a typed TraceError with a specific message, never a
traceback or a hang, with memory bounded; a hypothesis fuzz test over mutated traces allows nothing
else. The CLI turns each into exit status 2 and one line."""

from __future__ import annotations

import gzip
import io
import json
import stat
import subprocess
import sys
import tarfile
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler import load_traces
from profiler.analyzers.front import TraceAnalysis
from profiler.traces.errors import (
    CompressionError,
    DuplicateRankError,
    EmptyTraceError,
    EncodingError,
    MixedJobError,
    NotJSONError,
    NotKinetoError,
    NoTracesError,
    RankError,
    TooLargeError,
    TraceError,
    UnsafeArchiveError,
)
from profiler.traces.sources import Limits
from tests.support import trace_samples as ts

ROOT = Path(__file__).resolve().parents[2]
VALID = json.dumps(ts.gpu_pair()[0]).encode()
BOMB_MB = 48  # of zeros: compresses ~1000x; the default ratio cap stops it after 16 MiB


def _zip(path: Path, members: dict[str, bytes], *, symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return path


def _tar(path: Path, members: dict[str, bytes], *, link: str | None = None, hard: bool = False) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tf.addfile(info)
    return path


def _case(tmp_path: Path, case: str):
    """(path to load, kwargs) for each bad-input case."""
    p = tmp_path / "rank0_trace.json"
    if case == "not_json":
        return ts.write(p, {}).write_bytes(b"this is not json {") and p, {}
    if case == "empty_file":
        p.write_bytes(b"")
        return p, {}
    if case == "truncated_json":
        p.write_bytes(VALID[: len(VALID) // 2])
        return p, {}
    if case == "truncated_gzip":
        data = gzip.compress(VALID)
        p = tmp_path / "rank0_trace.json.gz"
        p.write_bytes(data[: len(data) // 2])
        return p, {}
    if case == "corrupt_gzip":
        data = bytearray(gzip.compress(VALID))
        data[20:40] = b"\xff" * 20
        p = tmp_path / "rank0_trace.json.gz"
        p.write_bytes(bytes(data))
        return p, {}
    if case == "not_gzip":
        p = tmp_path / "rank0_trace.json.gz"
        p.write_bytes(b"PK\x03\x04 a zip, or anything but gzip")
        return p, {}
    if case == "gzip_bomb":
        p = tmp_path / "rank0_trace.json.gz"
        p.write_bytes(gzip.compress(b"\0" * (BOMB_MB << 20), compresslevel=9))
        return p, {}
    if case == "file_over_cap":
        p.write_bytes(VALID)
        return p, {"limits": Limits(max_file_bytes=1000)}
    if case == "gzip_over_cap":
        p = tmp_path / "rank0_trace.json.gz"
        p.write_bytes(gzip.compress(VALID))
        return p, {"limits": Limits(max_file_bytes=1000)}
    if case == "zip_bomb":
        return _zip(tmp_path / "set.zip", {"rank0.json": b" " * (BOMB_MB << 20)}), {}
    if case == "tar_bomb":
        return _tar(tmp_path / "set.tar.gz", {"rank0.json": b"\0" * (BOMB_MB << 20)}), {}
    if case == "zip_escape":
        return _zip(tmp_path / "set.zip", {"../../evil/rank0.json": VALID}), {}
    if case == "zip_absolute":
        return _zip(tmp_path / "set.zip", {"/tmp/rank0.json": VALID}), {}
    if case == "zip_symlink":
        return _zip(tmp_path / "set.zip", {"rank0.json": VALID}, symlink="rank1.json"), {}
    if case == "zip_corrupt":
        p = tmp_path / "set.zip"
        _zip(p, {"rank0.json": VALID})
        data = bytearray(p.read_bytes())
        data[60:90] = b"\0" * 30
        p.write_bytes(bytes(data))
        return p, {}
    if case == "tar_escape":
        return _tar(tmp_path / "set.tar.gz", {"traces/../../rank0.json": VALID}), {}
    if case == "tar_symlink":
        return _tar(tmp_path / "set.tar.gz", {"rank0.json": VALID}, link="rank1.json"), {}
    if case == "tar_hardlink":
        return _tar(tmp_path / "set.tar.gz", {"rank0.json": VALID}, link="rank1.json", hard=True), {}
    if case == "tar_truncated":
        p = _tar(tmp_path / "set.tar.gz", {"rank0.json": VALID})
        p.write_bytes(p.read_bytes()[:200])
        return p, {}
    if case == "json_array":
        p.write_bytes(b"[1, 2, 3]")
        return p, {}
    if case == "json_not_kineto":
        p.write_bytes(b'{"loss": 1.5, "step": 3}')
        return p, {}
    if case == "events_not_list":
        p.write_bytes(b'{"traceEvents": {"a": 1}}')
        return p, {}
    if case == "no_events":
        p.write_bytes(b'{"traceEvents": []}')
        return p, {}
    if case == "no_usable_events":
        p.write_bytes(
            json.dumps(
                {
                    "traceEvents": [
                        {"ph": "M", "name": "process_name", "pid": 1},
                        {"ph": "X", "name": "a", "ts": "soon", "dur": 3},
                    ]
                }
            ).encode()
        )
        return p, {}
    if case == "duplicate_ranks":
        a, b = ts.gpu_pair()
        ts.write(tmp_path / "a.json", a)
        ts.write(tmp_path / "b.json", a)
        return tmp_path, {}
    if case == "mixed_jobs":
        ts.write(tmp_path / "a.json", ts.trace(0, 2, [ts.cpu("x", 0, 1)]))
        ts.write(tmp_path / "b.json", ts.trace(1, 8, [ts.cpu("x", 0, 1)]))
        return tmp_path, {}
    if case == "rank_beyond_world":
        ts.write(tmp_path / "a.json", ts.trace(5, 4, [ts.cpu("x", 0, 1)]))
        return tmp_path, {}
    if case == "non_utf8":
        p.write_bytes(VALID.replace(b'"aten::mm"', b'"aten::\xff\xfe"'))
        return p, {}
    if case == "utf16":
        p.write_bytes(VALID.decode().encode("utf-16"))
        return p, {}
    if case == "no_rank":
        ts.write(tmp_path / "anonymous.json", ts.trace(0, 1, [ts.cpu("x", 0, 1)], distributed=False))
        return tmp_path / "anonymous.json", {}
    if case == "missing_path":
        return tmp_path / "nope", {}
    if case == "empty_folder":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "notes.txt").write_text("hi")
        return tmp_path / "empty", {}
    raise AssertionError(case)


CASES = {
    "not_json": (NotJSONError, r"rank0_trace.json: is not valid JSON"),
    "empty_file": (NotJSONError, r"is empty, not a JSON trace"),
    "truncated_json": (NotJSONError, r"not valid JSON \(Input data was truncated\)"),
    "truncated_gzip": (CompressionError, r"gzip stream is truncated"),
    "corrupt_gzip": (CompressionError, r"corrupt gzip data"),
    "not_gzip": (
        CompressionError,
        r"rank0_trace.json.gz: is not gzip data although it is named .gz \(its first bytes are 50 4b 03 04\), nor JSON",
    ),
    "gzip_bomb": (TooLargeError, r"decompresses more than 200x .* compression bomb"),
    "gzip_over_cap": (TooLargeError, r"more than 1,000 bytes \(the per-file cap\)"),
    "file_over_cap": (TooLargeError, r"rank0_trace.json: is [\d,]+ bytes, more than the per-file cap of 1,000"),
    "zip_bomb": (TooLargeError, r"set.zip:rank0.json: decompresses more than 200x"),
    "tar_bomb": (TooLargeError, r"set.tar.gz:rank0.json: decompresses more than 200x"),
    "zip_escape": (UnsafeArchiveError, r"member '../../evil/rank0.json' escapes the archive's folder"),
    "zip_absolute": (UnsafeArchiveError, r"member '/tmp/rank0.json' escapes"),
    "zip_symlink": (UnsafeArchiveError, r"member 'rank1.json' is a symbolic link"),
    "zip_corrupt": (CompressionError, r"set.zip"),
    "tar_escape": (UnsafeArchiveError, r"member 'traces/../../rank0.json' escapes"),
    "tar_symlink": (UnsafeArchiveError, r"member 'rank1.json' is a symbolic link"),
    "tar_hardlink": (UnsafeArchiveError, r"member 'rank1.json' is a hard link"),
    "tar_truncated": (CompressionError, r"set.tar.gz: (corrupt|not a readable)"),
    "json_array": (NotKinetoError, r"the top level is a list"),
    "json_not_kineto": (NotKinetoError, r"it has no 'traceEvents' list"),
    "events_not_list": (NotKinetoError, r"it has no 'traceEvents' list"),
    "no_events": (EmptyTraceError, r"the trace has no events"),
    "no_usable_events": (EmptyTraceError, r"no complete \('X'\) events .* \(2 events, none usable\)"),
    "duplicate_ranks": (DuplicateRankError, r"rank 0 appears twice: in a.json and in b.json"),
    "mixed_jobs": (MixedJobError, r"world sizes differ \(2 in a.json, 8 in b.json\)"),
    "rank_beyond_world": (MixedJobError, r"rank 5 \(a.json\) cannot belong to a job of world size 4"),
    "non_utf8": (EncodingError, r"holds bytes that are not UTF-8"),
    "utf16": (EncodingError, r"not UTF-8"),
    "no_rank": (RankError, r"anonymous.json: cannot tell which rank wrote it"),
    "missing_path": (NoTracesError, r"nope: no such file or directory"),
    "empty_folder": (NoTracesError, r"no trace files"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_typed_error(tmp_path, case):
    path, kwargs = _case(tmp_path, case)
    error, message = CASES[case]
    started = time.monotonic()
    with pytest.raises(error, match=message) as info:
        load_traces(path, cache=False, **kwargs)
    assert isinstance(info.value, TraceError) and "\n" not in str(info.value)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("case", ["not_json", "truncated_gzip", "zip_escape", "mixed_jobs", "no_rank"])
def test_cli_exits_2_with_one_line(tmp_path, case):
    path, _ = _case(tmp_path, case)
    out = subprocess.run(
        [sys.executable, "-m", "profiler", "analyze", str(path), "--json", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr


@pytest.mark.parametrize("case", ["gzip_bomb", "tar_bomb"])
def test_bombs_stop_early_with_bounded_memory(tmp_path, case):
    """Every kind of compressed input streams under the same ratio check (a tar member too)."""
    path, _ = _case(tmp_path, case)
    tracemalloc.start()
    with pytest.raises(TooLargeError):
        load_traces(path, cache=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 << 20  # it stopped near the 16 MiB floor, well before the 48 MiB of zeros


# --- fuzzing -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


def _load_and_analyse(path: Path):
    try:
        traces = load_traces(path, cache=False)
    except TraceError:
        return
    json.dumps(TraceAnalysis(traces).summary())  # the analyzers must cope with whatever the loader accepted


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_structural_mutations_raise_only_trace_errors(tmp_path, data):
    doc = json.loads(VALID)
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(st.sampled_from(["event", "field", "top"]))
        if target == "event":
            events[data.draw(st.integers(0, len(events) - 1))] = data.draw(json_values)
        elif target == "field":
            event = events[data.draw(st.integers(0, len(events) - 1))]
            if isinstance(event, dict):
                key = data.draw(st.sampled_from(["ph", "ts", "dur", "name", "cat", "pid", "tid", "args"]))
                event[key] = data.draw(json_values)
        else:
            key = data.draw(
                st.sampled_from(
                    ["distributedInfo", "baseTimeNanoseconds", "deviceProperties", "traceEvents", "host_name"]
                )
            )
            doc[key] = data.draw(json_values)
    path = tmp_path / "rank0_trace.json"
    path.write_text(json.dumps(doc))
    _load_and_analyse(path)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, len(VALID)),
    flips=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6),
    gz=st.booleans(),
)
def test_fuzz_byte_mutations_raise_only_trace_errors(tmp_path, cut, flips, gz):
    raw = bytearray(VALID)
    for i, b in flips:
        raw[i] = b
    raw = bytes(raw[:cut]) if cut < len(raw) // 2 else bytes(raw)
    if gz:
        packed = gzip.compress(raw)
        raw = packed[: max(10, len(packed) * cut // max(1, len(VALID)))] if cut < len(VALID) // 4 else packed
    path = tmp_path / ("rank0_trace.json.gz" if gz else "rank0_trace.json")
    path.write_bytes(raw)
    _load_and_analyse(path)


def test_zlib_is_what_we_think():  # the bomb cases above rely on zlib compressing zeros ~1000x
    assert len(zlib.compress(b"\0" * (1 << 20))) < 2000


def test_archive_without_traces(tmp_path):
    path = _zip(tmp_path / "set.zip", {"notes.txt": b"hello", "metrics.json": b"{}"})
    with pytest.raises(NoTracesError, match=r"set.zip: no trace files"):
        load_traces(path, cache=False)
