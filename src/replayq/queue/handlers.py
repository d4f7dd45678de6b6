"""Registered handlers: each one's contract, function and payload check, and the registry
of every job type and version an application declares."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from msgspec import Struct, field

from replayq import codec
from replayq.errors import ContractError, FailureClass, PayloadError, UnknownJobTypeError
from replayq.queue.contracts import JobContract, KeyTemplate
from replayq.queue.payload_types import (
    NO_DEFAULT,
    Fields,
    FieldType,
    check_names,
    field_type,
    fixed_default,
    is_record,
    without_secrets,
)
from replayq.queue.schedule import Schedule
from replayq.redaction import Redactor, is_marker


# PayloadShape and Handler are frozen Structs, not frozen dataclasses: built in C, where
# each dataclass compiled six methods at every process's start. ``dict=True`` keeps room
# for their ``cached_property`` values.
class PayloadShape(Struct, frozen=True, dict=True):
    """The fields a handler takes, read from its signature after ``ctx``.

    Either keyword fields (``def ship(ctx, order_id: int, amount: Decimal)``), each
    checked by its annotation (``replayq.queue.payload_types``), or one record for the
    whole payload: a handler whose only parameter after ``ctx`` is annotated with a
    dataclass or a pydantic model (``def pay(ctx, order: Order)``) receives the
    payload as that class, and its fields are the payload's fields.
    """

    required: tuple[str, ...]
    optional: tuple[str, ...]
    accepts_extra: bool
    types: Mapping[str, FieldType]
    # The whole payload as one dataclass / pydantic model, if the handler declares one.
    record: FieldType | None = None
    # Each optional field's fixed default in its JSON form (``payload_types.fixed_default``):
    # what a key template renders for a field the payload leaves out.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional

    @cached_property
    def rich(self) -> bool:
        """Whether any field's JSON form differs from the value a handler receives
        (asked on every enqueue: computed once)."""
        return self.record is not None or any(t.rich for t in self.types.values())

    def schema(self) -> dict[str, Any]:
        """The payload schema the contract records: each field's type, ``?`` if optional."""
        if self.record is not None:
            return dict(self.record.schema)
        fields = Fields(self.required, self.optional, self.types).schema()
        return {**fields, "**": "any"} if self.accepts_extra else fields

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> PayloadShape:
        params = list(inspect.signature(fn).parameters.values())[1:]  # first is ctx
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # unresolvable annotations: skip type checks, keep field checks
            hints = {}
        if (
            len(params) == 1
            and params[0].kind
            in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            and is_record(hints.get(params[0].name))
        ):
            record = field_type(hints[params[0].name])
            assert record is not None and record.fields is not None
            fields = record.fields
            return cls(fields.required, fields.optional, False, {}, record, fields.defaults)
        required: list[str] = []
        optional: list[str] = []
        types: dict[str, FieldType] = {}
        defaults: dict[str, Any] = {}
        accepts_extra = False
        for param in params:
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                accepts_extra = True
                continue
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            (required if param.default is inspect.Parameter.empty else optional).append(param.name)
            checked = field_type(hints.get(param.name))
            if checked is not None:
                types[param.name] = checked
            if param.default is not inspect.Parameter.empty:
                default = fixed_default(param.default, checked, param.name)
                if default is not NO_DEFAULT:
                    defaults[param.name] = default
        return cls(tuple(required), tuple(optional), accepts_extra, types, None, defaults)

    def to_json(self, job_type: str, payload: Any) -> dict[str, Any]:
        """The payload's JSON form: rich values (``Decimal``, a dataclass...) converted,
        checked; a payload with no rich field is returned as it is."""
        try:
            if self.record is not None:
                plain: dict[str, Any] = self.record.to_json(payload, "")
                return plain
            if not isinstance(payload, dict):
                raise PayloadError(f"payload must be a JSON object, got {type(payload).__name__}")
            if not self.rich:
                return payload
            # None in an optional field passes unchecked, as ``decode`` lets it.
            return {
                name: self.types[name].to_json(value, name)
                if name in self.types and not (value is None and name in self.optional)
                else value
                for name, value in payload.items()
            }
        except PayloadError as exc:
            error = PayloadError(f"{job_type}: {exc}")
            error.quoted = exc.quoted
            raise error from None

    @cached_property
    def _fields(self) -> Fields:
        return Fields(self.required, self.optional, self.types)

    def check(self, job_type: str, payload: Mapping[str, Any]) -> None:
        """Raise ``PayloadError`` naming the first missing, unknown or mistyped field."""
        self.decode(job_type, payload)

    def decode(
        self, job_type: str, payload: Mapping[str, Any]
    ) -> tuple[Any, ...] | Mapping[str, Any]:
        """What the handler is called with: the record (a 1-tuple, positional) or the
        keyword fields, each converted from its stored JSON form (``payload`` itself
        when no field needs converting)."""
        try:
            if self.record is not None:
                return (self.record.from_json(payload, ""),)
            check_names(self._fields, payload, "", self.accepts_extra)
            decoded: dict[str, Any] | None = None
            for name, kind in self.types.items():
                if name not in payload or (payload[name] is None and name in self.optional):
                    continue
                if is_marker(payload[name]):  # a redacted secret: checked at enqueue
                    continue
                value = kind.from_json(payload[name], name)
                if kind.rich:
                    decoded = decoded if decoded is not None else dict(payload)
                    decoded[name] = value
            return decoded if decoded is not None else payload
        except PayloadError as exc:
            error = PayloadError(f"{job_type}: {exc}")
            error.quoted = exc.quoted
            raise error from None


