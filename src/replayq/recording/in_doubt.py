"""Settling in-doubt effects: list them, resolve them by hand or ask a reconciler.

An effect record is *in doubt* when it is ``started`` and the attempt that
claimed it is no longer running: the process crashed, or lost its lease, while
the effect was in flight, so the effect may or may not have happened. Under the
``park`` policy the job that meets it goes ``dead`` (``effect_in_doubt``). To
let it continue, someone who knows the truth settles the record:

* ``resolve_effect(key, succeeded=True, result=...)`` — it happened: the next
  attempt gets ``result`` from the ledger and the effect is not called again;
* ``resolve_effect(key, succeeded=False, reason=...)`` — it did not happen: the
  next attempt runs the effect again (exactly once more, under the same key);

then requeues the job (``replayq dead requeue``). Each resolution is appended
to the claiming job's trace as ``effect.resolved`` with who (``by``) and why.

A *reconciler* is an optional function per effect kind that asks the provider
(``@app.reconciler("payment.charge")``): it receives the ``EffectRecord`` and
returns an ``EffectResolution``, or ``None`` when the provider does not know.
The worker asks it before parking a job; ``replayq effects resolve --auto``
asks it for every in-doubt record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replayq import codec
from replayq.errors import ConfigurationError
from replayq.model import TraceEvent
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.protocol import IdemFilter, IdemRecord, IdemResolve, idem_get


@dataclass(frozen=True)
class EffectRecord:
    """One idempotency record of ``ctx.effect``, as ``replayq effects list`` shows it."""

    key: str
    kind: str
    status: str
    in_doubt: bool
    job_id: int | None
    attempt: int | None
    trace_id: str | None
    started_at: float
    completed_at: float | None
    error: str | None
    result: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "status": self.status,
            "in_doubt": self.in_doubt,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "trace_id": self.trace_id,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "result": self.result,
        }


@dataclass(frozen=True)
class EffectResolution:
    """The truth about an in-doubt effect: it succeeded (with ``result``) or it failed."""

    succeeded: bool
    result: Any = None
    reason: str | None = None

    @property
    def outcome(self) -> str:
        return "succeeded" if self.succeeded else "failed"


def record_of(row: IdemRecord, *, in_doubt: bool | None = None) -> EffectRecord:
    """An ``EffectRecord`` from an ``rq_idempotency`` row."""
    return EffectRecord(
        key=row.key,
        kind=row.operation,
        status=row.status,
        in_doubt=bool(row.in_doubt) if in_doubt is None else in_doubt,
        job_id=row.job_id,
        attempt=row.attempt,
        trace_id=row.trace_id,
        started_at=float(row.started_at),
        completed_at=row.completed_at,
        error=row.error,
        result=codec.loads(row.result) if row.result else None,
    )


def list_effects(
    source: RuntimeSource, *, in_doubt: bool = False, kind: str | None = None, limit: int = 100
) -> list[EffectRecord]:
    """Effect records, newest first; ``in_doubt`` keeps only those nobody will finish."""
    runtime = source.runtime
    with runtime.storage.transaction(readonly=True) as tx:
        rows = tx.idem_list(IdemFilter(operation=kind, in_doubt=in_doubt, limit=limit))
    return [record_of(row) for row in rows if row.operation != "db.write"]


def _in_doubt_record(runtime: Runtime, key: str) -> tuple[EffectRecord, str]:
    """The in-doubt record of ``key`` and its claim token, or a ``ConfigurationError``."""
    with runtime.storage.transaction(readonly=True) as tx:
        row = idem_get(tx, key)
        job = tx.job_get(row.job_id) if row and row.job_id is not None else None
    if row is None:
        raise ConfigurationError(f"no effect record with key {key!r}")
    if row.status != "started":
        raise ConfigurationError(
            f"effect {key!r} is {row.status}, not in doubt: there is nothing to resolve"
        )
    if job is not None and job.state.value == "running" and job.attempt == row.attempt:
        raise ConfigurationError(
            f"effect {key!r} is in progress (job {job.id} attempt {job.attempt} is running); "
            "it is in doubt only once that attempt has ended"
        )
    return record_of(row, in_doubt=True), row.claim_token


def settle(
    runtime: Runtime,
    record: EffectRecord,
    resolution: EffectResolution,
    *,
    by: str,
    claim_token: str,
) -> bool:
    """Write ``resolution`` to the record (compare-and-set on its claim) and trace it."""
    result_json = codec.dumps(resolution.result, what=f"resolved result of {record.key!r}")
    now, hlc = runtime.clock.now(), runtime.hlc.tick()
    with runtime.storage.transaction() as tx:
        changed = tx.idem_transition(
            IdemResolve(
                key=record.key,
                claim_token=claim_token,
                status=resolution.outcome,
                result=result_json if resolution.succeeded else None,
                error=None if resolution.succeeded else (resolution.reason or "resolved failed"),
                now=now,
            )
        )
        if not changed:
            return False
        # Redacted as a job's own events are (``Recorder._event``): the key names its
        # resource, and a resolved result is a recorded value.
        redactor = runtime.redactor
        traced = redactor.resource(record.key)
        tx.trace_append(
            [
                TraceEvent(
                    trace_id=record.trace_id or f"admin:{traced}",
                    name="effect.resolved",
                    ts=now,
                    hlc=hlc,
                    job_id=record.job_id,
                    kind="domain",
                    worker_id=by,
                    status=resolution.outcome,
                    resource=traced,
                    data=redactor.value(
                        {
                            "kind": record.kind,
                            "key": record.key,
                            "outcome": resolution.outcome,
                            "result": resolution.result if resolution.succeeded else None,
                            "reason": resolution.reason,
                            "by": by,
                            "claimed_by_attempt": record.attempt,
                        }
                    ),
                )
            ]
        )
    return True


def resolve_effect(
    source: RuntimeSource,
    key: str,
    *,
    succeeded: bool,
    result: Any = None,
    reason: str | None = None,
    by: str,
) -> EffectRecord:
    """Settle the in-doubt record ``key``; returns the record as it is now.

    ``succeeded=True``: a later attempt gets ``result`` and the effect is not run
    again. ``succeeded=False``: a later attempt runs it again. Refused (a
    ``ConfigurationError``) when the record is not in doubt.
    """
    if not by.strip():
        raise ConfigurationError("resolving an effect needs who resolved it (by=...)")
    if not succeeded and result is not None:
        raise ConfigurationError("a failed effect has no result; give a reason instead")
    runtime = source.runtime
    record, claim_token = _in_doubt_record(runtime, key)
    resolution = EffectResolution(succeeded, result if succeeded else None, reason)
    if not settle(runtime, record, resolution, by=by, claim_token=claim_token):
        raise ConfigurationError(f"effect {key!r} changed while resolving it; look again")
    with runtime.storage.transaction(readonly=True) as tx:
        row = idem_get(tx, key)
    assert row is not None
    return record_of(row, in_doubt=False)


def ask_reconciler(
    runtime: Runtime, record: EffectRecord
) -> tuple[EffectResolution | None, str | None]:
    """The kind's reconciler's answer (``None``: unknown or no reconciler) and its error."""
    reconcile = runtime.registry.reconcilers.get(record.kind)
    if reconcile is None:
        return None, None
    try:
        answer = reconcile(record)
    except Exception as exc:  # the provider is down: unknown, and say why
        return None, f"{type(exc).__name__}: {exc}"
    if answer is not None and not isinstance(answer, EffectResolution):
        return None, f"reconciler returned {type(answer).__name__}, not EffectResolution"
    return answer, None


def reconcile_effects(
    source: RuntimeSource, *, kind: str | None = None, by: str
) -> list[tuple[EffectRecord, EffectResolution | None, str | None]]:
    """Ask the reconciler of every in-doubt record (of ``kind``); settle what it knows.

    Returns ``(record, answer or None, error or None)`` for each in-doubt record
    whose kind has a reconciler.
    """
    runtime = source.runtime
    results = []
    for record in list_effects(runtime, in_doubt=True, kind=kind, limit=10_000):
        if record.kind not in runtime.registry.reconcilers:
            continue
        answer, error = ask_reconciler(runtime, record)
        if answer is not None:
            with runtime.storage.transaction(readonly=True) as tx:
                row = idem_get(tx, record.key)
            if row is None or not settle(
                runtime, record, answer, by=by, claim_token=row.claim_token
            ):
                answer, error = None, "the record changed while reconciling it"
        results.append((record, answer, error))
    return results
