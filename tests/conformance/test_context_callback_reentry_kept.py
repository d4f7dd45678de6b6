"""A step block or a lock handle made before a ``ctx.db_write`` function runs, and used
inside it, is refused there as a verb called inside it is (``recording.callbacks``), on
every backend.

``ctx.step("inner")`` and ``ctx.lock("warehouse")`` ask whether they are called inside a
function; the objects they return were not asked again when used. A kept step block
entered in the function waited for the very commit it ran in (the attempt's ``_live``, a
plain lock): the job's slot hung for good, its SQLite write lock held. A kept lock handle
acquired or released there committed on a connection of its own, outside the step's
commit (PostgreSQL: a lock taken and kept though the step rolled back; SQLite: a
``StorageError`` instead of the refusal naming the call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq
from replayq.testing import run_inline
from tests.conformance.test_context_callback_reentry import _insert_row, _ledger_table

AppFactory = Callable[..., replayq.App]


def _run_block(block: Any) -> None:
    with block:  # its end commits: under the attempt's ``_live``, which the commit holds
        pass


# Made in the handler before the function runs (``ctx``), then used in it (``kept``).
USES: dict[str, tuple[Callable[[replayq.Context], Any], Callable[[Any], Any]]] = {
    "ctx.step('inner')": (lambda ctx: ctx.step("inner"), lambda block: _run_block(block)),
    "ctx.lock('warehouse') acquire": (
        lambda ctx: ctx.lock("warehouse"),
        lambda handle: handle.__enter__(),
    ),
    "ctx.lock('warehouse') release": (
        lambda ctx: ctx.lock("warehouse").__enter__(),
        lambda handle: handle.__exit__(None, None, None),
    ),
}


@pytest.mark.parametrize("in_step", [True, False], ids=["step", "ack"])
@pytest.mark.parametrize("verb", list(USES))
def test_a_kept_step_block_or_lock_handle_used_inside_a_db_write_function_is_refused(
    app_factory: AppFactory, verb: str, in_step: bool
) -> None:
    app = app_factory()
    rows = _ledger_table(app)
    make, use = USES[verb]
    met: list[BaseException] = []

    @app.job("kept", retry=replayq.Retry(max_attempts=3, base="0.01s", cap="0.01s"))
    def kept(ctx: replayq.Context) -> str:
        made = make(ctx)

        def write(connection: Any) -> None:
            _insert_row(app, 1)(connection)
            try:
                use(made)
            except BaseException as exc:
                met.append(exc)
                raise

        if in_step:
            with ctx.step("outer"):
                ctx.db_write(write)
        else:
            ctx.db_write(write)
        return "done"

    ran: list[replayq.Job] = []
    # In a thread of its own: before the fix a kept step block hung the attempt for good.
    attempt = threading.Thread(target=lambda: ran.append(run_inline(app, "kept")), daemon=True)
    attempt.start()
    attempt.join(60)
    assert ran, f"the attempt never ended: {verb} inside the function waited for its commit"
    job = ran[0]
    assert [type(exc) for exc in met] == [replayq.CallbackReentryError], met
    assert job.state is replayq.JobState.DEAD, (job.state, job.last_error)
    assert job.last_error_class == "validation"
    assert (job.last_error or "").startswith(f"CallbackReentryError: {verb} inside a ctx.db_write")
    assert rows() == []
    acquired = [e for e in app.trace(job.id) if e.name == "lock.acquired"]
    # Only the handle taken before the function (release's) ever held the lock.
    assert len(acquired) == (1 if verb.endswith("release") else 0)
    with app.storage.transaction(readonly=True) as tx:
        held = tx.connection.execute(
            "SELECT resource FROM rq_locks WHERE owner_token IS NOT NULL"
        ).fetchall()
    # None taken inside the function; the one taken before and refused its release is
    # held to its TTL, as any lock an attempt leaves without releasing it.
    assert held == ([("warehouse",)] if verb.endswith("release") else [])
