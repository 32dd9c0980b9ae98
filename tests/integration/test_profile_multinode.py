"""`python -m profiler run` across two torchrun nodes on loopback:
each "node" runs its own `profiler run --launcher torchrun --nnodes 2 --node-rank K` into one shared
directory; node 0's supervisor writes run.json with every rank's host, node 1's writes its node
record, and the four ranks' traces land side by side. Marked slow (two agents, four torch imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import ROOT
from tests.integration.test_profile_failures import _tagged
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


def test_two_nodes_write_one_run_directory(tmp_path):
    out, port, job, tag = tmp_path / "run", free_port(), uuid.uuid4().hex[:12], uuid.uuid4().hex
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PARASCOPE_TEST_TAG": tag}
    flags = [
        "--dp=2",
        "--tp=2",
        "--global-batch=4",
        "--steps=3",
        "--wait=1",
        "--warmup=1",
        "--launcher=torchrun",
        "--nnodes=2",
        "--nproc-per-node=2",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={job}",
        f"--out={out}",
    ]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "profiler", "run", *flags, f"--node-rank={n}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    time.sleep(0.3)
    assert _tagged(tag) == []
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["run_id"] == job and run["nodes"] == 2 and run["world_size"] == 4
    assert sorted((h["node"], h["local_rank"]) for h in run["hosts"].values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [t["rank"] for t in run["traces"]] == [0, 1, 2, 3]
    node1 = json.loads((out / "nodes" / "node1.json").read_text())
    assert node1["status"] == "completed" and node1["run_id"] == job and node1["supervisor"]["node_rank"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nodes"] == 2 and metrics["launcher"] == "torchrun"
