"""What a contract decides after a failed attempt, as a replay reports it.

A dry-run or fork of a failed attempt reports the decision the replayed
version's contract makes — ``retry in ≤ 2.0 s (attempt 3 of 5)`` or
``dead: not_retryable`` — beside the decision the recording shows, so a version
whose retry policy changed does not replay "identically". The rules are the
worker's (``Worker._fail``): the class decides whether to retry, the attempt
budget whether one is left, the backoff ceiling bounds the delay; a failure that is
an effect in doubt is ``dead: effect_in_doubt``, and one that is a constraint of
replayq's own tables refusing replayq's own write (a bug of replayq's) is ``dead:
internal_error`` at once, whatever the contract maps or retries.

Two dead reasons are never a decision now: ``start_failed`` is the worker's, taken when
its start of the job (before the handler) kept raising, and a replay always starts the
handler; ``internal_error`` is one only when the replay itself meets the refusal. A
recorded decision of either is replayq's, not the contract's (``REPLAYQ_DECISIONS``): a
replay's decision now is not compared with it as if the version had changed its policy.
"""

from __future__ import annotations

from replayq.errors import FailureClass, failure_class_named
from replayq.model import DeadReason, TraceEvent
from replayq.queue.contracts import JobContract

RETRY_SCHEDULED = "retry.scheduled"
JOB_DEAD = "job.dead"
# Recorded decisions that replayq or the worker took, not the contract.
REPLAYQ_DECISIONS = frozenset(
    f"dead: {reason.value}" for reason in (DeadReason.INTERNAL_ERROR, DeadReason.START_FAILED)
)


def retry_text(ceiling: float, next_attempt: int, max_attempts: int) -> str:
    return f"retry in ≤ {ceiling:.1f} s (attempt {next_attempt} of {max_attempts})"


def contract_decision(
    contract: JobContract,
    error_class: str | None,
    attempt: int,
    *,
    in_doubt: bool = False,
    internal: bool = False,
) -> str:
    """The decision ``contract`` makes when ``attempt`` fails with ``error_class``;
    ``in_doubt``: an effect's outcome is unknown; ``internal``: replayq's own tables
    refused its own write (the worker parks the job, ``Outcomes._fail``)."""
    failure_class = failure_class_named(error_class) or FailureClass.UNKNOWN
    retry = contract.retry
    if in_doubt:
        return "dead: effect_in_doubt"
    if internal:
        return "dead: internal_error"
    if not retry.retries(failure_class):
        return "dead: not_retryable"
    if attempt >= retry.max_attempts:
        return "dead: attempts_exhausted"
    return retry_text(retry.ceiling(attempt), attempt + 1, retry.max_attempts)


def decisions_differ(recorded: str | None, now: str | None) -> bool:
    """Whether a replay's decision ``now`` differs from the ``recorded`` one as a change of
    the contract's would: both known, and the recorded one the contract's, not replayq's
    (``REPLAYQ_DECISIONS``)."""
    return bool(recorded and now) and recorded not in REPLAYQ_DECISIONS and recorded != now


def recorded_decision(lifecycle: list[TraceEvent], max_attempts: int) -> str | None:
    """The decision the worker took after the recorded attempt (``None``: it took none)."""
    for event in reversed(lifecycle):
        if event.name == RETRY_SCHEDULED:
            ceiling = event.data.get("ceiling")
            next_attempt = int(event.data.get("next_attempt") or (event.attempt or 0) + 1)
            budget = int(event.data.get("max_attempts") or max_attempts)
            return retry_text(float(ceiling or 0.0), next_attempt, budget)
        if event.name == JOB_DEAD:
            return f"dead: {event.data.get('reason') or event.status}"
    return None
