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
  gets the first's result; without one, a job that finds the key's effect still in
  flight in another job parks in doubt (recording-context.md, "Effects": the limit).
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


def test_without_an_ordering_key_a_job_finding_the_effect_in_flight_parks_it_made_once(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    """The documented limit, under ``park``: the effect is still made once, but the job
    that found the key ``started`` by another job's live attempt cannot tell it from one
    left by a crash, and parks it in doubt; requeued, it gets the stored result
    (recording-context.md, "Effects", "Two jobs of one key at once")."""
    first, second = (keyed_app.enqueue("charge", charge_payload(side_file, n)) for n in (1, 2))
    settled = run_both(launcher, keyed_app, (first, second))
    effects = [x for x in read_lines(side_file) if x["event"] == "effect"]
    assert len(effects) == 1, "the effect was made once"
    made_by = {1: first, 2: second}[effects[0]["n"]]
    other = second if made_by == first else first
    assert settled[made_by] == "succeeded"
    parked = keyed_app.get_job(other)
    assert (parked.state.value, parked.dead_reason) == ("dead", "effect_in_doubt")

    # A person requeues it: the record has succeeded since, so it gets the stored result.
    keyed_app.requeue(other, reason="the other job made the charge")
    launcher.start("after", app=APP, burst=True, options=("--prefetch", "0")).wait(30)
    assert keyed_app.get_job(other).state.value == "succeeded"
    assert keyed_app.get_job(other).result == {"charged_by": effects[0]["n"]}
    assert len([x for x in read_lines(side_file) if x["event"] == "effect"]) == 1


def test_without_an_ordering_key_the_retry_policy_makes_an_effect_in_flight_twice(
    launcher: WorkerLauncher, keyed_app: replayq.App, side_file: Path
) -> None:
    """The documented limit, under ``retry``: the second job takes the live claim over
    and runs the effect again, at the same time; both succeed."""
    jobs = tuple(keyed_app.enqueue("charge_retry", charge_payload(side_file, n)) for n in (1, 2))
    settled = run_both(launcher, keyed_app, jobs)
    assert set(settled.values()) == {"succeeded"}
    effects = [x for x in read_lines(side_file) if x["event"] == "effect"]
    assert sorted(x["n"] for x in effects) == [1, 2], "made by each job"
    assert abs(effects[0]["t"] - effects[1]["t"]) < 2.0, "the second began inside the first"


def run_both(launcher: WorkerLauncher, app: replayq.App, jobs: tuple[int, ...]) -> dict[int, str]:
    """Two workers, one slot each and nothing leased ahead, so each takes one of the two
    jobs at once; the jobs' states once both settled."""
    for name in ("left", "right"):
        launcher.start(name, app=APP, options=("--prefetch", "0"))

    def settled() -> dict[int, str] | None:
        states = {j: app.get_job(j).state.value for j in jobs}
        return states if set(states.values()) <= {"succeeded", "dead"} else None

    return wait_for(settled, timeout=30, what="both charges to settle")
