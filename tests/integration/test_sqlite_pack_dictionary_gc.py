"""gc never deletes a learned trace pack dictionary (``rq_pack_dictionaries``), also once
it has purged the jobs it was learned from: packs that other jobs wrote against it must
still read, in this process and in one that never met the dictionary before.

SQLite alone: PostgreSQL's packs are JSON, with no dictionary.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
import replayq.testing
from tests.apps import retained

DAY = 86_400.0
START = 1_700_000_000.0
RETENTION = replayq.Retention(full_days=1, ledger_days=2)


def _learned(path: Path) -> list[tuple[int, str, int]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, job_type, job_id FROM rq_pack_dictionaries").fetchall()
    finally:
        conn.close()


def _formats(path: Path, job_id: int) -> set[int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT events FROM rq_trace WHERE job_id = ?", (job_id,))
        return {bytes(events)[0] for (events,) in rows}
    finally:
        conn.close()


def _credit(app: replayq.App, amount: int) -> replayq.Job:
    job = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": amount})
    assert job.state == replayq.JobState.SUCCEEDED
    return job


def test_gc_keeps_a_dictionary_whose_jobs_it_purged_and_its_packs_still_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gc.db"
    url = f"sqlite:///{path}"
    clock = replayq.FrozenClock(START)
    app = retained.declare(replayq.App(url, clock=clock, retention=RETENTION))
    try:
        # Learned at the first attempt after two successes: the third job's packs use it.
        old = [_credit(app, n) for n in range(1, 5)]
        [(dictionary, job_type, learned_from)] = _learned(path)
        assert job_type == "credit" and learned_from in {job.id for job in old}
        clock.advance(DAY + 60)
        trimmed = _credit(app, 5)
        clock.advance(DAY + 60)
        fresh = _credit(app, 6)
        assert 5 in _formats(path, fresh.id), "written against the learned dictionary"
        fresh_trace = app.trace(fresh.id)

        report = app.gc()

        assert report.purged_jobs == len(old) and report.trimmed_jobs == 1
        assert all(app.trace(job.id) == [] for job in old)
        assert _learned(path) == [(dictionary, "credit", learned_from)]
        assert app.trace(fresh.id) == fresh_trace
        assert {e.name for e in app.trace(trimmed.id)} >= {"job.succeeded", "state.write"}
    finally:
        app.close()

    # A process that never met the dictionary reads it from the file, as it meets the pack.
    reader = replayq.App(url)
    try:
        assert reader.trace(fresh.id) == fresh_trace
    finally:
        reader.close()
