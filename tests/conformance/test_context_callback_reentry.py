"""A ``ctx`` call inside a ``ctx.db_write`` function is refused at once, never left waiting.

The function runs inside replayq's own commit: at a step's commit, under the context's
``_live`` and ``_pending_lock``, while the pending record is flushed; outside steps, in
the job's ack, after the context ended. Before, ``ctx.step``, ``ctx.call`` and
``ctx.effect`` there waited for ``_live`` forever (the job hung: these tests ran into
pytest's timeout), and the other verbs were recorded in the trace while their writes were
dropped (``ctx.state.put``, ``ctx.outbox.publish``, ``ctx.enqueue``...), or opened a
second transaction on the connection in use (SQLite: ``StorageError``). Now each is
refused in the function's thread with ``CallbackReentryError`` naming the verb and the
function: the commit rolls back (the function's own row with it) and the job is ``dead``
(class ``validation``). Another thread of the handler is not refused meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.testing import run_inline

# On the old tree the verbs that took ``_live`` hung: fail them here, not after 120 s.
pytestmark = pytest.mark.timeout(30)

# The verb, as the refusal names it, and a use of it inside the function. The views are
# built before the function runs (``ctx.state``... in the handler), so that their own
# entry points are the ones that refuse; ``VIEWS_UNBUILT`` below asks the views' doors.
VERBS: dict[str, Callable[[replayq.Context], Any]] = {
    "ctx.step('inner')": lambda ctx: ctx.step("inner").__enter__(),
    "ctx.step('computed')": lambda ctx: ctx.step("computed", lambda: 1),
    "ctx.call('price')": lambda ctx: ctx.call("price", lambda: 42),
    "ctx.effect('mail.send')": lambda ctx: ctx.effect("mail.send", lambda: 1, key="m-1"),
    "ctx.effects.run('mail.send')": lambda ctx: ctx.effects.run("mail.send", lambda: 1, key="m-2"),
    "ctx.decide('route')": lambda ctx: ctx.decide("route", "fast"),
    "ctx.now()": lambda ctx: ctx.now(),
    "ctx.random()": lambda ctx: ctx.random(),
    "ctx.uuid()": lambda ctx: ctx.uuid(),
    "ctx.lock('warehouse')": lambda ctx: ctx.lock("warehouse").__enter__(),
    "ctx.locks.handle('warehouse')": lambda ctx: ctx.locks.handle("warehouse"),
    "ctx.state.get('order', '1')": lambda ctx: ctx.state.get("order", 1),
    "ctx.state.put('order', '1')": lambda ctx: ctx.state.put("order", 1, {"paid": True}),
    "ctx.state.history('order', '1')": lambda ctx: ctx.state.history("order", 1),
    "ctx.cache.get('price', 1)": lambda ctx: ctx.cache.get("price", 1),
    "ctx.cache.set('price', 1)": lambda ctx: ctx.cache.set("price", 1, 42),
    "ctx.cache.invalidate('price', 1)": lambda ctx: ctx.cache.invalidate("price", 1),
    "ctx.outbox.publish('order.paid')": lambda ctx: ctx.outbox.publish("order.paid", {}),
    "ctx.db_write": lambda ctx: ctx.db_write(lambda connection: None),
    "ctx.enqueue('audit')": lambda ctx: ctx.enqueue("audit", {}),
}

VIEWS_UNBUILT: dict[str, Callable[[replayq.Context], Any]] = {
    "ctx.state": lambda ctx: ctx.state.get("order", 1),
    "ctx.cache": lambda ctx: ctx.cache.get("price", 1),
    "ctx.outbox": lambda ctx: ctx.outbox.publish("order.paid", {}),
    "ctx.locks": lambda ctx: ctx.locks.handle("warehouse"),
    "ctx.effects": lambda ctx: ctx.effects.run("mail.send", lambda: 1, key="m-3"),
}


def _ledger_table(app: replayq.App) -> Callable[[], list[int]]:
    """The application's own table, beside the queue's; returns a reader of its rows."""
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE ledger_rows (id INTEGER PRIMARY KEY)")

    def rows() -> list[int]:
        with app.storage.transaction(readonly=True) as tx:
            found = tx.connection.execute("SELECT id FROM ledger_rows ORDER BY id").fetchall()
            return [int(row[0]) for row in found]

    return rows


def _insert_row(app: replayq.App, row: int) -> Callable[[Any], None]:
    marker = "?" if app.storage.dialect == "sqlite" else "%s"

    def insert(connection: Any) -> None:
        connection.execute(f"INSERT INTO ledger_rows (id) VALUES ({marker})", (row,))  # noqa: S608 - placeholder marker only

    return insert


def _reentering_app(
    app: replayq.App, use: Callable[[replayq.Context], Any], *, in_step: bool, build_views: bool
) -> tuple[list[BaseException], Callable[[], list[int]]]:
    """``reenter``: a ``ctx.db_write`` whose function writes its row, then calls ``use``;
    in a step (committed at its end) or outside steps (with the ack). What the function
    met is kept in the list returned."""
    rows = _ledger_table(app)
    met: list[BaseException] = []

    @app.job("audit")
    def audit(ctx: replayq.Context) -> None:
        return None

    @app.job("reenter", retry=replayq.Retry(max_attempts=3, base="0.01s", cap="0.01s"))
    def reenter(ctx: replayq.Context) -> str:
        if build_views:
            ctx.state, ctx.cache, ctx.outbox, ctx.effects, ctx.locks  # noqa: B018 - built now

        def write(connection: Any) -> None:
            _insert_row(app, 1)(connection)
            try:
                use(ctx)
            except BaseException as exc:
                met.append(exc)
                raise

        if in_step:
            with ctx.step("outer"):
                ctx.db_write(write)
        else:
            ctx.db_write(write)
        return "done"

    return met, rows


def _assert_refused(app: replayq.App, job: replayq.Job, verb: str, rows: list[int]) -> None:
    assert job.state is replayq.JobState.DEAD, (job.state, job.last_error)
    assert job.last_error_class == "validation"
    assert job.attempt == 1  # never retried: the same code is refused again
    assert (job.last_error or "").startswith(f"CallbackReentryError: {verb} inside a ctx.db_write")
    assert rows == []  # the function's own row rolled back with its commit


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_ctx_verb_inside_a_db_write_function_at_its_steps_commit_is_refused(
    app_factory: Callable[..., replayq.App], verb: str
) -> None:
    app = app_factory()
    met, rows = _reentering_app(app, VERBS[verb], in_step=True, build_views=True)

    job = run_inline(app, "reenter")

    assert [type(exc) for exc in met] == [replayq.CallbackReentryError]
    refused = met[0]
    assert isinstance(refused, replayq.CallbackReentryError)
    assert (refused.verb, refused.callback) == (verb, "ctx.db_write")
    _assert_refused(app, job, verb, rows())
    trace = app.trace(job.id)
    rolled_back = [e for e in trace if e.name == "step.rolled_back"]
    assert [e.data["step_name"] for e in rolled_back] == ["outer"]
    # Nothing the refused verb would have recorded is in the trace.
    assert "step.started" not in {e.name for e in trace if e.data.get("step_name") == "inner"}
    assert not {"call", "decision", "clock.now", "outbox.written", "child.enqueued"} & {
        e.name for e in trace
    }


@pytest.mark.parametrize("verb", [*VERBS, *VIEWS_UNBUILT])
def test_a_ctx_verb_inside_a_db_write_function_at_the_ack_is_refused(
    app_factory: Callable[..., replayq.App], verb: str
) -> None:
    app = app_factory()
    use = VERBS.get(verb) or VIEWS_UNBUILT[verb]
    met, rows = _reentering_app(app, use, in_step=False, build_views=verb in VERBS)

    job = run_inline(app, "reenter")

    assert [type(exc) for exc in met] == [replayq.CallbackReentryError]
    _assert_refused(app, job, verb, rows())


def test_a_refusal_the_function_swallows_still_fails_the_commit(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    swallowed: list[Exception] = []

    def swallow(ctx: replayq.Context) -> None:
        try:
            ctx.call("price", lambda: 42)
        except Exception as exc:  # the application's code logs it and carries on
            swallowed.append(exc)

    _, rows = _reentering_app(app, swallow, in_step=True, build_views=False)

    job = run_inline(app, "reenter")

    assert [type(exc) for exc in swallowed] == [replayq.CallbackReentryError]
    _assert_refused(app, job, "ctx.call('price')", rows())


def test_another_thread_of_the_handler_is_not_refused_while_a_function_runs(
    app_factory: Callable[..., replayq.App],
) -> None:
    """A thread the function starts calls ``ctx.call`` while the function still runs: it
    passes the door (its outside call runs), then waits for the step's commit to end and
    records its call, as any thread's call does during another flow's commit."""
    app = app_factory()
    rows = _ledger_table(app)
    inside = threading.Event()
    answers: list[Any] = []

    @app.job("sidecar", retry=replayq.Retry(max_attempts=1))
    def sidecar(ctx: replayq.Context) -> None:
        threads: list[threading.Thread] = []

        def fetch() -> int:
            inside.set()  # the outside call runs: the call was not refused
            return 7

        def other_thread() -> None:
            answers.append(ctx.call("stock", fetch))

        def write(connection: Any) -> None:
            _insert_row(app, 2)(connection)
            thread = threading.Thread(target=other_thread)
            threads.append(thread)
            thread.start()
            # Held inside the function (the commit) until the other thread is past the door.
            assert inside.wait(20), "the other thread's ctx.call never ran its function"

        with ctx.step("outer"):
            ctx.db_write(write)
        for thread in threads:
            thread.join(20)

    job = run_inline(app, "sidecar")

    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    assert answers == [7]
    assert rows() == [2]
    calls = [e for e in app.trace(job.id) if e.name == "call"]
    assert [(e.data["call"], e.status) for e in calls] == [("stock", "success")]
