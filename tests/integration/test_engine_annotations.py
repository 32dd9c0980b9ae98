"""Every collective and phase of a real job is labelled in the profiler's format.

One TP2+SP × CP2 × PP2 job (8 ranks, every dimension) runs each rank under torch.profiler the way
the profiler does (`run_rank(..., on_step=lambda *_: prof.step())`), and the labels are read
back with runfiles.annotations: each parses; the members of a group issue the same collectives
(op, bytes) with the same sequence numbers; each send meets its receive; phases cover every
microbatch of every step.
"""

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from runfiles.annotations import parse_comm, parse_phase
from tests.conftest import ROOT

RUNNER = r"""
import json, sys, torch
from parallel.engine import job  # noqa: F401 - import torch and the engine once before forking
from parallel.engine.launch import run_local
from parallel.cli.train import config_from_args
from parallel.engine.api import run_rank

cfg, errors, _ = config_from_args(sys.argv[2:])
assert not errors, errors

def rank_fn(*, rank, world_size, init_method):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_rank(cfg, rank=rank, world_size=world_size, init_method=init_method, on_step=lambda *_: prof.step())
    names = [(e.time_range.start, e.name) for e in prof.events() if e.name.startswith("ps.")]
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
        json.dump([n for _, n in sorted(names)], f)

run_local(rank_fn, world_size=cfg.plan.world_size)
"""

STEPS, MICROBATCHES = 2, 2


@pytest.fixture(scope="module")
def labels(tmp_path_factory):
    out = tmp_path_factory.mktemp("labels")
    script = out / "runner.py"
    script.write_text(RUNNER)
    flags = ["--tp=2", "--sp", "--cp=2", "--pp=2", f"--steps={STEPS}", f"--global-batch={MICROBATCHES}"]
    r = subprocess.run(
        [sys.executable, str(script), str(out), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(8)}


@pytest.mark.slow
def test_every_label_parses_and_every_dimension_appears(labels):
    dims = set()
    for rank, names in labels.items():
        for name in names:
            if name.startswith("ps.comm"):
                label = parse_comm(name)
                assert label is not None, name
                assert rank in label.ranks
                dims.add(label.dim)
            elif name.startswith("ps.phase"):
                assert parse_phase(name) is not None, name
    assert dims == {"tp", "sp", "cp", "pp", "dp"}


@pytest.mark.slow
def test_group_members_issue_the_same_collectives_in_the_same_order(labels):
    per_group = defaultdict(dict)  # group ranks -> rank -> [(dim, op, bytes, seq)]
    p2p = defaultdict(lambda: defaultdict(list))  # (src, dst) -> op -> [(bytes, seq)]
    for rank, names in labels.items():
        for label in filter(None, map(parse_comm, names)):
            if label.op in ("send", "recv"):
                p2p[label.ranks][label.op].append((label.bytes, label.seq))
            else:
                per_group[label.ranks].setdefault(rank, []).append((label.dim, label.op, label.bytes, label.seq))
    assert per_group
    for ranks, by_rank in per_group.items():
        assert set(by_rank) == set(ranks), ranks  # every member issued them
        first = by_rank[ranks[0]]
        assert [s for *_, s in first] == list(range(len(first)))  # seq counts 0, 1, 2, ... per group
        for rank in ranks:
            assert by_rank[rank] == first, (ranks, rank)
    assert p2p
    for pair, ops in p2p.items():
        assert ops["send"] == ops["recv"], pair  # each send meets a receive of the same size and seq
        assert [s for _, s in ops["send"]] == list(range(len(ops["send"])))


@pytest.mark.slow
def test_phases_cover_every_microbatch_stage_and_step(labels):
    for rank, names in labels.items():
        phases = [parse_phase(n) for n in names if n.startswith("ps.phase")]
        stage = {p.stage for p in phases if p.kind != "optim"}
        assert len(stage) == 1 and stage <= {0, 1}
        for kind in ("fwd", "bwd"):
            mbs = [p.mb for p in phases if p.kind == kind]
            assert mbs == list(range(MICROBATCHES)) * STEPS, (rank, kind, mbs)
        assert sum(p.kind == "optim" for p in phases) == STEPS
