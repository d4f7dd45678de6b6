"""The replay engine: trace replay, deterministic dry-run, forked re-execution.

* ``trace_replay`` executes nothing: the recorded timeline of every attempt.
* ``dry_run`` runs the handler again; calls, effects, clock/random and cache
  reads come from the recording, state reads are the versions the attempt read,
  writes go to a throw-away branch. The run is compared with the recording event
  by event as it runs, and the first divergence is reported.
* ``dry_run_many`` dry-runs many jobs with one handler and one connection, their
  recordings read in batches, optionally in several worker processes
  (``replayq.replay.bulk``).
* ``fork`` branches the state as it was before a step, runs a chosen handler
  version from there on the branch, and records a trace of its own linked to
  the original.
* ``rerun`` re-executes against the real world with an allowlist of effect
  kinds (see ``replayq.replay.rerun``).

Every derived trace is tagged with its origin, kept out of the job's own
timeline and of production listings, and linked to its source in ``rq_lineage``.
The pieces: ``replay.recorded`` (loading a recording, its answers), ``replay.compare``
(signatures, divergences, the report), ``replay.run`` (running a handler against a
recording, sealed), ``replay.bulk`` (many jobs, worker processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replayq.errors import ConfigurationError
from replayq.model import TraceEvent
from replayq.replay.bulk import dry_run_many
from replayq.replay.compare import (
    Divergence,
    ReplayReport,
    compare_decisions,
    compare_writes,
    first_divergence,
    signature,
)
from replayq.replay.hold import held
from replayq.replay.recorded import load_recording
from replayq.replay.run import (
    REPLAY_WORKER,
    BufferedContext,
    choose_handler,
    dry_run_recording,
    load_handler_spec,
    run_derived,
)
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import TraceQuery

__all__ = [
    "REPLAY_WORKER",
    "AttemptTimeline",
    "BufferedContext",
    "Divergence",
    "ReplayReport",
    "choose_handler",
    "compare_decisions",
    "compare_writes",
    "dry_run",
    "dry_run_many",
    "first_divergence",
    "fork",
    "load_handler_spec",
    "signature",
    "trace_replay",
]


def dry_run(
    source: RuntimeSource,
    job_id: int,
    *,
    attempt: int | None = None,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
    keep: bool = True,
) -> ReplayReport:
    """Re-run a recorded attempt with every external answer from the recording.

    The handler runs sealed: I/O that bypasses ``ctx`` (sockets, host names,
    subprocesses, file writes outside the run's temporary directory) is refused
    with ``UnrecordedIOError`` and reported as the first divergence.
    ``allow_io=True`` lets it happen and still lists it.

    The recording (job, events, blobs, the state versions the attempt read) is
    loaded in one read transaction; the run commits nothing per step and is compared
    with the recording in memory as it runs; the derived trace, its branch's state
    and lineage are written in one transaction at the end; if a constraint of replayq's
    own tables refuses that write (a bug of replayq's), the report says so (failed, class
    ``unknown``, ``dead: internal_error``) and nothing is kept. ``keep=False`` writes
    nothing at all (verification): the report is the result.
    """
    runtime = source.runtime
    recording = load_recording(runtime, job_id, attempt)
    chosen = choose_handler(runtime, recording, version, handler)
    return dry_run_recording(runtime, recording, chosen, allow_io=allow_io, keep=keep)


def fork(
    source: RuntimeSource,
    job_id: int,
    *,
    from_step: str,
    attempt: int | None = None,
    version: str | None = None,
    handler: str | None = None,
    overrides: dict[str, Any] | None = None,
    stubs: dict[str, Any] | None = None,
    allow_io: bool = False,
) -> ReplayReport:
    """Branch the state as it was before ``from_step`` and run the chosen code from there.

    Sealed like ``dry_run``: I/O that bypasses ``ctx`` is refused and reported.
    """
    runtime = source.runtime
    # Held against gc while it runs: the recording it reads, the derived trace it writes.
    with held(runtime, job_id, "fork"):
        recording = load_recording(runtime, job_id, attempt)
        starts = [
            e
            for e in recording.events
            if e.name == "step.started" and e.data.get("step_name") == from_step
        ]
        if not starts:
            steps = sorted(
                {str(e.data.get("step_name")) for e in recording.events if e.name == "step.started"}
            )
            raise ConfigurationError(
                f"job {job_id} attempt {recording.attempt} has no step {from_step!r}; "
                f"recorded steps: {', '.join(steps) or 'none'}"
            )
        chosen = choose_handler(runtime, recording, version, handler)
        return run_derived(
            runtime,
            recording,
            chosen,
            origin="fork",
            fork_step=from_step,
            overrides=overrides or {},
            stubs=stubs or {},
            base_hlc=starts[0].hlc - 1,
            allow_io=allow_io,
        )


@dataclass(frozen=True)
class AttemptTimeline:
    attempt: int
    worker_id: str | None
    events: list[TraceEvent]
    side_effect_steps: list[str]


def trace_replay(source: RuntimeSource, job_id: int) -> list[AttemptTimeline]:
    """The recorded timeline of every attempt of a job; executes nothing."""
    with source.runtime.storage.transaction(readonly=True) as tx:
        events = tx.trace_query(TraceQuery(job_id=job_id))
    attempts: dict[int, list[TraceEvent]] = {}
    for event in events:
        attempts.setdefault(event.attempt or 0, []).append(event)
    timelines = []
    for number in sorted(attempts):
        chunk = attempts[number]
        workers = [e.worker_id for e in chunk if e.name == "job.leased"]
        effects = sorted({e.step or "(no step)" for e in chunk if e.side_effect})
        timelines.append(AttemptTimeline(number, workers[0] if workers else None, chunk, effects))
    return timelines
