"""A worker learns each job type's names once and its later trace packs deflate against
them (storage/pack_dictionaries.py, format 5), and everything that reads the trace still
reads it: replayq's own reads in another process that opened the file before the
dictionary existed, gc's question of which blobs the trace references, a dry-run, and SQL
on a connection of one's own after ``register_sqlite``.

The worker is a real ``replayq worker --burst`` process on a real SQLite file.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import replayq
from replayq.replay.engine import dry_run
from replayq.storage import packs
from replayq.storage.retention_params import BlobScan
from tests.app_modules import burst, imported_app

DB = "ledger.db"

# An application with names of its own (none of them in packs.DICTIONARY_2), and values a
# job is given that no dictionary may keep: an e-mail, an account holder's name, an IBAN.
MODULE = """
import os

import replayq

app = replayq.App(os.environ["LEDGER_DB"])


def lookup(entry, email):
    # Large enough (~3 KB) that the answer goes to the blob store, referenced by the trace.
    lines = [{"sku": f"sku-{entry}-{n}", "price_cents": n * 7} for n in range(80)]
    return {"holder": "Mia Example", "iban": "DE89370400440532013000", "fee_cents": entry % 7,
            "lines": lines}


@app.job("ledger.settle")
def settle(ctx, entry: int, email: str) -> dict:
    with ctx.step("pull"):
        found = ctx.state.get("entry", entry)
    with ctx.step("quote"):
        tariff = ctx.call("tariff.lookup", lookup, entry, email)
    with ctx.step("earmark"):
        ctx.state.put("entry", entry, {"status": "earmarked", "fee": tariff["fee_cents"]})
    with ctx.step("settle"):
        done = ctx.effect("ledger.debited", lambda: {"ok": True}, key=f"outlay:{entry}")
    with ctx.step("journal"):
        ctx.state.put("partner", entry, {"seen": found.version})
    with ctx.step(f"audit {email}"):  # a name made of the job's value
        ctx.state.get("partner", entry)
    return done
"""


def events_column(job_id: int, path: Path) -> list[bytes]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT events FROM rq_trace WHERE job_id = ? ORDER BY id", (job_id,))
        return [bytes(events) for (events,) in rows]
    finally:
        conn.close()


def ledger_app(directory: Path, monkeypatch: pytest.MonkeyPatch) -> replayq.App:
    """The application module, written to ``directory`` and imported here: its ``app``."""
    return imported_app(directory, "ledger_app", MODULE, ledger_env(directory), monkeypatch)


def ledger_env(directory: Path) -> dict[str, str]:
    return {"LEDGER_DB": f"sqlite:///{directory / DB}"}


def test_a_worker_learns_a_job_types_names_once_and_every_reader_reads_its_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / DB
    # A reader opened before any dictionary exists: it meets them only in the packs.
    reader = ledger_app(tmp_path, monkeypatch)
    try:

        def run(entries: range) -> list[int]:
            """Jobs of ``entries`` enqueued, then run by a ``replayq worker --burst``."""
            enqueued = [
                reader.enqueue("ledger.settle", {"entry": n, "email": f"mia{n}@example.com"})
                for n in entries
            ]
            burst(tmp_path, path, "ledger_app", ledger_env(tmp_path))
            assert {reader.get_job(j).state.value for j in enqueued} == {"succeeded"}
            return enqueued

        before = reader.enqueue("ledger.settle", {"entry": 1, "email": "noor@example.org"})
        assert [e.name for e in reader.trace(before)] == ["job.enqueued"]  # read: none known
        # The first worker learns at the first attempt it starts after two of its jobs were
        # acked (acks wait for group commits: a dozen jobs give it one); the second worker
        # reads what it learned at its first attempt.
        first = [before, *run(range(4711, 4722))]
        second = run(range(4722, 4724))
        jobs = [*first, *second]

        conn = sqlite3.connect(path)
        learned = conn.execute(
            "SELECT id, job_type, text, job_id FROM rq_pack_dictionaries"
        ).fetchall()
        conn.close()
        # One dictionary, learned from two of the first worker's jobs.
        assert [row[1] for row in learned] == ["ledger.settle"] and learned[0][3] in first
        text = bytes(learned[0][2])
        for name in (b"pull", b"quote", b"earmark", b"journal", b"tariff.lookup"):
            assert name in text, name
        assert b'"ledger.debited"' in text and b'"entry:"' in text and b'"outlay:"' in text
        for value in (b"example.", b"Mia Example", b"DE8937", b"4711", b"earmarked", b"audit"):
            assert value not in text, value

        # The first two jobs' packs were written before it: format 2; the second worker's
        # jobs have their main pack (their steps' and ack's events) in format 5.
        for job_id in first[:2]:
            assert all(stored[:1] != b"\x05" for stored in events_column(job_id, path))
        for job_id in second:
            assert any(stored[:1] == b"\x05" for stored in events_column(job_id, path))

        # replayq's reads in this process, which did not know the dictionary.
        names = [e.name for e in reader.trace(jobs[0])]
        for job_id in second:
            assert [e.name for e in reader.trace(job_id)] == names
            settled = [e for e in reader.trace(job_id) if e.name == "call"]
            assert settled[0].data["call"] == "tariff.lookup"
            assert settled[0].output_ref is not None
        # A dry-run of a job recorded in format 5 reads its recording and agrees with it.
        report = dry_run(reader, second[0], keep=False)
        assert report.first_divergence is None and report.error is None, report

        # gc's question in SQL (rq_pack_json on this process's connection): every call's
        # answer is referenced by its trace, so no blob is a candidate for deletion.
        with reader.storage.transaction(readonly=True) as tx:
            unreferenced = tx.gc_scan(BlobScan("", time.time() + 86_400, 100))
        assert unreferenced == []

        # SQL on a connection of one's own, after register_sqlite.
        own = sqlite3.connect(path)
        packs.register_sqlite(own)
        rows = own.execute(
            "SELECT name FROM rq_events WHERE job_id = ? ORDER BY hlc, id", (second[-1],)
        ).fetchall()
        own.close()
        assert [name for (name,) in rows] == names
    finally:
        reader.close()
