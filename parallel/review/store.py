"""Saved plan reviews: save, list, reopen, and notes appended by author and time.

    store = ReviewStore()                       # $PARASCOPE_REVIEWS_DB (any SQLAlchemy URL), else SQLite at
                                                # $PARASCOPE_DATA/reviews.db, else ./.parascope/reviews.db
    rid = store.save(review, author="ana")      # a new review; store.save(review, author=..., review_id=rid)
                                                # adds a revision of an existing one
    store.list()                                # newest first: id, title, model, cluster, plans, verdict, ...
    store.open(rid)                             # the latest revision, with every note
    store.add_note(rid, "bo", "why not CP 2?")

Nothing is ever updated in place, so concurrent saves lose nothing: a save inserts a revision row, a
note inserts a note row, and reopening reads the newest revision plus all notes. SQLite runs in WAL
mode with a busy timeout and takes its write lock at BEGIN (BEGIN IMMEDIATE), so writers from many
threads and processes queue instead of failing; a team server points the same code at PostgreSQL
with a URL (`postgresql+psycopg://user@host/db`). SQLAlchemy 2.x Core. Pure: no streamlit, no torch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from parallel.core.specs import SpecError
from parallel.review.document import Note, Review, now

ENV_URL, ENV_DATA = "PARASCOPE_REVIEWS_DB", "PARASCOPE_DATA"

metadata = MetaData()
reviews = Table(
    "reviews",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("title", String(300), nullable=False),
    Column("created_by", String(120), nullable=False),
    Column("created_at", String(40), nullable=False),  # ISO 8601 UTC, as in the review JSON
)
revisions = Table(
    "review_revisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("review_id", Integer, ForeignKey("reviews.id"), nullable=False, index=True),
    Column("saved_by", String(120), nullable=False),
    Column("saved_at", String(40), nullable=False),
    Column("body", Text, nullable=False),  # Review.to_dict() without notes, as JSON
)
notes = Table(
    "review_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("review_id", Integer, ForeignKey("reviews.id"), nullable=False, index=True),
    Column("author", String(120), nullable=False),
    Column("at", String(40), nullable=False),
    Column("text", Text, nullable=False),
)
# Timestamps are ISO 8601 strings (UTC): the same in SQLite and PostgreSQL, sortable, JSON-ready.


@dataclass(frozen=True)
class SavedReview:
    id: int
    title: str
    created_by: str
    created_at: str
    updated_at: str
    revisions: int
    notes: int
    model: str
    cluster: str
    plans: list[str]
    chosen: str | None
    verdict: str


def default_url() -> str:
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL]
    data = Path(os.environ.get(ENV_DATA) or Path.cwd() / ".parascope")
    data.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data / 'reviews.db'}"


def _sqlite_setup(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE (SQLAlchemy's recipe for pysqlite's transactions)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let SQLAlchemy's BEGIN below be the transaction
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA busy_timeout = 30000")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class ReviewStore:
    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        sqlite = self.url.startswith("sqlite")
        self.engine = create_engine(
            self.url, **({"connect_args": {"timeout": 30}} if sqlite else {"pool_pre_ping": True})
        )
        if sqlite:
            _sqlite_setup(self.engine)
        self._retry(lambda: metadata.create_all(self.engine))

    def _retry(self, fn, attempts: int = 8):
        """Run `fn`, retrying a locked SQLite database (schema creation racing across processes)."""
        for i in range(attempts):
            try:
                return fn()
            except OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err) or i == attempts - 1:
                    raise
                time.sleep(0.05 * 2**i)

    def save(self, review: Review, *, author: str, review_id: int | None = None) -> int:
        """Store `review` (its notes too, as note rows) as a new review, or as a new revision of `review_id`."""
        body = review.to_dict()
        body.pop("notes")
        stamp = now()

        def tx():
            with self.engine.begin() as conn:
                rid = review_id
                if rid is None:
                    rid = conn.execute(
                        insert(reviews).values(
                            title=review.title or "untitled review",
                            created_by=author,
                            created_at=review.created or stamp,
                        )
                    ).inserted_primary_key[0]
                elif conn.execute(select(reviews.c.id).where(reviews.c.id == rid)).first() is None:
                    raise SpecError(f"no saved review {rid}")
                conn.execute(
                    insert(revisions).values(review_id=rid, saved_by=author, saved_at=stamp, body=json.dumps(body))
                )
                known = {
                    (r.author, r.at, r.text)
                    for r in conn.execute(
                        select(notes.c.author, notes.c.at, notes.c.text).where(notes.c.review_id == rid)
                    )
                }
                fresh = [n for n in review.notes if (n.author, n.at, n.text) not in known]
                if fresh:
                    conn.execute(
                        insert(notes),
                        [{"review_id": rid, "author": n.author, "at": n.at, "text": n.text} for n in fresh],
                    )
                return int(rid)

        return self._retry(tx)

    def add_note(self, review_id: int, author: str, text: str) -> Note:
        if not text.strip():
            raise SpecError("a note needs some text")
        note = Note(author or "anonymous", text.strip(), now())

        def tx():
            with self.engine.begin() as conn:
                if conn.execute(select(reviews.c.id).where(reviews.c.id == review_id)).first() is None:
                    raise SpecError(f"no saved review {review_id}")
                conn.execute(insert(notes).values(review_id=review_id, author=note.author, at=note.at, text=note.text))

        self._retry(tx)
        return note

    def open(self, review_id: int, revision: int | None = None) -> Review:
        """The latest revision of a saved review (or the given revision id), with every note in time order."""
        with self.engine.connect() as conn:
            q = select(revisions.c.body).where(revisions.c.review_id == review_id)
            q = q.where(revisions.c.id == revision) if revision else q.order_by(revisions.c.id.desc()).limit(1)
            row = conn.execute(q).first()
            if row is None:
                raise SpecError(f"no saved review {review_id}" + (f" revision {revision}" if revision else ""))
            rows = conn.execute(
                select(notes.c.author, notes.c.at, notes.c.text)
                .where(notes.c.review_id == review_id)
                .order_by(notes.c.at, notes.c.id)
            ).all()
        body = json.loads(row.body)
        body["notes"] = [{"author": r.author, "at": r.at, "text": r.text} for r in rows]
        return Review.from_dict(body)

    def revisions(self, review_id: int) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(revisions.c.id, revisions.c.saved_by, revisions.c.saved_at)
                .where(revisions.c.review_id == review_id)
                .order_by(revisions.c.id)
            ).all()
        return [{"revision": r.id, "saved_by": r.saved_by, "saved_at": r.saved_at} for r in rows]

    def list(self, limit: int = 200) -> list[SavedReview]:
        """Saved reviews, most recently saved first."""
        latest = (
            select(revisions.c.review_id, func.max(revisions.c.id).label("rev"), func.count().label("n"))
            .group_by(revisions.c.review_id)
            .subquery()
        )
        counts = select(notes.c.review_id, func.count().label("n")).group_by(notes.c.review_id).subquery()
        q = (
            select(reviews, revisions.c.body, revisions.c.saved_at, latest.c.n.label("revs"), counts.c.n.label("notes"))
            .join(latest, latest.c.review_id == reviews.c.id)
            .join(revisions, revisions.c.id == latest.c.rev)
            .outerjoin(counts, counts.c.review_id == reviews.c.id)
            .order_by(latest.c.rev.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        out = []
        for r in rows:
            body = json.loads(r.body)
            out.append(
                SavedReview(
                    id=r.id,
                    title=r.title,
                    created_by=r.created_by,
                    created_at=r.created_at,
                    updated_at=r.saved_at,
                    revisions=r.revs,
                    notes=r.notes or 0,
                    model=body["model"]["name"],
                    cluster=f"{body['cluster']['name']} × {body['cluster']['nodes']}",
                    plans=[p["name"] for p in body["plans"]],
                    chosen=body.get("chosen"),
                    verdict=body.get("verdict", ""),
                )
            )
        return out

    def dispose(self) -> None:
        self.engine.dispose()
