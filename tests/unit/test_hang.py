"""profiler.analyzers.hang and `profiler hang`: Flight Recorder dumps of a job the test describes
(tests/support/fr_dumps.py) -- each fault kind named with its rank, dimension, collective and node;
pickles refused; archives read bounded; 1,024 ranks; and the same answer as PyTorch's own
torch.distributed.flight_recorder on the same dumps."""

import io
import json
import logging
import pickle
import re
import tarfile
from pathlib import Path

import pytest

from parallel.core.plan import Plan
from profiler.analyzers.hang import HangInputError, diagnose, load_dumps
from profiler.cli import hang as hang_cli
from profiler.traces.group_names import dim_from_group_desc as dim_of_desc
from tests.support.fr_dumps import Fault, job_dumps, write_dumps

FAULTS = [
    (Fault("missing", rank=5, dim="tp", seq=4), "never issued all_reduce #4"),
    (Fault("op_mismatch", rank=2, dim="dp", seq=2), "issued broadcast as collective #2"),
    (Fault("size_mismatch", rank=6, dim="tp", seq=3), "with sizes [[8192]] where its peers used [[4096]]"),
    (Fault("dtype_mismatch", rank=1, dim="dp", seq=1), 'in ["BFloat16"] where its peers used ["Float"]'),
]


@pytest.mark.parametrize(("fault", "words"), FAULTS, ids=[f.kind for f, _ in FAULTS])
def test_each_fault_names_rank_dim_collective_and_node(tmp_path, fault, words):
    folder = write_dumps(tmp_path / "fr", job_dumps(world=8, tp=2, steps=3, fault=fault))
    report = diagnose(load_dumps(folder), gpus_per_node=4)
    first = report["suspects"][0]
    assert (first["rank"], first["dim"], first["kind"], first["seq"]) == (fault.rank, fault.dim, fault.kind, fault.seq)
    assert first["op"] == "all_reduce" and first["node"] == fault.rank // 4
    assert (
        report["diagnosis"].startswith(f"Rank {fault.rank} on node {fault.rank // 4} ") and words in report["diagnosis"]
    )
    group = next(g for g in report["groups"] if g["name"] == first["group"])
    assert fault.rank in group["ranks"] and group["dim"] == fault.dim
    assert {row["rank"] for row in report["evidence"]} == set(group["ranks"])


def test_last_completed_per_rank_and_a_clean_job(tmp_path):
    report = diagnose(load_dumps(write_dumps(tmp_path / "a", job_dumps(8, 2, 3, Fault("missing", 3, "tp", 4)))))
    tp = next(g for g in report["groups"] if 3 in g["ranks"] and g["dim"] == "tp")
    assert tp["last_completed"] == {"2": 6, "3": 3}
    clean = diagnose(load_dumps(write_dumps(tmp_path / "b", job_dumps(8, 2, 3))))
    assert clean["suspects"] == [] and "agree" in clean["diagnosis"]


def test_membership_and_missing_dumps(tmp_path):
    dumps = job_dumps(world=8, tp=2, steps=2, fault=Fault("membership", rank=4, dim="tp", seq=0))
    del dumps[7]
    run = {"plan": Plan(dp=4, tp=2, global_batch=4).to_dict(), "hosts": {"4": {"node": 3}}}
    loaded = load_dumps(write_dumps(tmp_path / "fr", dumps))
    loaded.run = run
    report = diagnose(loaded)
    assert report["suspects"][0]["kind"] == "membership" and report["suspects"][0]["rank"] == 4
    assert report["suspects"][0]["node"] == 3  # the run's hosts, not rank // gpus_per_node
    assert report["missing_dumps"] == [7] and "No dump from rank(s) 7" in report["diagnosis"]


def test_pickles_are_refused_never_read(tmp_path):
    folder = tmp_path / "fr"
    folder.mkdir()
    (folder / "rank0").write_bytes(pickle.dumps({"entries": []}))
    (folder / "rank0.json").write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(HangInputError, match="a pickle .* never read: it can run code"):
        load_dumps(folder)
    assert hang_cli.main([str(folder)]) == 2


def test_bad_inputs_are_one_line(tmp_path, capsys):
    (tmp_path / "noname.json").write_text("{}")
    assert hang_cli.main([str(tmp_path / "noname.json")]) == 2
    assert "no rank number in the file name" in capsys.readouterr().err
    (tmp_path / "rank1.json").write_text('{"entries": 3}')
    with pytest.raises(HangInputError, match="not a Flight Recorder dump .*entries"):
        load_dumps(tmp_path / "rank1.json")
    (tmp_path / "rank2.json").write_text("{not json")
    with pytest.raises(HangInputError, match="not valid JSON"):
        load_dumps(tmp_path / "rank2.json")
    assert hang_cli.main([str(tmp_path / "missing")]) == 2


