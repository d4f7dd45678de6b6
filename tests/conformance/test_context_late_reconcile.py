"""The end of an attempt never waits for an effect's reconciler, on every backend.

``ctx.effect`` claims its key under the context's ``_live`` lock, which ``Context.end``
takes too (a call or effect left running in a thread records before the end, or sees
it). A key found in doubt under ``park`` with a reconciler asks the reconciler, which
calls the provider: an outside call. Asked under ``_live``, the handler's return waited
for that provider call (the executor blocked in ``end``, the job unsettled, however long
the provider took), though the end "never waits for an outside call"
(docs/recording-context.md). Now the reconciler is asked with ``_live`` let go; what it
answers is recorded and the key claimed again under ``_live`` only if the attempt has
not ended meanwhile (then the record is still settled with the answer, and the waiting
code gets ``ContextEndedError``; nothing goes into the ended attempt's trace).

The provider blocks on an event the test sets, never on a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import replayq
from replayq import EffectRecord, EffectResolution
from replayq.storage.context_params import IdemClaim
from tests.context_support import run_once

AppFactory = Callable[..., replayq.App]
KEY = "charge:1"


def _in_doubt(app: replayq.App) -> None:
    """``KEY``'s record ``started`` by an attempt that runs no more: in doubt."""
    with app.storage.transaction() as tx:
        claimed = tx.idem_transition(
            IdemClaim(KEY, "payment.charge", "gone-claim", app.clock.now(), None, 999, 1)
        )
    assert claimed


def test_the_end_of_an_attempt_does_not_wait_for_a_late_effects_reconciler(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    asked, answer = threading.Event(), threading.Event()
    seen: list[Any] = []
    ran: list[str] = []

    @app.reconciler("payment.charge")
    def provider(record: EffectRecord) -> EffectResolution | None:
        asked.set()
        assert answer.wait(30), "the test never let the provider answer"
        return EffectResolution(True, {"charge": "ch_1"})

    @app.job("charge")
    def charge(ctx: replayq.Context) -> None:
        def late() -> None:
            try:
                seen.append(ctx.effect("payment.charge", lambda: ran.append("charged"), key=KEY))
            except BaseException as exc:
                seen.append(exc)

        threading.Thread(target=late, daemon=True).start()
        assert asked.wait(30), "the reconciler was never asked"

    _in_doubt(app)
    job_id = app.enqueue("charge", {})
    worker = replayq.Worker(app, worker_id="w1")
    runner = threading.Thread(target=run_once, args=(worker,), daemon=True)
    began = time.monotonic()
    runner.start()
    try:
        # The handler returned once the reconciler was asked: its attempt settles while the
        # provider has not answered yet (before: ``end`` waited for the provider's call).
        runner.join(10)
        settled = not runner.is_alive()
        took = time.monotonic() - began
    finally:
        answer.set()
        runner.join(30)
    assert settled, f"the attempt's end waited for the reconciler's provider ({took:.1f}s)"
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    [outcome] = seen
    assert isinstance(outcome, replayq.ContextEndedError), outcome
    assert ran == [], "the effect is not run after its attempt ended"
    # The provider's answer still settles the record; the ended attempt's trace gets nothing.
    [record] = app.effects()
    assert (record.status, record.result) == ("succeeded", {"charge": "ch_1"}), record
    names = [e.name for e in app.trace(job_id)]
    assert names[-1] == "job.succeeded", names
    assert "effect.reconciled" not in names and "effect.claimed" not in names, names


def test_an_effects_reconciler_asked_in_the_handler_is_still_recorded(
    app_factory: AppFactory,
) -> None:
    """The usual case, unchanged: the handler's own ``ctx.effect`` asks the reconciler,
    records ``effect.reconciled`` and reuses the settled outcome."""
    app = app_factory()
    ran: list[str] = []

    @app.reconciler("payment.charge")
    def provider(record: EffectRecord) -> EffectResolution | None:
        return EffectResolution(True, {"charge": "ch_1"})

    @app.job("charge")
    def charge(ctx: replayq.Context) -> Any:
        return ctx.effect("payment.charge", lambda: ran.append("charged"), key=KEY)

    _in_doubt(app)
    job_id = app.enqueue("charge", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    assert job.result == {"charge": "ch_1"} and ran == []
    names = [e.name for e in app.trace(job_id)]
    assert names.count("effect.reconciled") == 1, names
