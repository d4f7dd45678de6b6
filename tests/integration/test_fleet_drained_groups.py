"""The fleet's ``replayq_jobs`` keeps a drained group at 0 for a while, not forever.

A group (queue, job type, version) whose jobs drained reads 0 in each state, so an
alert or a graph sees the queue empty rather than "no data"; after
``DRAINED_KEPT_SECONDS`` without open jobs its series end, so a long-lived
``replayq metrics serve`` does not report every job type it ever saw (types made from
data, versions a rollout retired) for as long as it runs. Real databases, the
collector a ``metrics serve`` process registers, the time from a frozen clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import replayq

AppFactory = Callable[..., replayq.App]


def _series(registry: Any) -> dict[tuple[str, str], float]:
    """``replayq_jobs`` by (job type, state)."""
    found: dict[tuple[str, str], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "replayq_jobs":
                found[(sample.labels["job_type"], sample.labels["state"])] = sample.value
    return found


def test_a_drained_group_reads_zero_then_its_series_end(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    registry = replayq.fleet_registry(app)
    kept = app.enqueue("kept", {}, check=False)
    gone = [app.enqueue(f"report-{n}", {}, check=False) for n in range(3)]

    first = _series(registry)
    assert first[("report-0", "queued")] == 1

    for job_id in gone:
        assert app.cancel(job_id)
    clock.advance(60)
    drained = _series(registry)
    assert drained[("report-0", "queued")] == 0, "a drained group reads 0, not no data"

    clock.advance(2 * 3600)  # past ``fleet.DRAINED_KEPT_SECONDS``, an hour
    later = _series(registry)
    assert {job_type for job_type, _ in later} == {"kept"}, later
    assert later[("kept", "queued")] == 1
    assert app.get_job(kept).state is replayq.JobState.QUEUED
    assert first.get(("report-0", "dead")) == 0, "every state of a group from its first scrape"
