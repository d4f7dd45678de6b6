"""Enqueue on every backend: dedup, priority, delay, cancel, bad input, hostile strings."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

import replayq

AppFactory = Callable[..., replayq.App]


def declare_jobs(app: replayq.App) -> replayq.App:
    @app.job("charge", ordering="account:{account}", max_payload_bytes=512)
    def charge(ctx: replayq.Context, account: str, amount: int, note: str = "") -> None:
        return None

    return app


@pytest.fixture
def clock() -> replayq.FrozenClock:
    return replayq.FrozenClock()


@pytest.fixture
def app(app_factory: AppFactory, clock: replayq.FrozenClock) -> replayq.App:
    return declare_jobs(app_factory(clock=clock))


def lease_all(app: replayq.App) -> list[replayq.Job]:
    """Lease everything ready, one at a time, in the order the queue hands it out."""
    worker = replayq.Worker(app, worker_id="conformance")
    leased = []
    while batch := worker.lease(1):
        leased.extend(batch)
    return leased


def event_names(app: replayq.App, job_id: int) -> list[str]:
    return [event.name for event in app.trace(job_id)]


# -- message_id dedup -------------------------------------------------------------------------


def test_same_message_id_yields_the_existing_job_and_one_row(app: replayq.App) -> None:
    first = app.enqueue("charge", {"account": "a", "amount": 5}, message_id="evt-9")
    again = app.enqueue("charge", {"account": "a", "amount": 999}, message_id="evt-9")

    assert again == first
    jobs = app.list_jobs()
    assert [job.id for job in jobs] == [first]
    assert jobs[0].payload["amount"] == 5, "the duplicate does not overwrite the original"
    assert event_names(app, first) == ["job.enqueued", "job.deduplicated"]


def test_different_message_ids_and_no_message_id_are_separate_jobs(app: replayq.App) -> None:
    ids = {
        app.enqueue("charge", {"account": "a", "amount": 1}, message_id="evt-1"),
        app.enqueue("charge", {"account": "a", "amount": 1}, message_id="evt-2"),
        app.enqueue("charge", {"account": "a", "amount": 1}),
        app.enqueue("charge", {"account": "a", "amount": 1}),
    }
    assert len(ids) == 4
    assert len(app.list_jobs()) == 4


def test_duplicate_message_id_inside_one_bulk_enqueue_makes_one_job(app: replayq.App) -> None:
    requests = [
        replayq.EnqueueRequest("charge", {"account": "a", "amount": n}, message_id="same")
        for n in range(3)
    ]
    ids = app.enqueue_many(requests)
    assert len(set(ids)) == 1
    assert len(app.list_jobs()) == 1


def test_a_bulk_enqueue_is_one_insert_in_request_order_with_every_event_as_one_by_one(
    app: replayq.App,
) -> None:
    existing = app.enqueue("charge", {"account": "z", "amount": 0}, message_id="old")
    requests = [
        replayq.EnqueueRequest("charge", {"account": "b", "amount": 1}, message_id="m1"),
        replayq.EnqueueRequest("charge", {"account": "a", "amount": 2}),
        replayq.EnqueueRequest("charge", {"account": "a", "amount": 3}, message_id="old"),
        replayq.EnqueueRequest("charge", {"account": "b", "amount": 4}, message_id="m1"),
        replayq.EnqueueRequest("charge", {"account": "a", "amount": 5}, delay="1h", priority=2),
    ]
    ids = app.enqueue_many(requests)
    new = [ids[0], ids[1], ids[4]]
    assert ids[2] == existing and ids[3] == ids[0]
    assert new == sorted(new) and existing < new[0], "ids follow the requests' order"
    jobs = {job.id: job for job in app.list_jobs()}
    assert sorted(jobs) == sorted([existing, *new])
    assert [jobs[i].payload["amount"] for i in new] == [1, 2, 5]
    assert jobs[ids[1]].ordering_key == "account:a" and jobs[ids[4]].priority == 2
    assert jobs[ids[4]].run_at == pytest.approx(jobs[ids[1]].run_at + 3600)
    assert event_names(app, existing) == ["job.enqueued", "job.deduplicated"]
    assert event_names(app, ids[0]) == ["job.enqueued", "job.deduplicated"]
    [enqueued] = app.trace(ids[4])
    assert enqueued.attempt == 0 and enqueued.status == "queued"
    assert enqueued.data["priority"] == 2 and enqueued.data["ordering_key"] == "account:a"
    # Per-key FIFO holds across the batch: account a's jobs lease in id order.
    assert [j.id for j in lease_all(app) if j.ordering_key == "account:a"] == [ids[1]]
    assert app.enqueue_many([]) == []


# -- priority and order -----------------------------------------------------------------------


def test_higher_priority_is_leased_first_then_fifo(app: replayq.App) -> None:
    low = app.enqueue("charge", {"account": "a", "amount": 1}, priority=0)
    high = app.enqueue("charge", {"account": "b", "amount": 1}, priority=10)
    mid_first = app.enqueue("charge", {"account": "c", "amount": 1}, priority=5)
    mid_second = app.enqueue("charge", {"account": "d", "amount": 1}, priority=5)

    assert [job.id for job in lease_all(app)] == [high, mid_first, mid_second, low]


def test_jobs_of_one_ordering_key_are_leased_one_at_a_time_in_enqueue_order(
    app: replayq.App,
) -> None:
    a1 = app.enqueue("charge", {"account": "a", "amount": 1})
    a2 = app.enqueue("charge", {"account": "a", "amount": 2}, priority=100)
    b1 = app.enqueue("charge", {"account": "b", "amount": 1})
    worker = replayq.Worker(app, worker_id="conformance")

    first = worker.lease(10)
    assert sorted(job.id for job in first) == [a1, b1], "a2 waits for a1, whatever its priority"
    for job in first:
        worker.execute(job)
    assert [job.id for job in worker.lease(10)] == [a2]


def test_a_job_of_a_key_waiting_for_its_retry_holds_the_later_ones_back(
    app_factory: AppFactory, clock: replayq.FrozenClock
) -> None:
    app = app_factory(clock=clock)
    runs: list[int] = []

    @app.job(
        "debit",
        ordering="account:{account}",
        retry=replayq.Retry(max_attempts=3, base="30s", cap="30s", jitter="none"),
    )
    def debit(ctx: replayq.Context, account: str, n: int) -> None:
        runs.append(n)
        if n == 1 and ctx.attempt == 1:
            raise replayq.TransientError("the bank is busy")

    first = app.enqueue("debit", {"account": "a", "n": 1})
    second = app.enqueue("debit", {"account": "a", "n": 2})
    other = app.enqueue("debit", {"account": "b", "n": 3})
    worker = replayq.Worker(app, worker_id="conformance")
    for job in worker.lease(10):
        worker.execute(job)
    assert app.get_job(first).state is replayq.JobState.QUEUED, "waiting for its retry"
    assert app.get_job(other).state is replayq.JobState.SUCCEEDED

    clock.advance(10)  # the retry is not due yet: the key's next job still waits
    assert worker.lease(10) == []
    clock.advance(25)
    leased = worker.lease(10)
    assert [job.id for job in leased] == [first], "the retry first, alone"
    worker.execute(leased[0])
    assert [job.id for job in worker.lease(10)] == [second]
    assert runs == [1, 3, 1]


# -- delay and run_at -------------------------------------------------------------------------


def test_delayed_job_is_not_leased_before_it_is_due(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    job_id = app.enqueue("charge", {"account": "a", "amount": 1}, delay="10s")
    assert app.get_job(job_id).run_at == pytest.approx(clock.now() + 10)

    clock.advance(9.9)
    assert lease_all(app) == []
    clock.advance(0.2)
    assert [job.id for job in lease_all(app)] == [job_id]


def test_run_at_in_the_future_is_honoured(app: replayq.App, clock: replayq.FrozenClock) -> None:
    due = clock.now() + 60
    job_id = app.enqueue("charge", {"account": "a", "amount": 1}, run_at=due)
    assert lease_all(app) == []
    clock.set(due)
    assert [job.id for job in lease_all(app)] == [job_id]


def test_delay_and_run_at_together_are_refused(app: replayq.App) -> None:
    with pytest.raises(replayq.ConfigurationError, match="delay or run_at"):
        app.enqueue("charge", {"account": "a", "amount": 1}, delay="1s", run_at=1.0)
    assert app.list_jobs() == []


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({"run_at": float("inf")}, "run_at must be a finite time"),
        ({"run_at": float("nan")}, "run_at must be a finite time"),
        ({"run_at": 1e300}, r"got 1e\+300"),
        ({"run_at": "tomorrow"}, "run_at must be a POSIX time in seconds"),
        ({"run_at": True}, "run_at must be a POSIX time in seconds"),
        ({"delay": 1e300}, r"delay 1e\+300 gives"),
        ({"priority": 1.5}, "priority must be a whole number"),
        ({"priority": "high"}, "priority must be a whole number"),
        ({"priority": True}, "priority must be a whole number"),
        ({"priority": 2**31}, "from -2147483648 to 2147483647"),
    ],
)
def test_a_run_at_or_priority_no_queue_can_keep_is_refused_and_nothing_is_written(
    app: replayq.App, when: dict[str, Any], message: str
) -> None:
    """A time that is not a finite number (or one no backend stores exactly) and a priority
    that is not a 32-bit whole number are refused before anything is written, one by one
    and in bulk, instead of a row that never runs or a driver's error."""
    with pytest.raises(replayq.ConfigurationError, match=message):
        app.enqueue("charge", {"account": "a", "amount": 1}, **when)
    request = replayq.EnqueueRequest("charge", {"account": "b", "amount": 2}, **when)
    with pytest.raises(replayq.ConfigurationError, match=message):
        app.enqueue_many([replayq.EnqueueRequest("charge", {"account": "c", "amount": 3}), request])
    assert app.list_jobs() == []


