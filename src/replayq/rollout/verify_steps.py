"""The steps of a ``replayq.verify`` job (``background`` draws the whole): select, then chunks.

``verify_job`` declares the type and imports this module when a worker first runs one;
``background`` reads a run's progress back by the same step names.
"""

from __future__ import annotations

import time
from typing import Any

from replayq.recording.context import Context
from replayq.rollout.verify import VerifyReport, compare_attempts, why_nothing_selected
from replayq.rollout.verify import recorded_attempts as select_attempts
from replayq.runtime import Runtime

SELECT_STEP = "select attempts"
# Only when the selection is empty: why, in words, as it was when the run selected.
EMPTY_STEP = "why nothing was selected"


def chunk_step(index: int) -> str:
    return f"chunk {index + 1}"


def _select(
    runtime: Runtime,
    job_type: str,
    from_version: str,
    sample: int | None,
    since: float | None,
    states: list[str] | None,
) -> list[list[Any]]:
    return [
        [job_id, attempt, last]
        for job_id, attempt, last in select_attempts(
            runtime, job_type, from_version, sample=sample, since=since, states=states
        )
    ]


def _why_empty(
    runtime: Runtime,
    job_type: str,
    from_version: str,
    sample: int | None,
    since: float | None,
    states: list[str] | None,
) -> str:
    return why_nothing_selected(
        runtime, job_type, from_version, sample=sample, since=since, states=states
    )


def _verify_chunk(
    runtime: Runtime, request: dict[str, Any], part: list[list[Any]]
) -> dict[str, Any]:
    report = empty_report(request)
    todo = [(int(j), int(a), bool(last)) for j, a, last in part]
    started = time.perf_counter()
    for comparison in compare_attempts(
        runtime, todo, request["to_version"], max_per_second=request.get("rate")
    ):
        report.add(comparison)
    report.seconds = time.perf_counter() - started
    return report.summary()


def empty_report(request: dict[str, Any]) -> VerifyReport:
    return VerifyReport(
        request["job_type"],
        request["from_version"],
        request["to_version"],
        tuple(request.get("allow") or ()),
    )


def run(
    ctx: Context,
    job_type: str,
    from_version: str,
    to_version: str,
    sample: int | None,
    since: float | None,
    states: list[str] | None,
    chunk: int,
) -> dict[str, Any]:
    """The body of the ``replayq.verify`` handler (``verify_job``): select once, then one
    step per chunk."""
    runtime = ctx.runtime
    request = dict(ctx.job.payload)
    runtime.registry.handler(job_type, to_version)  # this worker must declare the candidate
    todo = ctx.step(SELECT_STEP, _select, runtime, job_type, from_version, sample, since, states)
    report = empty_report(request)
    if not todo:
        report.empty_reason = ctx.step(
            EMPTY_STEP, _why_empty, runtime, job_type, from_version, sample, since, states
        )
    for index, start in enumerate(range(0, len(todo), max(1, chunk))):
        part = todo[start : start + max(1, chunk)]
        report.merge(ctx.step(chunk_step(index), _verify_chunk, runtime, request, part))
    return report.to_dict()
