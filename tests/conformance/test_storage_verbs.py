"""The storage verbs, one behaviour at a time, on every backend (``db_url`` is parametrized).

Each test drives ``storage.protocol.Transaction`` directly: what a verb promises
(compare-and-set on owner tokens and claims, first write wins, the filters of
the merged readers) must hold the same on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from msgspec import structs

from replayq.errors import ConfigurationError, StorageError
from replayq.model import Job, JobState, TraceEvent
from replayq.storage import open_storage
from replayq.storage.commits import CommitRefused
from replayq.storage.context_params import (
    LineageQuery,
    LockFilter,
    LockRelease,
    LockReleaseInTime,
    LockRenew,
    OutboxClaim,
)
from replayq.storage.params import (
    ActiveVersion,
    CancelRequested,
    ComparisonPut,
    ComparisonQuery,
    ContractActivate,
    ContractPut,
    ContractQuery,
    LeasesExpired,
    RoutingHistory,
    RoutingPut,
    RoutingQuery,
)
from replayq.storage.protocol import (
    BlobPut,
    BranchCreate,
    CacheDelete,
    CacheLookup,
    CachePut,
    EntityFilter,
    EntityGet,
    EntityRecord,
    IdemClaim,
    IdemCompensate,
    IdemFail,
    IdemFilter,
    IdemResolve,
    IdemSucceed,
    IdemTakeover,
    JobBury,
    JobCancel,
    JobCancelRequest,
    JobCancelRunning,
    JobFilter,
    JobInsert,
    JobLease,
    JobRedeliver,
    JobRequeue,
    JobReroute,
    JobRetry,
    JobRoute,
    JobsComplete,
    LeaseRelease,
    LeasesExtend,
    LineagePut,
    Listener,
    Lock,
    LockAcquire,
    LockGrant,
    OutboxInsert,
    OutboxMark,
    ScheduleAdvance,
    ScheduleMade,
    ScheduleRegister,
    Storage,
    TraceFence,
    TraceJobs,
    TraceQuery,
    idem_get,
    lock_get,
)
from replayq.storage.reports import (
    JobCount,
    JobDurations,
    JobGauges,
    JobsScheduled,
    JobStats,
    OutboxPending,
    OutOfOrder,
    SignalCounts,
    SignalSeries,
    VersionOutcomes,
)

T0 = 1_700_000_000.0


@pytest.fixture
def storage(db_url: str) -> Iterator[Storage]:
    store = open_storage(db_url)
    store.migrate(T0)
    yield store
    store.close()


def insert(job_type: str = "t", **overrides: Any) -> JobInsert:
    fields: dict[str, Any] = {
        "job_type": job_type,
        "queue": "default",
        "payload_json": '{"n":1}',
        "priority": 0,
        "run_at": T0,
        "now": T0,
        "max_attempts": 3,
        "trace_id": "trace",
        "hlc": 1,
    }
    fields.update(overrides)
    return JobInsert(**fields)


def lease(now: float = T0 + 1, limit: int = 10, owner: str = "tok") -> JobLease:
    return JobLease(
        worker_id="w",
        owner_token=owner,
        now=now,
        hlc=2,
        limit=limit,
        default_lease_seconds=30.0,
        lease_for={"short": 5.0},
        version_for={"t": "v7"},
    )


def leased_job(storage: Storage, **overrides: Any) -> int:
    with storage.transaction() as tx:
        job_id, _ = tx.job_insert(insert(**overrides))
        assert [j.id for j in tx.job_lease(lease())] == [job_id]
    return job_id


# -- jobs -----------------------------------------------------------------------------------


def test_enqueue_lease_complete_round_trip(storage: Storage) -> None:
    with storage.transaction() as tx:
        job_id, created = tx.job_insert(insert(message_id="m1", payload_json='{"a":[1,"é"]}'))
        again, created_again = tx.job_insert(insert(message_id="m1"))
    assert created and not created_again and again == job_id
    with storage.transaction() as tx:
        [job] = tx.job_lease(lease())
    assert job.id == job_id and job.state is JobState.RUNNING and job.attempt == 1
    assert job.payload == {"a": [1, "é"]} and job.handler_version == "v7"
    assert job.lease_deadline == pytest.approx(T0 + 31)
    with storage.transaction() as tx:
        assert tx.jobs_complete(JobsComplete(T0 + 2, [(job_id, "someone else", "1", 3)])) == set()
        assert tx.jobs_complete(JobsComplete(T0 + 2, [(job_id, "tok", '{"ok":true}', 3)])) == {
            job_id
        }
    with storage.transaction(readonly=True) as tx:
        done = tx.job_get(job_id)
    assert done is not None and done.state is JobState.SUCCEEDED and done.result == {"ok": True}


def leased_event(job: Job) -> TraceEvent:
    return event("job.leased", 10, trace_id=job.trace_id, job_id=job.id, attempt=job.attempt)


def test_a_pipelined_end_commits_what_it_sent_and_an_exception_in_it_commits_nothing(
    storage: Storage,
) -> None:
    """``pipelined``: the compare-and-set sent and read later (``jobs_complete_sent``), a
    lease and its packs commit together at the block's end; an exception raised in the
    block after the answer was read (a refused ack) rolls all of it back, and the
    connection serves the next transaction as before."""
    refused, job_id = leased_job(storage), leased_job(storage)
    with storage.transaction() as tx:
        next_id, _ = tx.job_insert(insert())
    with pytest.raises(_Abandoned), storage.transaction() as tx, tx.pipelined():
        held = tx.jobs_complete_sent(
            JobsComplete(T0 + 2, [(refused, "someone else", "1", 3), (job_id, "tok", "2", 3)])
        )
        [job] = tx.job_lease(lease(owner="next"))
        assert job.id == next_id
        tx.trace_append([leased_event(job)])
        assert held() == {job_id}, "the refused row is not in the answer"
        raise _Abandoned
    with storage.transaction(readonly=True) as tx:
        assert [j.state for j in map(tx.job_get, (refused, job_id, next_id))] == [
            JobState.RUNNING,
            JobState.RUNNING,
            JobState.QUEUED,
        ]
        assert [e.name for e in tx.trace_query(TraceQuery(job_id=next_id))] == ["job.enqueued"]
    with storage.transaction() as tx, tx.pipelined():
        held = tx.jobs_complete_sent(JobsComplete(T0 + 2, [(job_id, "tok", "2", 3)]))
        [job] = tx.job_lease(lease(owner="next"))
        tx.trace_append([leased_event(job)])
        assert held() == {job_id}
    with storage.transaction(readonly=True) as tx:
        done, leased = tx.job_get(job_id), tx.job_get(next_id)
        assert done is not None and done.state is JobState.SUCCEEDED and done.result == 2
        assert leased is not None and leased.owner_token == "next"
        names = [e.name for e in tx.trace_query(TraceQuery(job_id=next_id))]
        assert names == ["job.enqueued", "job.leased"]


class _Abandoned(Exception):
    """Raised inside a transaction to roll it back."""


@pytest.mark.parametrize("claim_first", [True, False], ids=["claim-first", "after-a-read"])
def test_a_lease_is_undone_with_the_transaction_it_was_taken_in(
    storage: Storage, claim_first: bool
) -> None:
    """A claim belongs to its transaction, whether or not it is the transaction's first
    statement: rolled back with it, it leaves the job queued as it was. (PostgreSQL
    committed a first-statement claim on its own: a worker killed before its commit left
    the job leased, with no ``job.leased`` in its trace.)"""
    with storage.transaction() as tx:
        job_id, _ = tx.job_insert(insert())
    with pytest.raises(_Abandoned), storage.transaction() as tx:
        if not claim_first:
            assert tx.job_get(job_id) is not None
        assert [j.id for j in tx.job_lease(lease())] == [job_id]
        raise _Abandoned
    with storage.transaction(readonly=True) as tx:
        job = tx.job_get(job_id)
    assert job is not None
    assert (job.state, job.attempt, job.owner_token, job.worker_id) == (
        JobState.QUEUED,
        0,
        None,
        None,
    )


@pytest.mark.parametrize("ordered", [None, False, True])
def test_a_group_of_acks_completes_exactly_the_jobs_its_tokens_still_hold(
    storage: Storage, ordered: bool | None
) -> None:
    """One statement for a group commit's acks: each row is its own compare-and-set, and
    every job it completes carries its own result and hlc and the group's exact time.
    Whether the caller says the jobs have ordering keys or not (SQLite then counts the
    rows changed, and names them from what the statement left when some acks held)."""
    with storage.transaction() as tx:
        ids = [tx.job_insert(insert(message_id=f"m{n}"))[0] for n in range(4)]
        leased = tx.job_lease(lease(limit=3))
    assert [j.id for j in leased] == ids[:3]  # the fourth stays queued
    finished = T0 + 2.123456789012345  # a time SQLite's JSON would not give back exactly
    acks = [
        (ids[0], "tok", '{"n":0}', 11),
        (ids[1], "someone else", '{"n":1}', 12),  # the lease went to another worker
        (ids[2], "tok", None, 13),
        (ids[3], "tok", '{"n":3}', 14),  # never leased
    ]
    with storage.transaction() as tx:
        assert tx.jobs_complete(JobsComplete(finished, acks, ordered)) == {ids[0], ids[2]}
        jobs = [tx.job_get(job_id) for job_id in ids]
    assert all(job is not None for job in jobs)
    done = [(j.state, j.result, j.hlc, j.finished_at, j.owner_token) for j in jobs if j]
    assert done[0] == (JobState.SUCCEEDED, {"n": 0}, 11, finished, None)
    assert done[2] == (JobState.SUCCEEDED, None, 13, finished, None)
    assert [d[0] for d in (done[1], done[3])] == [JobState.RUNNING, JobState.QUEUED]
    assert done[1][4] == "tok"


def test_a_group_commit_gives_back_its_texts_times_and_clocks_exactly(storage: Storage) -> None:
    """A group commit's acks and packs (the packs one JSON parameter on PostgreSQL):
    escapes, quotes, backslashes, characters outside the BMP, a float time to the last
    bit and a 63-bit clock read back as they were written."""
    text = 'quote " backslash \\ nul \\u0000 tab \\t é 𝄞 \u2028'
    result = json.dumps({"s": text})
    finished = T0 + 0.1 + 0.2  # not T0 + 0.3: its last bits count
    hlc = 2**62 + 12345
    with storage.transaction() as tx:
        ids = [tx.job_insert(insert(message_id=f"m{n}"))[0] for n in range(2)]
        tx.job_lease(lease(limit=2))
    with storage.transaction() as tx:
        assert tx.jobs_complete(JobsComplete(finished, [(i, "tok", result, hlc) for i in ids]))
        tx.trace_append(
            [
                TraceEvent(
                    trace_id="trace", name=f"e{i}", ts=finished, hlc=hlc, job_id=i, data={"s": text}
                )
                for i in ids
            ]
        )
    with storage.transaction(readonly=True) as tx:
        jobs = [tx.job_get(i) for i in ids]
        events = [e for i in ids for e in tx.trace_query(TraceQuery(job_id=i))]
    assert [(j.result, j.hlc, j.finished_at) for j in jobs if j] == [
        ({"s": text}, hlc, finished)
    ] * 2
    assert [e.name for e in events] == [n for i in ids for n in ("job.enqueued", f"e{i}")]
    assert [(e.name, e.data, e.ts, e.hlc) for e in events if e.name != "job.enqueued"] == [
        (f"e{i}", {"s": text}, finished, hlc) for i in ids
    ]


def test_retry_then_bury_are_compare_and_set_on_the_owner_token(storage: Storage) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        retry = JobRetry(job_id, "tok", T0 + 2, T0 + 10, "transient", "boom", 3)
        assert tx.job_transition(retry)
        assert not tx.job_transition(retry)
        assert tx.job_lease(lease(now=T0 + 5)) == []  # not due yet
        [again] = tx.job_lease(lease(now=T0 + 10, owner="tok2"))
        assert again.attempt == 2 and again.last_error_class == "transient"
        assert not tx.job_transition(JobBury(job_id, "tok", T0 + 11, "x", None, None, 4))
        assert tx.job_transition(JobBury(job_id, "tok2", T0 + 11, "gave up", "unknown", "e", 4))
        dead = tx.job_get(job_id)
    assert dead is not None and dead.state is JobState.DEAD and dead.dead_reason == "gave up"


def test_expired_lease_is_reaped_and_redelivered_once(storage: Storage) -> None:
    job_id = leased_job(storage, job_type="short")
    with storage.transaction() as tx:
        assert tx.lease_extend(LeasesExtend(((job_id, "not the owner", 5.0),), T0 + 2)) == set()
        assert tx.job_list(LeasesExpired(T0 + 5, 10)) == []
        [expired] = tx.job_list(LeasesExpired(T0 + 7, 10))
        assert expired.owner_token == "tok"
        assert tx.job_transition(JobRedeliver(job_id, "tok", T0 + 7, 5))
        assert not tx.job_transition(JobRedeliver(job_id, "tok", T0 + 7, 5))
        assert tx.jobs_complete(JobsComplete(T0 + 8, [(job_id, "tok", None, 6)])) == set()
        requeued = tx.job_get(job_id)
    assert requeued is not None and requeued.state is JobState.QUEUED
    assert requeued.redelivery_count == 1


def test_an_extended_lease_is_not_reaped(storage: Storage) -> None:
    job_id = leased_job(storage, job_type="short")  # lease ends at T0 + 6
    with storage.transaction() as tx:
        assert tx.lease_extend(LeasesExtend(((job_id, "tok", 5.0),), T0 + 5)) == {job_id}
        assert tx.job_list(LeasesExpired(T0 + 7, 10)) == []
        assert [j.id for j in tx.job_list(LeasesExpired(T0 + 11, 10))] == [job_id]


def test_one_heartbeat_statement_extends_each_lease_by_its_own_length_and_names_the_lost(
    storage: Storage,
) -> None:
    first = leased_job(storage, job_type="short")  # token "tok", leases end at T0 + 6
    with storage.transaction() as tx:
        second, _ = tx.job_insert(insert(job_type="short"))
        third, _ = tx.job_insert(insert(job_type="short"))
        assert {j.id for j in tx.job_lease(lease(owner="tok2"))} == {second, third}
    with storage.transaction() as tx:
        beat = LeasesExtend(
            ((first, "tok", 5.0), (second, "tok2", 20.0), (third, "tok2", 5.0)), T0 + 5
        )
        assert tx.lease_extend(beat) == {first, second, third}
        # A row is matched with its own token: another lease's token extends nothing.
        assert tx.lease_extend(LeasesExtend(((first, "tok2", 50.0),), T0 + 5)) == set()
        assert tx.job_transition(JobRedeliver(third, "tok2", T0 + 11, 5))
        # The lost one is missing from the answer; the others were extended all the same.
        assert tx.lease_extend(structs.replace(beat, now=T0 + 11)) == {first, second}
        assert tx.lease_extend(LeasesExtend((), T0 + 11)) == set()
        assert tx.job_list(LeasesExpired(T0 + 15, 10)) == []
        assert [j.id for j in tx.job_list(LeasesExpired(T0 + 17, 10))] == [first]
        assert sorted(j.id for j in tx.job_list(LeasesExpired(T0 + 32, 10))) == [first, second]


def test_a_job_given_back_unstarted_is_as_if_never_leased(storage: Storage) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        leased = tx.job_get(job_id)
        assert not tx.job_transition(LeaseRelease(job_id, "not the owner", T0 + 2, 3, False))
        assert tx.job_transition(LeaseRelease(job_id, "tok", T0 + 2, 3, started=False))
        back = tx.job_get(job_id)
    assert leased is not None and back is not None
    assert back.state is JobState.QUEUED and back.owner_token is None
    assert (back.attempt, back.max_attempts, back.run_at) == (0, leased.max_attempts, T0)
    with storage.transaction() as tx:
        [again] = tx.job_lease(lease(now=T0 + 3, owner="tok2"))
    assert again.id == job_id and again.attempt == 1


def test_a_lease_passes_over_the_jobs_it_is_told_to_skip(storage: Storage) -> None:
    """``JobLease.skip_ids``: a worker's lease after a job's start raised passes it over,
    so that another job, behind it in the queue, is started in between."""
    with storage.transaction() as tx:
        first, _ = tx.job_insert(insert(message_id="a"))
        second, _ = tx.job_insert(insert(message_id="b"))
        third, _ = tx.job_insert(insert(message_id="c"))
    with storage.transaction() as tx:
        skipped = tx.job_lease(structs.replace(lease(limit=1), skip_ids=[first]))
        none = tx.job_lease(structs.replace(lease(limit=5), skip_ids=[first, third]))
        rest = tx.job_lease(lease(limit=5))
    assert [j.id for j in skipped] == [second]
    assert none == []  # the one job left that is not skipped is held already
    assert sorted(j.id for j in rest) == [first, third]  # passed over, not lost


def test_with_the_database_clock_a_caller_30_s_off_neither_reaps_nor_shortens_a_lease(
    storage: Storage,
) -> None:
    """Leases judged by the database's clock (SQLite's, the PostgreSQL server's): the
    ``now`` of a worker whose clock is 30 s fast or slow moves no deadline."""
    fast, slow = time.time() + 30, time.time() - 30
    by_database = {"short": 0.5}
    with storage.transaction() as tx:
        job_id, _ = tx.job_insert(insert(job_type="short", run_at=T0))
        claim = structs.replace(lease(now=fast), lease_for=by_database, database_clock=True)
        [job] = tx.job_lease(claim)
    assert job.leased_at is not None and job.lease_deadline is not None
    assert abs(job.leased_at - time.time()) < 5, "granted in the database's time, not the caller's"
    assert job.lease_deadline - job.leased_at == pytest.approx(0.5)
    with storage.transaction() as tx:
        # A fast worker's now would reap it (its own clock says the lease ran out 29 s ago)...
        assert [j.id for j in tx.job_list(LeasesExpired(fast, 10))] == [job_id]
        # ... the database's clock does not; nor does a slow worker's extension shorten it.
        assert tx.job_list(LeasesExpired(fast, 10, database_clock=True)) == []
        beat = LeasesExtend(((job_id, "tok", 0.5),), slow, database_clock=True)
        assert tx.lease_extend(beat) == {job_id}
        extended = tx.job_get(job_id)
    assert extended is not None and extended.lease_deadline is not None
    assert extended.lease_deadline > job.lease_deadline - 0.01
    time.sleep(0.6)
    with storage.transaction() as tx:
        # Past the deadline by the database's clock: reaped, even by a worker 30 s slow.
        assert tx.job_list(LeasesExpired(slow, 10)) == []
        assert [j.id for j in tx.job_list(LeasesExpired(slow, 10, database_clock=True))] == [job_id]


def test_a_batch_claim_honours_priority_and_run_at(storage: Storage) -> None:
    with storage.transaction() as tx:
        low, _ = tx.job_insert(insert(priority=0))
        high, _ = tx.job_insert(insert(priority=5))
        tx.job_insert(insert(priority=9, run_at=T0 + 100))
        early, _ = tx.job_insert(insert(priority=0, run_at=T0 - 1000))
        jobs = tx.job_lease(lease(limit=10))
    assert [j.id for j in jobs] == [high, early, low]


def test_concurrent_batch_claims_never_hand_one_job_to_two_workers(storage: Storage) -> None:
    with storage.transaction() as tx:
        for n in range(200):
            tx.job_insert(insert(payload_json=f'{{"n":{n}}}'))
    claimed: dict[str, list[int]] = defaultdict(list)

    def claim(token: str) -> None:
        while True:
            with storage.transaction() as tx:
                jobs = tx.job_lease(lease(limit=7, owner=token))
            if not jobs:
                return
            claimed[token].extend(j.id for j in jobs)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    every = [job_id for ids in claimed.values() for job_id in ids]
    assert len(every) == len(set(every)) == 200


def test_a_running_job_is_cancelled_only_after_it_was_asked_and_only_by_its_owner(
    storage: Storage,
) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        assert not tx.job_transition(JobCancel(job_id, T0 + 2, 3)), "running: ask, not cancel"
        assert not tx.job_transition(JobCancelRunning(job_id, "tok", T0 + 2, 3)), "not asked"
        assert tx.job_transition(JobCancelRequest(job_id, T0 + 2, 3))
        assert not tx.job_transition(JobCancelRequest(job_id, T0 + 2, 3)), "asked once"
        assert {j.id for j in tx.job_list(CancelRequested("w"))} == {job_id}
        assert not tx.job_transition(JobCancelRunning(job_id, "other", T0 + 3, 4))
        assert tx.job_transition(JobCancelRunning(job_id, "tok", T0 + 3, 4))
        job = tx.job_get(job_id)
    assert job is not None and job.state is JobState.CANCELLED


def test_a_dead_job_is_requeued_with_more_attempts_and_a_queued_one_cancelled(
    storage: Storage,
) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        assert not tx.job_transition(JobRequeue(job_id, T0 + 2, 3)), "only a dead job"
        assert not tx.job_transition(JobBury(job_id, None, T0 + 2, "x", None, None, 3)), "running"
        assert tx.job_transition(JobBury(job_id, "tok", T0 + 2, "gave up", None, None, 3))
        assert tx.job_transition(JobRequeue(job_id, T0 + 3, 4, extra_attempts=2, to_version="v2"))
        job = tx.job_get(job_id)
        assert job is not None and job.state is JobState.QUEUED
        assert (job.max_attempts, job.handler_version) == (job.attempt + 2, "v2")
        assert tx.job_transition(JobCancel(job_id, T0 + 4, 5))
        assert not tx.job_transition(JobCancel(job_id, T0 + 4, 5))
        queued, _ = tx.job_insert(insert(message_id="unrunnable"))
        assert tx.job_transition(JobBury(queued, None, T0 + 5, "unknown type", None, None, 6))


def test_a_released_lease_gives_the_job_back_with_one_more_attempt(storage: Storage) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        assert not tx.job_transition(LeaseRelease(job_id, "other", T0 + 2, 3))
        assert tx.job_transition(LeaseRelease(job_id, "tok", T0 + 2, 3))
        job = tx.job_get(job_id)
    assert job is not None and job.state is JobState.QUEUED
    assert (job.attempt, job.max_attempts, job.owner_token) == (1, 4, None)


def test_a_version_is_routed_by_the_owner_and_rerouted_while_queued(storage: Storage) -> None:
    job_id = leased_job(storage, job_type="untyped")  # no version chosen at lease
    with storage.transaction() as tx:
        assert not tx.job_transition(JobRoute(job_id, "other", "v1"))
        assert tx.job_transition(JobRoute(job_id, "tok", "v1"))
        queued, _ = tx.job_insert(insert("untyped", handler_version="v1"))
        assert not tx.job_transition(JobRoute(queued, "tok", "v3")), "not leased"
        assert tx.job_transition(JobReroute("untyped", "v1", "v2")) == 1
        running, moved = tx.job_get(job_id), tx.job_get(queued)
    assert running is not None and running.handler_version == "v1", "running jobs stay"
    assert moved is not None and moved.handler_version == "v2"


def test_job_list_filters_by_state_and_type(storage: Storage) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        other, _ = tx.job_insert(insert("other"))
        running = tx.job_list(JobFilter(states=["running"]))
        of_type = tx.job_list(JobFilter(job_type="other"))
    assert [j.id for j in running] == [job_id]
    assert [j.id for j in of_type] == [other]


# -- trace ----------------------------------------------------------------------------------


def event(name: str, hlc: int, **fields: Any) -> TraceEvent:
    return TraceEvent(trace_id=fields.pop("trace_id", "tr"), name=name, ts=T0, hlc=hlc, **fields)


def test_trace_query_reads_a_job_a_trace_or_a_resource_in_hlc_order(storage: Storage) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        tx.trace_append(
            [
                event("b", 20, job_id=job_id, resource="price:sku-1"),
                event("a", 10, job_id=job_id, resource="price:sku-1:v3"),
                event("derived", 15, trace_id="fork-1", resource="price:sku-10"),
                event("other", 30, trace_id="fork-1", resource="price:sku-1:x"),
            ]
        )
    with storage.transaction(readonly=True) as tx:
        by_job = [e.name for e in tx.trace_query(TraceQuery(job_id=job_id))]
        by_trace = [e.name for e in tx.trace_query(TraceQuery(trace_id="fork-1"))]
        by_resource = [e.name for e in tx.trace_query(TraceQuery(resource="price:sku-1"))]
        with pytest.raises(ConfigurationError, match="job_id"):
            tx.trace_query(TraceQuery())
    assert by_job == ["job.enqueued", "a", "b"]
    assert by_trace == ["derived", "other"]
    assert by_resource == ["a", "b"], "the resource and its versioned keys, nothing else"


def test_a_fenced_trace_append_writes_only_while_the_owner_token_holds_the_lease(
    storage: Storage,
) -> None:
    """The lease check of a step's commit is the append of its events: refused (nothing
    appended, the index untouched) once the lease was reaped, and for any other token."""
    job_id = leased_job(storage, job_type="short")
    held, other = TraceFence(job_id, "tok"), TraceFence(job_id, "not the owner")
    with storage.transaction() as tx:
        assert not tx.trace_append([event("stolen", 10, job_id=job_id, resource="r:1")], other)
        assert tx.trace_append([event("kept", 11, job_id=job_id, resource="r:1")], held)
        assert tx.trace_append([], held), "no events: the lease is still asked"
        assert not tx.trace_append([], other)
    with storage.transaction() as tx:
        [expired] = tx.job_list(LeasesExpired(T0 + 7, 10))
        assert tx.job_transition(JobRedeliver(job_id, "tok", T0 + 7, 5))
    with storage.transaction() as tx:
        assert not tx.trace_append([event("late", 12, job_id=job_id, resource="r:2")], held)
        assert tx.trace_append([event("unfenced", 13, job_id=job_id)]), "no fence: appended"
    with storage.transaction(readonly=True) as tx:
        names = [e.name for e in tx.trace_query(TraceQuery(job_id=job_id))]
        indexed = [e.name for r in ("r:1", "r:2") for e in tx.trace_query(TraceQuery(resource=r))]
    assert expired.id == job_id
    assert names == ["job.enqueued", "kept", "unfenced"]
    assert indexed == ["kept"]


def test_trace_jobs_reads_several_jobs_events_in_one_query_as_trace_query_does(
    storage: Storage,
) -> None:
    first, second, idle = leased_job(storage), leased_job(storage), leased_job(storage)
    with storage.transaction() as tx:
        tx.trace_append([event("b", 20, job_id=first), event("x", 12, job_id=second)])
    with storage.transaction() as tx:
        tx.trace_append([event("a", 10, job_id=first), event("y", 14, job_id=second)])
        tx.trace_append([event("derived", 11, trace_id="fork-2")])
    with storage.transaction(readonly=True) as tx:
        both = {
            t.job_id: t.events for t in tx.trace_query(TraceJobs([first, second, idle, 10_000]))
        }
        one = {n: tx.trace_query(TraceQuery(job_id=n)) for n in (first, second, idle)}
    assert set(both) == {first, second, idle}, "every job has its job.enqueued; no job: absent"
    assert [e.name for e in both[first]] == ["job.enqueued", "a", "b"]
    assert [e.name for e in both[second]] == ["job.enqueued", "x", "y"]
    assert [e.name for e in both[idle]] == ["job.enqueued"]
    assert both == one


# -- effects --------------------------------------------------------------------------------


def claim(key: str, token: str, job_id: int | None = None) -> IdemClaim:
    return IdemClaim(key, "email.send", token, T0, "tr", job_id, 1)


def test_an_idempotency_key_is_claimed_once_and_settled_only_by_its_claim(
    storage: Storage,
) -> None:
    with storage.transaction() as tx:
        assert tx.idem_transition(claim("k1", "c1"))
        assert not tx.idem_transition(claim("k1", "c2")), "one claim per key"
        assert not tx.idem_transition(IdemSucceed("k1", "c2", "1", None, T0 + 1))
        assert not tx.idem_transition(IdemCompensate("k1", T0 + 1)), "not succeeded yet"
        assert tx.idem_transition(IdemSucceed("k1", "c1", '{"id": 7}', None, T0 + 1))
        assert not tx.idem_transition(IdemFail("k1", "c1", "late", T0 + 2)), "settled"
        assert tx.idem_transition(IdemCompensate("k1", T0 + 3))
        record = idem_get(tx, "k1")
    assert record is not None
    assert (record.status, record.result, record.claim_token) == ("compensated", '{"id": 7}', "c1")


def test_a_takeover_and_a_resolution_are_compare_and_set_on_the_claim_read(
    storage: Storage,
) -> None:
    job_id = leased_job(storage)
    with storage.transaction() as tx:
        assert tx.idem_transition(claim("k2", "c1", job_id))
        assert tx.idem_transition(IdemFail("k2", "c1", "boom", T0 + 1))
        take = IdemTakeover("k2", "c2", T0 + 2, "tr", job_id, 2, "failed", "c1")
        assert tx.idem_transition(take)
        assert not tx.idem_transition(take), "the claim moved on"
        resolve = IdemResolve("k2", "c1", "succeeded", '"ok"', None, T0 + 3)
        assert not tx.idem_transition(resolve), "resolved against a stale claim"
        assert tx.idem_transition(IdemResolve("k2", "c2", "failed", None, "gone", T0 + 3))
        by_job = tx.idem_list(IdemFilter(job_id=job_id))
        assert idem_get(tx, "missing") is None
    assert [(r.key, r.status, r.error) for r in by_job] == [("k2", "failed", "gone")]


def test_in_doubt_lists_started_records_whose_attempt_no_longer_runs(storage: Storage) -> None:
    running = leased_job(storage)
    with storage.transaction() as tx:
        finished, _ = tx.job_insert(insert(message_id="finished"))
        assert tx.idem_transition(claim("live", "c1", running))
        assert tx.idem_transition(claim("orphan", "c2", finished))
        in_doubt = tx.idem_list(IdemFilter(in_doubt=True))
        everything = tx.idem_list(IdemFilter(operation="email.send"))
    assert [(r.key, r.in_doubt) for r in in_doubt] == [("orphan", True)]
    assert {(r.key, r.in_doubt) for r in everything} == {("live", False), ("orphan", True)}


# -- state ----------------------------------------------------------------------------------


def version(key: str, number: int, hlc: int, branch: str = "main", job_id: int | None = None):  # type: ignore[no-untyped-def]
    return EntityRecord(
        branch, "order", key, number, number - 1 or None, f'{{"v":{number}}}', None, "{}",
        job_id, None, None, None, T0 + number, hlc,
    )  # fmt: skip


def test_entity_writes_are_compare_and_set_on_the_head_and_readable_three_ways(
    storage: Storage,
) -> None:
    with storage.transaction() as tx:
        assert tx.entity_put(version("1", 1, 100), 0)
        assert not tx.entity_put(version("1", 1, 101), 0), "exists already"
        assert tx.entity_put(version("1", 2, 200, job_id=9), 1)
        assert not tx.entity_put(version("1", 3, 300), 1), "stale expected version"
        tx.entity_put(version("1", 3, 300), None)  # imported: the head stays at 2
        head = tx.entity_get(EntityGet("main", "order", "1"))
        second = tx.entity_get(EntityGet("main", "order", "1", version=2))
        as_of = tx.entity_get(EntityGet("main", "order", "1", at_hlc=150))
        after = tx.entity_list(EntityFilter(branch="main", namespace="order", key="1"))
        later = tx.entity_list(
            EntityFilter(branch="main", namespace="order", key="1", after_version=1)
        )
        by_job = tx.entity_list(EntityFilter(job_id=9))
        missing = tx.entity_get(EntityGet("main", "order", "2"))
    assert head is not None and (head.version, head.hlc, head.data) == (2, 200, '{"v":2}')
    assert second is not None and second.job_id == 9
    assert as_of is not None and as_of.version == 1
    assert [v.version for v in after] == [1, 2, 3] and [v.version for v in later] == [2, 3]
    assert [v.version for v in by_job] == [2] and missing is None


def test_a_branch_is_created_once_with_its_base(storage: Storage) -> None:
    with storage.transaction() as tx:
        tx.branch_create(BranchCreate("fork:1", "main", 150, "fork", T0))
        branch = tx.branch_get("fork:1")
        assert tx.branch_get("fork:2") is None
    assert branch is not None and (branch.base_branch, branch.base_hlc) == ("main", 150)


def test_a_branch_created_with_versions_holds_each_entity_at_its_last_one(
    storage: Storage,
) -> None:
    """A dry-run's branch is stored at its end with the versions its run wrote: read back
    as its steps' commits one by one would have left them; never on a branch that exists."""
    rows = [
        version("1", 1, 100, "replay:1"),
        version("2", 1, 110, "replay:1"),
        version("1", 2, 120, "replay:1"),
    ]
    with storage.transaction() as tx:
        tx.branch_create(BranchCreate("replay:1", "main", 150, "replay", T0), rows)
        first = tx.entity_get(EntityGet("replay:1", "order", "1"))
        second = tx.entity_get(EntityGet("replay:1", "order", "2"))
        listed = tx.entity_list(EntityFilter(branch="replay:1", namespace="order", key="1"))
        assert not tx.entity_put(version("1", 3, 130, "replay:1"), 1), "the head is at 2"
        assert tx.entity_put(version("1", 3, 130, "replay:1"), 2)
        branch = tx.branch_get("replay:1")
    assert first is not None and (first.version, first.hlc, first.data) == (2, 120, '{"v":2}')
    assert second is not None and (second.version, second.hlc) == (1, 110)
    assert [v.version for v in listed] == [1, 2]
    assert branch is not None and (branch.base_branch, branch.base_hlc) == ("main", 150)
    with pytest.raises(StorageError), storage.transaction() as tx:
        tx.branch_create(
            BranchCreate("replay:1", "main", 160, "replay", T0), [version("3", 1, 140, "replay:1")]
        )
    with storage.transaction(readonly=True) as tx:
        assert tx.entity_get(EntityGet("replay:1", "order", "3")) is None