def test_the_bounds_themselves_are_kept(app: replayq.App) -> None:
    edges = [(-(2**31), 1e15 - 1), (2**31 - 1, -(1e15 - 1)), (0, 0)]
    ids = [
        app.enqueue("charge", {"account": "a", "amount": n}, priority=p, run_at=t)
        for n, (p, t) in enumerate(edges)
    ]
    assert [(j.priority, j.run_at) for j in map(app.get_job, ids)] == [
        (p, float(t)) for p, t in edges
    ]


# -- cancel -----------------------------------------------------------------------------------


def test_cancelled_queued_job_is_never_run(app: replayq.App) -> None:
    job_id = app.enqueue("charge", {"account": "a", "amount": 1})

    assert app.cancel(job_id) is True

    assert app.get_job(job_id).state is replayq.JobState.CANCELLED
    assert lease_all(app) == []
    assert event_names(app, job_id) == ["job.enqueued", "job.cancelled"]
    assert app.cancel(job_id) is False, "cancelling twice changes nothing"


def test_a_running_job_asked_to_stop_that_finishes_before_seeing_it_succeeds(
    app: replayq.App,
) -> None:
    # A cancel reaches a running job through its worker's heartbeat; a job that finishes
    # before any heartbeat (here: none runs) has done its work, and is not un-done.
    job_id = app.enqueue("charge", {"account": "a", "amount": 1})
    worker = replayq.Worker(app, worker_id="conformance")
    [job] = worker.lease(1)

    assert app.cancel(job_id) is True
    running = app.get_job(job_id)
    assert running.state is replayq.JobState.RUNNING
    assert running.cancel_requested_at is not None
    assert app.cancel(job_id) is False  # asked once

    worker.execute(job)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    assert "job.cancelled" not in event_names(app, job_id)


