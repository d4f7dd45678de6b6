"""What a step's commit takes when other threads or tasks of its attempt write too
(``Recorder._running``: each flow's outermost step holds its writes until it ends).

A write made inside a step by a thread or task the step itself started (and waited for)
still commits with the step, in the order it was made; what a thread records outside any
step while another thread's steps commit is committed by one of those commits or the ack;
a lock let go of in a step whose writes under it wait keeps the lock until those writes
commit, whichever other commit comes first; a cache write of a step still running at the
ack is not made by the ack.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Generator

import pytest

import replayq
from tests.context_support import count_rows, named, query, run_once

AppFactory = Callable[..., replayq.App]


def parked(app: replayq.App, job_type: str, naming: str) -> None:
    """A ``job_type`` job enqueued and run once: parked dead, its error naming ``naming``."""
    job_id = app.enqueue(job_type, {})
    run_once(replayq.Worker(app, worker_id="w1"))
    job = app.get_job(job_id)
    assert job.state is replayq.JobState.DEAD
    assert naming in (job.last_error or ""), job.last_error


def test_a_write_a_steps_own_thread_made_commits_after_the_steps_earlier_write(
    app_factory: AppFactory,
) -> None:
    """A step writes ``orders:1`` (v1), then a thread it waits for writes v2 on top of it:
    the step's commit writes v1 then v2 (before the fix: v2 first, refused as a version
    conflict, and the step failed)."""
    app = app_factory()

    @app.job("fans_out", retry=replayq.Retry(max_attempts=1))
    def fans_out(ctx: replayq.Context) -> None:
        with ctx.step("s"):
            ctx.state.put("orders", 1, {"n": 1})
            helper = threading.Thread(target=lambda: ctx.state.put("orders", 1, {"n": 2}))
            helper.start()
            helper.join()

    job_id = app.enqueue("fans_out", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    entity = app.state.get("orders", 1)
    assert (entity.version, entity.data) == (2, {"n": 2})


def test_a_write_a_steps_own_task_made_commits_after_the_steps_earlier_write(
    app_factory: AppFactory,
) -> None:
    """As above in an ``async def`` handler: the step gathers a coroutine that writes
    (``asyncio.gather`` runs it in a task of its own)."""
    app = app_factory()

    @app.job("gathers", retry=replayq.Retry(max_attempts=1))
    async def gathers(ctx: replayq.Context) -> None:
        async def bump() -> None:
            ctx.state.put("orders", 1, {"n": 2})

        with ctx.step("s"):
            ctx.state.put("orders", 1, {"n": 1})
            await asyncio.gather(bump())

    job_id = app.enqueue("gathers", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    entity = app.state.get("orders", 1)
    assert (entity.version, entity.data) == (2, {"n": 2})


def test_what_a_thread_records_outside_steps_while_another_threads_steps_commit_is_kept(
    app_factory: AppFactory,
) -> None:
    """One thread of the handler runs 60 steps that each write, another publishes 300
    outbox events and writes 100 entities outside any step meanwhile: the ack finds every
    one of them committed (rows and events), each once; three jobs, each so. Before the
    fix a step's commit put a new pending record in place of the one it had flushed, and
    what the other thread appended to the old one in between was dropped: the job
    succeeded with some of its outbox rows, events and state writes missing. Thread
    switches forced often (``sys.setswitchinterval``) make that window likely."""
    app = app_factory()
    steps, published, written, jobs = 60, 300, 100, 3
    failures: list[BaseException] = []

    @app.job("two_threads", retry=replayq.Retry(max_attempts=1))
    def two_threads(ctx: replayq.Context) -> None:
        def stepper() -> None:
            for i in range(steps):
                with ctx.step("s"):
                    ctx.state.put(f"stepped{ctx.job_id}", i, {"i": i})

        def outside() -> None:
            for i in range(published):
                ctx.outbox.publish("t", {"i": i})
                if i < written:
                    ctx.state.put(f"outside{ctx.job_id}", i, {"i": i})

        def guarded(body: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    body()
                except BaseException as exc:  # asserted empty below
                    failures.append(exc)

            return run

        threads = [threading.Thread(target=guarded(body)) for body in (stepper, outside)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    job_ids = [app.enqueue("two_threads", {}) for _ in range(jobs)]
    worker = replayq.Worker(app, worker_id="w1")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in job_ids:
            run_once(worker)
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    for job_id in job_ids:
        assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
        events = named(app, job_id, "outbox.written")
        assert sorted(e.data["payload"]["i"] for e in events) == list(range(published))
        assert count_rows(app.url, "rq_outbox", "job_id = ?", (job_id,)) == published
        assert len(named(app, job_id, "step.finished")) == steps
        for namespace, count in ((f"stepped{job_id}", steps), (f"outside{job_id}", written)):
            entities = [app.state.get(namespace, i).data for i in range(count)]
            assert entities == [{"i": i} for i in range(count)], f"{namespace}: not committed"


def test_a_lock_let_go_of_in_a_running_step_is_held_until_its_writes_commit(
    app_factory: AppFactory,
) -> None:
    """A thread's step writes under lock ``r`` and lets go of it, then waits; the
    handler's own step commits meanwhile. The lock stays held (its release waits for the
    thread's step's commit), so the thread's write lands once its step ends (before the
    fix: the handler's commit released ``r``, another holder took it, and the thread's
    write was refused as stale)."""
    app = app_factory()
    in_step, go_on = threading.Event(), threading.Event()
    seen: list[BaseException | None] = []
    held_meanwhile: list[list[str]] = []

    @app.job("guards")
    def guards(ctx: replayq.Context) -> None:
        def theirs() -> None:
            try:
                with ctx.step("theirs"):
                    with ctx.lock("r"):
                        ctx.state.put("orders", 1, {"n": 1})
                    in_step.set()
                    assert go_on.wait(30)
                seen.append(None)
            except BaseException as exc:
                seen.append(exc)

        helper = threading.Thread(target=theirs)
        helper.start()
        assert in_step.wait(30)
        with ctx.step("mine"):
            ctx.state.put("customers", 7, {"seen": True})
        held_meanwhile.append([lock.resource for lock in replayq.list_locks(app)])
        go_on.set()
        helper.join(30)

    job_id = app.enqueue("guards", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    assert held_meanwhile == [["r"]], "the lock was released before the writes it guarded"
    assert seen == [None]
    assert app.state.get("orders", 1).version == 1
    assert replayq.list_locks(app) == []


def test_a_lock_a_step_running_at_the_ack_let_go_of_is_released_once(
    app_factory: AppFactory,
) -> None:
    """A thread's step writes under lock ``r``, lets go of it and is still running when
    the handler returns: the ack does not write the step's write, and the lock is freed
    when the attempt is settled (not left to its TTL), its ``lock.released`` traced once."""
    app = app_factory()
    in_step, go_on, done = threading.Event(), threading.Event(), threading.Event()
    seen: list[BaseException] = []

    @app.job("leaves_a_lock")
    def leaves_a_lock(ctx: replayq.Context) -> None:
        def late() -> None:
            try:
                with ctx.step("late"):
                    with ctx.lock("r"):
                        ctx.state.put("orders", 1, {"n": 1})
                    in_step.set()
                    go_on.wait(30)
            except BaseException as exc:
                seen.append(exc)
            finally:
                done.set()

        threading.Thread(target=late, daemon=True).start()
        assert in_step.wait(30)

    job_id = app.enqueue("leaves_a_lock", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    assert replayq.list_locks(app) == [], "the lock was left to its TTL"
    go_on.set()
    assert done.wait(30)
    assert app.state.get("orders", 1).version == 0, "a running step's write committed"
    assert [type(exc) for exc in seen] == [replayq.ContextEndedError], seen
    names = [e.name for e in app.trace(job_id)]
    assert names.count("lock.released") == 1, names


def test_a_cache_write_of_a_step_running_at_the_ack_is_not_made(
    app_factory: AppFactory,
) -> None:
    """A step left running in a thread caches a value, then waits; the handler returns.
    The ack does not make the step's cache write (as it does not make its state writes);
    nor does the step, ended after the attempt."""
    app = app_factory()
    in_step, go_on, done = threading.Event(), threading.Event(), threading.Event()
    seen: list[BaseException] = []

    @app.job("leaves")
    def leaves(ctx: replayq.Context) -> None:
        def late() -> None:
            try:
                with ctx.step("late"):
                    ctx.cache.set("profile", 1, {"name": "half-done"})
                    in_step.set()
                    go_on.wait(30)
            except BaseException as exc:
                seen.append(exc)
            finally:
                done.set()

        threading.Thread(target=late, daemon=True).start()
        assert in_step.wait(30)

    @app.job("reads")
    def reads(ctx: replayq.Context) -> bool:
        return ctx.cache.get("profile", 1).hit

    app.enqueue("leaves", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    go_on.set()
    assert done.wait(30)
    assert [type(exc) for exc in seen] == [replayq.ContextEndedError], seen
    job_id = app.enqueue("reads", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).result is False, "a running step's cache write was made"


def test_a_steps_events_do_not_ride_an_effects_claim_while_its_cache_write_waits(
    app_factory: AppFactory,
) -> None:
    """A step caches a value, then runs an effect: its events so far (``cache.write``
    among them) commit with the step's commit, not ahead of it with the effect's claim, as
    for a step's other writes: the effect finds them not yet in the trace."""
    app = app_factory()
    traced_at_effect: list[list[str]] = []

    @app.job("caches_then_charges")
    def caches_then_charges(ctx: replayq.Context) -> None:
        def charge() -> str:
            traced_at_effect.append([e.name for e in app.trace(ctx.job_id)])
            return "ok"

        with ctx.step("s"):
            ctx.cache.set("profile", 1, {"name": "Ada"})
            ctx.effect("charge", charge, key="charge-1")

    job_id = app.enqueue("caches_then_charges", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    [names] = traced_at_effect
    assert "cache.write" not in names, names


def test_another_threads_failed_step_leaves_a_running_steps_reads_and_writes(
    app_factory: AppFactory,
) -> None:
    """A thread's step puts ``orders:1``, then waits while the handler's own step fails;
    the thread's step then reads its put back and puts on top of it: both of its writes
    commit (before: the handler's failure made ``ctx.state`` forget the thread's put,
    the read found nothing, and the second put, made from version 0 again, was refused
    as a version conflict at the thread's step's commit)."""
    app = app_factory()
    in_step, go_on = threading.Event(), threading.Event()
    seen: list[object] = []

    @app.job("two", retry=replayq.Retry(max_attempts=1))
    def two(ctx: replayq.Context) -> None:
        def theirs() -> None:
            try:
                with ctx.step("theirs"):
                    ctx.state.put("orders", 1, {"n": 1})
                    in_step.set()
                    assert go_on.wait(30)
                    seen.append(ctx.state.get("orders", 1).data)
                    ctx.state.put("orders", 1, {"n": 2})
                seen.append(None)
            except BaseException as exc:
                seen.append(exc)

        helper = threading.Thread(target=theirs)
        helper.start()
        assert in_step.wait(30)
        try:
            with ctx.step("mine"):
                raise ValueError("mine failed")
        except ValueError:
            pass
        go_on.set()
        helper.join(30)

    job_id = app.enqueue("two", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert seen == [{"n": 1}, None]
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    assert app.state.get("orders", 1).version == 2


def test_a_handler_returning_inside_a_step_it_left_open_fails_and_commits_nothing(
    app_factory: AppFactory,
) -> None:
    """A generator suspended inside ``with ctx.step(...)`` and kept past the handler's
    return leaves that step open: its write, and the one the handler made after it outside
    any step, wait in the step's flow. The attempt fails saying so, and neither write is
    committed (before: the job succeeded and both writes were silently dropped)."""
    app = app_factory()
    kept: list[Generator[int, None, None]] = []

    @app.job("leaves_open", retry=replayq.Retry(max_attempts=1))
    def leaves_open(ctx: replayq.Context) -> None:
        def lines() -> Generator[int, None, None]:
            with ctx.step("gen"):
                ctx.state.put("orders", 1, {"n": 1})
                yield 1

        suspended = lines()
        next(suspended)
        kept.append(suspended)  # kept: not closed when the handler returns
        ctx.state.put("customers", 7, {"seen": True})

    parked(app, "leaves_open", "returned inside ctx.step('gen')")
    assert not app.state.get("orders", 1).exists
    assert not app.state.get("customers", 7).exists
    # Closed now, the step ends after its attempt: it records and commits nothing.
    with pytest.raises(replayq.ContextEndedError):
        kept.pop().close()
    assert not app.state.get("orders", 1).exists


def test_a_loop_left_early_over_a_generator_in_a_step_fails_when_writes_were_dropped(
    app_factory: AppFactory,
) -> None:
    """``for line in lines(): break`` closes the generator suspended in its step: the step
    ends as failed (``GeneratorExit``) and drops the attempt's pending writes, here one the
    handler made before the loop, outside any step; ``close()`` swallows the exit. The
    attempt fails naming the step (before: the job succeeded and ``customers:7`` was never
    written)."""
    app = app_factory()

    @app.job("leaves_loop", retry=replayq.Retry(max_attempts=1))
    def leaves_loop(ctx: replayq.Context) -> None:
        def lines() -> Generator[int, None, None]:
            with ctx.step("gen"):
                yield 1
                yield 2

        ctx.state.put("customers", 7, {"seen": True})
        for _ in lines():
            break

    parked(app, "leaves_loop", "ctx.step('gen') was ended by its generator's close")
    assert not app.state.get("customers", 7).exists


def test_a_generator_closed_in_its_step_fails_its_attempt_when_writes_were_dropped(
    app_factory: AppFactory,
) -> None:
    """As above with the generator closed by the handler before it returns (the write it
    made meanwhile outside any step waited in the generator's step, and went with it)."""
    app = app_factory()

    @app.job("closes", retry=replayq.Retry(max_attempts=1))
    def closes(ctx: replayq.Context) -> None:
        def lines() -> Generator[int, None, None]:
            with ctx.step("gen"):
                ctx.state.put("orders", 1, {"n": 1})
                yield 1

        suspended = lines()
        next(suspended)
        ctx.state.put("customers", 7, {"seen": True})
        suspended.close()

    parked(app, "closes", "ctx.step('gen') was ended by its generator's close")
    assert not app.state.get("customers", 7).exists


def test_a_loop_left_early_over_a_generator_in_a_step_with_nothing_to_write_succeeds(
    app_factory: AppFactory,
) -> None:
    """No write waited when the generator's step was closed: nothing was dropped, the job
    succeeds, and the writes made after the loop commit."""
    app = app_factory()

    @app.job("reads_lines", retry=replayq.Retry(max_attempts=1))
    def reads_lines(ctx: replayq.Context) -> None:
        def lines() -> Generator[int, None, None]:
            with ctx.step("gen"):
                yield 1
                yield 2

        for _ in lines():
            break
        ctx.state.put("customers", 7, {"seen": True})

    job_id = app.enqueue("reads_lines", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert app.state.get("customers", 7).exists


def test_an_async_handler_returning_inside_a_step_it_left_open_fails_and_commits_nothing(
    app_factory: AppFactory,
) -> None:
    """As ``test_a_handler_returning_inside_a_step_it_left_open_fails_and_commits_nothing``
    with an ``async def`` handler: an async generator suspended inside ``with ctx.step``
    in the handler's own task, kept past its return. The attempt fails naming the step,
    and neither write is committed (before: the job succeeded and both writes were
    silently dropped at the ack)."""
    app = app_factory()
    kept: list[AsyncGenerator[int, None]] = []

    @app.job("leaves_open_async", retry=replayq.Retry(max_attempts=1))
    async def leaves_open_async(ctx: replayq.Context) -> None:
        async def lines() -> AsyncGenerator[int, None]:
            with ctx.step("gen"):
                ctx.state.put("orders", 1, {"n": 1})
                yield 1

        suspended = lines()
        await anext(suspended)
        kept.append(suspended)  # kept: not closed when the handler returns
        ctx.state.put("customers", 7, {"seen": True})

    parked(app, "leaves_open_async", "returned inside ctx.step('gen')")
    assert not app.state.get("orders", 1).exists
    assert not app.state.get("customers", 7).exists
    # Closed now, the step ends after its attempt: it records and commits nothing.
    with pytest.raises(replayq.ContextEndedError):
        asyncio.run(kept.pop().aclose())
    assert not app.state.get("orders", 1).exists


def test_an_async_generator_closed_in_its_step_fails_its_attempt_when_writes_were_dropped(
    app_factory: AppFactory,
) -> None:
    """An ``async def`` handler closes (``aclose()``) an async generator suspended in its
    step: the step ends as failed and drops the write the handler made meanwhile outside
    any step, and ``aclose()`` swallows the exit. The attempt fails naming the step
    (before: the job succeeded and ``customers:7`` was never written)."""
    app = app_factory()

    @app.job("closes_async", retry=replayq.Retry(max_attempts=1))
    async def closes_async(ctx: replayq.Context) -> None:
        async def lines() -> AsyncGenerator[int, None]:
            with ctx.step("gen"):
                ctx.state.put("orders", 1, {"n": 1})
                yield 1

        suspended = lines()
        await anext(suspended)
        ctx.state.put("customers", 7, {"seen": True})
        await suspended.aclose()

    parked(app, "closes_async", "ctx.step('gen') was ended by its generator's close")
    assert not app.state.get("customers", 7).exists


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_step_left_open_is_a_handler_bug_never_retried_whatever_the_contract_retries(
    app_factory: AppFactory, flavour: str
) -> None:
    """The attempt of a handler that returned with its step open fails with
    ``StepLeftOpenError``, class ``validation``: the same code leaves it open again, so a
    contract that maps every ``Exception`` to ``transient`` (and retries ``unknown`` too)
    does not retry it; the job is dead after its one attempt (before: a plain
    ``RuntimeError``, mapped to ``transient`` and run again to its last attempt)."""
    app = app_factory()
    kept: list[Generator[int, None, None] | AsyncGenerator[int, None]] = []
    retry_all = replayq.Retry(max_attempts=3, base=0.001, cap=0.001, on=("transient", "unknown"))

    if flavour == "sync":

        @app.job("leaves_open", retry=retry_all, errors={Exception: "transient"})
        def leaves_open(ctx: replayq.Context) -> None:
            def lines() -> Generator[int, None, None]:
                with ctx.step("gen"):
                    yield 1

            suspended = lines()
            next(suspended)
            kept.append(suspended)

    else:

        @app.job("leaves_open", retry=retry_all, errors={Exception: "transient"})
        async def leaves_open_async(ctx: replayq.Context) -> None:
            async def lines() -> AsyncGenerator[int, None]:
                with ctx.step("gen"):
                    yield 1

            suspended = lines()
            await anext(suspended)
            kept.append(suspended)

    job_id = app.enqueue("leaves_open", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == (replayq.JobState.DEAD, 1)
    assert (job.last_error_class, job.dead_reason) == ("validation", "not_retryable")
    assert (job.last_error or "").startswith("StepLeftOpenError: "), job.last_error
    [failed] = [e for e in app.trace(job_id) if e.name == "job.failed"]
    assert failed.data["error_class"] == "validation"
    assert not [e for e in app.trace(job_id) if e.name == "retry.scheduled"]
    for generator in kept:  # its step ends after the attempt: refused, nothing committed
        with pytest.raises(replayq.ContextEndedError):
            if isinstance(generator, Generator):
                generator.close()
            else:
                asyncio.run(generator.aclose())


def test_steps_running_at_once_in_two_threads_each_name_their_own_step(
    app_factory: AppFactory,
) -> None:
    """Two threads each hold a step open at the same time and publish in it, the first
    after the second entered its step; the handler's own thread publishes outside any step
    meanwhile. Each outbox event id (its step's position) and each event's step name is its
    own thread's step, or none (before the fix: one stack for the attempt, and the first
    thread's event, the handler's too, named the second thread's step). One publishes at a
    time (the events in turn): what this asks is whose step each names, not how the
    attempt's pending record takes a write made while another thread's step commits."""
    app = app_factory()
    left_in, right_in, left_done = threading.Event(), threading.Event(), threading.Event()
    handler_done = threading.Event()
    seen: list[BaseException | None] = []

    @app.job("two_threads", retry=replayq.Retry(max_attempts=1))
    def two_threads(ctx: replayq.Context) -> None:
        def left() -> None:
            try:
                with ctx.step("left"):
                    left_in.set()
                    assert handler_done.wait(30)
                    ctx.outbox.publish("side", {"from": "left"})
                    ctx.decide("went", "left")
                left_done.set()  # its step committed
                seen.append(None)
            except BaseException as exc:
                seen.append(exc)

        def right() -> None:
            try:
                assert left_in.wait(30)
                with ctx.step("right"):
                    right_in.set()
                    assert left_done.wait(30)
                    ctx.outbox.publish("side", {"from": "right"})
                    ctx.decide("went", "right")
                seen.append(None)
            except BaseException as exc:
                seen.append(exc)

        helpers = [threading.Thread(target=left), threading.Thread(target=right)]
        for helper in helpers:
            helper.start()
        assert right_in.wait(30)
        ctx.outbox.publish("side", {"from": "handler"})
        handler_done.set()
        for helper in helpers:
            helper.join(30)

    job_id = app.enqueue("two_threads", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert seen == [None, None]
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    trace_id = app.get_job(job_id).trace_id
    published = {e.data["payload"]["from"]: e for e in named(app, job_id, "outbox.written")}
    assert {source: e.data["event_id"] for source, e in published.items()} == {
        "left": f"{trace_id}:step:left:0",
        "right": f"{trace_id}:step:right:0",
        "handler": f"{trace_id}:job:0",
    }
    assert {source: e.step for source, e in published.items()} == {
        "left": "left",
        "right": "right",
        "handler": None,
    }
    decided = {e.data["value"]: e.step for e in named(app, job_id, "decision")}
    assert decided == {"left": "left", "right": "right"}


def test_steps_running_at_once_in_two_tasks_each_name_their_own_step(
    app_factory: AppFactory,
) -> None:
    """As above in an ``async def`` handler: two gathered coroutines (a task each) hold a
    step open at once; each one's outbox event id and step name is its own step's."""
    app = app_factory()

    @app.job("two_tasks", retry=replayq.Retry(max_attempts=1))
    async def two_tasks(ctx: replayq.Context) -> None:
        left_in, right_in, left_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def left() -> None:
            with ctx.step("left"):
                left_in.set()
                await right_in.wait()
                ctx.outbox.publish("side", {"from": "left"})
                left_done.set()

        async def right() -> None:
            await left_in.wait()
            with ctx.step("right"):
                right_in.set()
                await left_done.wait()
                ctx.outbox.publish("side", {"from": "right"})

        await asyncio.wait_for(asyncio.gather(left(), right()), 30)

    job_id = app.enqueue("two_tasks", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state == replayq.JobState.SUCCEEDED
    trace_id = app.get_job(job_id).trace_id
    published = {e.data["payload"]["from"]: e for e in named(app, job_id, "outbox.written")}
    assert {source: (e.data["event_id"], e.step) for source, e in published.items()} == {
        "left": (f"{trace_id}:step:left:0", "left"),
        "right": (f"{trace_id}:step:right:0", "right"),
    }


def test_a_steps_thread_publishes_under_the_step_so_a_resumed_retry_loses_no_event(
    app_factory: AppFactory,
) -> None:
    """A step's thread (joined in the step) publishes; a later step fails once; on the
    retry (``resume="step"``) the first step is skipped, so its thread does not run, and
    the handler publishes outside any step after the steps. Each logical event keeps one
    id on every attempt: the thread's is its step's (``{trace}:step:load:0``), as it
    commits with that step. Before the fix the thread's id was the job's
    (``{trace}:job:0``), and on the retry the handler's own first publish outside steps
    took the same id: refused as a duplicate, ``order.done`` was never written."""
    app = app_factory(clock=(clock := replayq.FrozenClock()))

    @app.job(
        "threaded_load",
        retry=replayq.Retry(max_attempts=2, base="1s", jitter="none"),
        resume="step",
    )
    def threaded_load(ctx: replayq.Context) -> None:
        def load() -> int:
            helper = threading.Thread(
                target=ctx.outbox.publish, args=("order.loaded", {"order_id": 7})
            )
            helper.start()
            helper.join(30)
            return 7

        def confirm() -> None:
            if ctx.attempt == 1:
                raise replayq.TransientError("confirmation service timed out")

        ctx.step("load", load)
        ctx.step("confirm", confirm)
        ctx.outbox.publish("order.done", {"order_id": 7})

    job_id = app.enqueue("threaded_load", {})
    worker = replayq.Worker(app, worker_id="w1")
    run_once(worker)
    assert app.get_job(job_id).state is replayq.JobState.QUEUED, "attempt 1 is retried"
    clock.advance(2)
    run_once(worker)
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == (replayq.JobState.SUCCEEDED, 2)
    rows = query(
        app.url, "SELECT event_id, topic FROM rq_outbox WHERE job_id = ? ORDER BY id", (job_id,)
    )
    assert rows == [
        (f"{job.trace_id}:step:load:0", "order.loaded"),
        (f"{job.trace_id}:job:0", "order.done"),
    ]
    [done] = [e for e in named(app, job_id, "outbox.written") if e.data["topic"] == "order.done"]
    assert not done.data.get("deduplicated")


def test_the_handlers_publish_while_its_threads_step_runs_keeps_the_jobs_id_on_a_retry(
    app_factory: AppFactory,
) -> None:
    """The handler publishes outside its steps while a thread it started runs a step; the
    retry (``resume="step"``) skips that step, so nothing runs beside the handler's
    publish then. The handler is not the thread's child: its id is the job's on both
    attempts (``{trace}:job:0``), and the retry's publish is the same event, one row.
    Numbered under the step it happened to run beside, it would have had another id on
    the retry than on the first attempt: a second row for one event."""
    app = app_factory(clock=(clock := replayq.FrozenClock()))
    inside, published = threading.Event(), threading.Event()

    @app.job(
        "beside_a_step",
        retry=replayq.Retry(max_attempts=2, base="1s", jitter="none"),
        resume="step",
    )
    def beside_a_step(ctx: replayq.Context) -> None:
        def late() -> int:
            inside.set()
            assert published.wait(30)
            return 1

        def confirm() -> None:
            if ctx.attempt == 1:
                raise replayq.TransientError("confirmation service timed out")

        helper = threading.Thread(target=ctx.step, args=("late", late))
        helper.start()
        if ctx.attempt == 1:
            assert inside.wait(30), "the thread's step never started"
        ctx.outbox.publish("order.seen", {"order_id": 7})
        published.set()
        helper.join(30)
        ctx.step("confirm", confirm)

    job_id = app.enqueue("beside_a_step", {})
    worker = replayq.Worker(app, worker_id="w1")
    run_once(worker)
    assert app.get_job(job_id).state is replayq.JobState.QUEUED, "attempt 1 is retried"
    clock.advance(2)
    run_once(worker)
    job = app.get_job(job_id)
    assert (job.state, job.attempt) == (replayq.JobState.SUCCEEDED, 2)
    assert [e.data["step_name"] for e in named(app, job_id, "step.skipped")] == ["late"]
    rows = query(
        app.url, "SELECT event_id, topic FROM rq_outbox WHERE job_id = ? ORDER BY id", (job_id,)
    )
    assert rows == [(f"{job.trace_id}:job:0", "order.seen")]


def test_a_steps_thread_write_is_shown_uncommitted_when_the_step_fails(
    app_factory: AppFactory,
) -> None:
    """A thread a step started (and joined) writes outside any step of its own; the step
    then fails, and its commit, which would have carried that write, drops it. The trace
    says so (``uncommitted_writes``, ``trace show``): the write names no step, but it
    belonged to the next commit, the failed step's. Before the fix it looked committed."""
    app = app_factory()

    @app.job("threaded_fail", retry=replayq.Retry(max_attempts=1))
    def threaded_fail(ctx: replayq.Context) -> None:
        with ctx.step("load"):
            helper = threading.Thread(target=ctx.state.put, args=("orders", 1, {"n": 1}))
            helper.start()
            helper.join(30)
            raise replayq.ValidationError("the order is not valid")

    job_id = app.enqueue("threaded_fail", {})
    run_once(replayq.Worker(app, worker_id="w1"))
    assert app.get_job(job_id).state is replayq.JobState.DEAD
    assert app.state.get("orders", 1).version == 0, "the failed step's write did not land"
    trace = app.trace(job_id)
    [write] = [e for e in trace if e.name == "state.write"]
    assert replayq.uncommitted_writes(trace) == {
        (write.trace_id, write.attempt, write.seq): "not committed (its step failed)"
    }


def test_a_nested_steps_end_commits_or_drops_the_writes_of_the_steps_around_it(
    app_factory: AppFactory,
) -> None:
    """A thread's steps hold their writes together (``StepFlow``): a nested step's end
    commits (or, failing, drops) the writes its outer step made before it, too.
    ``uncommitted_writes`` (``trace show``, ``replayq diff``) says what the database holds:
    before the fix it judged each write by its own step's end alone, and showed the outer
    write a failed nested step dropped as committed, and the one a nested step committed
    before its outer step failed as not committed."""
    app = app_factory()

    @app.job("nested_fails", retry=replayq.Retry(max_attempts=1))
    def nested_fails(ctx: replayq.Context) -> None:
        with ctx.step("outer"):
            ctx.state.put("orders", 1, {"n": 1})  # dropped with "bad"
            try:
                with ctx.step("bad"):
                    raise ValueError("refused")
            except ValueError:
                pass
            ctx.state.put("orders", 2, {"n": 2})  # committed with "outer"

    @app.job("outer_fails", retry=replayq.Retry(max_attempts=1))
    def outer_fails(ctx: replayq.Context) -> None:
        with ctx.step("outer"):
            ctx.state.put("orders", 3, {"n": 3})  # committed with "inner"
            with ctx.step("inner"):
                pass
            ctx.state.put("orders", 4, {"n": 4})  # dropped with "outer"
            raise replayq.ValidationError("the order is not valid")

    jobs = [app.enqueue("nested_fails", {}), app.enqueue("outer_fails", {})]
    worker = replayq.Worker(app, worker_id="w1")
    run_once(worker)
    run_once(worker)
    shown: dict[str, str | None] = {}
    for job_id in jobs:
        trace = app.trace(job_id)
        dropped = replayq.uncommitted_writes(trace)
        for e in trace:
            if e.name == "state.write":
                assert e.resource is not None
                shown[e.resource] = dropped.get((e.trace_id, e.attempt, e.seq))
    stored = {f"orders:{key}": app.state.get("orders", key).version for key in (1, 2, 3, 4)}
    assert stored == {"orders:1": 0, "orders:2": 1, "orders:3": 1, "orders:4": 0}
    failed = "not committed (its step failed)"
    assert shown == {"orders:1": failed, "orders:2": None, "orders:3": None, "orders:4": failed}
