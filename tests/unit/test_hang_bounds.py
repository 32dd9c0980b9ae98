"""Hostile and unusual Flight Recorder dumps: each is a right answer or a one-line HangInputError, fast
and small -- sequence gaps, huge ranks and worlds, a budget per dump set, wrong types, deep nesting,
integers past 64 bits, control characters; and the point-to-point and missing-dump facts a bare
folder of dumps carries (group-local p2p names, default_pg's ranks)."""

import json
import time

import pytest

from profiler.analyzers import hang, hang_dumps
from profiler.analyzers.hang import HangInputError, diagnose, load_dumps
from profiler.cli import hang as hang_cli
from tests.support.fr_dumps import Fault, job_dumps, write_dumps


def entry(pg, seq, op="all_reduce", sizes=((4,),), desc="tp", p2p=False, t=0, state="scheduled", rid=0):
    return {
        "record_id": rid,
        "process_group": [pg, desc],
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "profiling_name": f"nccl:{op}",
        "input_sizes": [list(s) for s in sizes],
        "output_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "state": state,
        "is_p2p": p2p,
        "time_created_ns": t,
    }


def write(folder, dumps: dict, config: dict | None = None, run=None):
    """dumps: rank -> entries; config: group name -> (desc, ranks) given to every member."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, entries in dumps.items():
        mine = {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in (config or {}).items() if rank in r}
        (folder / f"rank{rank}.json").write_text(
            json.dumps({"version": "2.8", "pg_config": mine, "entries": entries}, ensure_ascii=False)  # raw characters
        )
    if run is not None:
        (folder.parent / "run.json").write_text(run if isinstance(run, str) else json.dumps(run))
    return folder


@pytest.mark.parametrize("far", [10**15, -(10**18)])
def test_a_sequence_gap_is_walked_by_the_numbers_present(tmp_path, far):
    folder = write(tmp_path / "fr", {0: [entry("1", 1), entry("1", far)], 1: [entry("1", 1)]}, {"1": ("tp", [0, 1])})
    start = time.perf_counter()
    report = diagnose(load_dumps(folder))
    assert time.perf_counter() - start < 2
    assert report["suspects"][0]["rank"] in (0, 1)


def test_a_rank_beyond_the_cap_is_refused_before_its_bytes_are_read(tmp_path):
    write(tmp_path / "fr", {0: [entry("1", 1)]})
    (tmp_path / "fr" / "rank1000000000.json").write_text('{"entries": []}')
    with pytest.raises(HangInputError, match=r"rank 1000000000 in the file name; ranks are below 131,072"):
        load_dumps(tmp_path / "fr")


@pytest.mark.parametrize("world", [10**10, 3 * 10**7, "10", [4], 2**70])
def test_run_json_world_size_is_bounded(tmp_path, capsys, world):
    run = tmp_path / "run"
    write(run / "fr", {0: [entry("1", 1)], 1: [entry("1", 1)]}, {"0": ("default_pg", [0, 1])}, {"world_size": world})
    assert hang_cli.main([str(run), "--json"]) == (0 if world == "10" else 2)
    out, err = capsys.readouterr()
    if world == "10":
        assert json.loads(out)["missing_dumps"] == list(range(2, 10))
    else:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


@pytest.mark.parametrize("run", ["[1, 2]", "7", '{"hosts": [1, 2]}', '{"hosts": {"0": 5}, "plan": 3}', "[" * 100_000])
def test_run_json_of_the_wrong_shape_is_ignored(tmp_path, capsys, run):
    folder = tmp_path / "run"
    write(folder / "fr", {0: [entry("1", 1), entry("1", 2)], 1: [entry("1", 1)]}, {"1": ("tp", [0, 1])}, run)
    assert hang_cli.main([str(folder), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["suspects"][0]
    assert (first["rank"], first["kind"], first["node"]) == (1, "missing", 0)


def test_one_budget_for_the_whole_set(tmp_path, monkeypatch):
    write(tmp_path / "fr", {r: [entry("1", s) for s in range(1, 5)] for r in range(4)})
    monkeypatch.setattr(hang_dumps, "MAX_SET_ENTRIES", 10)  # 4 dumps x 4 entries: the third passes the cap
    with pytest.raises(HangInputError, match="more than 10 entries"):
        load_dumps(tmp_path / "fr")
    monkeypatch.setattr(hang_dumps, "MAX_SET_BYTES", 1000)
    with pytest.raises(HangInputError, match="more than 1,000 bytes"):
        load_dumps(tmp_path / "fr")


@pytest.mark.parametrize(
    "text",
    [
        '{"entries": [' + "[" * 100_000 + "]" * 100_000 + "]}",
        '{"pg_config": {"0": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        '{"entries": [{"process_group": ["1", "tp"], "collective_seq_id": 123456789012345678901234567890}]}',
    ],
    ids=["deep-entries", "deep-pg_config", "seq-past-64-bits"],
)
def test_deep_or_wide_dumps_are_one_line_errors(tmp_path, capsys, text):
    (tmp_path / "rank0.json").write_text(text)
    assert hang_cli.main([str(tmp_path / "rank0.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "rank0.json" in err


def test_integers_past_64_bits_elsewhere_are_dropped_and_json_still_prints(tmp_path, capsys):
    big = 123456789012345678901234567890
    folder = tmp_path / "fr"
    folder.mkdir()
    for rank in (0, 1):
        dump = {
            "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": [0, big]}},
            "pg_status": {"1": {"last_completed_collective": big}},
            "entries": [{**entry("1", 1, sizes=((big,),)), "pg_id": big, "time_created_ns": big}],
        }
        (folder / f"rank{rank}.json").write_text(json.dumps(dump))
    assert hang_cli.main([str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["suspects"] == [] and report["ranks"] == [0, 1]


def test_control_characters_are_escaped_in_the_text(tmp_path, capsys):
    name = "tp\x1b[2J\x9b\u202e\x00"
    folder = write(
        tmp_path / "fr",
        {
            0: [entry(name, 1, desc=name, state="sched\x1b[31m"), entry(name, 2, desc=name)],
            1: [entry(name, 1, desc=name)],
        },
    )
    assert hang_cli.main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in out), repr(out)
    assert "tp\\x1b[2J\\x9b\\u202e\\x00" in out


def test_missing_dumps_from_default_pgs_ranks(tmp_path):
    ranks = [0, 1, 2, 3]
    folder = write(
        tmp_path / "fr", {r: [entry("0", 1, desc="default_pg")] for r in ranks[:3]}, {"0": ("default_pg", ranks)}
    )
    report = diagnose(load_dumps(folder))
    assert report["missing_dumps"] == [3] and report["world_size"] == 4
    assert "no dump from rank(s) 3" in report["diagnosis"]  # the ranks present agree: the absent one is named


def _p2p(pg, seq, op, a, b, sizes=((8,),), t=0):
    name = f"send {a}->{b}" if op == "send" else f"recv {a}<-{b}"
    return entry(pg, seq, op=name, sizes=sizes, desc="pp", p2p=True, t=t)


def test_point_to_point_pairs_use_group_local_ranks(tmp_path):
    config = {"5": ("pp", [2, 3])}
    matched = {2: [_p2p("5", 1, "send", 0, 1)], 3: [_p2p("5", 1, "recv", 1, 0)]}
    report = diagnose(load_dumps(write(tmp_path / "a", {0: [], 1: [], **matched}, config)))
    assert report["suspects"] == [], report["diagnosis"]
    unpaired = {2: [_p2p("5", 1, "send", 0, 1), _p2p("5", 2, "send", 0, 1, t=5)], 3: [_p2p("5", 1, "recv", 1, 0)]}
    report = diagnose(load_dumps(write(tmp_path / "b", {0: [], 1: [], **unpaired}, config)))
    first = report["suspects"][0]
    assert (first["rank"], first["kind"], first["op"], first["dim"]) == (3, "missing", "recv", "pp")
    assert "never posted the recv of message #2 from rank 2 to rank 3" in report["diagnosis"]


def test_a_wrong_size_send_is_a_size_mismatch_of_the_sender(tmp_path):
    config = {"5": ("pp", [0, 1])}
    dumps = {
        0: [_p2p("5", k, "send", 0, 1) for k in (1, 2)] + [_p2p("5", 3, "send", 0, 1, sizes=((16,),))],
        1: [_p2p("5", k, "recv", 1, 0) for k in (1, 2, 3)],
    }
    first = diagnose(load_dumps(write(tmp_path / "fr", dumps, config)))["suspects"][0]
    assert (first["rank"], first["kind"], first["op"], first["seq"]) == (0, "size_mismatch", "send", 3)


def test_a_skipped_receive_blames_the_receiver_not_its_waiting_sender(tmp_path):
    """Stage 1 (rank 1) stops before its receive; stage 0 (rank 0) sent and waits for the gradient;
    rank 1's TP peer (rank 2) waits in a collective rank 1 never issues."""
    config = {"5": ("pp", [0, 1]), "6": ("tp", [1, 2])}
    dumps = {
        0: [_p2p("5", 1, "send", 0, 1, t=1), _p2p("5", 2, "recv", 0, 1, t=2)],
        1: [entry("6", 1, t=0)],
        2: [entry("6", 1, t=0), entry("6", 2, t=3)],
    }
    report = diagnose(load_dumps(write(tmp_path / "fr", dumps, config)))
    assert [s["rank"] for s in report["suspects"]][:2] == [1, 1], report["suspects"]
    assert report["suspects"][0]["dim"] in ("pp", "tp")


