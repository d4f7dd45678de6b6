"""Self-contained regression cases from recorded jobs (``replayq trace export``).

A case holds the job (type, payload, version), its contract, the domain and
lifecycle events of one attempt with large values resolved inline, and the
entity versions the attempt read. ``replayq.testing.replay_case`` dry-runs a
handler against it in a throw-away database, inside a user's own test suite.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from replayq import codec
from replayq.model import TraceEvent
from replayq.queue.enqueue import EnqueueRequest, insert_job
from replayq.queue.resources import stored_names
from replayq.recording.state import MAIN, read_entity, resource_name, version_row
from replayq.replay.engine import ReplayReport
from replayq.replay.recorded import load_recording
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.context_params import EntityFilter
from replayq.storage.protocol import EntityGet, JobSetRecorded, TraceQuery, Transaction
from replayq.storage.records import EntityRecord

CASE_FORMAT = "replayq.case/1"
_VALUE_KEYS = {"call": "response", "effect.succeeded": "result", "effect.deduplicated": "result"}


def _event_dict(event: TraceEvent, value: Any = None) -> dict[str, Any]:
    body = dict(vars(event))
    body.pop("id")
    if event.output_ref is not None:
        body["data"] = {**event.data, _VALUE_KEYS.get(event.name, "value"): value}
        body["output_ref"] = None
    return body


def export_case(source: RuntimeSource, job_id: int, attempt: int | None = None) -> dict[str, Any]:
    """A JSON-ready, self-contained recording of one attempt of a job."""
    runtime = source.runtime
    recording = load_recording(runtime, job_id, attempt)
    job = recording.job
    state = []
    with runtime.storage.transaction(readonly=True) as tx:
        for event in recording.events:
            if event.name != "state.read" or not event.resource_version:
                continue
            namespace, _, key = (event.resource or "").partition(":")
            version = event.resource_version
            row = tx.entity_get(EntityGet(MAIN, namespace, key, version=version))
            if row is None and "[redacted" in key:
                # (An entity keyed by a payload field's marker is found above.)
                row = _written_version(runtime, tx, event.resource or "", version)
            if row is None:
                continue
            from replayq.recording.state import version_from_row

            found = version_from_row(tx, row)
            state.append(
                {"namespace": namespace, "key": key, "version": found.version, "data": found.data}
            )
    handler = runtime.registry.handler(job.job_type, job.handler_version)
    return {
        "format": CASE_FORMAT,
        "job": {
            "id": job.id,
            "job_type": job.job_type,
            "payload": job.payload,
            "handler_version": job.handler_version,
            "trace_id": job.trace_id,
            "result": job.result,
        },
        "attempt": recording.attempt,
        "contract": handler.contract.to_dict(),
        "events": [
            _event_dict(e, recording.values.get(e.id or -1))
            for e in [*recording.lifecycle, *recording.events]
        ],
        "state": state,
    }


def _written_version(
    runtime: Runtime, tx: Transaction, resource: str, version: int
) -> EntityRecord | None:
    """The version row an event names by a redacted resource (``card:[redacted:…]``),
    which names no entity's key: found through the job whose ``state.write`` made that
    version (the resource index, then that job's own version rows), never by the key.
    The case keeps the redacted name (``_read_states`` reads it back so in the case's
    database). ``None`` when no traced job wrote it (``App.state.put``, a trace gc took)."""
    writers = {
        e.job_id
        for e in tx.trace_query(TraceQuery(resource=resource))
        if e.name == "state.write" and e.resource == resource and e.resource_version == version
    }
    for job_id in sorted(j for j in writers if j is not None):
        for row in tx.entity_list(EntityFilter(job_id=job_id)):
            if (
                row.branch == MAIN
                and row.version == version
                and resource in stored_names(runtime, resource_name(row.namespace, row.key))
            ):
                return row
    return None


def import_case(source: RuntimeSource, case: dict[str, Any]) -> int:
    """Load a case into ``runtime``'s (empty) database; returns the new job id."""
    runtime = source.runtime
    if case.get("format") != CASE_FORMAT:
        raise ValueError(f"not a replayq case (format {case.get('format')!r})")

    spec = case["job"]
    now = runtime.clock.now()
    with runtime.storage.transaction() as tx:
        for item in sorted(case["state"], key=lambda s: (s["namespace"], s["key"], s["version"])):
            current, _ = read_entity(tx, MAIN, item["namespace"], item["key"])
            if current is not None and current.version >= item["version"]:
                continue
            row = version_row(
                MAIN,
                item["namespace"],
                item["key"],
                item["version"],
                current,
                item["data"],
                now=now,
                hlc=0,
            )
            # A newer version than the head's is imported without moving the head.
            tx.entity_put(row, 0 if current is None else None)
        job_id = insert_job(
            runtime, tx, EnqueueRequest(spec["job_type"], spec["payload"]), check=False
        )
        job = tx.job_get(job_id)
        assert job is not None
        tx.job_transition(
            JobSetRecorded(
                job_id, spec["handler_version"], codec.dumps(spec["result"]), case["attempt"]
            )
        )
        events = []
        for body in case["events"]:
            fields = {k: v for k, v in body.items() if k not in ("trace_id", "job_id")}
            events.append(TraceEvent(trace_id=job.trace_id, job_id=job_id, **fields))
        tx.trace_append(events)
    return job_id


def replay_case_file(
    case: dict[str, Any] | str | Path,
    source: RuntimeSource,
    *,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
) -> ReplayReport:
    """Dry-run ``runtime``'s handler (or ``version``) against a case in a temporary database."""
    from replayq.replay.engine import dry_run

    runtime = source.runtime

    if not isinstance(case, dict):
        case = codec.loads(Path(case).read_text(encoding="utf-8"))
        assert isinstance(case, dict)
    with tempfile.TemporaryDirectory(prefix="replayq-case-") as folder:
        scratch = runtime.scratch(f"sqlite:///{folder}/case.db")
        try:
            job_id = import_case(scratch, case)
            return dry_run(scratch, job_id, version=version, handler=handler, allow_io=allow_io)
        finally:
            scratch.close()