def test_a_branchs_first_write_starts_its_head_there_and_later_ones_compare_and_set(
    storage: Storage,
) -> None:
    """``entity_put(copy_on_write=True)``: a branch's first write of an entity starts its
    head there, whatever version it was written on (the branch read it through to its
    base); later ones compare-and-set on that head, as on main. The base stays as it was.
    (On PostgreSQL, in a commit in one round trip, one statement that refuses where these
    answer ``False``: ``test_postgres_pipelined_commit``.)"""

    def put(number: int, hlc: int, expected: int) -> bool:
        return tx.entity_put(version("1", number, hlc, "fork:1"), expected, copy_on_write=True)

    with storage.transaction() as tx:
        assert tx.entity_put(version("1", 1, 100), 0) and tx.entity_put(version("1", 2, 110), 1)
        tx.branch_create(BranchCreate("fork:1", "main", 150, "fork", T0))
        assert put(3, 160, 2), "started on the base's version 2, read through"
        assert not put(3, 161, 2), "the branch's head is at 3 now"
        assert not put(4, 162, 0), "a new entity's write, but the branch has its head"
        assert put(4, 170, 3)
        head = tx.entity_get(EntityGet("fork:1", "order", "1"))
        base = tx.entity_get(EntityGet("main", "order", "1"))
        listed = tx.entity_list(EntityFilter(branch="fork:1", namespace="order", key="1"))
    assert head is not None and (head.version, head.hlc) == (4, 170)
    assert base is not None and (base.version, base.hlc) == (2, 110)
    assert [(v.version, v.hlc) for v in listed] == [(3, 160), (4, 170)]


