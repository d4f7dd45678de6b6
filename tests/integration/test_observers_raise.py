"""An observer that raises never fails, holds up or repeats a job, nor stops the worker.

Observers are user code (a metrics exporter, a tracer, a log shipper) called on the
worker's own threads: ``job_seen`` on the dispatcher's and executors' leases, ``attempt``
around each handler call, ``settled`` after an executor's settle and after the acks
thread's group commit, ``released`` when a leased job leaves unrun, ``events`` after
every commit. An exception out of ``settled`` used to end the acks thread (no later ack
committed: the jobs stayed ``running`` and were reaped and run again) or an executor.
Here every hook of one observer raises, on real databases, while a second observer
counts what it is told: every job settles as its handler decided, the worker's burst run
ends, and the second observer is told everything once.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import pytest

import replayq
from tests.observer_support import Ledger

AppFactory = Callable[..., replayq.App]


class Raising(replayq.Observer):
    """Every hook raises (the attempt's on entry, or on exit with ``on_exit``)."""

    def __init__(self, *, on_exit: bool = False) -> None:
        self.on_exit = on_exit

    def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
        return self._attempt()

    @contextmanager
    def _attempt(self) -> Iterator[None]:
        if not self.on_exit:
            raise RuntimeError("observer broken on entry")
        yield
        raise RuntimeError("observer broken on exit")

    def settled(self, job: replayq.Job) -> None:
        raise RuntimeError("observer broken in settled")

    def job_seen(self, job: replayq.Job) -> None:
        raise RuntimeError("observer broken in job_seen")

    def released(self, job: replayq.Job, reason: replayq.ReleaseReason) -> None:
        raise RuntimeError("observer broken in released")

    def events(self, events: Sequence[replayq.TraceEvent]) -> None:
        raise RuntimeError("observer broken in events")


@pytest.mark.parametrize("on_exit", [False, True], ids=["entry", "exit"])
def test_an_observer_that_raises_changes_no_outcome(app_factory: AppFactory, on_exit: bool) -> None:
    app = app_factory()
    runs: Counter[int] = Counter()

    @app.job("ok", lease="30s")
    def ok(ctx: replayq.Context, n: int) -> int:
        with ctx.step("count"):
            runs[n] += 1
        return n

    @app.job("bad", lease="30s")
    def bad(ctx: replayq.Context, n: int) -> None:
        runs[n] += 1
        raise replayq.ValidationError("never valid")

    ids = {n: app.enqueue("bad" if n % 5 == 0 else "ok", {"n": n}) for n in range(12)}
    counting = Ledger()
    worker = replayq.Worker(
        app,
        worker_id="w",
        burst=True,
        concurrency=2,
        observers=[Raising(on_exit=on_exit), counting],
    )
    done: list[replayq.WorkerStats] = []
    runner = threading.Thread(target=lambda: done.append(worker.run()), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the worker's burst run did not end"
    assert done, "the worker's run raised"

    states = {n: app.get_job(job_id).state for n, job_id in ids.items()}
    assert states == {n: "dead" if n % 5 == 0 else "succeeded" for n in ids}
    assert runs == Counter({n: 1 for n in ids}), "a handler ran more than once"
    assert counting.attempts == Counter({job_id: 1 for job_id in ids.values()})
    assert counting.settled_ids == Counter({job_id: 1 for job_id in ids.values()})
    assert done[0].succeeded == 9 and done[0].dead == 3


def test_an_observer_cannot_swallow_the_handlers_exception(app_factory: AppFactory) -> None:
    """An observer whose attempt's exit returns true (``suppress``) does not turn a
    failed attempt into a success."""
    app = app_factory()

    class Suppressing(replayq.Observer):
        def attempt(self, job: replayq.Job, worker_id: str) -> AbstractContextManager[None]:
            from contextlib import suppress

            return suppress(Exception)

    @app.job("bad", lease="30s")
    def bad(ctx: replayq.Context) -> None:
        raise replayq.ValidationError("never valid")

    job_id = app.enqueue("bad", {})
    stats = replayq.Worker(app, worker_id="w", burst=True, observers=[Suppressing()]).run()
    assert app.get_job(job_id).state == "dead" and stats.dead == 1