def test_archive_of_dumps_and_the_cli_json_contract(tmp_path, capsys):
    dumps = job_dumps(world=4, tp=2, steps=2, fault=Fault("missing", rank=1, dim="dp", seq=2))
    archive = tmp_path / "dumps.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for rank, dump in dumps.items():
            raw = json.dumps(dump).encode()
            info = tarfile.TarInfo(f"job/nccl_trace_rank_{rank}")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
    assert hang_cli.main([str(archive), "--json"]) == 2  # members without .json are not dumps
    capsys.readouterr()
    with tarfile.open(archive, "w:gz") as tf:
        for rank, dump in dumps.items():
            raw = json.dumps(dump).encode()
            info = tarfile.TarInfo(f"job/nccl_trace_rank_{rank}.json")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
    assert hang_cli.main([str(archive), "--json", "--gpus-per-node", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"diagnosis", "suspects", "groups"}
    assert out["suspects"][0] == {
        "rank": 1,
        "dim": "dp",
        "kind": "missing",
        "op": "all_reduce",
        "seq": 2,
        "node": 0,
        "group": "4",
    }
    assert all(set(g) >= {"name", "dim", "ranks", "last_completed"} for g in out["groups"])


def test_a_thousand_ranks(tmp_path):
    folder = write_dumps(tmp_path / "fr", job_dumps(world=1024, tp=8, steps=2, fault=Fault("missing", 777, "dp", 2)))
    report = diagnose(load_dumps(folder))
    assert report["suspects"][0]["rank"] == 777 and report["suspects"][0]["dim"] == "dp"
    assert len(report["ranks"]) == 1024


def test_group_descriptions_name_dimensions():
    assert dim_of_desc("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert dim_of_desc("DATA_PARALLEL_GROUP_WITH_CP") == "dp"
    assert dim_of_desc("PIPELINE_MODEL_PARALLEL_GROUP") == "pp"
    assert dim_of_desc("EXPERT_MODEL_PARALLEL_GROUP") == "ep"
    assert dim_of_desc("mesh_dp_shard") == "dp" and dim_of_desc("tp") == "tp"
    assert dim_of_desc("undefined") is None


REFERENCE_KINDS = {
    "COLLECTIVE_TYPE_MISMATCH": "op_mismatch",
    "SIZE_OR_SYNTAX_MISMATCH": "size_mismatch",
    "COLLECTIVE_DTYPE_MISMATCH": "dtype_mismatch",
}


def reference_finding(folder: Path, tmp: Path) -> tuple[str, int, set[int]]:
    """(kind, sequence number, ranks to blame) of the first fault PyTorch's flight_recorder reports on
    the dumps in `folder` (written as the pickles it reads, under names it parses)."""
    return _run_reference(folder, tmp)[0]


def _run_reference(folder: Path, tmp: Path) -> list[tuple[str, int, set[int]]]:
    # lazy: torch (2 s), for the one comparison with PyTorch's own analyzer; the other tests need none
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    tmp.mkdir()
    for f in folder.glob("rank*.json"):
        (tmp / f.stem).write_bytes(pickle.dumps(json.loads(f.read_text())))
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("Flight Recorder")
    logger.addHandler(handler)
    try:
        args = JobConfig().parse_args([str(tmp)])
        details, version = read_dir(args)
        build_db(details, args, version)
    finally:
        logger.removeHandler(handler)
    return _blocks("\n".join(lines))


def _blocks(text: str) -> list[tuple[str, int, set[int]]]:
    """Each fault the reference printed, in its order: (kind, sequence number, ranks it blames)."""
    heads = list(
        re.finditer(
            r"Collective sequence number: (\d+) has errors|Not all ranks joining collective, sequence number: (\d+)",
            text,
        )
    )
    assert heads, text[-2000:]
    out = []
    for i, head in enumerate(heads):
        block = text[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        seq = int(head.group(1) or head.group(2))
        culprits = re.findall(r"Culprit rank (\d+); Error type: (\w+)", block)
        if head.group(1) and culprits:
            out.append((REFERENCE_KINDS[culprits[0][1]], seq, {int(r) for r, _ in culprits}))
        elif missing := re.search(r"missing ranks: \{([\d, ]+)\}", block):
            out.append(("missing", seq, {int(r) for r in missing.group(1).split(",")}))
    return out


def reference_findings(folder: Path, tmp: Path) -> list[tuple[str, int, set[int]]]:
    """Every fault the reference prints for the dumps in `folder`."""
    return _run_reference(folder, tmp)


@pytest.mark.parametrize(("fault", "words"), FAULTS, ids=[f.kind for f, _ in FAULTS])
def test_same_finding_as_pytorchs_flight_recorder(tmp_path, fault, words):
    folder = write_dumps(tmp_path / "fr", job_dumps(world=8, tp=2, steps=3, fault=fault))
    report = diagnose(load_dumps(folder))
    kind, seq, blamed = reference_finding(folder, tmp_path / "pickles")
    # the reference reports the first fault in its reading order (a stuck rank's DP collective can
    # come before its TP one): it is one of ours, with its kind and sequence number
    ours = [s for s in report["suspects"] if (s["kind"], s["seq"]) == (kind, seq)]
    assert ours and ours[0]["rank"] == fault.rank, (kind, seq, blamed, report["suspects"])
    # the reference takes the first rank it reads as the expected one: where that rank is the odd one
    # out, it blames the others of the group instead
    members = set(next(g for g in report["groups"] if g["name"] == ours[0]["group"])["ranks"])
    assert blamed in ({fault.rank}, members - {fault.rank})