# -- locks ----------------------------------------------------------------------------------


def acquire(owner: str, now: float, hlc: int) -> LockAcquire:
    return LockAcquire("res", owner, None, f"worker-{owner}", now, 10.0, hlc)


def test_with_the_database_clock_a_worker_30_s_fast_cannot_take_a_live_lock(
    storage: Storage,
) -> None:
    """Lock TTLs judged like leases: by the database's clock, whatever the caller's says."""
    fast, slow = time.time() + 30, time.time() - 30

    def take(owner: str, now: float) -> LockAcquire:
        return LockAcquire("res", owner, None, owner, now, 0.5, 1, database_clock=True)

    with storage.transaction() as tx:
        assert tx.lock_transition(take("a", slow)) is not None
        held = lock_get(tx, "res")
    assert held is not None and held.expires_at is not None and held.acquired_at is not None
    assert abs(held.acquired_at - time.time()) < 5, "granted in the database's time"
    assert not held.expired
    with storage.transaction() as tx:
        # Its own clock says the lock ran out 29.5 s ago; the database's says it is live.
        assert tx.lock_transition(take("b", fast)) is None
        assert tx.lock_transition(acquire("b", fast, 2)) is not None, "a caller's now decides"
        assert tx.lock_transition(LockRelease("res", "b", 3)) is not None
        assert tx.lock_transition(take("a", slow)) is not None
        assert tx.lock_transition(LockRenew("res", "a", slow, 0.5, database_clock=True))
    time.sleep(0.6)
    with storage.transaction() as tx:
        over = lock_get(tx, "res")
        assert over is not None and over.expired, "past its TTL by the database's clock"
        assert lock_get(tx, "res", now=slow) is not None
        assert not lock_get(tx, "res", now=slow).expired  # type: ignore[union-attr]
        assert tx.lock_transition(take("b", slow)) is not None, "expired: a slow worker takes it"


