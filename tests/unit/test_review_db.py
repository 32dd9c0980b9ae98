"""Saved reviews: save, list, reopen, notes by author and time; concurrent saves from
several threads and several processes lose nothing — on SQLite in WAL mode (the default) and on a
real PostgreSQL server (what a team points PARASCOPE_REVIEWS_DB at)."""

import itertools
import multiprocessing as mp
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest

from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, MODELS, SpecError
from parallel.review.document import NamedPlan, Review
from parallel.review.store import ReviewStore, default_url
from tests.support.postgres import PostgresServer

CLUSTER = CLUSTERS["dgx-h100"].with_nodes(2)


def make(title: str, tp: int = 2) -> Review:
    plans = (
        NamedPlan("A", Plan(dp=16 // tp, tp=tp, global_batch=64)),
        NamedPlan("B", Plan(dp=4, tp=2, pp=2, global_batch=64)),
    )
    return Review(title=title, model=MODELS["gpt3-22b"], cluster=CLUSTER, plans=plans, author="ana")


@pytest.fixture(scope="session")
def postgres():
    reason = PostgresServer.missing()
    if reason:
        pytest.skip(reason)
    # Not under pytest's tmp dir: that is root-only (0700), and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="parascope-pg-"))
    server = PostgresServer(root).start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reviews.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database(f"reviews_{next(_databases)}")
    s = ReviewStore(url)
    yield s
    s.dispose()


def test_save_list_reopen_and_notes(store):
    r = make("first").with_note("ana", "initial thoughts", at="2026-11-30T09:00:00+00:00")
    rid = store.save(r, author="ana")
    store.add_note(rid, "bo", "why not PP 2 for A?")
    again = store.open(rid)
    assert again.plans == r.plans and again.model == r.model and again.cluster == r.cluster
    assert [(n.author, n.text) for n in again.notes] == [("ana", "initial thoughts"), ("bo", "why not PP 2 for A?")]
    # a new revision keeps the notes and becomes what reopens
    store.save(again.__class__(**{**again.__dict__, "verdict": "B", "chosen": "B"}), author="bo", review_id=rid)
    latest = store.open(rid)
    assert latest.chosen == "B" and len(latest.notes) == 2  # notes are not duplicated by re-saving them
    assert [r["saved_by"] for r in store.revisions(rid)] == ["ana", "bo"]
    first_rev = store.revisions(rid)[0]["revision"]
    assert store.open(rid, revision=first_rev).chosen is None
    (row,) = store.list()
    assert (row.id, row.title, row.revisions, row.notes, row.chosen, row.plans) == (rid, "first", 2, 2, "B", ["A", "B"])
    assert row.model == "gpt3-22b" and row.cluster == "dgx-h100 × 2"


def test_errors_are_clear(store):
    with pytest.raises(SpecError, match="no saved review 42"):
        store.open(42)
    with pytest.raises(SpecError, match="no saved review 42"):
        store.add_note(42, "ana", "hello")
    rid = store.save(make("x"), author="ana")
    with pytest.raises(SpecError, match="a note needs some text"):
        store.add_note(rid, "ana", "   ")


def test_wal_mode_and_default_location(tmp_path, monkeypatch):
    monkeypatch.delenv("PARASCOPE_REVIEWS_DB", raising=False)
    monkeypatch.setenv("PARASCOPE_DATA", str(tmp_path / "data"))
    assert default_url() == f"sqlite:///{tmp_path / 'data' / 'reviews.db'}"
    s = ReviewStore()
    s.save(make("x"), author="ana")
    s.dispose()
    assert sqlite3.connect(tmp_path / "data" / "reviews.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    monkeypatch.setenv("PARASCOPE_REVIEWS_DB", "sqlite:///:memory:")
    assert default_url() == "sqlite:///:memory:"


def _writer(url: str, who: str, shared: int, n: int) -> None:
    store = ReviewStore(url)
    for i in range(n):
        store.save(make(f"{who}-{i}"), author=who)
        store.add_note(shared, who, f"note {i} from {who}")
        store.save(make("shared", tp=4), author=who, review_id=shared)
    store.dispose()


def test_concurrent_threads_lose_nothing(store):
    shared = store.save(make("shared"), author="lead")
    threads = [threading.Thread(target=_writer, args=(store.url, f"t{k}", shared, 5)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = {r.title: r for r in store.list(limit=1000)}
    assert len(rows) == 1 + 8 * 5
    assert rows["shared"].revisions == 1 + 8 * 5 and rows["shared"].notes == 8 * 5
    assert {n.text for n in store.open(shared).notes} == {f"note {i} from t{k}" for i in range(5) for k in range(8)}


@pytest.mark.slow
def test_concurrent_processes_lose_nothing(store):
    shared = store.save(make("shared"), author="lead")
    ctx = mp.get_context("fork")  # children build their own engine; nothing is re-imported
    procs = [ctx.Process(target=_writer, args=(store.url, f"p{k}", shared, 5)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    rows = {r.title: r for r in store.list(limit=1000)}
    assert len(rows) == 1 + 4 * 5
    assert rows["shared"].revisions == 1 + 4 * 5 and rows["shared"].notes == 4 * 5
