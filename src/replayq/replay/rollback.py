"""Reversing what a job did to internal state, and compensating its external effects.

``rollback`` restores every entity a job wrote to the version it had before the
job, as a *new* version (history is kept), and records a ``state.rolled_back``
event in the job's trace. If a later job has written the same entity since, it
refuses and names that job and entity; ``force=True`` restores anyway, undoing
the later writes too (the plan lists them). Cache entries derived from a
restored entity are dropped. External effects are never silently undone: an
effect kind with a registered compensator (``@runtime.compensator(kind)``) can be
compensated explicitly, and the record and trace then say ``compensated``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import ConcurrencyError, RollbackRefusedError
from replayq.model import TraceEvent
from replayq.queue.enqueue import get_job
from replayq.recording.state import MAIN, delta_of, read_entity, resource_name, version_row
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import (
    CacheDelete,
    EntityFilter,
    EntityGet,
    EntityRecord,
    IdemCompensate,
    IdemFilter,
)

ROLLBACK_TRACE_PREFIX = "rollback:job-"


@dataclass
class RollbackChange:
    resource: str
    namespace: str
    key: str
    current_version: int
    restore_version: int | None
    current_data: Any
    restored_data: Any
    later_writers: list[int] = field(default_factory=list)


@dataclass
class RollbackPlan:
    job_id: int
    changes: list[RollbackChange]
    simulated: bool
    applied: bool = False
    compensated: list[str] = field(default_factory=list)
    attempt: int | None = None

    @property
    def blocked(self) -> list[RollbackChange]:
        return [c for c in self.changes if c.later_writers]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "simulated": self.simulated,
            "applied": self.applied,
            "compensated": self.compensated,
            "changes": [vars(c) for c in self.changes],
        }


def plan_rollback(source: RuntimeSource, job_id: int, attempt: int | None = None) -> RollbackPlan:
    """What a rollback of ``job_id`` (or of one of its attempts) would change; writes nothing.

    With ``attempt``, only the versions that attempt wrote are undone, e.g. the
    writes of an attempt that had lost its lease while another attempt ran; a
    later write by another attempt of the same job then counts as a later writer.
    """
    runtime = source.runtime
    changes = []
    with runtime.storage.transaction(readonly=True) as tx:
        rows = [
            r
            for r in tx.entity_list(EntityFilter(job_id=job_id))
            if r.branch == MAIN and (attempt is None or r.attempt == attempt)
        ]
        entities: dict[tuple[str, str], list[EntityRecord]] = {}
        for row in rows:
            entities.setdefault((row.namespace, row.key), []).append(row)
        for (namespace, key), written in entities.items():
            first = min(written, key=lambda r: r.version)
            current, _ = read_entity(tx, MAIN, namespace, key)
            assert current is not None
            restore_version = first.parent_version
            restored = None
            if restore_version is not None:
                before = tx.entity_get(EntityGet(MAIN, namespace, key, version=restore_version))
                from replayq.recording.state import version_from_row

                restored = version_from_row(tx, before).data if before else None
            # Every version since the job's *first* write that someone else wrote: writes
            # interleaved between the job's own (e.g. across its retries) would be undone too.
            later = tx.entity_list(
                EntityFilter(branch=MAIN, namespace=namespace, key=key, after_version=first.version)
            )
            changes.append(
                RollbackChange(
                    resource_name(namespace, key),
                    namespace,
                    key,
                    current.version,
                    restore_version,
                    current.data,
                    restored,
                    sorted(
                        {
                            r.job_id
                            for r in later
                            if r.job_id
                            and (
                                r.job_id != job_id or (attempt is not None and r.attempt != attempt)
                            )
                        }
                    ),
                )
            )
    return RollbackPlan(job_id, changes, simulated=True, attempt=attempt)


def rollback(
    source: RuntimeSource,
    job_id: int,
    *,
    simulate: bool = False,
    force: bool = False,
    attempt: int | None = None,
) -> RollbackPlan:
    """Restore the entities ``job_id`` (or its ``attempt``) wrote to their versions before it.

    The restored data is written as new versions (history is kept).
    """
    runtime = source.runtime
    plan = plan_rollback(runtime, job_id, attempt)
    plan.simulated = simulate
    if simulate:
        return plan
    if plan.blocked and not force:
        first = plan.blocked[0]
        raise RollbackRefusedError(
            f"job {first.later_writers[0]} wrote {first.resource} after job {job_id}; rolling back "
            f"would undo its work too (use --force to restore anyway; --simulate to see the plan)"
        )
    job = get_job(runtime, job_id)
    now = runtime.clock.now()
    # Its events are redacted as the job's own (``Recorder._event``): the resource and data.
    redactor = runtime.redactor_for(job.job_type)
    with runtime.storage.transaction() as tx:
        events = []
        for change in plan.changes:
            current, _ = read_entity(tx, MAIN, change.namespace, change.key)
            assert current is not None
            if current.version != change.current_version:
                raise ConcurrencyError(f"{change.resource} changed while rolling back; try again")
            hlc = runtime.hlc.tick()
            row = version_row(
                MAIN,
                change.namespace,
                change.key,
                current.version + 1,
                current,
                change.restored_data,
                now=now,
                hlc=hlc,
                # Provenance of the restored version: which job's rollback wrote it.
                trace_id=f"{ROLLBACK_TRACE_PREFIX}{job.id}:{job.trace_id}",
            )
            if not tx.entity_put(row, current.version):
                raise ConcurrencyError(f"{change.resource} changed while rolling back; try again")
            tx.cache_update(CacheDelete(namespace=change.namespace, key=change.key))
            events.append(
                TraceEvent(
                    trace_id=job.trace_id,
                    job_id=job.id,
                    name="state.rolled_back",
                    kind="domain",
                    ts=now,
                    hlc=hlc,
                    worker_id="rollback",
                    status="compensated",
                    resource=redactor.resource(change.resource),
                    resource_version=current.version + 1,
                    data=redactor.value(
                        {
                            "attempt_undone": attempt,
                            "restored_from_version": change.restore_version,
                            "replaced_version": change.current_version,
                            "delta": delta_of(current.data, change.restored_data),
                            "forced_over": change.later_writers or None,
                        }
                    ),
                )
            )
        tx.trace_append(events)
    plan.applied = True
    return plan


def compensate(
    source: RuntimeSource,
    job_id: int,
    *,
    kinds: list[str] | None = None,
    attempt: int | None = None,
) -> list[str]:
    """Run registered compensators for the job's succeeded effects; returns the keys compensated.

    With ``attempt``, only the effects that attempt made are compensated: an
    earlier attempt's legitimate effect (a hold that a later attempt relied on)
    is left alone.
    """
    runtime = source.runtime
    job = get_job(runtime, job_id)
    redactor = runtime.redactor_for(job.job_type)  # as ``rollback``'s events
    done = []
    with runtime.storage.transaction(readonly=True) as tx:
        records = [
            r
            for r in tx.idem_list(IdemFilter(job_id=job_id))
            if r.status == "succeeded" and (attempt is None or r.attempt == attempt)
        ]
    for record in records:
        kind = record.operation
        if kinds is not None and kind not in kinds:
            continue
        compensator = runtime.registry.compensators.get(kind)
        if compensator is None:
            continue
        compensator(record.key, codec.loads(record.result))
        now = runtime.clock.now()
        with runtime.storage.transaction() as tx:
            if tx.idem_transition(IdemCompensate(record.key, now)):
                tx.trace_append(
                    [
                        TraceEvent(
                            trace_id=job.trace_id,
                            job_id=job.id,
                            name="effect.compensated",
                            kind="domain",
                            ts=now,
                            hlc=runtime.hlc.tick(),
                            worker_id="rollback",
                            status="compensated",
                            resource=redactor.resource(record.key),
                            side_effect=True,
                            data=redactor.value(
                                {"kind": kind, "key": record.key, "attempt": record.attempt}
                            ),
                        )
                    ]
                )
                done.append(record.key)
    return done
