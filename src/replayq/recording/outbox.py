"""The transactional outbox: events written with the step, published at least once later.

``ctx.outbox.publish(topic, payload)`` writes a row in the step's transaction,
with a stable ``event_id`` consumers dedup on: ``{trace_id}:step:{step}:{n}`` for
the n-th publish (from 0) of a step position (a thread or task a step started
publishes under that step: ``Context._outbox_step_key``), ``{trace_id}:job:{n}``
outside steps. It is the same on every attempt, so a step that runs again (a retry
without resume, a ``with`` block) writes no second row: the first one stays and
the event is recorded as ``deduplicated``. ``replayq outbox run`` claims
unpublished rows and delivers them to a sink:

* ``job`` (default): enqueue a replayq job of type ``topic`` with payload
  ``{"event_id", "payload"}``, in the same transaction that marks the row
  published (``message_id = event_id``) — exactly once on one database;
* ``redis://host:port/db``: ``XADD`` to the stream ``replayq:outbox:<topic>``;
* ``http(s)://...``: ``POST`` JSON with header ``Idempotency-Key: <event_id>``.

For Redis and HTTP the row is marked published after the sink accepted it, so a
crash in between publishes it again: consumers dedup on ``event_id``. Publish
lag (published_at - created_at) is recorded as an ``outbox.published`` event.
"""

from __future__ import annotations

import json
from typing import Any

from msgspec import Struct

from replayq import codec
from replayq.model import TraceEvent
from replayq.queue.enqueue import EnqueueRequest, insert_job
from replayq.recording.attempt import Attempt
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.context_params import OutboxClaim
from replayq.storage.protocol import OutboxInsert, OutboxMark, OutboxRecord, Transaction


class OutboxView:
    """``ctx.outbox``."""

    def __init__(self, ctx: Attempt) -> None:
        self._ctx = ctx
        self._published: dict[str, int] = {}

    def _next_event_id(self) -> str:
        """Stable per job, step position and publish position (the same on every attempt)."""
        ctx = self._ctx
        step = ctx._outbox_step_key
        scope = f"step:{step}" if step is not None else "job"
        position = self._published.get(scope, 0)
        self._published[scope] = position + 1
        return f"{ctx.job.trace_id}:{scope}:{position}"

    def publish(self, topic: str, payload: dict[str, Any]) -> str:
        """Write an outbox row in the step's transaction; returns its stable event id."""
        if self._ctx._callback is not None:
            self._ctx._refuse_inside(f"ctx.outbox.publish({topic!r})")
        ctx = self._ctx
        # Its event and its write in the ack's commit, or refused, as a view kept past its
        # attempt is (``_hold_pending``).
        lock = ctx._hold_pending()
        try:
            ctx.encode(payload, what=f"outbox {topic} payload")
            event = ctx.record(
                "outbox.written", resource=f"outbox:{topic}", topic=topic, payload=payload
            )
            event_id = self._next_event_id()
            event.data["event_id"] = event_id
            if not ctx.world.is_live:
                return event_id
            params = OutboxInsert(
                event_id=event_id,
                topic=topic,
                payload=codec.dumps(payload),
                job_id=ctx.job.id,
                trace_id=ctx.trace_id,
                now=event.ts,
            )

            def write(tx: Transaction) -> None:
                if not tx.outbox_update(params):
                    # This step position published this event in an earlier attempt.
                    event.data["deduplicated"] = True

            ctx.defer(write, f"outbox {topic} {event_id}", pipelines=True)
            return event_id
        finally:
            lock.release()


class PublishResult(Struct):  # a Struct: no dataclass compiled at every process's start
    published: int = 0
    failed: int = 0


class Sink:
    """Delivers one outbox row; ``in_transaction`` sinks write inside the marking transaction."""

    in_transaction = False

    def deliver(self, tx: Transaction, row: OutboxRecord) -> None:
        raise NotImplementedError


class JobSink(Sink):
    in_transaction = True

    def __init__(self, source: RuntimeSource) -> None:
        runtime = source.runtime
        self._runtime = runtime

    def deliver(self, tx: Transaction, row: OutboxRecord) -> None:
        request = EnqueueRequest(
            row.topic,
            {"event_id": row.event_id, "payload": codec.loads(row.payload)},
            message_id=f"outbox:{row.event_id}",
        )
        insert_job(self._runtime, tx, request, check=False, causation_id=str(row.job_id))


class RedisStreamSink(Sink):
    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)

    def deliver(self, tx: Transaction, row: OutboxRecord) -> None:
        self._redis.xadd(
            f"replayq:outbox:{row.topic}",
            {"event_id": row.event_id, "payload": row.payload},
        )


class WebhookSink(Sink):
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self._url = url
        self._timeout = timeout

    def deliver(self, tx: Transaction, row: OutboxRecord) -> None:
        # Imported here: urllib.request (http.client, email, ssl) is a webhook's alone,
        # and every worker imports this module.
        import urllib.request

        body = json.dumps(
            {
                "event_id": row.event_id,
                "topic": row.topic,
                "payload": codec.loads(row.payload),
            }
        ).encode()
        request = urllib.request.Request(  # noqa: S310 - the operator configures the webhook URL
            self._url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": row.event_id},
        )
        with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310
            if response.status >= 300:
                raise OSError(f"webhook answered {response.status}")


def open_sink(source: RuntimeSource, spec: str) -> Sink:
    runtime = source.runtime
    if spec == "job":
        return JobSink(runtime)
    if spec.startswith(("redis://", "rediss://")):
        return RedisStreamSink(spec)
    if spec.startswith(("http://", "https://")):
        return WebhookSink(spec)
    from replayq.errors import ConfigurationError

    raise ConfigurationError(
        f"unknown outbox sink {spec!r}; use job, redis://..., or http(s)://..."
    )


def publish_pending(
    source: RuntimeSource, sink: Sink, *, limit: int = 100, claim_seconds: float = 30.0
) -> PublishResult:
    """Publish up to ``limit`` unpublished rows once; returns the counts."""
    runtime = source.runtime
    result = PublishResult()
    now = runtime.clock.now()
    with runtime.storage.transaction() as tx:
        rows = tx.outbox_claim(OutboxClaim(now, claim_seconds, limit))
    for row in rows:
        try:
            with runtime.storage.transaction() as tx:
                # A job sink enqueues inside this transaction (exactly once); other sinks
                # deliver first and the row is marked after (at least once).
                sink.deliver(tx, row)
                published_at = runtime.clock.now()
                if tx.outbox_update(OutboxMark(row.id, published_at)):
                    tx.trace_append([_published_event(runtime, row, published_at)])
            result.published += 1
        except Exception as exc:
            with runtime.storage.transaction() as tx:
                tx.outbox_update(OutboxMark(row.id, now, runtime.redactor.error(exc)))
            result.failed += 1
    return result


def _published_event(runtime: Runtime, row: OutboxRecord, published_at: float) -> TraceEvent:
    return TraceEvent(
        trace_id=row.trace_id or f"outbox:{row.event_id}",
        job_id=row.job_id,
        name="outbox.published",
        kind="domain",
        ts=published_at,
        hlc=runtime.hlc.tick(),
        resource=runtime.redactor.resource(f"outbox:{row.topic}"),  # as ``Recorder._event``
        data={
            "event_id": row.event_id,
            "topic": row.topic,
            "lag": published_at - row.created_at,
            "attempts": row.attempts,
        },
    )