@pytest.mark.slow
def test_hang_dump_reading_stays_fast_for_a_large_job(tmp_path):
    """256 ranks x 2,000 entries (~200 MB of JSON): read and diagnosed in seconds (4.4 s here)."""
    folder = write_dumps(tmp_path / "fr", job_dumps(world=256, tp=8, steps=667, fault=Fault("missing", 77, "dp", 600)))
    start = time.perf_counter()
    report = diagnose(load_dumps(folder))
    assert report["suspects"][0]["rank"] == 77
    assert time.perf_counter() - start < 30


def test_control_characters_in_dtypes_are_escaped_in_the_paragraph(tmp_path):
    odd = {**entry("1", 1), "input_dtypes": ["Fl\u202eoat\x9b"], "output_dtypes": ["Fl\u202eoat\x9b"]}
    folder = write(tmp_path / "fr", {0: [odd], 1: [entry("1", 1)], 2: [entry("1", 1)]}, {"1": ("tp", [0, 1, 2])})
    report = diagnose(load_dumps(folder))
    assert report["suspects"][0]["kind"] == "dtype_mismatch" and report["suspects"][0]["rank"] == 0
    assert "\u202e" not in report["diagnosis"] and "\x9b" not in report["diagnosis"]
    assert "Fl\\u202eoat\\x9b" in report["diagnosis"]


def test_a_process_group_per_entry_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(hang, "MAX_GROUPS", 50)
    folder = write(tmp_path / "fr", {0: [entry(str(k), 1) for k in range(60)], 1: [entry("1", 1)]})
    with pytest.raises(HangInputError, match="more than 50 process groups"):
        diagnose(load_dumps(folder))
