"""An archive member is streamed where it is parsed, as a plain .json.gz is: the same trace as a
.json.gz, a zip member, a .tar.gz member and a plain .tar member costs the same peak memory to load
(before, a member was read whole into memory first: +1x its size). The load's peak in a fresh
process per input, side by side."""

from __future__ import annotations

import gzip
import io
import json
import random
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.conftest import ROOT
from tests.support import trace_samples as ts

pytestmark = pytest.mark.slow

# the load's own peak, after the imports (whose RSS would hide it): tracemalloc sees every Python
# bytes object and numpy array the loader holds, which is where a member read whole would sit
_PEAK = """
import sys, tracemalloc
from profiler import load_traces
tracemalloc.start()
t = load_traces(sys.argv[1], cache=False, workers=1)
assert t.rank_ids == [0], t.rank_ids
print(tracemalloc.get_traced_memory()[1])
"""


def _trace_bytes(n_events: int) -> bytes:
    """A one-rank trace padded with `n_events` memory instants (skipped by the loader), random
    enough to compress ~6x, well under the 200x cap."""
    rnd = random.Random(0)
    t = ts.gloo_cpu(0, 1)
    pad = {"ph": "i", "s": "t", "pid": 1, "tid": 1, "name": "[memory]"}
    t["traceEvents"] += [
        {
            **pad,
            "ts": rnd.random() * 1e9,
            "args": {"Bytes": rnd.randrange(1 << 30), "Total Allocated": rnd.randrange(1 << 40)},
        }
        for _ in range(n_events)
    ]
    return json.dumps(t).encode()


def _peak(path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    return int(out.stdout.split()[-1])


def test_archive_members_cost_no_more_memory_than_a_json_gz(tmp_path):
    data = _trace_bytes(400_000)  # ~63 MB of JSON
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "rank0.json.gz").write_bytes(gzip.compress(data, 1))
    with zipfile.ZipFile(tmp_path / "set.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("traces/rank0.json", data)
    with tarfile.open(tmp_path / "set.tar.gz", "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("traces/rank0.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    with tarfile.open(tmp_path / "set.tar", "w") as tf:
        tf.addfile(info, io.BytesIO(data))
    size = len(data)
    base = _peak(tmp_path / "gz")
    for archive in ("set.zip", "set.tar.gz", "set.tar"):
        extra = _peak(tmp_path / archive) - base
        # holding the member whole would add its whole size; streamed, the loads are alike
        assert extra < 0.25 * size, f"{archive}: {extra / 1e6:,.0f} MB above the .json.gz's {base / 1e6:,.0f} MB"
    assert not list(tmp_path.glob("**/member-*"))  # a spilled member is deleted after its parse
