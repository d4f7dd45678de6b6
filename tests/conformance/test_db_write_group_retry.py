"""A keyed ``ctx.db_write`` whose group commit is tried again without another ack says
what the try that committed did, on every backend.

A group commit is tried again without an ack it refused (its lease lost: ``_Refused``),
and a group refused for one ack's write is split in halves (``acks._split``): the acks
left are flushed again in a new transaction. A keyed write found already claimed in the
try rolled back (by an ack that is not in the commit that lands) runs in the next try,
and its ``db.write`` event must not keep the ``deduplicated`` mark of the try before: the
trace would say the application's row was never written by this job while it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq

AppFactory = Callable[..., replayq.App]


def test_a_keyed_write_run_in_a_later_try_of_its_group_is_not_marked_deduplicated(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    marker = "?" if app.storage.dialect == "sqlite" else "%s"
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE invoices (order_id INTEGER PRIMARY KEY, job TEXT)")
    ids: dict[str, int] = {}

    def insert(order: int, name: str) -> Callable[[Any], None]:
        sql = f"INSERT INTO invoices (order_id, job) VALUES ({marker}, {marker})"  # noqa: S608

        def write(connection: Any) -> None:
            connection.execute(sql, (order, name))

        return write

    @app.job("invoice", lease="30s", heartbeat="10s")
    def invoice(ctx: replayq.Context, order: int, name: str) -> None:
        # Two jobs for the same order (a duplicate delivery): the key lets one row in.
        ctx.db_write(insert(order, name), key=f"invoice:{order}")
        if name == "second":
            # Meanwhile another worker took the first job over (its lease reaped and given
            # again): its owner token moved, so its ack, waiting in this group, is refused.
            with app.storage.transaction() as tx:
                tx.connection.execute(
                    f"UPDATE rq_jobs SET owner_token = {marker} WHERE id = {marker}",  # noqa: S608
                    ("another-worker", ids["first"]),
                )

    ids["first"] = app.enqueue("invoice", {"order": 7, "name": "first"})
    ids["second"] = app.enqueue("invoice", {"order": 7, "name": "second"})
    # One executor, both leased at once, acks held: one group of two, the first's first.
    worker = replayq.Worker(
        app, burst=True, prefetch=3, prefetch_window=float("inf"), ack_window=10.0
    )
    stats = worker.run()
    assert (stats.succeeded, stats.rejected) == (1, 1), stats

    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute("SELECT order_id, job FROM invoices").fetchall()
    assert [tuple(row) for row in rows] == [(7, "second")], rows
    assert app.get_job(ids["second"]).state is replayq.JobState.SUCCEEDED
    [write] = [e for e in app.trace(ids["second"]) if e.name == "db.write"]
    # The second job's write is the row in the table: not deduplicated.
    assert not write.data.get("deduplicated"), write.data


def test_a_child_enqueued_at_an_ack_tried_again_is_traced_with_the_child_that_exists(
    app_factory: AppFactory,
) -> None:
    """A group tried again without an ack it refused (its lease lost) flushes the other
    acks again: a child job enqueued outside any step is inserted again, with a new id on
    PostgreSQL (a sequence is not rolled back). Its ``child.enqueued`` event must name the
    child that exists, not the one rolled back with the first try (an event's text kept
    from that try: ``packs._ITEM_TEXTS``)."""
    app = app_factory()
    marker = "?" if app.storage.dialect == "sqlite" else "%s"
    ids: dict[str, int] = {}

    @app.job("child", lease="30s")
    def child(ctx: replayq.Context, n: int) -> None:
        return None

    @app.job("parent", lease="30s", heartbeat="10s")
    def parent(ctx: replayq.Context, name: str) -> None:
        if name == "taken":
            return
        ctx.enqueue("child", {"n": 1})  # outside a step: with the ack
        # Meanwhile another worker took the first job over (its lease reaped and given
        # again): its ack, waiting in this group, is refused and the group tried again.
        with app.storage.transaction() as tx:
            tx.connection.execute(
                f"UPDATE rq_jobs SET owner_token = {marker} WHERE id = {marker}",  # noqa: S608
                ("another-worker", ids["taken"]),
            )

    ids["taken"] = app.enqueue("parent", {"name": "taken"})
    ids["parent"] = app.enqueue("parent", {"name": "parent"})
    worker = replayq.Worker(
        app, burst=True, prefetch=3, prefetch_window=float("inf"), ack_window=10.0
    )
    stats = worker.run()
    assert (stats.succeeded, stats.rejected) == (2, 1), stats  # the parent and its child

    assert app.get_job(ids["parent"]).state is replayq.JobState.SUCCEEDED
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute(
            f"SELECT id FROM rq_jobs WHERE job_type = {marker}",  # noqa: S608
            ("child",),
        ).fetchall()
    children = [int(row[0]) for row in rows]
    [enqueued] = [e for e in app.trace(ids["parent"]) if e.name == "child.enqueued"]
    assert [enqueued.data["child_job_id"]] == children, (enqueued.data, children)