def test_cancelled_head_of_an_ordering_key_unblocks_the_next_job(app: replayq.App) -> None:
    head = app.enqueue("charge", {"account": "a", "amount": 1})
    nxt = app.enqueue("charge", {"account": "a", "amount": 2})
    app.cancel(head)
    assert [job.id for job in lease_all(app)] == [nxt]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"account": "a", "amount": 1, "note": {1, 2}}, "note"),
        ({"account": "a", "amount": float("nan")}, "amount"),
        ({"account": "a", "amount": 1, "note": object()}, "note"),
        ({"account": "a"}, "'amount'"),
        ({"amount": 1}, "'account'"),
        ({"account": "a", "amount": 1, "colour": "red"}, "'colour'"),
        ({"account": "a", "amount": "12"}, "'amount'"),
        ({"account": "a", "amount": 1, "note": "x" * 600}, "max_payload_bytes=512"),
    ],
    ids=[
        "set-not-json",
        "nan-not-json",
        "object-not-json",
        "missing-amount",
        "missing-account",
        "unknown-field",
        "wrong-type",
        "too-large",
    ],
)
def test_bad_payload_is_rejected_at_enqueue_naming_the_field_or_limit(
    app: replayq.App, payload: dict[str, Any], named: str
) -> None:
    with pytest.raises(replayq.PayloadError, match=re.escape(named)):
        app.enqueue("charge", payload)
    assert app.list_jobs() == [], "a rejected payload leaves no job behind"


