"""Promises about keys, held by real worker processes (``tests/apps/keyed``).

* The contract's ``lock`` template takes the lock around the whole handler: two jobs of
  one resource never run at once, whichever worker runs them, and each holder gets a
  fencing token newer than the last (docs/contracts.md, docs/recording-context.md).
* A lock held by a worker that is SIGKILLed is left to its TTL: another worker's job
  takes it once the TTL has run out, with a newer fencing token (recording-context.md,
  "Locks with fencing").
* Jobs of one ordering key run one at a time in enqueue order even when the worker
  running the first is SIGKILLed: the next waits for the first's redelivery to settle
  (docs/state_machine.md, "Per-key order").
* An effect's business idempotency key makes it once across jobs and workers. Two jobs
  of one key that also share an ordering key run one after the other, and the second
  gets the first's result. Without one, a job that finds the key's effect still in
  flight in another job's attempt (which holds its lease) waits for it under either
  in-doubt policy: its attempt fails ``concurrency`` and is retried until the record is
  finished, then it gets the stored result; one whose retries run out first goes
  ``dead`` (``attempts_exhausted``, not in doubt) and, requeued, gets it
  (recording-context.md, "Effects", "Two jobs of one key at once").
"""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import replayq
from replayq.recording.locks import list_locks
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for
from tests.apps import keyed

APP = "tests.apps.keyed:app"


@pytest.fixture
def keyed_app(launcher: WorkerLauncher) -> Iterator[replayq.App]:
    app = keyed.build(launcher.url)
    yield app
    app.close()


def lock_tokens(app: replayq.App, job_id: int) -> list[tuple[int, int]]:
    """(attempt, fencing token) of each ``lock.acquired`` in the job's trace."""
    return [
        (e.attempt, e.data["fencing_token"]) for e in app.trace(job_id) if e.name == "lock.acquired"
    ]


