"""Side effects behind idempotency records (``ctx.effect``).

Before an effect runs, a record for its business key is claimed atomically
(``started``). If the key already ``succeeded``, the stored result is returned
and the effect is not repeated (an idempotency conflict, recorded). On success
the record becomes ``succeeded`` with the result; on error, ``failed`` (a later
attempt may try again).

A ``started`` record of another claim whose attempt still runs under its lease (another
job of the key, inside the effect right now) is *in flight*: the claim neither waits nor
takes it over but fails the attempt with ``ConcurrencyError``, retried by the job's
``Retry``, whose next attempts find the outcome (a success is reused). Whether that
attempt still runs is read with the record, in one statement (``_judged``).

A ``started`` record that no one will finish — the attempt that claimed it crashed
or lost its lease mid-effect — is *in doubt*: the effect may or may not have
happened. What happens next is the effect kind's explicit policy, declared on
the job (``effects={"email.send": "retry"}``):

* ``park`` (the default): the job goes to ``dead`` with reason
  ``effect_in_doubt`` so that a human checks the real world first;
* ``retry``: the effect runs again (choose this only when the downstream
  dedups on the key you pass it, or a repeat is harmless).

Before parking, the worker asks the kind's reconciler if one is registered
(``@app.reconciler("payment.charge")``, see ``replayq.recording.in_doubt``): a
known outcome settles the record (a success is returned, a failure runs the
effect again); ``None`` (unknown) parks the job as before. A parked record is
settled by hand with ``replayq effects resolve KEY`` and the job requeued.

Fencing: the claim and the recorded outcome each commit only while the
attempt's owner token holds the job's lease (``ctx.fence``). A worker whose
lease was taken never starts the effect; one that lost it while the effect ran
cannot record the outcome (the record stays in doubt for the new owner) and the
outcome it saw is kept in its ``write.fenced`` event for whoever settles it.

An effect whose outside call ends after its attempt ended (a thread or a task the
handler left running) records nothing into the attempt's trace: its record still gets
the outcome, by the compare-and-set on its claim token alone (``_record_late``), and
the outcome is logged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from replayq import codec
from replayq.errors import (
    ConcurrencyError,
    ConfigurationError,
    ContextEndedError,
    EffectInDoubtError,
    EffectRefusedError,
    RecordedFailure,
    classify,
)
from replayq.model import Job, TraceEvent
from replayq.queue.handlers import Handler
from replayq.recording.aio import Flow, outside_call, run_flow
from replayq.recording.attempt import ENDED, Attempt, ended_error, ended_late
from replayq.recording.blobs import Encoded, load_json, put_bytes
from replayq.recording.world import LIVE
from replayq.seal import unsealed
from replayq.storage.commits import commit_at_once
from replayq.storage.protocol import (
    IdemClaim,
    IdemFail,
    IdemRecord,
    IdemSucceed,
    IdemTakeover,
    Transaction,
    idem_get,
    idem_judged,
)
from replayq.storage.reconnect import retry_unavailable

IN_DOUBT_POLICIES = ("park", "retry")
# How long the record's claim or completion is retried while the database is unreachable.
RECONNECT_SECONDS = 60.0


_T = TypeVar("_T")


def default_effect_key(handler: Handler, job: Job, kind: str) -> str | None:
    """The key of an effect given none: the job's idempotency key, then ``:kind``
    (``None`` without a template). The dry-run's quick check derives it the same way.

    The key is rendered from the job's payload as the handler receives it (a field left
    out takes its default), as at enqueue; a job whose row kept a key rendered with
    ``None`` for such a field (stored before replayq filled defaults in) keeps it.
    """
    template = handler.keys.idempotency
    if template is None:
        return None
    return f"{template.render(job.payload, job.idempotency_key)}:{kind}"


def claim_token_hex() -> str:
    """A new claim token: a random (version 4) UUID's 32 hex digits, as ``uuid4().hex``
    writes them, from the same 16 random bytes without building a ``UUID`` (its
    ``__init__`` and ``hex`` in Python were ~11,000 instructions of every effect)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # the version, 4
    raw[8] = raw[8] & 0x3F | 0x80  # the variant, RFC 4122
    return raw.hex()