def test_payload_that_is_not_an_object_is_rejected(app: replayq.App) -> None:
    with pytest.raises(replayq.PayloadError, match="JSON object"):
        app.enqueue("charge", ["account", "a"])  # type: ignore[arg-type]


def test_bulk_enqueue_with_one_bad_payload_enqueues_nothing(app: replayq.App) -> None:
    requests = [
        replayq.EnqueueRequest("charge", {"account": "a", "amount": 1}),
        replayq.EnqueueRequest("charge", {"account": "b"}),
    ]
    with pytest.raises(replayq.PayloadError, match="'amount'"):
        app.enqueue_many(requests)
    assert app.list_jobs() == []


def test_enqueue_of_an_undeclared_type_is_refused_unless_unchecked(app: replayq.App) -> None:
    with pytest.raises(replayq.UnknownJobTypeError, match="'ghost'"):
        app.enqueue("ghost", {})
    assert app.list_jobs() == []
    job_id = app.enqueue("ghost", {"x": 1}, check=False)
    assert app.get_job(job_id).job_type == "ghost"


def test_each_optional_column_is_stored_as_given_whichever_others_are_none(
    app: replayq.App,
) -> None:
    # On SQLite the parameters that are None are written NULL in the insert's text (one
    # statement per set of them): every mix must store exactly what was given.
    @app.job("plain")
    def plain(ctx: replayq.Context, n: int) -> None:
        return None

    given: dict[int, dict[str, str | None]] = {}
    for n in range(8):
        options = {
            "message_id": f"m-{n}" if n & 1 else None,
            "correlation_id": f"c-{n}" if n & 2 else None,
            "causation_id": f"k-{n}" if n & 4 else None,
        }
        job_type, payload = (
            ("charge", {"account": f"a{n}", "amount": n})
            if n % 3
            else (
                "plain",
                {"n": n},
            )
        )
        given[app.enqueue(job_type, payload, **options)] = {  # type: ignore[arg-type]
            **options,
            "ordering_key": f"account:a{n}" if job_type == "charge" else None,
        }
    for job_id, expected in given.items():
        job = app.get_job(job_id)
        stored = {name: getattr(job, name) for name in expected}
        assert stored == expected
        [enqueued] = [e for e in app.trace(job_id) if e.name == "job.enqueued"]
        assert enqueued.data["message_id"] == expected["message_id"]
        assert enqueued.data["causation_id"] == expected["causation_id"]
        assert enqueued.worker_id is None and enqueued.job_id == job_id


