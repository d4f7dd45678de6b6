"""A COMMIT whose reply is lost after the server committed: the worker recognises its
own landed write and neither repeats nor rejects it.

The worker talks to PostgreSQL through ``tests/pgproxy.py``, a real TCP proxy. Armed,
it forwards the COMMIT of the one transaction that carries given bytes, drops the
server's reply (``CommandComplete COMMIT``: it did commit) and closes the connection.
The worker sees only a dead connection (``DatabaseUnavailableError``) and retries:

* an ack (``jobs_complete`` in the worker's group commit): the retried compare-and-set
  finds the job no longer running under its token; the worker finds its own
  ``job.succeeded`` (its worker id, token and attempt) and counts the job succeeded,
  without a ``job.write_rejected``;
* an effect's claim: the retry finds the record claimed under its own claim token and
  runs the effect (once), adding no second ``effect.claimed``;
* an effect's completion: the retried ``succeeded`` transition changes nothing and adds
  no second ``effect.succeeded``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from tests import chaos_check
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for, workers_ended
from tests.apps import storage_faults
from tests.pgproxy import PgProxy
from tests.services import Service

pytestmark = pytest.mark.postgres

JOBS = 12
MORE = 5  # enqueued after the cut: the worker keeps draining


@pytest.fixture
def proxy() -> Iterator[PgProxy]:
    running = PgProxy().start()
    yield running
    running.close()


@pytest.fixture
def queue(pg_schema_url: str) -> Iterator[replayq.App]:
    """The storage-faults app on the test's schema (migrated before any worker starts)."""
    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    app = storage_faults.build(pg_schema_url)
    yield app
    app.close()


def _by_n(app: replayq.App) -> dict[int, replayq.Job]:
    return {int(j.payload["n"]): j for j in app.list_jobs(limit=1000)}


def _names(app: replayq.App, job: replayq.Job) -> Counter[str]:
    return Counter(e.name for e in app.trace(job.id))


def _drain(
    app: replayq.App, proxy: PgProxy, sink: Path, launcher: WorkerLauncher, total: int
) -> None:
    """Wait for the cut, then for every job; then enqueue ``MORE`` and wait for them too."""
    proxy.cut.wait(60)
    assert proxy.cut.is_set(), "the armed COMMIT never came"
    assert b"COMMIT" in proxy.cut_replies[0], "the server committed; only its reply was lost"

    def succeeded() -> int:
        return sum(1 for j in app.list_jobs(limit=1000) if j.state.value == "succeeded")

    wait_for(lambda: succeeded() == total, timeout=60, what="every job to succeed")
    for n in range(total, total + MORE):
        app.enqueue("deliver", {"n": n, "sink": str(sink)})
    wait_for(lambda: succeeded() == total + MORE, timeout=60, what="the jobs enqueued after")


def _assert_worker_fine(launcher: WorkerLauncher) -> None:
    for worker in launcher.started:
        assert worker.proc.poll() is None, f"worker {worker.worker_id} exited"
        assert "Traceback" not in worker.log()


def test_an_ack_whose_commit_reply_was_lost_is_recognised_as_landed(
    queue: replayq.App,
    pg_schema_url: str,
    proxy: PgProxy,
    tmp_path: Path,
    effects_service: Service,
    request: pytest.FixtureRequest,
) -> None:
    """The last job's ack commits, its reply is lost: succeeded once, one event, no
    rejection, the handler ran once, and the worker goes on."""
    sink = tmp_path / "effects.jsonl"
    for n in range(JOBS):
        queue.enqueue("deliver", {"n": n, "sink": str(sink)})
    target = JOBS - 1  # the last: its group commit leases no further job to lose with it
    # The result is a parameter of jobs_complete, sent even once the statement is prepared:
    # an element of a text array, its quotes escaped.
    proxy.arm_commit_cut(b'{\\"n\\":%d,\\"quote\\":%d}' % (target, 2 * target))
    launcher = WorkerLauncher(proxy.url(pg_schema_url), tmp_path)
    worker = launcher.start("w1", app="tests.apps.storage_faults:app")
    with workers_ended(request, launcher):
        _drain(queue, proxy, sink, launcher, JOBS)
        chaos_check.assert_clean(
            "PostgreSQL, an ack's COMMIT reply lost",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS + MORE,
            sink=sink,
        )
        job = _by_n(queue)[target]
        names = _names(queue, job)
        assert names["job.succeeded"] == 1 and names["job.leased"] == 1, names
        assert names["job.write_rejected"] == 0, (
            "the worker took its own landed ack for a lost lease"
        )
        assert names["job.failed"] == 0 and names["lease.released"] == 0, names
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects[target] == 1, "the handler ran once"
        log = worker.log()
        assert "group commit of the acks of jobs" in log, "the worker saw the COMMIT fail"
        assert f"job {job.id} succeeded" in log, "and counted the job succeeded"
        _assert_worker_fine(launcher)


@pytest.mark.parametrize("record", ["claim", "completion"])
def test_an_effect_record_whose_commit_reply_was_lost_runs_the_effect_once(
    record: str,
    queue: replayq.App,
    pg_schema_url: str,
    proxy: PgProxy,
    tmp_path: Path,
    effects_service: Service,
    request: pytest.FixtureRequest,
) -> None:
    """A job's effect claim (or its completion) commits and its reply is lost: the
    retry recognises its own claim token (or finds the completion landed), the effect
    runs once, the job succeeds, nothing is parked, and the worker goes on."""
    sink = tmp_path / "effects.jsonl"
    for n in range(JOBS):
        queue.enqueue("deliver", {"n": n, "sink": str(sink)})
    target = JOBS // 2
    key = f"deliver:{target}:parcel.deliver".encode()
    # The claim is the first transaction to carry the key; the completion carries its
    # effect.succeeded event.
    markers = (key,) if record == "claim" else (key, b"effect.succeeded")
    proxy.arm_commit_cut(*markers)
    launcher = WorkerLauncher(proxy.url(pg_schema_url), tmp_path)
    worker = launcher.start("w1", app="tests.apps.storage_faults:app")
    with workers_ended(request, launcher):
        _drain(queue, proxy, sink, launcher, JOBS)
        chaos_check.assert_clean(
            f"PostgreSQL, an effect {record}'s COMMIT reply lost",
            pg_schema_url,
            effects_service.base_url,
            expected=JOBS + MORE,
            sink=sink,
        )
        effects = Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")
        assert effects[target] == 1, "the effect ran exactly once"
        job = _by_n(queue)[target]
        names = _names(queue, job)
        assert names["effect.claimed"] == 1 and names["effect.succeeded"] == 1, names
        assert names["effect.in_doubt"] == 0 and names["job.failed"] == 0, names
        assert names["job.leased"] == 1 and names["job.succeeded"] == 1, names
        what = "claim effect" if record == "claim" else "record effect"
        assert f"{what} {key.decode()!r}: database unavailable" in worker.log()
        _assert_worker_fine(launcher)
