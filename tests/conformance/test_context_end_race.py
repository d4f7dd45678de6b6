"""A thread the handler leaves running writes outside steps while its attempt ends and
is acked: each write either commits with the ack or is refused (``ContextEndedError``),
never returned as made and then dropped (docs/recording-context.md: what an ended
attempt would have recorded is "refused instead of dropped without a word")."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import replayq
from tests.context_support import count_rows, run_once

AppFactory = Callable[..., replayq.App]


JOBS = 40


def race_the_end(
    app: replayq.App, call: Callable[[replayq.Context, list[int]], None]
) -> dict[int, tuple[int, list[int]]]:
    """Job ``races`` starts a thread that makes ``call(ctx, counts)`` again and again (it
    counts what returned), outside any step, and returns once the first call is made; the
    worker ends each attempt and commits its ack while the thread is inside a call (the
    switch interval at a microsecond, ``JOBS`` jobs). By job id: its ``n`` and counts."""
    made: dict[int, list[int]] = {}
    threads: list[threading.Thread] = []

    @app.job("races")
    def races(ctx: replayq.Context, n: int) -> None:
        first = threading.Event()
        counts = made[n] = [0, 0]

        def calls() -> None:
            try:
                while True:
                    call(ctx, counts)
                    first.set()
            except replayq.ContextEndedError:
                pass
            finally:
                first.set()

        thread = threading.Thread(target=calls, daemon=True)
        threads.append(thread)
        thread.start()
        first.wait(10)

    ids = {app.enqueue("races", {"n": n}): n for n in range(JOBS)}
    worker = replayq.Worker(app, worker_id="w1")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(JOBS):
            run_once(worker)
            threads[-1].join(10)
    finally:
        sys.setswitchinterval(interval)
    return {job_id: (n, made[n]) for job_id, n in ids.items()}


def test_writes_outside_steps_racing_the_attempts_end_are_committed_or_refused(
    app_factory: AppFactory, db_url: str
) -> None:
    """Job ``races`` starts a thread that puts one entity and publishes an outbox row again
    and again, outside any step, and returns once the first pair is made; the worker ends
    the attempt and commits its ack while the thread is in a put or a publish (the switch
    interval at a microsecond, 40 jobs). Each job's entity version and outbox rows in the
    database are the puts and publishes that returned, and its trace has an event for each
    of them and no more (before, a write that looked at the end before it and joined the
    pending record after the ack's flush was forgotten with that record: it returned,
    nothing was written, no error — in most of the 40 jobs)."""
    app = app_factory()

    def put_and_publish(ctx: replayq.Context, counts: list[int]) -> None:
        n = ctx.payload["n"]
        ctx.state.put("race", str(n), {"i": counts[0]})
        counts[0] += 1
        ctx.outbox.publish("race.tick", {"n": n})
        counts[1] += 1

    wrong = {}
    for job_id, (n, (puts, publishes)) in race_the_end(app, put_and_publish).items():
        trace = app.trace(job_id)
        found = (
            app.state.get("race", str(n)).version,
            count_rows(db_url, "rq_outbox", "job_id = ?", (job_id,)),
            sum(e.name == "state.write" for e in trace),
            sum(e.name == "outbox.written" for e in trace),
        )
        if found != (puts, publishes, puts, publishes):
            wrong[n] = {"returned": (puts, publishes), "committed and traced": found}
    assert wrong == {}, wrong


def test_recorded_values_racing_the_attempts_end_are_in_the_trace_or_refused(
    app_factory: AppFactory,
) -> None:
    """As above with ``ctx.decide`` and ``ctx.now``, which return a value and record it:
    each one that returned to the thread is in the job's committed trace (before, the last
    one often returned and its event, recorded after the ack's flush, was never written:
    a trace short of a decision the code acted on)."""
    app = app_factory()

    def decide_and_read_the_clock(ctx: replayq.Context, counts: list[int]) -> None:
        ctx.decide("tick", counts[0])
        counts[0] += 1
        ctx.now()
        counts[1] += 1

    wrong = {}
    for job_id, (n, made) in race_the_end(app, decide_and_read_the_clock).items():
        trace = app.trace(job_id)
        found = [
            sum(e.name == "decision" for e in trace),
            sum(e.name == "clock.now" for e in trace),
        ]
        if found != made:
            wrong[n] = {"returned": made, "traced": found}
    assert wrong == {}, wrong


def test_cache_writes_outside_steps_racing_the_attempts_end_are_committed_or_refused(
    app_factory: AppFactory, db_url: str
) -> None:
    """As above with ``ctx.cache.set``, whose entry is written after the ack commits: each
    set that returned to the thread has its entry in the cache and its ``cache.write`` in
    the trace (before, a set that looked at the end before it and recorded its event and
    held its entry after the ack's flush returned, and neither was ever written)."""
    app = app_factory()

    def set_in_cache(ctx: replayq.Context, counts: list[int]) -> None:
        # A new version each time: one entry each, counted in the cache's own table.
        ctx.cache.set("race", ctx.payload["n"], {"i": counts[0]}, version=counts[0] + 1)
        counts[0] += 1

    wrong = {}
    for job_id, (n, (sets, _)) in race_the_end(app, set_in_cache).items():
        found = (
            count_rows(db_url, "rq_cache", "base_key = ?", (f"race:{n}",)),
            sum(e.name == "cache.write" for e in app.trace(job_id)),
        )
        if found != (sets, sets):
            wrong[n] = {"returned": sets, "in the cache and traced": found}
    assert wrong == {}, wrong


def test_reads_racing_the_attempts_end_are_in_the_trace_or_refused(
    app_factory: AppFactory,
) -> None:
    """As above with ``ctx.state.get`` and ``ctx.cache.get``: each read that returned a
    value to the thread has its ``state.read`` or ``cache.read`` in the job's committed
    trace, or the read raised ``ContextEndedError`` (before, the last read often looked at
    the end before its database read and recorded its event after the ack's flush: the
    thread acted on a value the trace does not say it saw)."""
    app = app_factory()

    def read_state_and_cache(ctx: replayq.Context, counts: list[int]) -> None:
        n = ctx.payload["n"]
        ctx.state.get("race", str(n))
        counts[0] += 1
        ctx.cache.get("race", n)
        counts[1] += 1

    wrong = {}
    for job_id, (n, made) in race_the_end(app, read_state_and_cache).items():
        trace = app.trace(job_id)
        found = [
            sum(e.name == "state.read" for e in trace),
            sum(e.name == "cache.read" for e in trace),
        ]
        if found != made:
            wrong[n] = {"returned": made, "traced": found}
    assert wrong == {}, wrong
