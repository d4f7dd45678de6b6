"""An enqueue on SQLite writes only the pages its row, its pack and their indexes need.

Each page a commit dirties is a WAL frame written (two ``pwrite`` calls) and later copied
back by a checkpoint, so an index that no query reads still costs every job a page
(docs/benchmarks.md: 9.8 pages per enqueue with ``rq_jobs_type``, 8.7 without, 7.7
without ``AUTOINCREMENT``'s ``sqlite_sequence``). The
WAL frames that enqueues add are counted here: one more index on ``rq_jobs`` or on the
trace raises the count by about one per enqueue.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import replayq

ENQUEUES = 300
# The row, rq_jobs_ready, rq_jobs_trace, rq_jobs_message, the job.enqueued pack,
# rq_trace_job and rq_trace_hlc: 7 pages, plus page splits and the file's growth (7.87
# measured here with the default 2048-byte pages, whose splits come twice as often as
# 4096-byte ones' (7.28); one more index adds about one page an enqueue).
MOST_PAGES_PER_ENQUEUE = 8.5
_WAL_HEADER = 32
_FRAME_HEADER = 24


def test_an_enqueue_writes_no_page_for_an_index_that_no_query_reads(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    app = replayq.App(f"sqlite:///{db}")

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    for n in range(50):  # the tables' and indexes' first pages exist
        app.enqueue("noop", {"n": n})
    observer = sqlite3.connect(db)
    try:
        # An empty WAL; ENQUEUES enqueues stay far below the automatic checkpoint's 4,000
        # pages, so every frame they write is still in the file afterwards.
        busy, _, _ = observer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        page_size = observer.execute("PRAGMA page_size").fetchone()[0]
        for n in range(ENQUEUES):
            app.enqueue("noop", {"n": n})
        frames = (os.path.getsize(f"{db}-wal") - _WAL_HEADER) / (page_size + _FRAME_HEADER)
        assert observer.execute("SELECT count(*) FROM rq_jobs").fetchone()[0] == 50 + ENQUEUES
    finally:
        observer.close()
        app.close()
    assert frames / ENQUEUES <= MOST_PAGES_PER_ENQUEUE, f"{frames / ENQUEUES:.2f} pages"


def _page_size(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def _app(url: str) -> replayq.App:
    app = replayq.App(url)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def test_a_new_database_has_half_size_pages_and_the_url_can_choose_another(
    tmp_path: Path,
) -> None:
    """Each commit copies whole pages into the WAL: a queue's small commits copy half
    the bytes with 2048-byte pages. ``?page_size=`` applies when replayq creates the file;
    a file that exists keeps its own, and keeps working."""
    default, chosen = tmp_path / "default.db", tmp_path / "chosen.db"
    for url in (f"sqlite:///{default}", f"sqlite:///{chosen}?page_size=4096"):
        app = _app(url)
        app.enqueue("noop", {"n": 1})
        app.close()
    assert (_page_size(default), _page_size(chosen)) == (2048, 4096)

    reopened = _app(f"sqlite:///{chosen}?page_size=1024")
    job_id = reopened.enqueue("noop", {"n": 2})
    assert reopened.get_job(job_id).state is replayq.JobState.QUEUED
    assert len(reopened.list_jobs(limit=10)) == 2
    reopened.close()
    assert _page_size(chosen) == 4096


def test_a_page_size_sqlite_cannot_have_is_refused_before_any_file_is_made(
    tmp_path: Path,
) -> None:
    for bad in ("1000", "256", "131072", "big", "-2048"):
        db = tmp_path / f"bad-{bad}.db"
        app = _app(f"sqlite:///{db}?page_size={bad}")
        with pytest.raises(replayq.ConfigurationError, match="page_size must be a power of two"):
            app.enqueue("noop", {"n": 1})
        assert not db.exists()


def test_the_documented_conversion_gives_a_file_the_default_page_size_and_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    """docs/operations.md: with every process stopped, ``journal_mode=DELETE``, the new
    ``page_size``, ``VACUUM`` and ``journal_mode=WAL`` convert a 4096-page file; replayq
    then reads its jobs and their traces as before and enqueues on it."""
    db = tmp_path / "old.db"
    app = _app(f"sqlite:///{db}?page_size=4096")
    before = [app.enqueue("noop", {"n": n}, message_id=f"m{n}") for n in range(20)]
    app.close()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for pragma in ("journal_mode=DELETE", "page_size=2048", "VACUUM", "journal_mode=WAL"):
            conn.execute(pragma if pragma == "VACUUM" else f"PRAGMA {pragma}")
    finally:
        conn.close()
    assert _page_size(db) == 2048
    app = _app(f"sqlite:///{db}")
    assert [app.get_job(i).message_id for i in before] == [f"m{n}" for n in range(20)]
    assert all([e.name for e in app.trace(i)] == ["job.enqueued"] for i in before)
    assert app.enqueue("noop", {"n": 0}, message_id="m0") == before[0]
    app.close()
