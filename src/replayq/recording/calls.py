"""External reads: ``ctx.call(name, fn, *args, **kwargs)``.

The request is summarised (JSON; non-JSON arguments become their type name) and
fingerprinted; the ``World`` answers with a recorded response (replays) or ``LIVE``,
in which case ``fn`` runs, unsealed, and its response (or failure, with its failure
class) is recorded. A large response goes to the blob store with the step's commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replayq import codec
from replayq.errors import PayloadError, RecordedFailure, classify
from replayq.recording.aio import Flow, outside_call
from replayq.recording.attempt import ENDED, Attempt, ended_error, ended_late
from replayq.recording.world import LIVE
from replayq.seal import unsealed


def call_request(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a call's fingerprint is over (redacted, then encoded): its arguments. The
    dry-run's quick check builds it the same way."""
    return {"args": list(args), "kwargs": dict(kwargs)}


def record_call(
    ctx: Attempt,
    name: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Flow[Any]:
    """Run (or answer from the world) the external read ``name`` and record it: a flow
    that ``recording.aio.run_flow`` drives plain or awaited.

    Refused once the attempt ended (``Context.end``): when the flow starts (an awaitable
    ``ctx.call`` awaited only after the handler returned) and when the outside call
    returns after it (its response would be recorded into an attempt that has settled)."""
    if ctx._cancel is ENDED:  # awaited, or called through a kept ``ctx``, past the attempt
        raise ended_error(ctx.job.id, ctx.attempt)
    # The fingerprint is over the redacted request: a replay that passes the marker
    # (read back from a redacted payload) or the secret itself matches it.
    # A JSON request without secrets is encoded once, here, and not walked.
    request = call_request(args, kwargs)
    try:
        summary, summary_text = ctx.redactor.encoded_keyed(request, codec.dumps_keyed)
    except PayloadError:
        summary, summary_text = _summarise_encoded(ctx.redactor.value(request))
    fingerprint = codec.fingerprint_text(summary_text)
    try:
        answer = ctx.world.answer("call", name, fingerprint)
    except RecordedFailure as exc:
        ctx.record(
            "call",
            status="fail",
            call=name,
            fingerprint=fingerprint,
            error=exc.error,
            error_class=exc.failure_class.value,
            replayed=True,
        )
        raise
    if answer is not LIVE:
        ctx.record("call", call=name, fingerprint=fingerprint, response=answer, replayed=True)
        return answer
    started = time.monotonic()
    try:
        with unsealed():  # a recorded call is the door the seal leaves open
            response = yield outside_call(fn, *args, **kwargs)
    except Exception as exc:
        error = ctx.redactor.error(exc)
        # The look at the end and the record under ``_live``: the handler's return (in
        # another thread) ends the attempt either before the look or after the record.
        with ctx._live:
            if ctx._cancel is ENDED:  # the handler returned while the call ran
                failed = f"failed ({type(exc).__name__}: {error})"
                raise ended_late(ctx, f"ctx.call({name!r})", failed, "not recorded") from exc
            ctx.record(
                "call",
                status="fail",
                call=name,
                fingerprint=fingerprint,
                request=summary,
                error=error,
                # Recorded so that a replay raises the failure with the class it had.
                error_class=classify(exc, dict(ctx.handler.error_map)).value,
                duration=round(time.monotonic() - started, 6),
            )
        raise
    with ctx._live:
        if ctx._cancel is ENDED:  # the handler returned while the call ran
            raise ended_late(ctx, f"ctx.call({name!r})", "returned", "not recorded")
        duration = round(time.monotonic() - started, 6)
        what = f"ctx.call({name!r}) response"
        inline, ref, raw, _ = ctx.encoded(response, what=what)
        ctx.store_blob(raw, what, ref)
        # The request and the response were redacted above (``encoded``): not screened again.
        ctx.record_screened(
            "call",
            ("request", "response"),
            status="success",
            call=name,
            fingerprint=fingerprint,
            request=summary,
            response=inline,
            output_ref=ref,
            duration=duration,
        )
    return response


def _summarise_encoded(request: Any) -> tuple[Any, str]:
    """``_summarise`` and its canonical text, walking a JSON request once."""
    try:
        return request, codec.dumps(request)
    except PayloadError:
        summary = _summarise(request)
        return summary, codec.dumps(summary)


def _summarise(request: Any) -> Any:
    """A JSON form of call arguments (non-JSON values become their type name)."""
    try:
        codec.dumps(request)
        return request
    except PayloadError:
        if isinstance(request, dict):
            return {k: _summarise(v) for k, v in request.items()}
        if isinstance(request, list | tuple):
            return [_summarise(v) for v in request]
        return f"<{type(request).__name__}>"
