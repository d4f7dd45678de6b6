"""Per-key ordering across two worker processes with concurrency 4 each."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import replayq
from tests.acceptance.workers import WorkerLauncher, read_lines, wait_for

ACCOUNTS = ["a", "b", "c", "d", "e", "f"]  # more keys than one worker's slots
PER_ACCOUNT = 3


def test_one_key_runs_one_at_a_time_in_enqueue_order_while_keys_overlap(
    launcher: WorkerLauncher, sleepy_app: replayq.App, side_file: Path
) -> None:
    enqueued: dict[str, list[int]] = defaultdict(list)
    requests = []
    for _ in range(PER_ACCOUNT):
        for account in ACCOUNTS:
            n = len(requests)
            enqueued[account].append(n)
            payload = {"log": str(side_file), "n": n, "account": account, "seconds": 0.3}
            requests.append(replayq.EnqueueRequest("sleep_in_order", payload))
    sleepy_app.enqueue_many(requests)

    workers = [launcher.start(name, concurrency=4) for name in ("left", "right")]
    total = len(requests)
    wait_for(
        lambda: len(sleepy_app.list_jobs(states=["succeeded"])) == total,
        timeout=40,
        what=f"all {total} jobs to succeed",
    )

    lines = read_lines(side_file)
    start = {line["n"]: line["t"] for line in lines if line["event"] == "start"}
    end = {line["n"]: line["t"] for line in lines if line["event"] == "end"}
    assert len(start) == len(end) == total, "every job ran exactly once"

    for account, numbers in enqueued.items():
        by_start = sorted(numbers, key=start.__getitem__)
        assert by_start == numbers, f"account {account} ran out of enqueue order"
        for earlier, later in itertools.pairwise(numbers):
            assert end[earlier] <= start[later], f"account {account}: {earlier} overlapped {later}"

    def overlap(x: int, y: int) -> bool:
        return start[x] < end[y] and start[y] < end[x]

    accounts_of = {n: acc for acc, numbers in enqueued.items() for n in numbers}
    assert any(overlap(x, y) for x in start for y in start if accounts_of[x] != accounts_of[y]), (
        "jobs with different keys should have run in parallel"
    )
    pids = {line["pid"] for line in lines}
    assert pids == {worker.pid for worker in workers}, "both worker processes took jobs"
