"""The ledger tier in day partitions on PostgreSQL (migration 0013): expiring a day drops a
partition instead of deleting rows.

Jobs finish over several days on an injected clock, with ``Retention(full_days=1,
ledger_days=3)``: gc moves each job's ledger tier into the partition of the day its ledger
ends, the readers (``trace show``, ``trace resource``, ``state history``, ``effects list``)
still answer for it there, a job pinned afterwards is moved out, a held job keeps its day's
partition, and once the day has ended and its jobs are gone gc drops the partition: row
triggers on every trace table count the rows deleted, and none is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import psycopg
import psycopg.sql
import pytest

import replayq
import replayq.testing
from replayq.queue.retention import in_ledger
from replayq.storage.postgres import LEDGER_DROP_DAYS, parse_postgres_url
from replayq.storage.retention_params import KeepHold, KeepRelease
from tests.apps import retained
from tests.replay_support import cli, cli_ok

DAY = 86_400.0
START = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
RETENTION = replayq.Retention(full_days=1, ledger_days=3)
TRACE_TABLES = ("rq_trace", "rq_trace_resources", "rq_trace_ledger", "rq_trace_ledger_resources")


def partition_name(expires_at: float) -> str:
    import time

    return "rq_trace_ledger_" + time.strftime("%Y%m%d", time.gmtime(expires_at))


@pytest.fixture
def pg(pg_schema_url: str) -> Iterator[Callable[..., list[tuple[object, ...]]]]:
    """Run SQL in the test's schema (autocommit); the rows it returns."""
    conninfo, _ = parse_postgres_url(pg_schema_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:

        def run(sql: str | psycopg.sql.Composable, *params: object) -> list[tuple[object, ...]]:
            cursor = conn.execute(sql, params or None)
            return cursor.fetchall() if cursor.description else []

        yield run


def partitions(pg: Callable[..., list[tuple[object, ...]]], parent: str) -> set[str]:
    rows = pg(
        "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass",
        parent,
    )
    return {str(name) for (name,) in rows}


def shape(events: list[replayq.TraceEvent]) -> list[tuple[object, ...]]:
    return [(e.name, e.hlc, e.resource, e.status, e.attempt) for e in events]


def test_an_expired_day_is_dropped_as_a_partition_and_pinned_and_held_jobs_survive(
    pg_schema_url: str, pg: Callable[..., list[tuple[object, ...]]]
) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        replayq.App(pg_schema_url, clock=clock, retention=RETENTION, auto_migrate=True)
    )
    try:
        expired = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
        held = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 2})
        pinned = replayq.testing.run_inline(app, "credit", {"account": "b", "amount": 3})
        clock.advance(DAY)
        later = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 4})
        jobs = (expired, held, pinned, later)
        before = {job.id: app.trace(job.id) for job in jobs}
        history_before = app.state.history("account", "a")
        day = partition_name(START + 3 * DAY)

        # Day 1.5: the first three move to their ledger tier, into the partition of the day
        # their ledger ends; nothing of them stays in rq_trace.
        clock.advance(DAY / 2)
        first = app.gc()
        assert first.trimmed_jobs == 3
        assert day in partitions(pg, "rq_trace_ledger")
        assert day.replace("ledger_", "ledger_resources_") in partitions(
            pg, "rq_trace_ledger_resources"
        )
        moved = pg(
            "SELECT DISTINCT job_id FROM rq_trace_ledger WHERE tableoid = %s::regclass "
            "ORDER BY job_id",
            day,
        )
        assert moved == [(expired.id,), (held.id,), (pinned.id,)]
        assert pg("SELECT count(*) FROM rq_trace WHERE job_id = %s", expired.id) == [(0,)]
        for job in (expired, held, pinned):
            assert shape(app.trace(job.id)) == shape([e for e in before[job.id] if in_ledger(e)])
        # The readers still answer for a ledger-tier job.
        writes = [e for e in app.resource_trace("account:a") if e.name == "state.write"]
        assert {e.job_id for e in writes} == {expired.id, held.id, later.id}
        assert app.state.history("account", "a") == history_before
        assert str(expired.id) in cli_ok(app.url, "trace", "show", str(expired.id)).stdout
        assert f"job {expired.id}" in cli_ok(app.url, "trace", "resource", "account:a").stdout
        assert str(expired.id) in cli_ok(app.url, "state", "history", "account", "a").stdout
        assert f"notify:a:{expired.id}" in cli_ok(app.url, "effects", "list").stdout
        window = replayq.events_between(app, since=START - 60, until=START + DAY)
        assert expired.id in {item.event.job_id for item in window}, "events --since reads it"

        # Pinned after its move: its packs leave the partition, back into rq_trace.
        app.keep(pinned.id, "incident 42")
        assert pg("SELECT count(*) FROM rq_trace_ledger WHERE job_id = %s", pinned.id) == [(0,)]
        pinned_trace = app.trace(pinned.id)
        assert shape(pinned_trace) == shape([e for e in before[pinned.id] if in_ledger(e)])

        # Day 2.5: "later" moves to its own day.
        clock.advance(DAY)
        assert app.gc().trimmed_jobs == 1
        assert partition_name(START + 4 * DAY) in partitions(pg, "rq_trace_ledger")

        # From here on, count every trace row deleted.
        pg("CREATE TABLE trace_deletes (tab text, job_id bigint)")
        pg(
            "CREATE FUNCTION count_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO trace_deletes VALUES (TG_TABLE_NAME, NULL); RETURN OLD; END $$"
        )
        for table in TRACE_TABLES:
            pg(
                f"CREATE TRIGGER count_delete AFTER DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION count_delete()"
            )

        # Day 3.5: "expired" and "held" are past their ledger tier, but a fork holds "held":
        # its job row stays, and so does the partition.
        clock.advance(DAY)
        with app.storage.transaction() as tx:
            assert tx.keep_transition(KeepHold("fork-1", held.id, clock.now() + 600))
        blocked = app.gc()
        assert blocked.purged_jobs == 1 and blocked.partitions_dropped == 0
        assert day in partitions(pg, "rq_trace_ledger")
        assert shape(app.trace(held.id)) == shape([e for e in before[held.id] if in_ledger(e)])

        # Released: the held job goes, and with it the day's partitions, whole.
        with app.storage.transaction() as tx:
            tx.keep_transition(KeepRelease("fork-1"))
        dropped = app.gc()
        assert dropped.purged_jobs == 1 and dropped.partitions_dropped == 1
        assert day not in partitions(pg, "rq_trace_ledger")
        assert pg("SELECT to_regclass(%s)", day) == [(None,)]
        assert pg("SELECT to_regclass(%s)", day.replace("ledger_", "ledger_resources_")) == [
            (None,)
        ]
        assert pg("SELECT count(*) FROM trace_deletes") == [(0,)], "no trace row was deleted"
        assert app.trace(expired.id) == [] and app.trace(held.id) == []
        # The pinned job and the next day's survive, readable.
        assert app.trace(pinned.id) == pinned_trace
        assert {e.name for e in app.trace(later.id)} >= {"job.succeeded", "state.write"}
        writes = [e for e in app.resource_trace("account:a") if e.name == "state.write"]
        assert {e.job_id for e in writes} == {later.id}
        # A pass over nothing new drops nothing more.
        assert app.gc().partitions_dropped == 0
    finally:
        app.close()