def test_a_contract_lock_keeps_jobs_of_one_resource_apart_across_two_workers(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    orders: dict[str, list[int]] = {"A": [], "B": []}
    for n, order in enumerate(["A", "B"] * 3):
        payload = {"log": str(side_file), "n": n, "order": order, "seconds": 0.3,
                   "stall_first": False}  # fmt: skip
        orders[order].append(keyed_app.enqueue("hold", payload))
    workers = [
        launcher.start(name, app=APP, concurrency=2, options=("--prefetch", "0"))
        for name in ("left", "right")
    ]
    jobs = [job_id for ids in orders.values() for job_id in ids]
    wait_for(
        lambda: all(keyed_app.get_job(j).state.value == "succeeded" for j in jobs),
        timeout=30,
        what="every hold job to succeed",
    )

    lines = read_lines(side_file)
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    start = {line["n"]: line["t"] for line in lines if line["event"] == "start"}
    for line in lines:
        if line["event"] == "end":
            spans[line["order"]].append((start[line["n"]], line["t"]))
    for order, runs in spans.items():
        assert len(runs) == 3, f"order {order}: every job ran once"
        for (_, end), (later, _) in itertools.pairwise(sorted(runs)):
            assert end <= later, f"order {order}: two holders of its lock ran at once: {runs}"
        tokens = sorted(t for job_id in orders[order] for _, t in lock_tokens(keyed_app, job_id))
        assert tokens == [1, 2, 3], f"order {order}: each holder a newer fencing token"
    assert {line["pid"] for line in lines} == {w.pid for w in workers}, "both workers ran jobs"
    runs_a, runs_b = spans["A"], spans["B"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in runs_a for b0, b1 in runs_b), (
        "jobs of different resources ran side by side: the lock is per resource"
    )


def test_a_lock_left_by_a_killed_worker_is_taken_after_its_ttl_with_a_newer_token(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    def payload(n: int, seconds: float) -> dict[str, object]:
        return {"log": str(side_file), "n": n, "order": "A", "seconds": seconds,
                "stall_first": True}  # fmt: skip

    stuck = keyed_app.enqueue("hold", payload(1, 60))
    doomed = launcher.start("doomed", app=APP, options=("--prefetch", "0"))
    wait_for(lambda: read_lines(side_file), timeout=20, what="the first job to start")
    later = keyed_app.enqueue("hold", payload(2, 0.1))
    doomed.signal(signal.SIGKILL)
    doomed.proc.wait(10)
    killed_at = time.time()
    launcher.start("survivor", app=APP, options=("--prefetch", "0"))
    wait_for(
        lambda: all(keyed_app.get_job(j).state.value == "succeeded" for j in (stuck, later)),
        timeout=30,
        what="both jobs to succeed after the kill",
    )

    [(first_attempt, first_token), *retaken] = lock_tokens(keyed_app, stuck)
    assert (first_attempt, first_token) == (1, 1)
    [(_, later_token)] = lock_tokens(keyed_app, later)
    assert later_token > first_token, "the lock was taken again with a newer fencing token"
    assert [attempt for attempt, _ in retaken] == [2], "the killed job ran again, once"
    assert retaken[0][1] not in (first_token, later_token)
    later_start = next(x["t"] for x in read_lines(side_file) if x["n"] == 2)
    # The lock was renewed at most one heartbeat (0.3 s) before the kill, TTL 2 s; a
    # worker's start-up and a wait's poll on a loaded machine get the rest of the margin.
    assert later_start - killed_at < 2 + 6, "taken once the TTL ran out, not at the lease's end"
    assert list_locks(keyed_app) == [], "released by the run that took it last"


def test_a_key_whose_first_job_died_with_its_worker_waits_for_its_redelivery(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    def payload(n: int, order: str, seconds: float) -> dict[str, object]:
        return {"log": str(side_file), "n": n, "order": order, "seconds": seconds,
                "stall_first": True}  # fmt: skip

    head = keyed_app.enqueue("hold_in_order", payload(1, "A", 60))
    doomed = launcher.start("doomed", app=APP, options=("--prefetch", "0"))
    wait_for(lambda: read_lines(side_file), timeout=20, what="the first job to start")
    rest = [keyed_app.enqueue("hold_in_order", payload(n, "A", 0.2)) for n in (2, 3)]
    other = keyed_app.enqueue("hold_in_order", payload(4, "B", 0.2))
    doomed.signal(signal.SIGKILL)
    doomed.proc.wait(10)
    for name in ("left", "right"):
        launcher.start(name, app=APP, concurrency=2, options=("--prefetch", "0"))
    jobs = [head, *rest, other]
    wait_for(
        lambda: all(keyed_app.get_job(j).state.value == "succeeded" for j in jobs),
        timeout=30,
        what="every job to succeed after the kill",
    )

    lines = read_lines(side_file)
    runs = [(x["n"], x["attempt"], x["event"]) for x in sorted(lines, key=lambda x: x["t"])]
    key_a = [run for run in runs if run[0] != 4]
    assert key_a == [
        (1, 1, "start"),  # the killed attempt: no end
        (1, 2, "start"), (1, 2, "end"),
        (2, 1, "start"), (2, 1, "end"),
        (3, 1, "start"), (3, 1, "end"),
    ], "one at a time, the redelivered head first"  # fmt: skip
    assert keyed_app.get_job(head).redelivery_count == 1


def charge_payload(side_file: Path, n: int) -> dict[str, object]:
    return {"log": str(side_file), "n": n, "order": "A", "seconds": 2.0}


def test_two_jobs_of_one_key_and_one_ordering_key_make_the_effect_once_and_both_succeed(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    first, second = (
        keyed_app.enqueue("charge_in_order", charge_payload(side_file, n)) for n in (1, 2)
    )
    for name in ("left", "right"):
        launcher.start(name, app=APP, options=("--prefetch", "0"))
    wait_for(
        lambda: all(keyed_app.get_job(j).state.value == "succeeded" for j in (first, second)),
        timeout=30,
        what="both charges to succeed",
    )
    effects = [x for x in read_lines(side_file) if x["event"] == "effect"]
    assert [x["n"] for x in effects] == [1], "the effect was made once, by the first job"
    assert keyed_app.get_job(second).result == {"charged_by": 1}, "the second got its result"
    [dedup] = [e for e in keyed_app.trace(second) if e.name == "effect.deduplicated"]
    assert dedup.data["first_job"] == first


@pytest.mark.parametrize("job_type", ["charge", "charge_retry"])
def test_without_an_ordering_key_a_job_finding_the_effect_in_flight_waits_for_its_result(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path, job_type: str
) -> None:
    """Under ``park`` (``charge``) as under ``retry`` (``charge_retry``): the job that
    finds the key ``started`` by the other job's attempt, still running under its lease,
    neither parks in doubt nor runs the effect again; its attempts fail ``concurrency``
    and are retried until the record is finished, then it gets the stored result."""
    jobs = tuple(keyed_app.enqueue(job_type, charge_payload(side_file, n)) for n in (1, 2))
    settled = run_both(launcher, keyed_app, jobs)
    assert settled == dict.fromkeys(jobs, "succeeded"), "neither parked"
    effects = [x for x in read_lines(side_file) if x["event"] == "effect"]
    assert len(effects) == 1, "the effect was made once"
    made_by = jobs[effects[0]["n"] - 1]
    [waited] = [j for j in jobs if j != made_by]
    assert keyed_app.get_job(waited).result == {"charged_by": effects[0]["n"]}

    trace = keyed_app.trace(waited)
    in_flight = [e for e in trace if e.name == "effect.failed"]
    assert in_flight, "it found the effect in flight (the two ran side by side)"
    for event in in_flight:
        assert event.data["error_class"] == "concurrency"
        assert event.data["in_flight_job"] == made_by
        assert "in flight" in event.data["error"]
    assert not [e for e in trace if e.name == "effect.in_doubt"], "never judged in doubt"
    [dedup] = [e for e in trace if e.name == "effect.deduplicated"]
    assert dedup.data["first_job"] == made_by
    assert dedup.attempt == len(in_flight) + 1, "the attempt after the last that waited"


def test_a_job_whose_retries_run_out_while_the_effect_is_in_flight_goes_dead_not_in_doubt(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    """The wait is bounded by the job's ``Retry``: ``charge_impatient`` has under a second
    of backoff, the effect takes 6 s. Its attempts run out while the other job's attempt
    still runs it: ``dead`` with ``attempts_exhausted`` (class ``concurrency``), not in
    doubt. Requeued once the other succeeded, it gets the stored result."""
    jobs = tuple(
        keyed_app.enqueue("charge_impatient", {**charge_payload(side_file, n), "seconds": 6.0})
        for n in (1, 2)
    )
    settled = run_both(launcher, keyed_app, jobs)
    effects = [x for x in read_lines(side_file) if x["event"] == "effect"]
    assert len(effects) == 1, "the effect was made once"
    made_by = jobs[effects[0]["n"] - 1]
    [other] = [j for j in jobs if j != made_by]
    assert settled == {made_by: "succeeded", other: "dead"}
    dead = keyed_app.get_job(other)
    assert (dead.dead_reason, dead.last_error_class) == ("attempts_exhausted", "concurrency")
    assert dead.attempt == 5, "every attempt of its Retry, then no more"
    assert "in flight" in (dead.last_error or "")

    keyed_app.requeue(other, reason="the other job made the charge")
    launcher.start("after", app=APP, burst=True, options=("--prefetch", "0")).wait(30)
    assert keyed_app.get_job(other).state.value == "succeeded"
    assert keyed_app.get_job(other).result == {"charged_by": effects[0]["n"]}
    assert len([x for x in read_lines(side_file) if x["event"] == "effect"]) == 1


def run_both(launcher: WorkerLauncher, app: replayq.App, jobs: tuple[int, ...]) -> dict[int, str]:
    """Two workers, one slot each and nothing leased ahead, so each takes one of the two
    jobs at once; the jobs' states once both settled."""
    for name in ("left", "right"):
        launcher.start(name, app=APP, options=("--prefetch", "0"))

    def settled() -> dict[int, str] | None:
        states = {j: app.get_job(j).state.value for j in jobs}
        return states if set(states.values()) <= {"succeeded", "dead"} else None

    return wait_for(settled, timeout=30, what="both charges to settle")
