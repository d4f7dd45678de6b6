"""PostgreSQL: the job a duplicate message id met can be gone before it is read.

``App.enqueue`` is one statement committed by itself: the insert that meets an existing
job's message id and the read of that job's id are two statements, and gc (or anyone)
can delete the job between them. The message id is free then; the enqueue makes a new
job with its ``job.enqueued``, as on SQLite, instead of failing on a job that is gone.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import replayq
from replayq.storage.postgres import PostgresTransaction


def test_a_duplicate_whose_job_is_deleted_before_its_read_is_enqueued_anew(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("noop")
    def noop(ctx: replayq.Context, n: int) -> None: ...

    first = app.enqueue("noop", {"n": 1}, message_id="m")
    deleted: list[int] = []
    read = PostgresTransaction.fetchone

    def delete_first_then_read(self: PostgresTransaction, name: str, params: Any = None) -> Any:
        # Another session deletes the job, as gc does, just before the duplicate reads it.
        if name == "job_by_message_id" and not deleted:
            with psycopg.connect(pg_schema_url, autocommit=True) as other:
                other.execute("DELETE FROM rq_trace WHERE job_id = %s", (first,))
                other.execute("DELETE FROM rq_jobs WHERE id = %s", (first,))
            deleted.append(first)
        return read(self, name, params)

    monkeypatch.setattr(PostgresTransaction, "fetchone", delete_first_then_read)
    again = app.enqueue("noop", {"n": 2}, message_id="m")
    monkeypatch.undo()

    assert deleted == [first]
    assert again != first
    job = app.get_job(again)
    assert (job.message_id, job.payload) == ("m", {"n": 2})
    assert [e.name for e in app.trace(again)] == ["job.enqueued"]
    assert [j.id for j in app.list_jobs()] == [again]
    app.close()