class EffectRunner:
    """Runs ``ctx.effect`` calls for one attempt."""

    def __init__(self, ctx: Attempt) -> None:
        self._ctx = ctx
        # Keys whose reconciler this attempt already asked (asked once, then parked).
        self._asked: set[str] = set()

    def default_key(self, kind: str) -> str:
        ctx = self._ctx
        key = default_effect_key(ctx.handler, ctx.job, kind)
        if key is None:
            raise ConfigurationError(
                f"{self._ctx.job.job_type}: effect {kind!r} needs an idempotency key: pass "
                "key=... or declare idempotency='...' on the job (keys are never random)"
            )
        return key

    def run(self, kind: str, fn: Callable[[], Any], *, key: str | None) -> Any:
        """Run ``fn`` as the effect of ``kind`` under ``key`` (plain or async, see ``aio``)."""
        return run_flow(self.flow(kind, fn, key=key), fn)

    def flow(self, kind: str, fn: Any, *, key: str | None) -> Flow[Any]:
        """The effect's recording, yielding where ``fn`` runs (``recording.aio``). Refused
        once the attempt ended: a kept ``ctx.effects``, or an awaitable ``ctx.effect``
        awaited only after the handler returned (checked when the flow starts).

        The look at the end and what follows it up to the run (the claim), then the look
        again and the outcome's commit, each under the context's ``_live``: an effect in a
        thread or a task that outlived the handler claims and records before the end, or
        sees it. One whose outside call ends after the end records nothing into the trace;
        its idempotency record still gets the outcome (``_record_late``)."""
        ctx = self._ctx
        if ctx._callback is not None:  # ``ctx.effects`` kept: it would wait for ``_live``
            ctx._refuse_inside(f"ctx.effects.run({kind!r})")
        with ctx._live:
            claimed = self._claim(kind, key)
        if not isinstance(claimed, _Claimed):
            return claimed  # replayed, deduplicated or settled: not run
        key, claim_token = claimed.key, claimed.claim_token
        runtime = ctx.runtime
        started = time.monotonic()
        try:
            with unsealed():  # the effect itself is the door the seal leaves open
                result = yield outside_call(fn)
        except Exception as exc:
            error = ctx.redactor.error(exc)
            with ctx._live:
                if ctx._cancel is ENDED:  # the handler returned while the effect ran
                    raise self._record_late(kind, key, claim_token, error=error) from exc
                with runtime.storage.transaction() as tx, tx.pipelined():
                    ctx.fence(tx, [f"effect failure {kind} {key}"], kind=kind, key=key, error=error)
                    tx.idem_transition(IdemFail(key, claim_token, error, runtime.clock.now()))
                    tx.trace_append(
                        [
                            ctx.event(
                                "effect.failed",
                                status="fail",
                                side_effect=True,
                                resource=key,
                                kind=kind,
                                key=key,
                                error=error,
                                error_class=classify(exc, dict(ctx.handler.error_map)).value,
                                duration=round(time.monotonic() - started, 6),
                            )
                        ]
                    )
            raise
        with ctx._live:
            encoded = ctx.encoded(result, what=f"ctx.effect({kind!r}) result")
            if ctx._cancel is ENDED:  # the handler returned while the effect ran
                raise self._record_late(kind, key, claim_token, encoded=encoded)
            riding = ctx.ride_along()
            # The effect happened: record it even across an outage, or the next attempt would
            # find the key ``started`` (in doubt). A retry after a lost COMMIT reply changes
            # nothing (compare-and-set on the claim token) and adds no second event.
            retry_unavailable(
                f"job {ctx.job.id}: record effect {key!r}",
                lambda retrying: self._record_success(
                    kind, key, claim_token, encoded, started, riding, first=not retrying
                ),
                seconds=RECONNECT_SECONDS,
            )
            ctx.rode(riding)
        return result

    def _claim(self, kind: str, key: str | None) -> Any:
        """Up to the effect's run (under ``_live``): refused once the attempt ended; the
        world's answer (a replay), else the claim of the key's record. ``_Claimed`` (the
        key and the claim token) to run it, else what the verb returns without running it
        (recorded, deduplicated, or settled by the reconciler)."""
        ctx = self._ctx
        if ctx._cancel is ENDED:  # a view kept past its attempt (``Context.end``)
            raise ended_error(ctx.job.id, ctx.attempt)
        key = key or self.default_key(kind)
        try:
            answer = ctx.world.answer("effect", kind, key)
        except RecordedFailure as exc:
            ctx.record(
                "effect.failed",
                status="fail",
                resource=key,
                kind=kind,
                key=key,
                error=exc.error,
                error_class=exc.failure_class.value,
                replayed=True,
            )
            raise
        except EffectRefusedError as exc:
            ctx.record(
                "effect.refused", status="fail", resource=key, kind=kind, key=key, reason=str(exc)
            )
            raise
        if answer is not LIVE:
            ctx.record("effect.replayed", resource=key, kind=kind, key=key, result=answer)
            return answer
        claim_token = claim_token_hex()
        runtime = ctx.runtime
        claim = IdemClaim(
            key=key,
            operation=kind,
            claim_token=claim_token,
            now=runtime.clock.now(),
            trace_id=ctx.trace_id,
            job_id=ctx.job.id,
            attempt=ctx.attempt,
        )

        # The step's events so far commit with the claim (not in a commit of their own).
        riding = ctx.ride_along()

        refused = [f"effect claim {kind} {key}"]

        def claim_in(tx: Transaction, claimed: _Once[TraceEvent]) -> Any:
            if tx.idem_transition(claim):
                # A new claim (the usual case): the append of its event is the fence. A
                # worker whose lease was taken never starts the effect: nothing is
                # appended, ``LeaseLostError`` rolls the claim back.
                ctx.append_fenced(tx, [*riding, claimed()], refused, kind=kind, key=key)
                return _RUN_RODE
            # A record exists. The event a refused try of this commit made (it found the
            # record) is unmade: made again below, after ``_existing``'s events, or never
            # (a deduplicated or parked effect), as where no try was refused.
            claimed.unmade(ctx.unmake)
            # Fenced before anything is decided from it.
            ctx.fence(tx, refused, kind=kind, key=key)
            existing = idem_get(tx, key)
            ours = existing is not None and existing.claim_token == claim_token
            if existing is not None and not ours:
                outcome = self._existing(tx, kind, key, existing, claim)
                if outcome is not _RUN:
                    return outcome
            if not ours:
                tx.trace_append([*riding, claimed()])
            # ``riding`` committed now, or with this claim by the try whose reply was lost.
            return _RUN_RODE

        # One round trip where it can be (``commit_at_once``); a claim whose COMMIT reply
        # was lost is recognised by its claim token on the retry.
        def claim_once(retrying: bool) -> Any:
            # Made once a commit (``_Once``): ``commit_at_once`` may run ``claim_in`` twice;
            # a try after an outage (its COMMIT maybe made) makes its own, as before.
            claimed = _Once(
                lambda: ctx.event(
                    "effect.claimed", resource=key, kind=kind, key=key, claim=claim_token
                )
            )
            return commit_at_once(runtime.storage, lambda tx: claim_in(tx, claimed))

        outcome = retry_unavailable(
            f"job {ctx.job.id}: claim effect {key!r}", claim_once, seconds=RECONNECT_SECONDS
        )
        if isinstance(outcome, _Ask):
            # In doubt under ``park`` with a reconciler: ask it outside any transaction and
            # with ``_live`` let go (it calls the provider), settle the record with its
            # answer, and claim again if the attempt has not ended meanwhile.
            self._reconcile(kind, key, outcome.existing)
            # Read again: another thread's effect may have committed the pending events
            # while ``_live`` was let go (``rode``); they must not be appended twice.
            riding = ctx.ride_along()
            outcome = retry_unavailable(
                f"job {ctx.job.id}: claim effect {key!r}", claim_once, seconds=RECONNECT_SECONDS
            )
        if outcome is _RUN_RODE:
            ctx.rode(riding)
            return _Claimed(key, claim_token)
        if outcome is _RUN:
            return _Claimed(key, claim_token)
        return outcome

    def _record_late(
        self,
        kind: str,
        key: str,
        claim_token: str,
        *,
        encoded: Encoded | None = None,
        error: str | None = None,
    ) -> ContextEndedError:
        """The outcome of an effect whose outside call ended after its attempt did (a
        thread or a task the handler left running): its idempotency record gets it, as
        it would have (``succeeded`` with the result, or ``failed``), so the effect is not
        left in doubt (a later holder of the key reuses a success, and never parks on
        it); nothing goes into the attempt's trace, which takes nothing after its end.
        Not fenced by the lease (the attempt's settle has usually given it up by then):
        the compare-and-set on the record's claim token, still ``started``, is the guard,
        so a record taken over or settled since is left as it is. Logged either way; the
        error the effect's caller gets is returned (``ended_late``)."""
        ctx = self._ctx
        runtime = ctx.runtime
        wanted = "failed" if error is not None else "succeeded"

        def write(tx: Transaction) -> bool:
            now = runtime.clock.now()
            if error is not None:
                tx.idem_transition(IdemFail(key, claim_token, error, now))
            else:
                assert encoded is not None
                _, ref, raw, text = encoded
                if raw is not None:
                    put_bytes(
                        tx, raw, now=now, limit=runtime.limits.blob_limit_bytes, what=kind, ref=ref
                    )
                tx.idem_transition(IdemSucceed(key, claim_token, None if ref else text, ref, now))
            # Read back: a try after a lost COMMIT reply changes nothing, yet it was ours.
            record = idem_get(tx, key)
            return record is not None and (record.claim_token, record.status) == (
                claim_token,
                wanted,
            )

        recorded = retry_unavailable(
            f"job {ctx.job.id}: record late effect {key!r}",
            lambda retrying: commit_at_once(runtime.storage, write),
            seconds=RECONNECT_SECONDS,
        )
        return ended_late(
            ctx,
            f"ctx.effect({kind!r}, key={key!r})",
            f"failed ({error})" if error is not None else "succeeded",
            f"not in its trace; its idempotency record says {wanted}"
            if recorded
            else "not in its trace; its idempotency record was taken over or settled "
            "meanwhile: left as it is",
        )

    def _record_success(
        self,
        kind: str,
        key: str,
        claim_token: str,
        encoded: Encoded,
        started: float,
        riding: list[Any],
        *,
        first: bool,
    ) -> None:
        ctx = self._ctx
        runtime = ctx.runtime
        inline, ref, raw, text = encoded
        refused = [f"effect result {kind} {key}"]
        # The outcome the late worker saw is kept in ``write.fenced`` for whoever settles
        # the record the new owner finds in doubt.
        details = {"kind": kind, "key": key, "result": inline, "output_ref": ref}
        # ``inline`` came out of ``encoded``: redacted once, not screened again. Made once
        # (``_Once``): ``commit_at_once`` may run ``record_in`` twice.
        succeeded = _Once(
            lambda: ctx.event_screened(
                "effect.succeeded",
                ("result",),
                status="success",
                side_effect=True,
                resource=key,
                kind=kind,
                key=key,
                result=inline,
                output_ref=ref,
                duration=round(time.monotonic() - started, 6),
            )
        )

        def record_in(tx: Transaction) -> None:
            if raw is not None:
                put_bytes(
                    tx,
                    raw,
                    now=runtime.clock.now(),
                    limit=runtime.limits.blob_limit_bytes,
                    what=kind,
                    ref=ref,
                )
            changed = tx.idem_transition(
                IdemSucceed(
                    key=key,
                    claim_token=claim_token,
                    result=None if ref else text,
                    result_ref=ref,
                    now=runtime.clock.now(),
                )
            )
            if not changed and not first:
                # The event a refused try made is not recorded: unmade, as never made.
                succeeded.unmade(ctx.unmake)
                ctx.fence(tx, refused, **details)
                return  # committed by the try whose reply was lost, with ``riding``
            # The append is the fence: without the lease nothing of ``tx`` commits.
            ctx.append_fenced(tx, [*riding, succeeded()], refused, **details)

        commit_at_once(runtime.storage, record_in)

    def _existing(
        self, tx: Transaction, kind: str, key: str, existing: IdemRecord, claim: IdemClaim
    ) -> Any:
        """Decide what a found record means: reuse, wait for it, take over, or park."""
        ctx = self._ctx
        if existing.status == "started":
            existing = self._judged(tx, kind, key, existing)
        status = existing.status
        if status in ("succeeded", "compensated"):
            result = load_json(tx, codec.loads(existing.result), existing.result_ref)
            tx.trace_append(
                [
                    ctx.event(
                        "effect.deduplicated",
                        resource=key,
                        kind=kind,
                        key=key,
                        first_job=existing.job_id,
                        first_attempt=existing.attempt,
                        first_trace=existing.trace_id,
                        status=status,
                        result=result,
                    )
                ]
            )
            return result
        policy = ctx.handler.contract.effect_policy(kind)
        reconciler = ctx.runtime.registry.reconcilers.get(kind)
        if status == "started" and policy == "park" and reconciler and key not in self._asked:
            return _Ask(existing)
        if status == "started" and policy == "park":
            # Recorded as pending, not in ``tx``: the raise below rolls ``tx`` back, and the
            # failed attempt's events are flushed with its failure.
            ctx.record(
                "effect.in_doubt",
                status="fail",
                resource=key,
                kind=kind,
                key=key,
                claimed_by_job=existing.job_id,
                claimed_by_attempt=existing.attempt,
                started_at=existing.started_at,
                policy=policy,
            )
            raise EffectInDoubtError(
                f"effect {kind!r} with key {key!r} was started by job {existing.job_id} "
                f"attempt {existing.attempt} and never finished; policy 'park': check the "
                "real world, then requeue (replayq dead requeue) or mark it"
            )
        takeover = IdemTakeover(
            key=claim.key,
            claim_token=claim.claim_token,
            now=claim.now,
            trace_id=claim.trace_id,
            job_id=claim.job_id,
            attempt=claim.attempt,
            expected_status=status,
            expected_claim=existing.claim_token,
        )
        if not tx.idem_transition(takeover):
            raise EffectInDoubtError(f"effect {kind!r} key {key!r} changed hands while claiming it")
        if status == "started":
            tx.trace_append(
                [
                    ctx.event(
                        "effect.in_doubt",
                        resource=key,
                        kind=kind,
                        key=key,
                        claimed_by_job=existing.job_id,
                        claimed_by_attempt=existing.attempt,
                        policy=policy,
                        action="run again",
                    )
                ]
            )
        return _RUN

    def _judged(self, tx: Transaction, kind: str, key: str, existing: IdemRecord) -> IdemRecord:
        """A ``started`` record of another claim, read again with whether its attempt still
        runs (``idem_judged``): in one statement, one snapshot on PostgreSQL, lest an
        outcome recorded and its job acked between two reads look like a crash. The record
        as it is now (``succeeded`` meanwhile: reused) if it is in doubt or no longer
        ``started``; else it is in flight, neither in doubt nor ours to take over:
        ``ConcurrencyError`` (retried by the job's ``Retry``), its next attempt finds the
        outcome, recorded as ``effect.failed`` (a replay of the attempt fails alike)."""
        ctx = self._ctx
        runtime = ctx.runtime
        judged = idem_judged(
            tx, key, runtime.clock.now(), database_clock=runtime.leases_by_database
        )
        if judged is not None and judged.in_doubt:
            return judged
        if judged is not None and judged.status != "started":
            return judged
        owner = existing if judged is None else judged
        error = ConcurrencyError(
            f"effect {kind!r} with key {key!r} is in flight in job {owner.job_id} attempt "
            f"{owner.attempt}, which still holds its lease: retried later, to get its outcome"
        )
        # Recorded as pending, not in ``tx``: the raise rolls ``tx`` back, and the failed
        # attempt's events are flushed with its failure (as ``effect.in_doubt`` below).
        ctx.record(
            "effect.failed",
            status="fail",
            resource=key,
            kind=kind,
            key=key,
            error=ctx.redactor.error(error),
            error_class=error.failure_class.value,
            in_flight_job=owner.job_id,
            in_flight_attempt=owner.attempt,
        )
        raise error

    def _reconcile(self, kind: str, key: str, existing: IdemRecord) -> None:
        """Ask the kind's reconciler about an in-doubt record; settle it if it knows.

        Called under ``_live`` (``flow``'s claim), which it lets go while the reconciler
        runs: that calls the provider, an outside call the attempt's end (``Context.end``,
        the handler's return) must not wait for, however long it takes. Taken again, the
        attempt found ended (an effect in a thread the handler left running): the answer
        still settles the record (its own trace, as ``replayq effects reconcile`` would),
        nothing goes into the attempt's, and ``ContextEndedError`` is raised."""
        from replayq.recording.in_doubt import ask_reconciler, record_of, settle

        ctx = self._ctx
        record = record_of(existing, in_doubt=True)
        live = ctx._live
        live.release()
        try:
            answer, error = ask_reconciler(ctx.runtime, record)
        finally:
            live.acquire()
        ended = ctx._cancel is ENDED
        if not ended:
            ctx.record(
                "effect.reconciled",
                resource=key,
                kind=kind,
                key=key,
                outcome="unknown" if answer is None else answer.outcome,
                error=error,
            )
        if answer is not None:
            settle(
                ctx.runtime,
                record,
                answer,
                by=f"reconciler on {ctx.worker_id}",
                claim_token=existing.claim_token,
            )
        if ended:
            raise ended_error(ctx.job.id, ctx.attempt)
        self._asked.add(key)


