"""The World port: where a handler's reads of the outside world come from.

Every ``ctx`` verb that touches the world asks the context's ``World``:

* ``answer(name, label, fingerprint)`` — the result of a call, an effect, a
  clock or random read, or a cache read: ``LIVE`` means "do it for real";
  anything else is the answer to use instead (a recorded response, a stub).
  A recorded failure raises ``RecordedFailure``; a refused effect raises
  ``EffectRefusedError``; something the recording lacks raises
  ``ReplayDivergenceError``.
* ``state_version(resource)`` — the version a state read must return (the one
  the recorded attempt read), or ``None`` for the branch's current version.
* ``recorded_state(resource, version)`` — the data of that version if the world
  already holds it (a dry-run loads what the attempt read with the recording),
  or ``LIVE``: read it from the database.
* ``reads_recorded`` / ``writes_apply`` — state and cache reads come from the
  recording; state and cache writes go to the context's branch.
* ``is_live`` — the attempt reaches production: real locks, outbox rows,
  ``ctx.db_write`` rows and child jobs.
* ``sealed`` — handler I/O that bypasses ``ctx`` is refused (see ``replayq.seal``).
* ``lock_outcome(action, resource)`` — ``LIVE`` (take or release the lock for
  real), or what the lock did in the recording: ``{"event": "lock.acquired",
  "fencing_token": ...}``, ``lock.timeout``, ``lock.released`` or ``lock.expired``.
* ``write_rejection(resource)`` — ``LIVE`` (fencing checks the write for real),
  ``None`` (the write is not rejected) or how fencing rejected it in the recording.
* ``lease_lost()`` — the worker learned that its lease on the job is gone.
* ``on_step(name)`` — a step starts (a fork switches to live answers at its step).
* ``completed_step(key)`` — whether the step at position ``key`` committed in an
  earlier attempt of the job, and its result (asked only under ``resume="step"``):
  the step ledger for workers, the recorded ``step.skipped`` events for replays.

``LiveWorld`` is the worker's world. The replay engine brings the others:
``RecordedWorld`` (dry-run, fork) and ``GatedWorld`` (guarded rerun). Adding a
``ctx`` verb means: the verb in ``context.py`` (or its view), a question here
if it reads the world, and the answer in each world that substitutes it.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from replayq.recording.ledger import CompletedStep, CompletedSteps


class _Live:
    def __repr__(self) -> str:
        return "LIVE"


LIVE: Final[Any] = _Live()
"""The answer that means: run it against the real world."""


class World(Protocol):
    """What a context asks before it reads or changes the world."""

    @property
    def is_live(self) -> bool: ...

    @property
    def sealed(self) -> bool: ...

    @property
    def reads_recorded(self) -> bool: ...

    @property
    def writes_apply(self) -> bool: ...

    def answer(self, name: str, label: str, fingerprint: str) -> Any:
        """``LIVE``, or the value to use instead of running ``name`` (call, effect, ...)."""
        ...

    def state_version(self, resource: str) -> int | None: ...

    def recorded_state(self, resource: str, version: int) -> Any:
        """The data of ``resource`` at ``version`` if this world holds it, else ``LIVE``."""
        ...

    def lock_outcome(self, action: str, resource: str) -> Any:
        """``LIVE``, or what ``action`` (acquire, release) on ``resource`` returned."""
        ...

    def write_rejection(self, resource: str) -> Any:
        """``LIVE``, ``None``, or the recorded fencing rejection of this write."""
        ...

    def on_step(self, name: str) -> None: ...

    def completed_step(self, key: str) -> CompletedStep | None:
        """The earlier attempt's completion of the step at position ``key``, or ``None``."""
        ...

    def lease_lost(self) -> bool: ...


class LostFlag:
    """Set once by the heartbeat thread when the lease is gone; read by the handler.

    Nobody waits on it, so a plain attribute (atomic under the GIL) does what a
    ``threading.Event`` did without its lock and condition per job.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class LiveWorld:
    """A worker's world: everything is real. ``lost`` is set when the worker's lease is gone.

    ``steps`` loads the job's step ledger; without it (a rerun) every step runs.
    """

    is_live = True
    sealed = False
    reads_recorded = False
    writes_apply = True

    def __init__(self, lost: LostFlag | None = None, steps: CompletedSteps | None = None) -> None:
        self._lost = lost
        self._steps = steps

    def answer(self, name: str, label: str, fingerprint: str) -> Any:
        return LIVE

    def state_version(self, resource: str) -> int | None:
        return None

    def recorded_state(self, resource: str, version: int) -> Any:
        return LIVE

    def lock_outcome(self, action: str, resource: str) -> Any:
        return LIVE

    def write_rejection(self, resource: str) -> Any:
        return LIVE

    def on_step(self, name: str) -> None:
        return None

    def completed_step(self, key: str) -> CompletedStep | None:
        return self._steps().get(key) if self._steps is not None else None

    def lease_lost(self) -> bool:
        return self._lost is not None and self._lost.is_set()