def test_a_day_an_owner_view_depends_on_is_kept_and_named_and_the_other_days_drop(
    pg_schema_url: str,
    pg: Callable[..., list[tuple[object, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A view of the owner's over one day's partition: gc drops every other expired day,
    keeps that one (never the owner's view with it) and says so, in its report, in its log
    and as ``replayq gc``'s exit status; once the view is gone the day drops."""
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        replayq.App(pg_schema_url, clock=clock, retention=RETENTION, auto_migrate=True)
    )
    try:
        replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
        clock.advance(DAY)
        replayq.testing.run_inline(app, "credit", {"account": "b", "amount": 2})
        viewed, other = partition_name(START + 3 * DAY), partition_name(START + 4 * DAY)
        clock.advance(DAY / 2)
        app.gc()
        clock.advance(DAY)
        app.gc()
        assert {viewed, other} <= partitions(pg, "rq_trace_ledger")
        pg(
            psycopg.sql.SQL("CREATE VIEW owner_day AS SELECT job_id FROM {}").format(
                psycopg.sql.Identifier(viewed)
            )
        )

        clock.advance(4 * DAY)  # both days ended, both jobs past their ledger tier
        with caplog.at_level(logging.WARNING, logger="replayq.retention"):
            report = app.gc()

        assert report.purged_jobs == 2 and report.partitions_dropped == 1
        assert other not in partitions(pg, "rq_trace_ledger")
        assert viewed in partitions(pg, "rq_trace_ledger")
        [kept] = report.partitions_kept
        assert kept.startswith(f"{viewed}: ") and "owner_day" in kept, kept
        assert [r.getMessage() for r in caplog.records if viewed in r.getMessage()] != []
        # The owner's view untouched, and through it the day's rows still there: the
        # retention promise is not kept for that day, which is why gc fails loudly.
        [(rows,)] = pg("SELECT count(*) FROM owner_day")
        assert isinstance(rows, int) and rows > 0

        shown = cli(pg_schema_url, "gc", "--app", "tests.apps.retained:app")
        assert shown.returncode == 1, shown.stdout + shown.stderr
        [line] = [line for line in shown.stderr.splitlines() if viewed in line]
        assert line.startswith("error: ") and "owner_day" in line, shown.stderr

        # The periodic gc job fails where an operator looks: dead, naming the day.
        app.gc_periodic()
        periodic = replayq.testing.run_inline(app, "replayq.gc")
        assert periodic.state == replayq.JobState.DEAD, periodic.last_error
        assert viewed in (periodic.last_error or "") and "owner_day" in (periodic.last_error or "")

        pg("DROP VIEW owner_day")
        again = app.gc()
        assert again.partitions_dropped == 1 and again.partitions_kept == []
        assert viewed not in partitions(pg, "rq_trace_ledger")
        assert pg("SELECT to_regclass(%s)", viewed.replace("ledger_", "ledger_resources_")) == [
            (None,)
        ]
    finally:
        app.close()


def test_a_backlog_of_expired_days_drops_in_bounded_transactions(
    pg_schema_url: str, pg: Callable[..., list[tuple[object, ...]]]
) -> None:
    """More expired days than one transaction looks at (``LEDGER_DROP_DAYS``, each a
    subtransaction): gc goes on in the next transaction until every one is dropped."""
    days = LEDGER_DROP_DAYS + 8
    clock = replayq.FrozenClock(START + (days + 2) * DAY)
    app = retained.declare(
        replayq.App(pg_schema_url, clock=clock, retention=RETENTION, auto_migrate=True)
    )
    try:
        assert app.gc().partitions_dropped == 0  # the schema made, nothing to drop yet
        for day in range(days):
            pg("SELECT rq_trace_ledger_partition(%s::double precision)", START + day * DAY)
        assert len(partitions(pg, "rq_trace_ledger")) == days

        report = app.gc()

        assert report.partitions_dropped == days and report.partitions_kept == []
        assert partitions(pg, "rq_trace_ledger") == set()
        assert partitions(pg, "rq_trace_ledger_resources") == set()
    finally:
        app.close()