def test_a_lock_is_held_by_one_owner_and_each_acquisition_bumps_its_fencing_token(
    storage: Storage,
) -> None:
    with storage.transaction() as tx:
        first = tx.lock_transition(acquire("a", T0, 10))
        assert tx.lock_transition(acquire("b", T0 + 1, 11)) is None, "held"
        assert tx.lock_transition(LockRenew("res", "a", T0 + 5, 10.0))
        assert not tx.lock_transition(LockRenew("res", "b", T0 + 5, 10.0))
        assert tx.lock_transition(acquire("b", T0 + 12, 12)) is None, "renewed until T0 + 15"
        assert tx.lock_transition(LockRelease("res", "b", 13)) is None, "not b's to release"
        released = tx.lock_transition(LockRelease("res", "a", 14))
        assert tx.lock_list(LockFilter()) == []
        second = tx.lock_transition(acquire("b", T0 + 16, 15))
        [held] = tx.lock_list(LockFilter())
        broken = tx.lock_transition(LockRelease("res", None, 16))
        after = lock_get(tx, "res")
    assert first is not None and second is not None
    assert second.fencing_token == first.fencing_token + 1
    assert released is not None and released.owner_token is None
    assert held.owner_token == "b" and held.worker_id == "worker-b"
    assert broken is not None and broken.fencing_token == second.fencing_token + 1
    assert after is not None and after.owner_token is None and after.worker_id == "worker-b"


