"""One huge file in bounded memory: `parse_stream` cuts `traceEvents` into chunks
at event boundaries and must give exactly what decoding the whole file gives -- on every public
trace, and on files built to trap a naive splitter (`},{` inside strings and nested args, fields
after the array, odd shapes that need the lenient path)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from profiler.traces import kineto
from profiler.traces.errors import NotJSONError
from profiler.traces.kineto import parse, parse_stream
from profiler.traces.sources import Limits, stream
from tests.support import trace_samples as ts


def _pieces(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _same(a, b) -> None:
    assert a.meta == b.meta and a.threads == b.threads and dict(a.skipped) == dict(b.skipped)
    assert list(a.names[a.columns["name"]]) == list(b.names[b.columns["name"]])
    assert list(a.cats[a.columns["cat"]]) == list(b.cats[b.columns["cat"]])
    for k in ("ts_ns", "dur_ns", "kind", "op", "pid", "tid", "correlation", "external_id"):
        np.testing.assert_array_equal(a.columns[k], b.columns[k], err_msg=k)
    assert a.comm_args == b.comm_args


def _tricky(n: int = 400) -> bytes:
    events = []
    for i in range(n):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f'weird }}, {{ "name" {i}' if i % 7 == 0 else f"aten::mm_{i % 13}",
                "pid": 1,
                "tid": 1 + i % 3,
                "ts": ts.EPOCH_US + 10 * i,
                "dur": 5,
                "args": {"External id": i, "Input Dims": [[{"a": 1}, {"b": 2}]] if i % 5 == 0 else [[4, 4]]},
            }
        )
        if i % 50 == 0:
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": f"t{i}"}})
            events.append({"ph": "X", "name": "bad args", "ts": ts.EPOCH_US, "dur": 1, "args": [1, 2]})
    doc = {"schemaVersion": 1, "traceEvents": events, "deviceProperties": [{"id": 0, "name": "G"}, {"id": 1}]}
    doc["distributedInfo"] = {"rank": 3, "world_size": 4, "backend": "nccl"}  # after the array
    return json.dumps(doc, indent=1).encode()


@pytest.mark.parametrize("chunk", [300, 4096, 1 << 16])
def test_chunks_equal_the_whole_file_on_a_trap(chunk):
    data = _tricky()
    whole = parse(data, "t.json")
    assert whole.meta["rank_in_trace"] == 3 and whole.skipped  # the odd-shaped events were skipped or mended
    got = parse_stream(_pieces(data, 1000), "t.json", chunk_bytes=chunk)
    assert got.chunks >= len(data) // max(chunk, 1000) // 2 and got.chunks > 1  # really cut
    _same(got, whole)


def test_relative_time_and_base_after_the_array():
    t = ts.trace(0, 2, [ts.cpu(f"aten::op{i}", 10 * i, 5) for i in range(300)], style="relative")
    base = t.pop("baseTimeNanoseconds")
    t["baseTimeNanoseconds"] = base  # written after traceEvents, as newer Kineto does
    data = json.dumps(t).encode()
    got = parse_stream(_pieces(data, 512), "r.json", chunk_bytes=2048)
    _same(got, parse(data, "r.json"))
    assert got.chunks > 1 and got.meta["time_base"] == "relative_us+baseTimeNanoseconds"


def test_a_truncated_big_file_is_a_clear_error():
    data = _tricky()[:-5000]
    with pytest.raises(NotJSONError, match="t.json"):
        parse_stream(_pieces(data, 1000), "t.json", chunk_bytes=4096)


def test_every_shared_trace_decodes_the_same_in_chunks(shared_traces):
    files = sorted(p for p in shared_traces.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert files
    for path in files:
        raw = path.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        try:
            whole = parse(data, path.name)
        except ValueError:
            continue  # not a trace (a config beside the traces): covered by the error tests
        with open(path, "rb") as f:
            got = parse_stream(stream(f, path.name, Limits()), path.name, chunk_bytes=1 << 16)
        assert got.chunks >= len(data) >> 18, path.name  # a 1 MB file is cut in a few pieces at least
        _same(got, whole)


def test_default_chunk_is_bounded():
    assert 8 << 20 <= kineto.CHUNK_BYTES <= 256 << 20
