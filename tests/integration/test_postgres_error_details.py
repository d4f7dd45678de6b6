"""A server error's DETAIL, HINT and CONTEXT never reach a job's trace (PostgreSQL).

psycopg's ``str(exc)`` is the server's whole report: the primary message, then DETAIL,
HINT and CONTEXT lines, which quote the values the statement met (``Token "…" is
invalid``, ``Failing row contains (…)``, ``JSON data, line 1: …``): an application's
data. A handler's ``ctx.db_write`` function meeting such an error at its step's commit
fails the attempt with replayq's ``StorageError``, whose message is the job's error in
its trace (``job.failed``, ``job.dead``) and in ``last_error``. It used to be
``{what}: {str(exc)}``; it is the primary message and the SQLSTATE now (with the names
of the objects the server's diagnostics give), as a constraint violation's already was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import replayq
import replayq.testing
from replayq.cli import main

pytestmark = pytest.mark.postgres

# An application's stored data (a customer's note), not the job's payload: only the
# server's report of the failed cast quotes it.
MARKER = "S3CRET4111"


@pytest.fixture
def app(pg_schema_url: str) -> Iterator[replayq.App]:
    app = replayq.App(pg_schema_url, auto_migrate=True)
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, note TEXT)")
        tx.connection.execute("CREATE TABLE shipments (order_id INTEGER, doc JSONB)")
        tx.connection.execute("INSERT INTO customers VALUES (1, %s)", (f"{MARKER} vip",))

    @app.job("ship", retry=replayq.Retry(max_attempts=1))
    def ship(ctx: replayq.Context, order: int, customer: int) -> None:
        def insert(connection: Any) -> None:
            # The note is not JSON: 22P02, DETAIL ``Token "S3CRET4111" is invalid.``
            connection.execute(
                "INSERT INTO shipments SELECT %s, note::jsonb FROM customers WHERE id = %s",
                (order, customer),
            )

        with ctx.step("ship"):
            ctx.db_write(insert)

    yield app
    app.close()


def test_a_server_error_in_a_write_function_leaves_its_detail_out_of_the_trace(
    app: replayq.App, pg_schema_url: str
) -> None:
    job = replayq.testing.run_inline(app, "ship", {"order": 7, "customer": 1})

    assert job.state is replayq.JobState.DEAD, (job.state, job.last_error)
    error = job.last_error or ""
    assert MARKER not in error, error
    assert "StorageError" in error and "invalid input syntax for type json" in error, error
    assert "SQLSTATE 22P02" in error, error
    events = app.trace(job.id)
    (failed,) = [e for e in events if e.name == "job.failed"]
    assert "SQLSTATE 22P02" in str(failed.data.get("error")), failed.data
    for event in events:
        stored = json.dumps(
            {"data": event.data, "resource": event.resource, "step": event.step},
            default=str,
        )
        assert MARKER not in stored, (event.name, stored)
    # What an operator reads of it: the trace and the job on the command line.
    for args in (["trace", "show", str(job.id), "--json"], ["jobs", "show", str(job.id)]):
        shown = CliRunner().invoke(main, ["--db", pg_schema_url, *args])
        assert shown.exit_code == 0, shown.output
        assert "SQLSTATE 22P02" in shown.output, shown.output
        assert MARKER not in shown.output, shown.output