def test_a_writes_fence_finds_the_lock_only_once_its_fencing_token_moved_past_the_writes(
    storage: Storage,
) -> None:
    """``LockFilter.newer_than``, a write's fence: the lock's row only once its fencing
    token moved past the write's (taken again, broken). No lock, the write's own token, or
    a lock whose TTL ran out with nobody taking it fences nothing."""

    def newer(token: int, now: float | None = None) -> list[int]:
        found = tx.lock_list(LockFilter("res", now=now, newer_than=token))
        return [lock.fencing_token for lock in found]

    with storage.transaction() as tx:
        assert newer(0) == [], "no lock row"
        first = tx.lock_transition(acquire("a", T0, 10))
        assert first is not None
        token = first.fencing_token
        assert newer(token) == [] and newer(token, now=T0 + 100) == [], "ran out, not taken"
        assert newer(token - 1) == [token]
        second = tx.lock_transition(acquire("b", T0 + 100, 11))
        assert second is not None
        [taken] = tx.lock_list(LockFilter("res", newer_than=token))
        assert (taken.fencing_token, taken.owner_token) == (second.fencing_token, "b")
        assert second.fencing_token == token + 1
        tx.lock_transition(LockRelease("res", None, 12))
        assert newer(token + 1) == [token + 2], "broken: the token moved on"
        assert newer(token + 2) == []


