"""Real workers, real signals: a frozen worker writes nothing once its lease was taken, and an
effect left in doubt by a killed worker can be settled and its job continued.

Over both backends. The counting HTTP service and the side file (one line per
real effect, with the worker) are the ground truth of what happened outside.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, run_cli, wait_for
from tests.apps import fenced
from tests.services import Service

APP = "tests.apps.fenced:app"
JOBS = 30


@pytest.fixture
def fenced_app(launcher: WorkerLauncher) -> Iterator[replayq.App]:
    app = fenced.build(launcher.url)
    app.register_contracts()  # migrates a SQLite file on first use
    with app.storage.transaction() as tx:
        tx.connection.execute("CREATE TABLE fenced_rows (job_id INTEGER, worker TEXT)")
    yield app
    app.close()


def _written_by(app: replayq.App, worker: str) -> dict[str, int]:
    """What the database accepted from ``worker``: state versions, db_write rows, outbox rows."""
    marker = "?" if app.storage.dialect == "sqlite" else "%s"
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute(
            f"SELECT COUNT(*) FROM fenced_rows WHERE worker = {marker}",  # noqa: S608 - marker only
            (worker,),
        ).fetchone()[0]
        outbox = tx.connection.execute(
            f"SELECT COUNT(*) FROM rq_outbox WHERE payload LIKE {marker}",  # noqa: S608 - marker only
            (f'%"by": "{worker}"%',),
        ).fetchone()[0]
    states = sum(
        1
        for n in range(JOBS)
        for version in app.state.history("account", n)
        if version.data["by"] == worker
    )
    return {"state": states, "db_write": int(rows), "outbox": int(outbox)}


def freeze_outside_a_write(
    launcher: WorkerLauncher, worker: Any, settled: Callable[[], bool] = lambda: True
) -> None:
    """SIGSTOP ``worker``; on SQLite, not while it holds the database's write lock; and
    only where ``settled()`` holds (the test's own ground truth is consistent).

    A process frozen inside a SQLite write transaction blocks every writer until it
    resumes (a known limit of the SQLite backend: no server can end its session), so
    no other worker could take its jobs. On SQLite the test probes the write lock after
    freezing and, if the frozen worker holds it, lets it run a moment and freezes again;
    so it does when ``settled()`` does not hold.
    """
    for _ in range(200):
        worker.signal(signal.SIGSTOP)
        if not settled():
            worker.signal(signal.SIGCONT)
            time.sleep(0.02)
            continue
        if not isinstance(launcher.database, Path):
            return
        probe = sqlite3.connect(launcher.database, timeout=0.05, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            worker.signal(signal.SIGCONT)
            time.sleep(0.02)
        finally:
            probe.close()
    raise AssertionError("the worker was always in a write or an effect when frozen")


def test_frozen_worker_past_its_lease_gets_no_write_and_no_effect_accepted(
    launcher: WorkerLauncher, fenced_app: replayq.App, service: Service, tmp_path: Path
) -> None:
    sink = tmp_path / "effects.jsonl"
    ids = [
        fenced_app.enqueue("charge", {"n": n, "sink": str(sink), "step_seconds": 0.4})
        for n in range(JOBS)
    ]
    frozen = launcher.start("frozen", app=APP, concurrency=4)
    wait_for(
        lambda: len([x for x in read_lines(sink) if x["event"] == "start"]) >= 6,
        timeout=30,
        what="the first worker to be busy with several jobs",
    )
    # Not between an effect's side-file line and its call to the service (the effect
    # writes the line first): frozen there, the side file would count a call that the
    # service has not had yet.
    freeze_outside_a_write(
        launcher,
        frozen,
        lambda: (
            service.counts().get("/warehouse/shipments", 0)
            == len([x for x in read_lines(sink) if x["event"] == "effect"])
        ),
    )
    # For the failure message only: what the database said the frozen worker held.
    at_freeze = [
        j.id
        for j in fenced_app.list_jobs(states=[replayq.JobState.RUNNING], limit=100)
        if j.worker_id == "frozen"
    ]

    launcher.start("taker", app=APP, concurrency=4)
    wait_for(
        lambda: all(fenced_app.get_job(i).state is replayq.JobState.SUCCEEDED for i in ids),
        timeout=90,
        what="the second worker to finish every job",
    )
    before = _written_by(fenced_app, "frozen")
    effects_before = len([x for x in read_lines(sink) if x["event"] == "effect"])
    calls_before = service.counts().get("/warehouse/shipments", 0)
    assert calls_before == effects_before

    frozen.signal(signal.SIGCONT)

    def taken_over() -> list[int]:
        """The jobs whose handler the frozen worker started and did not finish itself: it
        was inside them when the taker took their leases (the side file says who started
        what; the job's result says whose run counted)."""
        starts = [x for x in read_lines(sink) if x["event"] == "start"]
        started = {x["n"] for x in starts}
        started_by_frozen = {x["n"] for x in starts if x["worker"] == "frozen"}
        assert started == set(range(JOBS))
        return [
            ids[n]
            for n in sorted(started_by_frozen)
            if fenced_app.get_job(ids[n]).result["by"] != "frozen"
        ]

    def unrefused() -> dict[int, list[tuple[str, str | None, int]]]:
        """The jobs taken over with no refusal of the frozen worker yet, with their traces."""
        traces = {job_id: fenced_app.trace(job_id) for job_id in taken_over()}
        return {
            job_id: [(e.name, e.worker_id, e.attempt) for e in events]
            for job_id, events in traces.items()
            if not any(e.worker_id == "frozen" and e.name == "job.write_rejected" for e in events)
        }

    try:
        wait_for(lambda: not unrefused(), timeout=30, what="the resumed worker's refusals")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; running under the frozen worker at the freeze: {at_freeze}; "
            f"not refused: {unrefused()}"
        ) from exc
    frozen.signal(signal.SIGTERM)
    frozen.wait(30)

    held = taken_over()
    assert held, "the frozen worker was inside jobs when it was frozen"
    assert _written_by(fenced_app, "frozen") == before, "a write of the frozen worker was accepted"
    effects_after = [x for x in read_lines(sink) if x["event"] == "effect"]
    assert len(effects_after) == effects_before, "the frozen worker started an effect"
    assert service.counts()["/warehouse/shipments"] == calls_before
    for job_id in held:
        assert fenced_app.get_job(job_id).result["by"] == "taker", "the taker's run counts"
    fenced_events = [
        e
        for job_id in held
        for e in fenced_app.trace(job_id)
        if e.name == "write.fenced" and e.worker_id == "frozen"
    ]
    assert fenced_events, "write.fenced says what was refused"
    assert all(e.data["refused"] for e in fenced_events)


@pytest.mark.parametrize("truth", ["succeeded", "failed"])
def test_effect_in_doubt_after_sigkill_is_settled_and_the_requeued_job_continues(
    launcher: WorkerLauncher,
    fenced_app: replayq.App,
    service: Service,
    tmp_path: Path,
    truth: str,
) -> None:
    sink = tmp_path / "effects.jsonl"
    job_id = fenced_app.enqueue("charge_once", {"n": 7, "sink": str(sink), "after_seconds": 30})
    doomed = launcher.start("doomed", app=APP)
    wait_for(lambda: read_lines(sink), timeout=30, what="the effect to reach the provider")
    doomed.kill()  # SIGKILL: the charge went out, the ledger still says "started"

    launcher.start("survivor", app=APP)
    dead = wait_for(
        lambda: (job := fenced_app.get_job(job_id)).state is replayq.JobState.DEAD and job,
        timeout=30,
        what="the job to be parked dead in doubt",
    )
    assert dead.dead_reason == "effect_in_doubt"
    assert dead.last_error_class == "in_doubt"
    assert service.counts()["/warehouse/shipments"] == 1

    listed = run_cli(launcher.url, "effects", "list", "--in-doubt", "--json")
    assert listed.returncode == 0, listed.stderr
    [record] = json.loads(listed.stdout)
    assert (record["key"], record["kind"], record["job_id"]) == ("ship-7", "warehouse.ship", job_id)

    resolve: list[str] = ["effects", "resolve", "ship-7", "--by", "oncall", "--reason", "checked"]
    if truth == "succeeded":
        resolve += ["--succeeded", "--result", '{"shipment_id": "shp-1"}']
    else:
        resolve += ["--failed"]
    settled = run_cli(launcher.url, *resolve)
    assert settled.returncode == 0, settled.stderr
    requeued = run_cli(launcher.url, "dead", "requeue", str(job_id), "--reason", "settled")
    assert requeued.returncode == 0, requeued.stderr

    done = wait_for(
        lambda: (job := fenced_app.get_job(job_id)).state is replayq.JobState.SUCCEEDED and job,
        timeout=30,
        what="the requeued job to continue and succeed",
    )
    calls = service.counts()["/warehouse/shipments"]
    if truth == "succeeded":
        assert calls == 1, "a resolved success is returned from the ledger, not called again"
        assert done.result == {"shipment_id": "shp-1"}
    else:
        assert calls == 2, "a resolved failure lets the effect run exactly once more"
        assert done.result["shipment_id"] == "shp-2"
    [resolved] = [e for e in fenced_app.trace(job_id) if e.name == "effect.resolved"]
    data: dict[str, Any] = resolved.data
    assert (data["by"], data["reason"], data["outcome"]) == ("oncall", "checked", truth)
    assert fenced_app.effects_in_doubt() == []
