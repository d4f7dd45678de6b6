"""The step ledger: which step positions of a job committed, and what each returned.

One row of ``rq_steps`` per (job, step position), written in the step's own
transaction by ``ctx.step(name, fn)`` under ``resume="step"``; the first
completion of a position wins. A worker's ``LiveWorld`` reads it (once, on
first use) to answer ``completed_step``; see ``replayq.recording.steps``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from msgspec import Struct

from replayq import codec
from replayq.recording.blobs import load_json
from replayq.runtime import RuntimeSource
from replayq.storage.protocol import StepRecord, Transaction


class CompletedStep(Struct, frozen=True):
    """A step position that committed in an earlier attempt, and what it returned."""

    key: str
    name: str
    attempt: int
    result: Any
    result_ref: str | None = None


CompletedSteps = Callable[[], Mapping[str, CompletedStep]]
"""Loads a job's step ledger when first asked (most attempts never ask)."""


def step_key(name: str, occurrence: int) -> str:
    """The position of the ``occurrence``-th (1-based) step called ``name`` in an attempt."""
    return name if occurrence == 1 else f"{name}#{occurrence}"


def ledger_loader(source: RuntimeSource, job_id: int) -> CompletedSteps:
    """A loader of the job's committed steps, read from the database on first use."""
    runtime = source.runtime
    loaded: dict[str, CompletedStep] | None = None

    def load() -> Mapping[str, CompletedStep]:
        nonlocal loaded
        if loaded is None:
            with runtime.storage.transaction(readonly=True) as tx:
                loaded = {
                    row.step_key: CompletedStep(
                        key=row.step_key,
                        name=row.step_name,
                        attempt=row.attempt,
                        result=_result(tx, row),
                        result_ref=row.result_ref,
                    )
                    for row in tx.step_by_job(job_id)
                }
        return loaded

    return load


def _result(tx: Transaction, row: StepRecord) -> Any:
    inline = codec.loads(row.result) if row.result is not None else None
    return load_json(tx, inline, row.result_ref)
