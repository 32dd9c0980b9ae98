"""load_traces: inputs (run dir, folder, files, .zip, .tar.gz), ranks, both time styles, the cache,
skipped-event accounting, and that the library never imports torch."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler import load_traces
from profiler.traces import sources
from profiler.traces.errors import RankError
from profiler.traces.kineto import DUPLICATE
from profiler.traces.sources import resolve
from tests.support import trace_samples as ts
from tests.support.trace_samples import gpu_pair, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PARASCOPE_CACHE", str(d))
    return d


def _pair(folder: Path, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, t in enumerate(ts.gpu_pair(**kw)):
        ts.write(folder / f"rank{rank}_trace.json.gz", t)
    return folder


def test_public_entry_point_does_not_import_torch():
    code = (
        "import sys, profiler; f = profiler.load_traces; "
        "import profiler.analyzers, profiler.analyzers.timeline, profiler.analyzers.export, "
        "profiler.analyzers.breakdown, profiler.analyzers.matching, profiler.cli.analyze; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'streamlit')]; "
        "assert not bad, bad; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("layout", ["run_dir", "folder", "files", "zip", "tar.gz", "single_file"])
def test_inputs(tmp_path, cache, layout):
    pair = ts.gpu_pair()
    if layout == "run_dir":
        run = tmp_path / "run"
        _pair(run / "traces")
        (run / "run.json").write_text(json.dumps({"status": "completed", "plan": {"tp": 2}}))
        (run / "metrics.json").write_text("{}")
        path = run
    elif layout == "folder":
        path = _pair(tmp_path / "f")
    elif layout == "files":
        path = [ts.write(tmp_path / f"rank-{r}.json", t) for r, t in enumerate(pair)]
    elif layout == "zip":
        path = tmp_path / "set.zip"
        with zipfile.ZipFile(path, "w") as zf:
            for r, t in enumerate(pair):
                zf.writestr(f"set/rank{r}.pt.trace.json", json.dumps(t))
            zf.writestr("set/README.txt", "not a trace")
    elif layout == "tar.gz":
        path = tmp_path / "set.tar.gz"
        with tarfile.open(path, "w:gz") as tf:
            for r, t in enumerate(pair):
                data = gzip.compress(json.dumps(t).encode())
                info = tarfile.TarInfo(f"traces/rank{r}_trace.json.gz")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    else:
        path = ts.write(tmp_path / "rank1_trace.json", pair[1])
    traces = load_traces(path)
    assert traces.rank_ids == ([1] if layout == "single_file" else [0, 1])
    assert traces.world_size == 2 and traces.steps == [1]
    assert set(traces.ranks["rank_from"]) == {"distributedInfo"}
    if layout == "run_dir":
        assert traces.run["plan"] == {"tp": 2}


def test_both_time_styles_give_the_same_ns(tmp_path, cache):
    epoch = load_traces(_pair(tmp_path / "e", style="epoch"), cache=False)
    rel = load_traces(_pair(tmp_path / "r", style="relative"), cache=False)
    assert set(epoch.ranks["time_base"]) == {"epoch_us"}
    assert set(rel.ranks["time_base"]) == {"relative_us+baseTimeNanoseconds"}
    e = epoch.events["ts_ns"] - ts.EPOCH_US * 1000
    r = rel.events["ts_ns"] - ts.BASE_NS
    np.testing.assert_array_equal(e.to_numpy(), r.to_numpy())
    np.testing.assert_array_equal(epoch.events["dur_ns"].to_numpy(), rel.events["dur_ns"].to_numpy())


def test_fractional_relative_microseconds_are_exact_ns(tmp_path):
    t = ts.trace(0, 1, [ts.cpu("aten::mm", 0, 1)], style="relative")
    t["traceEvents"][0].update(ts=4458676522690.655, dur=2636.669)
    traces = load_traces(ts.write(tmp_path / "rank0.json", t), cache=False)
    row = traces.events.iloc[0]
    assert row["ts_ns"] == ts.BASE_NS + 4458676522690655 and row["dur_ns"] == 2636669


def test_events_table_types_and_skipped_reasons(tmp_path):
    traces = load_traces(_pair(tmp_path / "p"), cache=False)
    ev = traces.events
    assert ev["ts_ns"].dtype == np.int64 and ev["dur_ns"].dtype == np.int64
    assert isinstance(ev["name"].dtype, pd.CategoricalDtype) and isinstance(ev["kind"].dtype, pd.CategoricalDtype)
    assert (ev.groupby("rank")["ts_ns"].apply(lambda s: s.is_monotonic_increasing)).all()
    assert len(ev) == 2 * 11  # every 'X' event kept
    assert traces.skipped["count"].sum() == 2 * 3  # one metadata, one flow, one instant per file
    assert traces.skipped.groupby("rank")["count"].sum().tolist() == [3, 3]
    reasons = set(traces.skipped["reason"])
    assert any(r.startswith("flow") for r in reasons) and any(r.startswith("instant") for r in reasons)
    kinds = ev[ev["rank"] == 0]["kind"].value_counts()
    assert kinds["comm"] == 1 and kinds["compute"] == 1 and kinds["memcpy"] == 1 and kinds["cpu_comm"] == 3
    assert list(traces.threads["name"].unique()) == ["main"]
    assert set(traces.pg_config["pg_desc"]) == {"default_pg", "TENSOR_MODEL_PARALLEL_GROUP"}


def test_cache_round_trip_and_key(tmp_path, cache):
    folder = _pair(tmp_path / "p")
    cold = load_traces(folder)
    warm = load_traces(folder)
    assert not cold.from_cache and warm.from_cache and cold.key == warm.key
    for name in ("events", "comm_args", "ranks", "pg_config", "threads", "skipped"):
        pd.testing.assert_frame_equal(getattr(cold, name), getattr(warm, name), check_dtype=True)
    assert [p for p in cache.iterdir() if p.is_dir()] == [cache / cold.key]
    ts.write(folder / "rank1_trace.json.gz", ts.gpu_pair(late_us=70)[1])  # new bytes, new key
    assert load_traces(folder).key != cold.key


def test_digest_memo_skips_unchanged_files_and_sees_every_write(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MEMO_SETTLE_NS", 0)  # files written just now may be memoized
    folder = _pair(tmp_path / "p")
    found = sources.resolve(folder)
    memo: dict = {}
    digest = found.digest(memo)
    assert digest == found.digest() and len(memo) == 2  # the same key with or without the memo
    # an unchanged file is not read again: a (deliberately) wrong memo value changes the key
    trusted = {k: "0" * 64 for k in memo}
    assert found.digest(trusted) != digest
    # a write of the same size with its mtime set back is still seen (ctime moves)
    path = folder / "rank1_trace.json.gz"
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[-9] ^= 0xFF  # a byte of the gzip trailer's CRC: same size, other bytes
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    assert found.digest(memo) == found.digest() != digest


def test_digest_memo_is_kept_in_the_cache_and_a_bad_one_is_ignored(tmp_path, cache, monkeypatch):
    folder = _pair(tmp_path / "p")
    assert load_traces(folder).key and not (cache / "digests.json").exists()  # files just written: not memoized
    monkeypatch.setattr(sources, "MEMO_SETTLE_NS", 0)
    key = load_traces(folder).key
    memo = json.loads((cache / "digests.json").read_text())
    assert {k.rsplit(":", 1)[1] for k in memo} == {str(folder / f"rank{r}_trace.json.gz") for r in (0, 1)}
    for bad in (b"not json", b"[1, 2]", json.dumps({k: 7 for k in memo}).encode()):
        (cache / "digests.json").write_bytes(bad)
        assert load_traces(folder).key == key  # hashed again, same key


def test_corrupt_cache_entry_is_rebuilt(tmp_path, cache):
    folder = _pair(tmp_path / "p")
    first = load_traces(folder)
    part = sorted((cache / first.key).glob("part-*.events.arrow"))[0]
    part.write_bytes(b"garbage")
    again = load_traces(folder)
    assert not again.from_cache and len(again.events) == len(first.events)
    assert load_traces(folder).from_cache  # the damaged entry was replaced


def test_rank_from_file_name_then_override(tmp_path):
    t = ts.trace(0, 4, [ts.cpu("aten::mm", 0, 10)], distributed=False)
    named = ts.write(tmp_path / "trace_8_rank_3.json", t)
    assert load_traces(named, cache=False).ranks["rank_from"].tolist() == ["file name"]
    assert load_traces(named, cache=False).rank_ids == [3]
    anonymous = ts.write(tmp_path / "anonymous.json", t)
    with pytest.raises(RankError, match=r"no distributedInfo.rank .* ranks=\{'anonymous.json': 0\}"):
        load_traces(anonymous, cache=False)
    given = load_traces(anonymous, ranks=2, cache=False)
    assert given.rank_ids == [2] and given.ranks["rank_from"].tolist() == ["given"]
    assert load_traces(anonymous, ranks={"anonymous.json": 5}, cache=False).rank_ids == [5]


def test_run_json_is_read_fresh_on_a_cache_hit(tmp_path, cache):
    run = tmp_path / "run"
    _pair(run / "traces")
    (run / "run.json").write_text(json.dumps({"status": "running"}))
    assert load_traces(run).run["status"] == "running"
    (run / "run.json").write_text(json.dumps({"status": "completed"}))
    again = load_traces(run)
    assert again.from_cache and again.run["status"] == "completed"


def test_exact_duplicate_events_count_once_and_are_reported(tmp_path):
    plain, doubled = tmp_path / "plain", tmp_path / "doubled"
    for folder, repeat in ((plain, False), (doubled, True)):
        folder.mkdir()
        for rank, t in enumerate(gpu_pair()):
            if repeat and rank == 0:  # rank 0's complete events written twice: a trace concatenated to itself
                t["traceEvents"] += [e for e in t["traceEvents"] if e.get("ph") == "X"]
            write(folder / f"rank{rank}.json", t)
    a, b = load_traces(plain, cache=False), load_traces(doubled, cache=False)
    assert list(b.ranks["events"]) == list(a.ranks["events"])
    assert len(b.rank_comm_args(0)) == len(a.rank_comm_args(0))  # the collective's record kept once
    dup = b.skipped[b.skipped["reason"] == DUPLICATE]
    assert list(dup["rank"]) == [0] and int(dup["count"].iloc[0]) == int(a.ranks["events"].iloc[0])


def test_first_ranks_is_a_part_of_the_set_with_its_own_cache_key(tmp_path, cache):
    folder = tmp_path / "files"
    folder.mkdir()
    for r in (11, 2, 0, 7, 1, 10, 3, 5, 4, 9, 8, 6):  # file order says nothing about rank order
        ts.write(folder / f"rank{r}_trace.json", ts.gloo_cpu(r, 12))
    with zipfile.ZipFile(tmp_path / "set.zip", "w") as zf:
        for r in range(12):
            zf.writestr(f"traces/rank{r}_trace.json", json.dumps(ts.gloo_cpu(r, 12)))
    for source in (folder, tmp_path / "set.zip"):
        found = resolve(source)
        part = found.first_ranks(3)
        assert part is not None and part.count() == 3
        assert len(list(part.sources())) == 3 and len(list(found.sources())) == 12
        traces = load_traces(part)
        assert traces.rank_ids == [0, 1, 2]
        assert traces.key != load_traces(found).key  # a part is never mistaken for the whole set
        assert load_traces(resolve(source).first_ranks(3)).from_cache  # the same part, the same entry
        assert found.first_ranks(6) is not None and found.first_ranks(7) is None  # not much larger: none
    (folder / "trace_extra.json").write_text(json.dumps(ts.gloo_cpu(0, 12)))
    assert resolve(folder).first_ranks(3) is None  # a name without a rank: its rank is unknown until parsed
