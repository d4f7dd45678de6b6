"""SQLite binds a lease batch's and an ack group's rows in the statement (``VALUES``): a
batch larger than one statement's parameters allow is split, and still leases and acks
exactly the jobs it should, each row its own compare-and-set."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from replayq.errors import StorageError
from replayq.model import JobState
from replayq.storage import open_storage
from replayq.storage.params import JobInsert, JobLease, JobsComplete
from replayq.storage.protocol import Storage

T0 = 1_700_000_000.0
JOBS = 12
# 20 parameters a statement: the lease's 5 scalars (its time twice: bound by position) and
# 5 rows of 3, or the acks' 1 and 4 rows of 4. Twelve jobs take three statements each way.
# 19: 4 rows of 3 and 4 of 4, four statements each way (5 rows of 3 would be 20).
LIMITS = (20, 19)


def _inserted(storage: Storage) -> list[int]:
    with storage.transaction() as tx:
        return [
            tx.job_insert(
                JobInsert(
                    job_type="t",
                    queue="default",
                    payload_json=f'{{"n":{n}}}',
                    priority=0,
                    run_at=T0,
                    now=T0,
                    max_attempts=3,
                    trace_id=f"trace-{n}",
                    hlc=1,
                    message_id=f"m{n}",
                )
            )[0]
            for n in range(JOBS)
        ]


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("ordered", [None, False])
def test_batches_beyond_one_statements_parameters_lease_and_ack_exactly_their_jobs(
    tmp_path: Path, ordered: bool | None, limit: int
) -> None:
    """``ordered`` given, the acks' statement counts the rows it changed (no ``RETURNING``):
    over three statements, and some acks refused, the rows it left name those held."""
    storage = open_storage(f"sqlite:///{tmp_path / 'rows.db'}")
    storage.migrate(T0)
    try:
        ids = _inserted(storage)
        with storage.transaction() as tx:
            tx.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
            leased = tx.job_lease(
                JobLease(
                    worker_id="w",
                    owner_token="tok",
                    now=T0 + 1,
                    hlc=2,
                    limit=JOBS,
                    default_lease_seconds=30.0,
                    lease_for={},
                    version_for={"t": "v1"},
                )
            )
        assert [job.id for job in leased] == ids  # every one, in the order chosen
        assert [job.payload for job in leased] == [{"n": n} for n in range(JOBS)]
        assert {(job.state, job.owner_token, job.handler_version) for job in leased} == {
            (JobState.RUNNING, "tok", "v1")
        }
        # Every third ack names a token that does not hold the lease.
        acks = [
            (job_id, "tok" if n % 3 else "another", f'{{"r":{n}}}', 10 + n)
            for n, job_id in enumerate(ids)
        ]
        with storage.transaction() as tx:
            tx.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
            held = tx.jobs_complete(JobsComplete(T0 + 2, acks, ordered))
        assert held == {job_id for n, job_id in enumerate(ids) if n % 3}
        with storage.transaction(readonly=True) as tx:
            jobs = [tx.job_get(job_id) for job_id in ids]
        for n, job in enumerate(jobs):
            assert job is not None
            if n % 3:
                assert (job.state, job.result, job.hlc) == (JobState.SUCCEEDED, {"r": n}, 10 + n)
            else:
                assert (job.state, job.owner_token) == (JobState.RUNNING, "tok")
    finally:
        storage.close()


def test_an_ack_group_whose_changed_rows_cannot_be_told_apart_is_refused_whole(
    tmp_path: Path,
) -> None:
    """Counted acks, some refused: a refused job that another ack finished with the very
    hlc and time of this group's looks like one this group changed. The statement is
    refused (rolled back with its transaction), never answered with a job it did not ack."""
    storage = open_storage(f"sqlite:///{tmp_path / 'rows.db'}")
    storage.migrate(T0)
    try:
        ids = _inserted(storage)[:3]
        lease = JobLease("w", "tok", T0 + 1, 2, 3, 30.0, version_for={"t": "v1"})
        with storage.transaction() as tx:
            assert [job.id for job in tx.job_lease(lease)] == ids
        finished = T0 + 2
        # Another worker's ack of the third job, at this group's time and with its hlc.
        with storage.transaction() as tx:
            assert tx.jobs_complete(JobsComplete(finished, [(ids[2], "tok", None, 12)], False))
        acks = [(ids[0], "tok", None, 10), (ids[1], "lost", None, 11), (ids[2], "tok", None, 12)]
        with pytest.raises(StorageError, match="rolled back"), storage.transaction() as tx:
            tx.jobs_complete(JobsComplete(finished, acks, False))
        with storage.transaction(readonly=True) as tx:
            first = tx.job_get(ids[0])
        assert first is not None and first.state is JobState.RUNNING  # nothing committed
        # Another time: the rows it changed are told apart, and only those are named.
        with storage.transaction() as tx:
            assert tx.jobs_complete(JobsComplete(finished + 1, acks, False)) == {ids[0]}
    finally:
        storage.close()