class ContractKeys(Struct, frozen=True):
    """A handler's key templates (``Handler.keys``); ``None`` where the contract has none."""

    idempotency: KeyTemplate | None
    ordering: KeyTemplate | None
    lock: KeyTemplate | None


class Handler(Struct, frozen=True, dict=True):
    """A job type at one version: contract, function, payload shape, error mapping."""

    contract: JobContract
    fn: Callable[..., Any]
    shape: PayloadShape
    error_map: Mapping[type[BaseException], FailureClass]
    # The app's redaction rules plus this job type's own (``None``: the app's alone).
    redactor: Redactor | None = None

    @cached_property
    def keys(self) -> ContractKeys:
        """The contract's key templates, parsed once, with this payload shape's defaults."""
        contract, defaults = self.contract, self.shape.defaults
        owner = f"{contract.name} {contract.version}"
        return ContractKeys(
            *(
                None if template is None else KeyTemplate(template, label, defaults, owner)
                for label, template in (
                    ("idempotency", contract.idempotency),
                    ("ordering", contract.ordering),
                    ("lock", contract.lock),
                )
            )
        )

    @cached_property
    def is_async(self) -> bool:
        """Whether ``fn`` is an ``async def`` (asked once: ``inspect`` costs ~2 µs a job)."""
        return inspect.iscoroutinefunction(self.fn)

    def encode_payload(self, payload: Any) -> str:
        """Check and encode a payload; ``PayloadError`` names the field or the limit."""
        return self.prepare_payload(payload)[1]

    def prepare_payload(
        self, payload: Any, redactor: Redactor | None = None
    ) -> tuple[dict[str, Any], str]:
        """The payload's JSON form (rich values converted) and its canonical text, checked
        against the handler's fields and the contract's size limit. ``redactor``: the
        rules a rejected field's value is redacted with in the error's message (default:
        this handler's own)."""
        name = self.contract.name
        try:
            plain = self.shape.to_json(name, payload)
            text = codec.dumps(plain, what=f"{name} payload")
            size = len(text.encode())
            if size > self.contract.max_payload_bytes:
                raise PayloadError(
                    f"{name}: payload is {size} bytes, above max_payload_bytes="
                    f"{self.contract.max_payload_bytes}"
                )
            self.shape.check(name, plain)
        except PayloadError as exc:
            rules = redactor or self.redactor
            if rules is None:
                raise
            raise without_secrets(exc, rules, payload) from None
        return plain, text

    def decode_payload(
        self, payload: Mapping[str, Any], redactor: Redactor
    ) -> tuple[Any, ...] | Mapping[str, Any]:
        """``shape.decode`` of a stored payload, a refusal's message screened by
        ``redactor`` (``without_secrets``): a payload stored before its type changed, or
        before a rule named one of its fields secret, holds values in clear."""
        try:
            return self.shape.decode(self.contract.name, payload)
        except PayloadError as exc:
            raise without_secrets(exc, redactor, payload) from None


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
        # replayq's own job types (``replayq.verify``): run by every worker, never listed
        # among the app's types, contracts or lock file.
        self._system: dict[str, Handler] = {}

    def declare_system(self, handler: Handler) -> None:
        """Declare one of replayq's own job types (one version, not listed by ``job_types``)."""
        self._system[handler.contract.name] = handler

    def system_types(self) -> list[str]:
        return sorted(self._system)

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
        self._system.update(other._system)

    def handler(self, job_type: str, version: str | None = None) -> Handler:
        """The handler for a type (the active version unless one is named)."""
        versions = self._versions.get(job_type)
        if not versions and job_type in self._system and version in (None, "v1"):
            return self._system[job_type]
        if not versions:
            raise UnknownJobTypeError(f"no handler is registered for job type {job_type!r}")
        chosen = version or self._active[job_type]
        if chosen not in versions:
            raise UnknownJobTypeError(
                f"{job_type} has no version {chosen!r} (declared: {', '.join(versions)})"
            )
        return versions[chosen]

    def declares(self, job_type: str) -> bool:
        return job_type in self._versions or job_type in self._system

    def declared(self, job_type: str) -> Handler | None:
        """``handler(job_type)`` if this registry ``declares`` the type, else ``None``: in
        one lookup (each enqueue asks)."""
        versions = self._versions.get(job_type)
        if versions:
            return versions[self._active[job_type]]
        return self._system.get(job_type)

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