@pytest.mark.parametrize("lock", ["no row", "held", "released", "run out", "taken again", "broken"])
def test_a_one_round_trip_fence_refuses_exactly_where_the_careful_fence_finds_a_newer_lock(
    storage: Storage, lock: str
) -> None:
    """The fence sent unread (``lock_fence_refusing``) decides as the fence read does: only
    a fencing token moved past the write's (taken again, broken) refuses it."""
    with storage.transaction() as tx:
        if lock != "no row":
            tx.lock_transition(acquire("a", T0, 10))
        if lock == "released":
            tx.lock_transition(LockRelease("res", "a", 11))
        elif lock == "taken again":
            tx.lock_transition(acquire("b", T0 + 100, 11))
        elif lock == "broken":
            tx.lock_transition(LockRelease("res", None, 11))
    with storage.transaction() as tx:
        careful = tx.lock_list(LockFilter("res", newer_than=1)) != []
    try:
        with storage.transaction() as tx, tx.pipelined(refusals=True):
            at_once = tx.lock_list(LockFilter("res", newer_than=1)) != []
    except CommitRefused:
        at_once = True
    assert at_once == careful == (lock in ("taken again", "broken"))


@pytest.mark.parametrize("lock", ["held", "run out", "released", "taken again", "broken"])
def test_a_release_in_time_frees_only_its_holders_live_lock_and_refuses_where_it_does_not(
    storage: Storage, lock: str
) -> None:
    """``LockReleaseInTime``: the holder's lock, its lease not run out, is freed (``True``);
    a lock that ran out, another's or none is left as it is (``False``). Sent unread in a
    commit in one round trip (PostgreSQL) it refuses exactly there, nothing committed."""

    def prepared(resource: str) -> Lock | None:
        with storage.transaction() as tx:
            tx.lock_transition(LockAcquire(resource, "a", None, "worker-a", T0, 10.0, 10))
            if lock == "released":
                tx.lock_transition(LockRelease(resource, "a", 11))
            elif lock == "taken again":
                tx.lock_transition(LockAcquire(resource, "b", None, "worker-b", T0 + 100, 10.0, 11))
            elif lock == "broken":
                tx.lock_transition(LockRelease(resource, None, 11))
            return lock_get(tx, resource)

    def release(resource: str) -> LockReleaseInTime:
        now = T0 + 100 if lock in ("run out", "taken again") else T0 + 5
        return LockReleaseInTime(resource, "a", now, 20)

    before = prepared("at-once")
    try:
        with storage.transaction() as tx, tx.pipelined(refusals=True):
            at_once = tx.lock_transition(release("at-once"))
    except CommitRefused:
        at_once = False
    prepared("careful")
    with storage.transaction() as tx:
        careful = tx.lock_transition(release("careful"))
    assert at_once == careful == (lock == "held")
    with storage.transaction(readonly=True) as tx:
        for resource in ("at-once", "careful"):
            after = lock_get(tx, resource)
            assert before is not None and after is not None
            assert after.fencing_token == before.fencing_token, "a release never moves it"
            if lock == "held":
                assert after.owner_token is None and after.expires_at is None
            else:
                assert (after.owner_token, after.expires_at) == (
                    before.owner_token,
                    before.expires_at,
                ), "refused: nothing changed"


# A write's fence as a step's commit asks it: sent unread with the commit in one round
# trip (``pipelined(refusals=True)``, PostgreSQL) or read before ``COMMIT`` (the careful way).
FENCE_WAYS = pytest.mark.parametrize("refusals", [True, False], ids=["one-round-trip", "careful"])


def changed_while_a_fenced_write_commits(
    storage: Storage, refusals: bool, change: Any, what: str
) -> tuple[LockGrant, Any]:
    """Lock ``res`` taken by ``a``; then, inside a transaction whose write fence on it
    passed (``refusals`` as in ``FENCE_WAYS``), ``change`` asked of the lock's row on
    another connection, asserted answered only after that transaction committed. The
    first grant and the change's answer."""
    with storage.transaction() as tx:
        first = tx.lock_transition(acquire("a", T0, 10))
    assert first is not None
    changed: list[tuple[float, Any]] = []

    def change_it() -> None:
        with storage.transaction() as other:
            answer = other.lock_transition(change)
        changed.append((time.monotonic(), answer))

    with storage.transaction() as tx, tx.pipelined(refusals=refusals):
        assert tx.lock_list(LockFilter("res", newer_than=first.fencing_token)) == []
        # A read that waits for its answer: a fence sent unread has run in the server.
        assert lock_get(tx, "res") is not None
        changer = threading.Thread(target=change_it)
        changer.start()
        changer.join(0.5)
        committing = time.monotonic()
    changer.join(10)
    [(at, answer)] = changed
    assert at > committing, f"the lock was {what} before the fenced write committed"
    return first, answer