HOSTILE = [
    "'; DROP TABLE jobs;--",
    "Robert'); DROP TABLE rq_jobs;--",
    '" OR 1=1 --',
    "%_\\ [*] $1 :name ?",
    "ключ 🔑 日本 \t\n\r",
    " leading and trailing ",
    "{account} {0} {{}}",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_message_ids_and_ordering_keys_round_trip_byte_exact(
    app: replayq.App, text: str
) -> None:
    job_id = app.enqueue("charge", {"account": text, "amount": 1, "note": text}, message_id=text)

    job = app.get_job(job_id)
    assert job.message_id.encode() == text.encode()
    assert job.ordering_key.encode() == f"account:{text}".encode()
    assert job.payload["note"].encode() == text.encode()
    assert app.enqueue("charge", {"account": "x", "amount": 2}, message_id=text) == job_id
    other = app.enqueue("charge", {"account": "x", "amount": 3}, message_id=text + "!")
    assert other != job_id
    assert len(app.list_jobs()) == 2, "the table is intact and holds exactly what was enqueued"
    [leased, *_] = lease_all(app)
    assert leased.ordering_key == f"account:{text}"


def test_a_burst_worker_waits_for_a_job_due_within_burst_wait_and_counts_the_rest(
    app: replayq.App, clock: replayq.FrozenClock
) -> None:
    app.enqueue("charge", {"account": "a", "amount": 1}, delay="10s")
    app.enqueue("charge", {"account": "b", "amount": 1}, delay="1h")

    left = replayq.Worker(app, burst=True, poll_interval=0.01).run()
    assert (left.leased, left.scheduled_later) == (0, 2)
    assert left.next_run_at == clock.now() + 10

    clock.advance(9.99)  # due in 10 ms of frozen time: the worker waits, then runs it
    waiting = replayq.Worker(app, burst=True, burst_wait=60, poll_interval=0.01)
    timer = threading.Timer(0.2, clock.advance, args=(0.02,))
    timer.start()
    stats = waiting.run()
    timer.join()
    assert (stats.succeeded, stats.scheduled_later) == (1, 1)


# -- set-based enqueue: what it writes, and in how many statements ---------------------------


def _readable(event: replayq.TraceEvent) -> tuple[Any, ...]:
    """What the trace readers answer about an event, besides its ids and clocks."""
    data = {k: v for k, v in event.data.items() if k != "message_id"}
    return (
        event.name,
        event.kind,
        event.attempt,
        event.status,
        event.worker_id,
        event.step,
        event.resource,
        event.side_effect,
        data,
    )


def test_a_bulk_enqueue_writes_each_job_the_events_one_by_one_writes(app: replayq.App) -> None:
    from replayq.replay.window import events_between

    requests = [
        replayq.EnqueueRequest(
            "charge", {"account": f"k{n}", "amount": n}, message_id=f"m{n}", priority=n
        )
        for n in range(4)
    ]
    single = [
        app.enqueue(r.job_type, r.payload, message_id=f"one-{r.message_id}", priority=r.priority)
        for r in requests
    ]
    bulk = app.enqueue_many(requests)
    for one, many, request in zip(single, bulk, requests, strict=True):
        [alone], [batched] = app.trace(one), app.trace(many)
        assert _readable(batched) == _readable(alone)
        assert batched.job_id == many and batched.data["message_id"] == request.message_id
        assert batched.trace_id == app.get_job(many).trace_id
        assert batched.hlc == app.get_job(many).hlc and batched.id is not None
    # The by-time reader (``events --since``) and the rq_events view see every job's event.
    window = {w.event.job_id: w for w in events_between(app)}
    for job_id in [*single, *bulk]:
        assert window[job_id].event.name == "job.enqueued" and window[job_id].job_type == "charge"
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute(
            "SELECT job_id, name, attempt, status, count(*) FROM rq_events "
            "GROUP BY job_id, name, attempt, status ORDER BY job_id"
        ).fetchall()
    assert [tuple(r) for r in rows] == [
        (job_id, "job.enqueued", 0, "queued", 1) for job_id in sorted([*single, *bulk])
    ]


def test_a_bulk_enqueue_without_message_ids_stores_each_job_as_one_by_one_does(
    app: replayq.App,
) -> None:
    """No message id, so nothing in the batch can be a duplicate (PostgreSQL then copies the
    rows and packs instead of inserting them): each row and its ``job.enqueued`` event are
    what ``enqueue`` stores, ids in the requests' order, later events in later packs."""
    requests = [
        replayq.EnqueueRequest(
            "charge",
            {"account": f"k{n % 2}", "amount": n, "note": 'é ✓ \\ "q"' * n},
            priority=n,
            delay="1h" if n == 2 else None,
        )
        for n in range(5)
    ]
    single = [
        app.enqueue(r.job_type, r.payload, priority=r.priority, delay=r.delay) for r in requests
    ]
    bulk = app.enqueue_many(requests)
    assert bulk == sorted(bulk) and bulk[0] > single[-1] and len(set(bulk)) == 5

    def stored(job: replayq.Job) -> dict[str, Any]:
        return {k: v for k, v in job.to_dict().items() if k not in ("id", "trace_id", "hlc")}

    for one, many in zip(single, bulk, strict=True):
        alone_job, batched_job = app.get_job(one), app.get_job(many)
        assert stored(batched_job) == stored(alone_job)
        [alone], [batched] = app.trace(one), app.trace(many)
        assert _readable(batched) == _readable(alone)
        assert (batched.job_id, batched.trace_id) == (many, batched_job.trace_id)
        assert batched.hlc == batched_job.hlc and batched.ts == batched_job.created_at
    assert len({app.get_job(i).trace_id for i in bulk}) == 5
    # Leasing appends to the trace after the copied pack: the job's events stay in order.
    for job in lease_all(app):
        if job.id in bulk:
            names = event_names(app, job.id)
            assert names[0] == "job.enqueued" and len(names) >= 2


class _CountingCursor:
    """A driver cursor that counts what it is asked to execute."""

    def __init__(self, cursor: Any, counts: list[str]) -> None:
        self._cursor, self._counts = cursor, counts

    def execute(self, sql: str, params: Any = None) -> Any:
        self._counts.append(sql.split()[0].upper())
        return self._cursor.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        self._counts.append(sql.split()[0].upper())
        return self._cursor.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _CountingConnection:
    """A DB-API connection to the test's database (a framework's wrapper, as it were)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.counts = raw, []

    def cursor(self) -> _CountingCursor:
        return _CountingCursor(self.raw.cursor(), self.counts)


def test_a_bulk_enqueue_writes_its_jobs_and_events_set_based(db_url: str, app: replayq.App) -> None:
    """PostgreSQL: one statement for every row and every ``job.enqueued`` pack. SQLite: one
    insert per row (in-process calls), which writes the row's pack too (the trigger
    ``rq_jobs_enqueued``). Inside the caller's transaction (``conn=``), committed with it."""
    import sqlite3

    app.storage  # noqa: B018 - the schema exists before the caller's transaction
    if db_url.startswith("sqlite"):
        raw: Any = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    else:
        import psycopg

        raw = psycopg.connect(db_url)
    conn = _CountingConnection(raw)
    requests = [replayq.EnqueueRequest("charge", {"account": "a", "amount": n}) for n in range(50)]
    ids = app.enqueue_many(requests, conn=conn)
    raw.commit()
    raw.close()
    if db_url.startswith("sqlite"):
        assert conn.counts == ["INSERT"] * 50
    else:
        assert conn.counts == ["WITH"]
    assert app.count_jobs(states=["queued"]) == 50
    assert [[e.name for e in app.trace(job_id)] for job_id in ids] == [["job.enqueued"]] * 50


