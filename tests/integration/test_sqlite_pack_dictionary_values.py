"""What a learned pack dictionary (storage/pack_dictionaries.py) may never hold, and who
can still read format 5 packs: a job's values stay out of the learned text whatever shape
the handler gives them (a key with a ``:`` inside a resource, custom events with data
keys that replayq's own events use for names), and a connection of one's own, registered
before any dictionary was learned, reads the packs written against one later.

The worker is a real ``replayq worker --burst`` process on a real SQLite file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import replayq
from replayq.storage import packs
from tests.app_modules import burst, imported_app

MODULE = """
import os

import replayq

app = replayq.App(os.environ["NOTES_DB"])


@app.job("notes.welcome")
def welcome(ctx, email: str, holder: str) -> dict:
    with ctx.step("remember"):
        # A key with the customer's e-mail before its last ':'.
        ctx.state.put("session", f"{email}:inbox", {"seen": 1})
    with ctx.step("note"):
        # An application's own event, its data keys named as replayq names its own.
        ctx.record("customer.noted", kind=email, version=holder, call=holder, topic=email)
        ctx.record("customer.flagged", status=email)  # a status of the application's
    with ctx.step("balance"):
        # An answer keyed by the customer's IBAN and account id (identifiers in shape).
        ctx.call("ledger.balances", lambda: {"DE89370400440532013000": 12, "acct_20261206": 3})
        # A yes-or-no about the customer is a value too.
        ctx.call("ledger.flags", lambda: {"overdrawn": True})
    with ctx.step("send"):
        done = ctx.effect("mail.sent", lambda: {"ok": True}, key=f"mail:{email}:welcome")
    return done
"""

EMAIL = "mia@example.com"
# Jobs a burst worker runs to learn a type's dictionary: it learns at the first attempt it
# starts after two of them were acked, and acks wait for group commits.
LEARNED_AFTER = 12
HOLDER = "Mia Example"


def notes_app(
    directory: Path, db: Path, monkeypatch: pytest.MonkeyPatch, url: str | None = None
) -> replayq.App:
    """The application module, written to ``directory`` and imported here: its ``app``
    (on ``db``, or ``url`` if given)."""
    return imported_app(
        directory, "notes_app", MODULE, {"NOTES_DB": url or f"sqlite:///{db}"}, monkeypatch
    )


def run_worker(directory: Path, db: Path) -> None:
    burst(directory, db, "notes_app", {"NOTES_DB": f"sqlite:///{db}"})


def test_no_value_a_job_was_given_reaches_its_types_learned_dictionary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "notes.db"
    app = notes_app(tmp_path, db, monkeypatch)
    try:
        for _ in range(LEARNED_AFTER):
            app.enqueue("notes.welcome", {"email": EMAIL, "holder": HOLDER})
    finally:
        app.close()
    run_worker(tmp_path, db)
    conn = sqlite3.connect(db)
    try:
        texts = [bytes(t) for (t,) in conn.execute("SELECT text FROM rq_pack_dictionaries")]
    finally:
        conn.close()
    assert len(texts) == 1
    text = texts[0]
    # The names the code gives are there: the learning happened.
    assert b"remember" in text and b"customer.noted" in text and b"mail.sent" in text
    assert b"ledger.balances" in text and b'"overdrawn":false' in text
    assert b"true" not in text, text
    for value in (b"mia@example.com", b"Mia Example", b"example.com", b"DE8937", b"20261206"):
        assert value not in text, (value, text)


def test_a_connection_registered_before_a_dictionary_was_learned_reads_its_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "notes.db"

    def enqueued(count: int) -> list[int]:
        app = notes_app(tmp_path, db, monkeypatch)
        try:
            return [
                app.enqueue("notes.welcome", {"email": EMAIL, "holder": HOLDER})
                for _ in range(count)
            ]
        finally:
            app.close()

    jobs = enqueued(LEARNED_AFTER)
    # A script's own connection, opened and registered while no dictionary exists yet.
    own = sqlite3.connect(db)
    try:
        packs.register_sqlite(own)
        assert own.execute("SELECT count(*) FROM rq_events").fetchone()[0] == LEARNED_AFTER
        run_worker(tmp_path, db)  # learns the type's dictionary
        jobs += enqueued(1)
        run_worker(tmp_path, db)  # reads it at its first attempt: that job's packs use it
        stored = [
            bytes(e)
            for (e,) in own.execute("SELECT events FROM rq_trace WHERE job_id = ?", (jobs[-1],))
        ]
        assert any(s[:1] == b"\x05" for s in stored)  # the last job's packs: format 5
        names = [
            name
            for (name,) in own.execute(
                "SELECT name FROM rq_events WHERE job_id = ? ORDER BY hlc, id", (jobs[-1],)
            )
        ]
    finally:
        own.close()
    assert "customer.noted" in names and names[-1] == "job.succeeded"


def test_a_reader_on_a_relative_path_reads_a_dictionary_learned_after_it_changed_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "notes.db"
    notes_app(tmp_path, db, monkeypatch).close()
    # A reader that named its file relative to where it started, and moved on since (a
    # daemon's chdir, a test runner's): its connection is open on the file already.
    monkeypatch.chdir(tmp_path)
    reader = notes_app(tmp_path, db, monkeypatch, url="sqlite:///notes.db")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        welcome = {"email": EMAIL, "holder": HOLDER}
        jobs = [reader.enqueue("notes.welcome", welcome) for _ in range(LEARNED_AFTER)]
        assert [e.name for e in reader.trace(jobs[-1])] == ["job.enqueued"]
        monkeypatch.chdir(elsewhere)
        run_worker(tmp_path, db)  # learns the type's dictionary
        jobs.append(reader.enqueue("notes.welcome", welcome))
        run_worker(tmp_path, db)  # its job's packs use it
        names = [e.name for e in reader.trace(jobs[-1])]
    finally:
        reader.close()
    with sqlite3.connect(db) as conn:  # what the reader met: a pack of format 5
        rows = conn.execute("SELECT events FROM rq_trace WHERE job_id = ?", (jobs[-1],))
        assert any(bytes(events)[:1] == b"\x05" for (events,) in rows)
    assert "customer.noted" in names and names[-1] == "job.succeeded"
    assert list(elsewhere.iterdir()) == []  # no database file made where it is now