@FENCE_WAYS
def test_a_lock_is_taken_again_only_after_the_commit_of_a_write_whose_fence_passed(
    storage: Storage, refusals: bool
) -> None:
    """A write under a lock whose fence passed commits before the lock can be taken again:
    another worker's ``lock_acquire`` meanwhile (the holder's TTL ran out) waits for that
    commit (PostgreSQL: the fence keeps the lock's row ``FOR SHARE``; SQLite: the commit
    holds the write lock). Else the write, under the old token, would commit after the
    new holder's writes, and fencing would guard nothing but the entity it writes."""
    take_again = acquire("b", T0 + 100, 11)
    first, grant = changed_while_a_fenced_write_commits(
        storage, refusals, take_again, "taken again"
    )
    assert grant is not None and grant.fencing_token == first.fencing_token + 1


CHANGES = {
    "renewed by its holder": LockRenew("res", "a", T0 + 5, 10.0),
    "released": LockRelease("res", "a", 11),
    "broken": LockRelease("res", None, 11),
}


@FENCE_WAYS
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_lock_changes_only_after_the_commit_of_a_write_whose_fence_passed(
    storage: Storage, refusals: bool, change: str
) -> None:
    """Every other change of the lock's row waits for that commit too, then goes through:
    the holder's heartbeat renewing it while its own step commits on another connection,
    a release, a break. No deadlock: none of them holds a row the commit waits for."""
    _, answer = changed_while_a_fenced_write_commits(storage, refusals, CHANGES[change], change)
    assert answer, f"not {change}"


@FENCE_WAYS
def test_a_fence_asked_while_the_lock_is_taken_again_waits_and_finds_the_new_token(
    storage: Storage, refusals: bool
) -> None:
    """The lock taken again by a transaction not yet committed: a write's fence asked then
    waits for it and finds the new token, so the write is refused (PostgreSQL: ``FOR
    SHARE`` waits for the row's updater and reads its newest version, where a plain read
    saw the old token and let the write commit after the new holder's; SQLite: the
    fence's transaction waits for the write lock)."""
    with storage.transaction() as tx:
        first = tx.lock_transition(acquire("a", T0, 10))
    assert first is not None
    fenced: list[Any] = []

    def fence() -> None:
        try:
            with storage.transaction() as tx, tx.pipelined(refusals=refusals):
                newer = tx.lock_list(LockFilter("res", newer_than=first.fencing_token))
            fenced.append([lock.fencing_token for lock in newer])
        except CommitRefused:
            fenced.append("refused in the server")

    with storage.transaction() as tx:
        taken = tx.lock_transition(acquire("b", T0 + 100, 11))
        fencing = threading.Thread(target=fence)
        fencing.start()
        fencing.join(0.5)
    fencing.join(10)
    assert taken is not None and taken.fencing_token == first.fencing_token + 1
    # Refused in the server only in a one-round-trip commit on PostgreSQL (SQLite's
    # ``pipelined`` changes nothing: the fence's answer is read there).
    assert fenced in ([[taken.fencing_token]], ["refused in the server"]), fenced


# -- cache, outbox, blobs, lineage ----------------------------------------------------------


def cache_entry(key: str, version: int, written: float, expires: float | None) -> CachePut:
    return CachePut(key, "price:1", f'"{key}"', version, "sku", "1", written, expires)


def test_cache_reads_by_key_or_newest_of_a_base_key_and_deletes_both_ways(
    storage: Storage,
) -> None:
    with storage.transaction() as tx:
        tx.cache_update(cache_entry("price:1:v1", 1, T0, None))
        tx.cache_update(cache_entry("price:1:v2", 2, T0 + 1, T0 + 5))
        newest = tx.cache_get(CacheLookup(T0 + 2, base_key="price:1"))
        expired = tx.cache_get(CacheLookup(T0 + 6, key="price:1:v2"))
        kept = tx.cache_get(CacheLookup(T0 + 6, base_key="price:1"))
        tx.cache_update(CacheDelete(namespace="sku", key="1"))
        assert tx.cache_get(CacheLookup(T0, key="price:1:v1")) is None
        tx.cache_update(cache_entry("price:1:v3", 3, T0 + 7, None))
        tx.cache_update(CacheDelete(base_key="price:1"))
        assert tx.cache_get(CacheLookup(T0 + 8, base_key="price:1")) is None
    assert newest is not None and newest.key == "price:1:v2" and newest.value == '"price:1:v2"'
    assert expired is None
    assert kept is not None and kept.version == 1


def test_an_outbox_row_is_written_once_claimed_and_marked(storage: Storage) -> None:
    row = OutboxInsert("e1", "orders", '{"n":1}', 1, "tr", T0)
    with storage.transaction() as tx:
        assert tx.outbox_update(row)
        assert not tx.outbox_update(OutboxInsert("e1", "orders", '{"n":2}', 1, "tr", T0))
        assert tx.outbox_update(OutboxInsert("e2", "orders", "{}", 1, "tr", T0 + 1))
        [first, second] = tx.outbox_claim(OutboxClaim(T0 + 2, 30.0, 10))
        assert tx.outbox_claim(OutboxClaim(T0 + 3, 30.0, 10)) == [], "claimed"
        assert tx.outbox_update(OutboxMark(first.id, T0 + 4))
        assert not tx.outbox_update(OutboxMark(first.id, T0 + 4)), "published once"
        assert tx.outbox_update(OutboxMark(second.id, T0 + 4, "sink down"))
        backlog = tx.report(OutboxPending())
        [again] = tx.outbox_claim(OutboxClaim(T0 + 5, 30.0, 10))
        rows = tx.outbox_by_job(1)
    assert (first.event_id, first.payload, first.attempts) == ("e1", '{"n":1}', 1)
    assert (backlog.pending, backlog.oldest) == (1, T0 + 1)
    assert again.id == second.id and again.attempts == 2 and again.last_error == "sink down"
    assert [r.published_at for r in rows] == [T0 + 4, None]


def test_a_blob_and_a_lineage_row_round_trip(storage: Storage) -> None:
    with storage.transaction() as tx:
        tx.blob_put(BlobPut("ab" * 32, "zstd", 10, 4, b"\x00\x01\xff\x02", T0))
        blob = tx.blob_get("ab" * 32)
        assert tx.blob_get("de" * 32) is None
        assert tx.blob_get("not hex") is None  # a reference to nothing stored: no blob
        tx.lineage_put(LineagePut("fork-1", "fork", "tr", 1, "fork:1", "{}", T0))
        tx.lineage_put(LineagePut("fork-2", "replay", "tr", 1, None, "{}", T0 + 1))
        tx.lineage_put(LineagePut("fork-3", "replay", "other", 2, None, "{}", T0 + 2))
        one = tx.lineage_list(LineageQuery(trace_id="fork-2"))
        derived = tx.lineage_list(LineageQuery(source_trace_id="tr"))
    assert blob is not None and (blob.codec, blob.body) == ("zstd", b"\x00\x01\xff\x02")
    assert [(r.trace_id, r.origin) for r in one] == [("fork-2", "replay")]
    assert [r.trace_id for r in derived] == ["fork-1", "fork-2"]


def test_lineage_pages_follow_the_created_at_and_trace_id_cursor(storage: Storage) -> None:
    with storage.transaction() as tx:
        for n, at in enumerate((T0, T0, T0 + 1)):
            tx.lineage_put(LineagePut(f"fork-{n}", "fork", "tr", 1, None, "{}", at))
        first = tx.lineage_list(LineageQuery(after=(0.0, ""), limit=2))
        rest = tx.lineage_list(LineageQuery(after=(first[-1].created_at, first[-1].trace_id)))
    assert [r.trace_id for r in first] == ["fork-0", "fork-1"]
    assert [r.trace_id for r in rest] == ["fork-2"]