class _Once(Generic[_T]):
    """``make()``, made at the first call and kept: ``commit_at_once`` may run a block
    twice, and an event it appends is made once (no sequence number skipped); one the
    careful try does not append where the refused one did is ``unmade``. Not
    ``functools.cache``: its wrapper cost ~9 K instructions to make, twice an effect."""

    __slots__ = ("_made", "_make")

    def __init__(self, make: Callable[[], _T]) -> None:
        self._make = make
        self._made: _T | None = None

    def __call__(self) -> _T:
        if self._made is None:
            self._made = self._make()
        return self._made

    def unmade(self, unmake: Callable[[_T], None]) -> None:
        """What a refused try made, dropped (``unmake``): the next call makes it anew."""
        made, self._made = self._made, None
        if made is not None:
            unmake(made)


class _Claimed:
    """Claim outcome: the record is this attempt's, ``started``: run the effect."""

    __slots__ = ("claim_token", "key")

    def __init__(self, key: str, claim_token: str) -> None:
        self.key = key
        self.claim_token = claim_token


class _Ask:
    """Claim outcome: the record is in doubt and the kind has a reconciler to ask."""

    def __init__(self, existing: IdemRecord) -> None:
        self.existing = existing


_RUN = object()
_RUN_RODE = object()  # run it; the events riding with the claim committed
