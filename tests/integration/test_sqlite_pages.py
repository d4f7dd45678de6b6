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

import replayq

ENQUEUES = 300
# The row, rq_jobs_ready, rq_jobs_trace, rq_jobs_message, the job.enqueued pack,
# rq_trace_job and rq_trace_hlc: 7 pages, plus page splits and the file's growth (7.28
# measured here; 8.28 with AUTOINCREMENT's sqlite_sequence, before migration 0017).
MOST_PAGES_PER_ENQUEUE = 8.0
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
