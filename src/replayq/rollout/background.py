"""``rollout verify --background``: verification as a job, resumable chunk by chunk.

``start_verify`` enqueues a job of replayq's own type ``replayq.verify``; any
worker runs it (every ``App`` declares the type; it is not listed among the
app's types, contracts or lock file). Its handler is ordinary replayq code:

1. ``ctx.step("select attempts", ...)`` picks the recorded attempts once; the
   list is the step's recorded result.
2. ``ctx.step("chunk N", ...)`` dry-runs each slice of ``chunk`` attempts
   (``compare_attempts``: ``dry_run_many(..., keep=False)``, nothing written)
   and returns the slice's summary (counts, first-divergence histogram, first
   differing examples) — recorded in the step ledger in the step's commit.
3. The job's result is the report, the summaries merged in order.

A worker killed mid-run loses only the chunk it was in: the job's lease expires,
another worker leases it, and under ``resume="step"`` every committed step
returns its recorded result instead of running again. Merged in order, the
summaries give the same report as an uninterrupted run.

``verify_runs`` / ``verify_run`` read a run's progress and partial report from
the job and its step ledger (``rollout verify-status``, ``rollout status``, the
dashboard). A partial report is not a verdict: ``VerifyRun.passed`` is ``None``
until the job succeeded (a queued run has compared nothing, a running one only its
committed chunks), and ``False`` for a run that ended without a report (dead or
cancelled); ``verdict`` names the four cases, as ``VERDICTS`` lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replayq.errors import ReplayqError
from replayq.model import Job
from replayq.queue.enqueue import EnqueueRequest, insert_job
from replayq.recording.ledger import CompletedStep, ledger_loader
from replayq.rollout.verify import DIFFERENCE_CLASSES, VerifyReport
from replayq.rollout.verify_job import CHUNK, VERIFY_JOB_TYPE
from replayq.rollout.verify_steps import SELECT_STEP, chunk_step, empty_report
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.protocol import JobFilter


def start_verify(
    source: RuntimeSource,
    job_type: str,
    *,
    from_version: str,
    to_version: str,
    sample: int | None = None,
    since: float | None = None,
    states: Sequence[str] | None = None,
    allow: Sequence[str] = (),
    max_per_second: float | None = None,
    chunk: int = CHUNK,
    app: str | None = None,
) -> int:
    """Enqueue a background verification (a ``replayq.verify`` job); returns its job id.

    ``app``: the ``module:attribute`` the caller loaded the app from (``rollout verify
    --app``), kept in the job so the report's fork commands name it; the worker's own
    app runs the verification either way.
    """
    runtime = source.runtime
    runtime.registry.handler(job_type, to_version)  # refuse an undeclared version up front
    unknown = [c for c in allow if c not in DIFFERENCE_CLASSES]
    if unknown:
        raise ReplayqError(f"unknown difference class {unknown[0]!r}")
    payload = {
        "job_type": job_type,
        "from_version": from_version,
        "to_version": to_version,
        "sample": sample,
        "since": since,
        "states": list(states) if states else None,
        "allow": list(allow),
        "rate": max_per_second,
        "chunk": chunk,
    }
    if app is not None:  # only when known: the payload of a run without stays as it was
        payload["app"] = app
    with runtime.storage.transaction() as tx:
        return insert_job(runtime, tx, EnqueueRequest(VERIFY_JOB_TYPE, payload))


VERDICTS = {
    "passed": "finished, no difference outside --allow",
    "findings": "finished, with differences outside --allow",
    "unfinished": "queued or running: no verdict yet (its report so far is partial)",
    "no_report": "ended without a report (dead or cancelled): the candidate was not verified",
}
"""A background verification's ``verdict``, each with what it means."""

_ENDED_WITHOUT_REPORT = frozenset({"dead", "cancelled"})


@dataclass(frozen=True)
class VerifyRun:
    """A background verification: its job, progress and (partial) report.

    ``passed`` is the verdict a gate may trust: ``True`` only once the job succeeded
    and its report found nothing outside ``allow``; ``None`` while it is queued or
    running (``report`` is then what its committed chunks found so far); ``False`` on
    findings, and for a run that ended without a report (dead, cancelled).
    """

    job_id: int
    state: str
    attempt: int
    total: int | None
    chunks_done: int
    report: VerifyReport
    error: str | None
    app: str | None = None  # the ``--app`` it was started with, if the caller gave one

    @property
    def done(self) -> int:
        return self.report.attempts

    @property
    def finished(self) -> bool:
        return self.state == "succeeded"

    @property
    def verdict(self) -> str:
        """passed, findings, unfinished (queued or running) or no_report (dead, cancelled)."""
        if self.finished:
            return "passed" if self.report.passed else "findings"
        return "no_report" if self.state in _ENDED_WITHOUT_REPORT else "unfinished"

    @property
    def passed(self) -> bool | None:
        """True: finished and found nothing; None: no verdict yet; False: otherwise."""
        verdict = self.verdict
        return None if verdict == "unfinished" else verdict == "passed"

    def to_dict(self) -> dict[str, Any]:
        # The report's own ``passed`` is the run's: a partial report is no pass.
        report = {**self.report.to_dict(), "passed": self.passed}
        return {
            "job_id": self.job_id,
            "state": self.state,
            "attempt": self.attempt,
            "total": self.total,
            "done": self.done,
            "chunks_done": self.chunks_done,
            "finished": self.finished,
            "verdict": self.verdict,
            "passed": self.passed,
            "app": self.app,
            "error": self.error,
            "report": report,
        }


def _run_of(runtime: Runtime, job: Job) -> VerifyRun:
    steps: dict[str, CompletedStep] = dict(ledger_loader(runtime, job.id)())
    request = dict(job.payload)
    report = empty_report(request)
    selected = steps.get(SELECT_STEP)
    chunks = 0
    while chunk_step(chunks) in steps:
        report.merge(steps[chunk_step(chunks)].result)
        chunks += 1
    app = request.get("app")
    if app:
        report.point_forks_at(str(app))
    return VerifyRun(
        job_id=job.id,
        state=job.state.value,
        attempt=job.attempt,
        total=len(selected.result) if selected is not None else None,
        chunks_done=chunks,
        report=report,
        error=job.last_error,
        app=str(app) if app else None,
    )


def verify_run(source: RuntimeSource, job_id: int) -> VerifyRun:
    """One background verification, read from its job and step ledger."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        job = tx.job_get(job_id)
    if job is None or job.job_type != VERIFY_JOB_TYPE:
        raise ReplayqError(f"no background verification with job id {job_id}")
    return _run_of(runtime, job)


def verify_runs(
    source: RuntimeSource, job_type: str | None = None, *, limit: int = 20
) -> list[VerifyRun]:
    """Background verifications (of ``job_type``, if given), newest first."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        jobs = tx.job_list(JobFilter(None, VERIFY_JOB_TYPE, None, 1000))
    jobs = [j for j in jobs if job_type is None or j.payload.get("job_type") == job_type]
    jobs.sort(key=lambda j: j.id, reverse=True)
    return [_run_of(runtime, job) for job in jobs[:limit]]
