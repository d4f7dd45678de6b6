"""A constraint of replayq's own tables (``rq_*``) refusing replayq's own write is a bug of
replayq, not the job's data failing validation, on every backend: the job is parked in
``dead`` at once with reason ``internal_error`` and a message that says so and names the
table and constraint; never class ``validation``, never retried, whatever its contract
maps or retries. A constraint of the application's tables is still ``validation``
(``tests/conformance/test_worker_constraint_refused.py``).

The bug is stood in for by an index the test adds to ``rq_jobs``: at most one
``succeeded`` job of each type. The second job's ack (its ``jobs_complete``) and the
second ``in_step`` job's step commit (an index on ``rq_entity_versions``: one version
per namespace) are then refused by replayq's own
schema, as a replayq whose writes broke its own invariants would be. Before, the job went
to ``dead`` as ``not_retryable`` / ``validation``, or, with a contract mapping
``ConstraintViolationError`` to a retried class, was run again until its attempts ran out.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

import replayq
import replayq.testing
from replayq.errors import ConstraintViolationError
from replayq.storage.sqlite import storage_error

AppFactory = Callable[..., replayq.App]
RETRY = replayq.Retry(max_attempts=3, base="0.001s", cap="0.001s")
# A contract that would retry a constraint's refusal: an internal one is still never retried.
MAPPED = {replayq.ConstraintViolationError: "concurrency"}


def _app(app_factory: AppFactory, **contract: Any) -> tuple[replayq.App, dict[str, int]]:
    app = app_factory()
    runs: dict[str, int] = {}
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_jobs_one_succeeded ON rq_jobs (job_type) "
            "WHERE state = 'succeeded'"
        )
        tx.connection.execute(
            "CREATE UNIQUE INDEX rq_entity_versions_one ON rq_entity_versions (namespace)"
        )

    @app.job("at_ack", retry=RETRY, **contract)
    def at_ack(ctx: replayq.Context, order: int) -> None:
        runs["at_ack"] = runs.get("at_ack", 0) + 1

    @app.job("in_step", retry=RETRY, **contract)
    def in_step(ctx: replayq.Context, order: int) -> None:
        runs["in_step"] = runs.get("in_step", 0) + 1
        with ctx.step("ship"):
            ctx.state.put("order", order, {"shipped": True})

    return app, runs


def _parked_as_internal(app: replayq.App, job: replayq.Job, table: str) -> None:
    assert (job.state, job.dead_reason) == (replayq.JobState.DEAD, "internal_error"), (
        job.state,
        job.dead_reason,
        job.last_error,
    )
    assert job.last_error_class != "validation", job.last_error_class
    error = job.last_error or ""
    assert "internal error of replayq" in error, error
    assert f"table {table}" in error, error
    (dead,) = [e for e in app.trace(job.id) if e.name == "job.dead"]
    assert dead.data["reason"] == "internal_error", dead.data
    assert [e for e in app.trace(job.id) if e.name == "retry.scheduled"] == []


@pytest.mark.parametrize("contract", [{}, {"errors": MAPPED}], ids=["default", "mapped"])
def test_an_ack_refused_by_replayqs_own_table_parks_the_job_as_an_internal_error(
    app_factory: AppFactory, contract: dict[str, Any]
) -> None:
    app, runs = _app(app_factory, **contract)
    first = replayq.testing.run_inline(app, "at_ack", {"order": 1})
    assert first.state is replayq.JobState.SUCCEEDED, first.last_error
    job = replayq.testing.run_inline(app, "at_ack", {"order": 2})
    _parked_as_internal(app, job, "rq_jobs")
    assert runs["at_ack"] == 2, runs  # each job ran once: the refused one is not run again


def test_a_step_commit_refused_by_replayqs_own_table_parks_the_job_as_an_internal_error(
    app_factory: AppFactory,
) -> None:
    app, runs = _app(app_factory, errors=MAPPED)
    first = replayq.testing.run_inline(app, "in_step", {"order": 1})
    assert first.state is replayq.JobState.SUCCEEDED, first.last_error
    job = replayq.testing.run_inline(app, "in_step", {"order": 2})
    _parked_as_internal(app, job, "rq_entity_versions")
    assert runs["in_step"] == 2, runs
    assert app.state.get("order", 2).version == 0  # the refused step wrote nothing


def test_a_grouped_ack_refused_by_replayqs_own_table_parks_its_job_and_acks_the_others(
    app_factory: AppFactory,
) -> None:
    app, runs = _app(app_factory, errors=MAPPED)
    ids = [app.enqueue("at_ack", {"order": order}) for order in range(1, 5)]
    worker = replayq.Worker(
        app, burst=True, prefetch=5, prefetch_window=float("inf"), ack_window=10.0
    )
    stats = worker.run()
    jobs = [app.get_job(job_id) for job_id in ids]
    states = sorted(job.state.value for job in jobs)
    # One group of four: one ack of it commits, each of the others is refused by the index.
    assert states == ["dead", "dead", "dead", "succeeded"], [
        (job.state, job.last_error) for job in jobs
    ]
    assert stats.succeeded == 1, stats
    for job in jobs:
        if job.state is replayq.JobState.DEAD:
            _parked_as_internal(app, job, "rq_jobs")
    assert runs["at_ack"] == 4, runs


def test_sqlite_names_the_table_of_a_refusal_by_replayqs_own_schema(sqlite_url: str) -> None:
    """SQLite's messages name a unique key's and a not-null column's table; an unnamed
    ``CHECK`` says only its expression, which is looked up among replayq's own tables."""
    app = replayq.App(sqlite_url, auto_migrate=True)
    with app.storage.transaction() as tx:
        tx.connection.execute(
            "CREATE TABLE orders (id INTEGER UNIQUE, note TEXT NOT NULL, n INTEGER CHECK (n > 0))"
        )
    path = sqlite_url.removeprefix("sqlite:///")
    app.close()
    refused: dict[str, ConstraintViolationError] = {}
    with sqlite3.connect(path) as conn:
        job = (
            "INSERT INTO rq_jobs (job_type, payload, state, run_at, created_at, max_attempts, "
            "trace_id, message_id) VALUES ('t', '{}', 'queued', 1, 1, 1, 'x', 'm')"
        )
        conn.execute(job)
        conn.execute("INSERT INTO orders VALUES (1, 'a', 1)")
        for name, sql in {
            "rq check": "UPDATE rq_jobs SET state = 'lost'",
            "rq not null": "UPDATE rq_jobs SET payload = NULL",
            "rq unique": job,
            "app check": "UPDATE orders SET n = 0",
            "app not null": "UPDATE orders SET note = NULL",
            "app unique": "INSERT INTO orders VALUES (1, 'b', 2)",
        }.items():
            try:
                conn.execute(sql)
            except sqlite3.Error as exc:
                error = storage_error("query", exc)
                assert isinstance(error, ConstraintViolationError), (name, exc)
                refused[name] = error
        conn.rollback()
    assert {name: (e.table, e.internal) for name, e in refused.items()} == {
        "rq check": ("rq_jobs", True),
        "rq not null": ("rq_jobs", True),
        "rq unique": ("rq_jobs", True),
        "app check": (None, False),
        "app not null": ("orders", False),
        "app unique": ("orders", False),
    }
