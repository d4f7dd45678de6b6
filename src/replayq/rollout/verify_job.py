"""The ``replayq.verify`` job type, as every ``App`` declares it: its contract and entry.

Its body is ``verify_steps.run``, imported when a worker first runs a verification:
every worker and every ``App`` declares the type, few run one, and the verification
code (the replay engine's comparisons, the report) cost each of them at start.
"""

from __future__ import annotations

from typing import Any

from replayq.queue.contracts import Retry, build_contract
from replayq.queue.handlers import Handler, PayloadShape
from replayq.recording.context import Context

VERIFY_JOB_TYPE = "replayq.verify"
CHUNK = 200
"""Attempts per chunk: the most a killed run does again."""


def _run(
    ctx: Context,
    job_type: str,
    from_version: str,
    to_version: str,
    sample: int | None = None,
    since: float | None = None,
    states: list[str] | None = None,
    allow: list[str] | None = None,
    rate: float | None = None,
    chunk: int = CHUNK,
    app: str | None = None,
    **later: Any,
) -> dict[str, Any]:
    """The ``replayq.verify`` handler: select once, then one step per chunk.

    ``app`` is where the report's fork commands point (``background._run_of`` reads it
    from the payload); the run itself uses this worker's app. ``later``: fields a newer
    replayq's ``start_verify`` adds, which this worker has no use for; taking them keeps
    it from burying that run as a malformed payload (a worker from before ``app`` did).
    """
    from replayq.rollout.verify_steps import run

    return run(ctx, job_type, from_version, to_version, sample, since, states, chunk)


def verify_handler() -> Handler:
    """The handler of ``replayq.verify`` (declared by every ``App``)."""
    shape = PayloadShape.from_function(_run)
    contract = build_contract(
        VERIFY_JOB_TYPE,
        fields=shape.fields,
        # A short lease, kept alive by heartbeats: a killed run is picked up again soon.
        lease="10s",
        heartbeat="2s",
        retry=Retry(max_attempts=10, base="1s", cap="30s"),
    )
    return Handler(contract, _run, shape, {})
