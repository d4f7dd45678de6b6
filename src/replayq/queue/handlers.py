"""Registered handlers: each one's contract, function and payload check, and the registry
of every job type and version an application declares."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replayq import codec
from replayq.errors import ContractError, FailureClass, PayloadError, UnknownJobTypeError
from replayq.queue.contracts import JobContract
from replayq.queue.schedule import Schedule
from replayq.redaction import Redactor, is_marker

_SIMPLE_TYPES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    dict: (dict,),
    list: (list,),
}


@dataclass(frozen=True)
class PayloadShape:
    """The fields a handler takes, read from its signature after ``ctx``."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    accepts_extra: bool
    types: Mapping[str, tuple[type, ...]]

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> PayloadShape:
        params = list(inspect.signature(fn).parameters.values())[1:]  # first is ctx
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # unresolvable annotations: skip type checks, keep field checks
            hints = {}
        required: list[str] = []
        optional: list[str] = []
        types: dict[str, tuple[type, ...]] = {}
        accepts_extra = False
        for param in params:
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                accepts_extra = True
                continue
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            (required if param.default is inspect.Parameter.empty else optional).append(param.name)
            simple = _SIMPLE_TYPES.get(hints.get(param.name))
            if simple is not None:
                types[param.name] = simple
        return cls(tuple(required), tuple(optional), accepts_extra, types)

    def check(self, job_type: str, payload: Mapping[str, Any]) -> None:
        """Raise ``PayloadError`` naming the first missing, unknown or mistyped field."""
        missing = [name for name in self.required if name not in payload]
        if missing:
            raise PayloadError(f"{job_type}: payload is missing required field {missing[0]!r}")
        if not self.accepts_extra:
            unknown = sorted(set(payload) - set(self.fields))
            if unknown:
                raise PayloadError(
                    f"{job_type}: payload has unknown field {unknown[0]!r} "
                    f"(fields: {', '.join(self.fields) or 'none'})"
                )
        for name, allowed in self.types.items():
            if name not in payload or (payload[name] is None and name in self.optional):
                continue
            value = payload[name]
            if is_marker(value):  # a redacted secret: its type was checked at enqueue
                continue
            bad_bool = isinstance(value, bool) and bool not in allowed
            if bad_bool or not isinstance(value, allowed):
                raise PayloadError(
                    f"{job_type}: field {name!r} expects {allowed[-1].__name__}, "
                    f"got {type(value).__name__} {value!r}"
                )


@dataclass(frozen=True)
class Handler:
    """A job type at one version: contract, function, payload shape, error mapping."""

    contract: JobContract
    fn: Callable[..., Any]
    shape: PayloadShape
    error_map: Mapping[type[BaseException], FailureClass]
    # The app's redaction rules plus this job type's own (``None``: the app's alone).
    redactor: Redactor | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def encode_payload(self, payload: Any) -> str:
        """Check and encode a payload; ``PayloadError`` names the field or the limit."""
        name = self.contract.name
        if not isinstance(payload, dict):
            raise PayloadError(
                f"{name}: payload must be a JSON object, got {type(payload).__name__}"
            )
        text = codec.dumps(payload, what=f"{name} payload")
        size = len(text.encode())
        if size > self.contract.max_payload_bytes:
            raise PayloadError(
                f"{name}: payload is {size} bytes, above max_payload_bytes="
                f"{self.contract.max_payload_bytes}"
            )
        self.shape.check(name, payload)
        return text


class HandlerRegistry:
    """Every declared job type and version, which version is active, the compensators,
    reconcilers and schedules.

    The newest declaration of a type becomes the active version (the one
    workers run), unless it is declared as a candidate (kept for replay, fork
    and verification).
    """

    def __init__(self) -> None:
        self._versions: dict[str, dict[str, Handler]] = {}
        self._active: dict[str, str] = {}
        self.compensators: dict[str, Callable[[str, Any], Any]] = {}
        # Per effect kind: asks the provider whether an in-doubt effect happened.
        self.reconcilers: dict[str, Callable[[Any], Any]] = {}
        # Periodic jobs (``App.periodic``): the worker's scheduler enqueues their slots.
        # Not adopted: a scratch database for a replay must not start enqueueing them.
        self.schedules: list[Schedule] = []

    def declare(self, handler: Handler, *, candidate: bool = False) -> None:
        name, version = handler.contract.name, handler.contract.version
        versions = self._versions.setdefault(name, {})
        if version in versions:
            raise ContractError(f"{name} {version} is declared twice")
        versions[version] = handler
        if not candidate or name not in self._active:
            self._active[name] = version

    def adopt(self, other: HandlerRegistry) -> None:
        """Declare every job type of ``other`` here too (replaying a case in a scratch database)."""
        for job_type, versions in other._versions.items():
            self._versions[job_type] = dict(versions)
        self._active.update(other._active)
        self.compensators.update(other.compensators)
        self.reconcilers.update(other.reconcilers)

    def handler(self, job_type: str, version: str | None = None) -> Handler:
        """The handler for a type (the active version unless one is named)."""
        versions = self._versions.get(job_type)
        if not versions:
            raise UnknownJobTypeError(f"no handler is registered for job type {job_type!r}")
        chosen = version or self._active[job_type]
        if chosen not in versions:
            raise UnknownJobTypeError(
                f"{job_type} has no version {chosen!r} (declared: {', '.join(versions)})"
            )
        return versions[chosen]

    def declares(self, job_type: str) -> bool:
        return job_type in self._versions

    def versions(self, job_type: str) -> list[str]:
        """The declared versions of a type, in declaration order."""
        return list(self._versions.get(job_type, {}))

    def job_types(self) -> list[str]:
        return sorted(self._versions)

    def handlers(self) -> list[Handler]:
        """Every declared handler, all versions."""
        return [h for versions in self._versions.values() for h in versions.values()]

    def active_version(self, job_type: str) -> str | None:
        return self._active.get(job_type)