# -- schedules, contracts, routing ----------------------------------------------------------


def test_a_schedule_anchor_moves_only_from_the_anchor_that_was_read(storage: Storage) -> None:
    with storage.transaction() as tx:
        register = ScheduleRegister("tick", "* * * * *", "t", "UTC", "skip", T0 + 60, T0)
        assert tx.schedule_update(register)
        assert tx.schedule_update(ScheduleAdvance("tick", T0, T0 + 60, T0 + 120, T0 + 61))
        assert not tx.schedule_update(ScheduleAdvance("tick", T0, T0 + 60, T0 + 120, T0 + 61))
        assert tx.schedule_update(ScheduleMade("tick", T0 + 60, 42))
        tx.schedule_update(ScheduleRegister("other", "0 * * * *", "t", "UTC", "skip", None, T0))
        [tick] = tx.schedule_list("tick")
        names = [s.name for s in tx.schedule_list()]
    assert (tick.anchor, tick.last_slot, tick.last_job_id) == (T0 + 60, T0 + 60, 42)
    assert names == ["other", "tick"]


def test_contracts_are_listed_by_type_and_version_and_one_version_is_active(
    storage: Storage,
) -> None:
    with storage.transaction() as tx:
        tx.rollout_update(ContractPut("t", "v1", '{"n":1}', T0))
        tx.rollout_update(ContractPut("t", "v2", '{"n":2}', T0 + 1))
        tx.rollout_update(ContractPut("u", "v1", '{"n":3}', T0))
        tx.rollout_update(ContractActivate("t", "v2", T0 + 2))
        [v2] = tx.rollout_query(ContractQuery("t", "v2"))
        of_t = [c.version for c in tx.rollout_query(ContractQuery("t"))]
        every = [(c.job_type, c.version) for c in tx.rollout_query(ContractQuery(None))]
        active = tx.rollout_query(ActiveVersion("t"))
    assert v2.body == '{"n":2}' and of_t == ["v1", "v2"] and active == "v2"
    assert every == [("t", "v1"), ("t", "v2"), ("u", "v1")]


def test_routing_is_compare_and_set_on_its_revision_and_every_change_is_kept(
    storage: Storage,
) -> None:
    def put(revision: int, body: str, now: float) -> int | None:
        change = RoutingPut("t", body, revision, "set", "ann", "why", now)
        return tx.rollout_update(change)

    with storage.transaction() as tx:
        assert put(0, '{"n":1}', T0) == 1
        assert put(0, '{"n":2}', T0 + 1) is None, "exists: created once"
        assert put(1, '{"n":2}', T0 + 2) == 2
        assert put(1, '{"n":3}', T0 + 3) is None, "read at 1, changed since"
        [record] = tx.rollout_query(RoutingQuery("t"))
        every = tx.rollout_query(RoutingQuery())
        history = tx.rollout_query(RoutingHistory("t"))
    assert (record.revision, record.body) == (2, '{"n":2}') and every == [record]
    assert [(e.revision, e.actor, e.reason, e.body) for e in history] == [
        (1, "ann", "why", '{"n":1}'),
        (2, "ann", "why", '{"n":2}'),
    ]


def test_comparisons_are_listed_newest_first_of_one_mode(storage: Storage) -> None:
    with storage.transaction() as tx:
        for n, mode in enumerate(("shadow", "dual", "shadow")):
            tx.rollout_update(ComparisonPut("t", n, 1, mode, "v1", "v2", "[]", "{}", T0 + n))
        shadow = tx.rollout_query(ComparisonQuery("t", "shadow", 10))
        newest = tx.rollout_query(ComparisonQuery("t", None, 1))
    assert [c.job_id for c in shadow] == [2, 0]
    assert [c.job_id for c in newest] == [2]


def test_reports_count_what_operators_ask_about(storage: Storage) -> None:
    """Each question ``report`` answers, over the same few jobs, with its own record."""
    leased_job(storage, queue="q")  # running, routed to v7
    with storage.transaction() as tx:
        tx.job_insert(insert(queue="q", run_at=T0 + 60, message_id="later"))
        tx.job_insert(insert("other", queue="q2", message_id="now"))
        stats = {(r.job_type, r.state): r.count for r in tx.report(JobStats())}
        count = tx.report(JobCount(JobFilter(states=["queued"])))
        scheduled = tx.report(JobsScheduled(T0 + 1, ["q"]))
        gauges = {(g.queue, g.job_type, g.state): g.count for g in tx.report(JobGauges(T0 + 1))}
        nothing = (
            tx.report(OutOfOrder()),
            tx.report(JobDurations("t")),
            tx.report(VersionOutcomes("t", T0)),
            tx.report(SignalCounts(["job.failed"], T0)),
            tx.report(SignalSeries(["job.failed"], 0, 2**62, 60_000)),
        )
    assert stats == {("t", "running"): 1, ("t", "queued"): 1, ("other", "queued"): 1}
    assert count == 2
    assert scheduled == (1, T0 + 60), "only the delayed job of queue q"
    assert gauges[("q", "t", "running")] == 1 and gauges[("q2", "other", "queued")] == 1
    assert nothing == ([], [], [], [], [])


def test_both_backends_push_wake_ups_for_a_commit_from_another_connection(
    storage: Storage, db_url: str
) -> None:
    """The worker asks ``isinstance(storage, Listener)``: LISTEN on PostgreSQL, a watch of
    the file on SQLite. A job inserted through another storage object (another process's
    connection, for all either backend can tell) wakes the listener."""
    assert isinstance(storage, Listener)
    woken = threading.Event()
    handle = storage.listen(lambda queue: woken.set())
    other = open_storage(db_url)
    try:
        deadline = time.monotonic() + 10
        while not handle.listening.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.listening.is_set()
        time.sleep(0.05)
        woken.clear()
        time.sleep(0.1)
        if db_url.startswith("sqlite"):
            # An idle file does not wake it (PostgreSQL's channel is shared by the
            # database's other schemas, whose tests may be enqueuing meanwhile).
            assert not woken.is_set()
        with other.transaction() as tx:
            tx.job_insert(insert(now=T0, run_at=T0))
        assert woken.wait(5)
    finally:
        handle.close()
        other.close()


def test_trace_jobs_without_enqueued_reads_every_attempts_event_the_same(
    storage: Storage, db_url: str
) -> None:
    """``enqueued=False`` (what a replay reads): each job's events as ``TraceJobs`` reads
    them, without its ``job.enqueued`` where SQLite keeps that in the job's row."""
    first, idle = leased_job(storage), leased_job(storage)
    with storage.transaction() as tx:
        tx.trace_append([event("b", 20, job_id=first), event("a", 10, job_id=first)])
    with storage.transaction(readonly=True) as tx:
        every = {t.job_id: t.events for t in tx.trace_query(TraceJobs([first, idle]))}
        read = {
            t.job_id: t.events
            for t in tx.trace_query(TraceJobs([first, idle, 10_000], enqueued=False))
        }
    for job_id in (first, idle):
        assert [e for e in read.get(job_id, []) if e.name != "job.enqueued"] == [
            e for e in every[job_id] if e.name != "job.enqueued"
        ]
    assert [e.name for e in read[first]][-2:] == ["a", "b"]
    if db_url.startswith("sqlite"):
        assert idle not in read, "SQLite: no pack of its own, only its row's job.enqueued"
        assert [e.name for e in read[first]] == ["a", "b"]
