"""Migration 0017: SQLite's job ids without AUTOINCREMENT are still never given twice.

A reused id would attach a new job to a deleted one's state versions, lineage and the
references users keep (logs, dashboards, tickets). Without AUTOINCREMENT SQLite gives
``max(id) + 1``, which repeats an id once the newest job is deleted; the floor that 0017
keeps (and its trigger raises) must prevent that, for ids given before the migration as
well as after. The deletes here are plain SQL on another connection, as any delete could
be: gc's ``jobs_delete`` is one of them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
from tests.migration.older import migrated_before, version_named

JOB_IDS = version_named("job_ids")


def noop_app(db: Path) -> replayq.App:
    app = replayq.App(f"sqlite:///{db}")

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    return app


def delete_jobs(db: Path, low: int, high: int = 2**63 - 1) -> None:
    """Delete the jobs with ids from ``low`` to ``high`` on a connection of our own."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM rq_jobs WHERE id BETWEEN ? AND ?", (low, high))
    conn.close()


def test_the_id_of_a_deleted_newest_job_is_never_given_again(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    app = noop_app(db)
    try:
        first = [app.enqueue("noop", {"n": n}) for n in range(5)]
        delete_jobs(db, first[3])  # the two newest
        assert app.enqueue("noop", {"n": 5}) == first[-1] + 1
        delete_jobs(db, 0)  # every job: the table is empty
        after_all = app.enqueue("noop", {"n": 6})
        assert after_all == first[-1] + 2
        # Once a job above the floor exists, ids follow max(id) again.
        assert app.enqueue("noop", {"n": 7}) == after_all + 1
        many = app.enqueue_many([replayq.EnqueueRequest("noop", {"n": n}) for n in range(3)])
        assert many == [after_all + 2, after_all + 3, after_all + 4]
    finally:
        app.close()


def test_an_older_jobs_delete_leaves_ids_as_they_were(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    app = noop_app(db)
    try:
        first = [app.enqueue("noop", {"n": n}) for n in range(3)]
        delete_jobs(db, first[0], first[0])
        assert app.enqueue("noop", {"n": 3}) == first[-1] + 1
    finally:
        app.close()
    conn = sqlite3.connect(db)
    floor = conn.execute("SELECT cursor FROM rq_gc WHERE name = 'job_id_floor'").fetchone()
    conn.close()
    assert floor is None  # the trigger writes only when the newest job goes


def test_ids_given_before_the_migration_are_not_given_again_after_it(tmp_path: Path) -> None:
    """AUTOINCREMENT had given ids up to 7 and the newest jobs were deleted before it:
    the floor starts at 7, not at the highest id left."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        migrated_before(conn, JOB_IDS)
        for n in range(7):
            conn.execute(
                "INSERT INTO rq_jobs (job_type, payload, state, run_at, created_at,"
                " max_attempts, trace_id) VALUES ('noop', ?, 'queued', 0, 0, 3, ?)",
                (f'{{"n":{n}}}', f"{n:032x}"),
            )
        conn.execute("DELETE FROM rq_jobs WHERE id > 4")
    conn.close()
    app = noop_app(db)
    try:
        assert app.enqueue("noop", {"n": 7}) == 8
    finally:
        app.close()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT id, payload FROM rq_jobs ORDER BY id").fetchall()
    conn.close()
    # The rows kept their ids through the table's rebuild.
    assert rows == [(1, '{"n":0}'), (2, '{"n":1}'), (3, '{"n":2}'), (4, '{"n":3}'), (8, '{"n":7}')]