def test_when_the_event_cannot_be_written_no_job_is_either(db_url: str, app: replayq.App) -> None:
    """The row and its ``job.enqueued`` pack commit together or not at all, one by one
    (one statement committed by itself on PostgreSQL) and in bulk. On SQLite the pack is
    in the row itself (migration 0023): nothing else is written that could be refused."""
    first = app.enqueue("charge", {"account": "a", "amount": 0})
    sqlite = db_url.startswith("sqlite")
    if sqlite:
        with app.storage.transaction(readonly=True) as tx:
            row = tx.connection.execute(
                "SELECT enqueued IS NOT NULL, enqueued_hlc IS NOT NULL,"
                " (SELECT COUNT(*) FROM rq_trace WHERE job_id = ?) FROM rq_jobs WHERE id = ?",
                (first, first),
            ).fetchone()
        assert tuple(row) == (1, 1, 0)
        assert [e.name for e in app.trace(first)] == ["job.enqueued"]
        return
    refuse = [
        "CREATE FUNCTION rq_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'trace refused'; END $$",
        "CREATE TRIGGER rq_test_refuse BEFORE INSERT ON rq_trace "
        "FOR EACH ROW EXECUTE FUNCTION rq_test_refuse()",
    ]
    with app.storage.transaction() as tx:
        for statement in refuse:
            tx.connection.execute(statement)
    with pytest.raises(replayq.StorageError, match="trace refused"):
        app.enqueue("charge", {"account": "b", "amount": 1}, message_id="m1")
    with pytest.raises(replayq.StorageError, match="trace refused"):
        app.enqueue_many(
            [replayq.EnqueueRequest("charge", {"account": "c", "amount": n}) for n in range(3)]
        )
    assert [job.payload["account"] for job in app.list_jobs()] == ["a"]
    with app.storage.transaction() as tx:
        tx.connection.execute("DROP TRIGGER rq_test_refuse ON rq_trace")
    # The refused message id was not taken: the same enqueue now makes the job.
    job_id = app.enqueue("charge", {"account": "b", "amount": 1}, message_id="m1")
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
