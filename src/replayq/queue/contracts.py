"""Operational contracts: lease, retry, idempotency, ordering, lock, cache and ack timing as data.

A ``JobContract`` is validated when declared, stored per job type and version
when a worker starts, and can be shown, diffed and linted.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from msgspec import Struct

from replayq import codec
from replayq.durations import Duration, parse_duration
from replayq.errors import ContractError, FailureClass, PayloadError
from replayq.queue.retention import Retention, check_contract_retention

JitterMode = Literal["full", "none"]
ACK_AFTER_COMMIT = "after_commit"
RESUME_MODES = ("step", "none")
"""``resume="step"``: a retry returns the recorded result of every ``ctx.step(name, fn)``
that committed in an earlier attempt instead of running it again; ``"none"``: every
attempt runs every step (see docs/recording-context.md, "Retries resume at the failed step")."""
DEFAULT_RESUME = "step"


@dataclass(frozen=True)
class Retry:
    """Retry policy: exponential backoff from ``base`` capped at ``cap``, with full jitter.

    Attempt ``n`` (1-based) that failed with a class listed in ``on`` is retried
    after ``uniform(0, min(cap, base * 2**(n-1)))`` seconds (``jitter="full"``),
    or exactly that bound with ``jitter="none"``. ``validation`` is never retried.
    """

    max_attempts: int = 5
    base: Duration = "1s"
    cap: Duration = "5m"
    jitter: JitterMode = "full"
    on: tuple[str, ...] = ("transient", "dependency", "concurrency")

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ContractError(f"Retry.max_attempts must be at least 1, got {self.max_attempts}")
        base = parse_duration(self.base, name="Retry.base")
        cap = parse_duration(self.cap, name="Retry.cap")
        # Stored in seconds, so that Retry("2s") == Retry(2.0) and contracts round-trip.
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "cap", cap)
        object.__setattr__(self, "on", tuple(self.on))
        if base <= 0:
            raise ContractError("Retry.base must be positive")
        if cap < base:
            raise ContractError(f"Retry.cap ({self.cap}) is shorter than Retry.base ({self.base})")
        if self.jitter not in ("full", "none"):
            raise ContractError(f"Retry.jitter must be 'full' or 'none', got {self.jitter!r}")
        known = {c.value for c in FailureClass}
        for name in self.on:
            if name not in known:
                raise ContractError(
                    f"Retry.on: unknown failure class {name!r}; known: {', '.join(sorted(known))}"
                )

    @property
    def base_seconds(self) -> float:
        return parse_duration(self.base)

    @property
    def cap_seconds(self) -> float:
        return parse_duration(self.cap)

    def ceiling(self, attempt: int) -> float:
        """The largest delay after failed attempt ``attempt`` (1-based)."""
        # 2.0**1024 overflows a float: past the cap, doubling further changes nothing.
        exponent = min(max(attempt - 1, 0), 1023)
        return min(self.cap_seconds, self.base_seconds * 2.0**exponent)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The delay before the retry that follows failed attempt ``attempt``."""
        ceiling = self.ceiling(attempt)
        return rng.uniform(0, ceiling) if self.jitter == "full" else ceiling

    def retries(self, failure_class: FailureClass) -> bool:
        """Whether this policy retries ``failure_class`` (validation and in_doubt: never)."""
        never = (FailureClass.VALIDATION, FailureClass.IN_DOUBT)
        return failure_class not in never and failure_class.value in self.on


def template_fields(template: str) -> list[str]:
    """The payload fields a key template such as ``"order:{order_id}"`` refers to."""
    names = []
    for _, field_name, _, _ in string.Formatter().parse(template):
        if field_name is not None:
            if field_name == "" or not field_name.isidentifier():
                raise ContractError(
                    f"template {template!r}: use named payload fields like {{order_id}}"
                )
            names.append(field_name)
    return names


def render_template(template: str | None, payload: Mapping[str, Any]) -> str | None:
    """Fill a key template from the payload; ``None`` when there is no template.

    Every field it names must be in ``payload`` (``PayloadError`` otherwise): a key of a
    declared type is rendered by its handler's ``KeyTemplate``, with the defaults filled in.
    """
    if template is None:
        return None
    return KeyTemplate(template, "key", {}, "payload").render(payload)


# A field's value renders as it is: the stored payload reads it back the same.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _as_stored(value: Any) -> Any:
    """``value`` as the stored payload reads it back: a tuple is a list, a dict's keys are
    sorted (``codec.dumps``), so a key renders one text for one value at enqueue, where
    the payload's JSON form may still hold a tuple, and from the stored payload."""
    if type(value) in _SCALARS:
        return value
    return codec.loads(codec.dumps(value, what="key field"))


class KeyTemplate:
    """A key template (``idempotency``, ``ordering``, ``lock``), parsed once, rendered from
    the payload as the handler receives it: a field the payload leaves out takes the
    default the handler's payload shape gives it (its JSON form), so ``{"order_id": 2}``
    and ``{"order_id": 2, "tenant": "a"}`` are one key when ``tenant`` defaults to ``"a"``.

    A field that is absent and has no fixed default is refused with ``PayloadError``
    naming the template and the field; it is never rendered as ``None``.
    """

    __slots__ = ("defaults", "fields", "label", "owner", "template")

    def __init__(self, template: str, label: str, defaults: Mapping[str, Any], owner: str) -> None:
        self.template = template
        self.label = label
        self.owner = owner  # who the refusal names: "charge v2"
        self.fields = tuple(template_fields(template))
        # Only the defaults this template can use: ``render`` looks them up by name. In their
        # stored form: a default given as a tuple renders as the list a job that gives it
        # stores (``(1, 2)`` and ``[1, 2]`` were two keys, two locks for one payload).
        self.defaults = {
            name: _as_stored(defaults[name]) for name in self.fields if name in defaults
        }

    def render(self, payload: Mapping[str, Any], stored: str | None = None) -> str:
        """The key for ``payload`` (a JSON object: the stored form).

        ``stored``: the key a job's row carries. A job stored by a replayq that rendered
        an absent defaulted field as ``None`` keeps that key (its earlier attempts'
        effects and its recording were made under it); see docs/contracts.md.
        """
        values: dict[str, Any] = {}
        filled = False
        for name in self.fields:
            if name in payload:
                value = payload[name]
                values[name] = value if type(value) in _SCALARS else _as_stored(value)
            elif name in self.defaults:
                values[name] = self.defaults[name]
                filled = True
            elif stored is not None and self._legacy(payload) == stored:
                return stored
            else:
                raise PayloadError(
                    f"{self.owner}: the {self.label} key {self.template!r} needs payload "
                    f"field {name!r}, which is absent and has no default"
                )
        key = self.template.format_map(values)
        if filled and stored is not None and stored != key and self._legacy(payload) == stored:
            return stored
        return key

    def _legacy(self, payload: Mapping[str, Any]) -> str:
        """The key as replayq rendered it before defaults were filled in: ``None`` for
        each absent field."""
        return self.template.format_map({name: payload.get(name) for name in self.fields})


@dataclass(frozen=True)
class JobContract:
    """Everything the queue promises about one job type at one handler version."""

    name: str
    version: str = "v1"
    queue: str = "default"
    lease: float = 30.0
    heartbeat: float = 10.0
    retry: Retry = field(default_factory=Retry)
    idempotency: str | None = None
    ordering: str | None = None
    lock: str | None = None
    lock_ttl: float | None = None
    max_payload_bytes: int = 256 * 1024
    effects: Mapping[str, str] = field(default_factory=dict)
    cache_namespace: str | None = None
    cache_ttl: float | None = None
    errors: Mapping[str, str] = field(default_factory=dict)
    ack: str = ACK_AFTER_COMMIT
    fields: tuple[str, ...] = ()
    resume: str = DEFAULT_RESUME
    # Each payload field's type (``PayloadShape.schema``): ``{"amount": "decimal", ...}``.
    # ``None``: not recorded (a contract stored before payload schemas existed).
    payload_schema: Mapping[str, Any] | None = None
    # The retention fields this type's contract sets over the app's (``Retention``'s field
    # names, in days; None: forever). ``None``: the app's retention, unchanged.
    retention: Mapping[str, float | None] | None = None

    def effect_policy(self, kind: str) -> str:
        """What to do with an in-doubt effect of ``kind``: ``park`` (default) or ``retry``."""
        return self.effects.get(kind, "park")

    def to_dict(self) -> dict[str, Any]:
        """The stored form: plain JSON, durations in seconds."""
        body = asdict(self)
        body["retry"] = {
            "max_attempts": self.retry.max_attempts,
            "base": self.retry.base_seconds,
            "cap": self.retry.cap_seconds,
            "jitter": self.retry.jitter,
            "on": list(self.retry.on),
        }
        body["effects"] = dict(self.effects)
        body["fields"] = list(self.fields)
        body["errors"] = dict(self.errors)
        if self.payload_schema is None:
            del body["payload_schema"]
        else:
            body["payload_schema"] = dict(self.payload_schema)
        # Left out when not set: a contract stored before retention existed reads the same.
        if self.retention is None:
            del body["retention"]
        else:
            body["retention"] = dict(self.retention)
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> JobContract:
        """Read a stored contract; a field a newer replayq added takes its default.

        A contract stored before ``resume`` existed reads as the default, ``"step"``:
        only ``ctx.step(name, fn)`` can be skipped, and that form did not exist then, so
        such a version behaves the same under either value.
        """
        data = dict(body)
        retry = data.pop("retry")
        return cls(
            retry=Retry(
                max_attempts=retry["max_attempts"],
                base=retry["base"],
                cap=retry["cap"],
                jitter=retry["jitter"],
                on=tuple(retry["on"]),
            ),
            effects=dict(data.pop("effects", {})),
            fields=tuple(data.pop("fields", ())),
            **data,
        )


def build_contract(
    name: str,
    *,
    fields: Iterable[str],
    version: str = "v1",
    queue: str = "default",
    lease: Duration = "30s",
    heartbeat: Duration | None = None,
    retry: Retry | None = None,
    idempotency: str | None = None,
    ordering: str | None = None,
    lock: str | None = None,
    lock_ttl: Duration | None = None,
    max_payload_bytes: int = 256 * 1024,
    effects: Iterable[str] | Mapping[str, str] = (),
    cache_namespace: str | None = None,
    cache_ttl: Duration | None = None,
    errors: Mapping[type[BaseException], str] | None = None,
    resume: str = DEFAULT_RESUME,
    payload_schema: Mapping[str, Any] | None = None,
    retention: Retention | Mapping[str, float | None] | None = None,
) -> JobContract:
    """Validate a declaration and return its contract; ``ContractError`` says what is wrong."""
    if not name or not name.replace("_", "").replace(".", "").replace("-", "").isalnum():
        raise ContractError(f"job type {name!r}: use letters, digits, '_', '.', '-'")
    lease_s = parse_duration(lease, name=f"{name}: lease")
    if lease_s <= 0:
        raise ContractError(f"{name}: lease must be positive, got {lease!r}")
    heartbeat_s = (
        parse_duration(heartbeat, name=f"{name}: heartbeat")
        if heartbeat is not None
        else lease_s / 3
    )
    # heartbeat=0 declares a fixed visibility timeout: the lease is never extended.
    if heartbeat_s != 0 and not 0 < heartbeat_s < lease_s:
        raise ContractError(
            f"{name}: heartbeat ({heartbeat_s:g}s) must be positive and shorter than the lease "
            f"({lease_s:g}s), or the lease expires between two heartbeats (0: never extended)"
        )
    lock_ttl_s = None
    if lock_ttl is not None:
        lock_ttl_s = parse_duration(lock_ttl, name=f"{name}: lock_ttl")
        if lock_ttl_s <= 0:
            raise ContractError(f"{name}: lock_ttl must be positive, got {lock_ttl!r}")
    if lock is not None:
        if lock_ttl_s is None:
            lock_ttl_s = lease_s * 2
        if lock_ttl_s < lease_s:
            raise ContractError(
                f"{name}: lock_ttl ({lock_ttl_s:g}s) is shorter than the lease ({lease_s:g}s); "
                "the lock would expire while the job is still legitimately running"
            )
    field_set = tuple(fields)
    for label, template in (("idempotency", idempotency), ("ordering", ordering), ("lock", lock)):
        if template is None:
            continue
        for ref in template_fields(template):
            if ref not in field_set:
                raise ContractError(
                    f"{name}: {label} template {template!r} refers to {{{ref}}}, "
                    f"which is not a payload field (fields: {', '.join(field_set) or 'none'})"
                )
    effect_policies = (
        dict(effects) if isinstance(effects, Mapping) else dict.fromkeys(effects, "park")
    )
    for kind, policy in effect_policies.items():
        if policy not in ("park", "retry"):
            raise ContractError(
                f"{name}: effect {kind!r} has in-doubt policy {policy!r}; use 'park' or 'retry'"
            )
    if max_payload_bytes <= 0:
        raise ContractError(f"{name}: max_payload_bytes must be positive")
    if resume not in RESUME_MODES:
        raise ContractError(
            f"{name}: resume={resume!r}; use 'step' (a retry skips the steps an earlier "
            "attempt committed) or 'none' (every attempt runs every step)"
        )
    retention_fields = None
    if retention is not None:
        try:
            retention_fields = check_contract_retention(name, retention)
        except ValueError as exc:
            raise ContractError(str(exc)) from None
    error_names: dict[str, str] = {}
    for exc_type, class_name in (errors or {}).items():
        try:
            FailureClass(class_name)
        except ValueError:
            raise ContractError(
                f"{name}: errors maps {exc_type.__name__} to unknown class {class_name!r}"
            ) from None
        error_names[f"{exc_type.__module__}.{exc_type.__qualname__}"] = class_name
    return JobContract(
        name=name,
        version=version,
        queue=queue,
        lease=lease_s,
        heartbeat=heartbeat_s,
        retry=retry or Retry(),
        idempotency=idempotency,
        ordering=ordering,
        lock=lock,
        lock_ttl=lock_ttl_s,
        max_payload_bytes=max_payload_bytes,
        effects=effect_policies,
        cache_namespace=cache_namespace,
        cache_ttl=parse_duration(cache_ttl, name=f"{name}: cache_ttl") if cache_ttl else None,
        errors=error_names,
        fields=field_set,
        resume=resume,
        payload_schema=payload_schema,
        retention=retention_fields,
    )


class ContractChange(Struct, frozen=True):
    """One difference between two versions of a contract."""

    field: str
    old: Any
    new: Any
    concern: str


_CONCERNS = {
    "ack": "ack timing",
    "lease": "lease / visibility timeout",
    "heartbeat": "lease extension",
    "retry": "retry policy",
    "idempotency": "idempotency",
    "ordering": "ordering",
    "lock": "locking",
    "lock_ttl": "locking",
    "cache_namespace": "cache format",
    "cache_ttl": "cache TTL",
    "max_payload_bytes": "payload limit",
    "effects": "side effects",
    "errors": "error classification",
    "queue": "routing",
    "fields": "payload shape",
    "resume": "retry resumption",
    "payload_schema": "payload schema",
    "retention": "retention",
}


# How a diff shows a retention field a contract leaves to the app.
APP_RETENTION = "(the app's)"


def _flatten(body: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, Mapping) and key in ("retry", "payload_schema", "retention"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def diff_contracts(old: JobContract, new: JobContract) -> list[ContractChange]:
    """Every operational difference between two contracts of one job type."""
    if old.payload_schema is None or new.payload_schema is None:
        # Not recorded on one side (stored by an older replayq): not a change.
        old, new = replace(old, payload_schema=None), replace(new, payload_schema=None)
    before, after = _flatten(old.to_dict()), _flatten(new.to_dict())
    changes = []
    for key in sorted(set(before) | set(after)):
        if key in ("name", "version"):
            continue
        old_value, new_value = before.get(key), after.get(key)
        if key.startswith("retention."):
            # A retention field the contract leaves out is the app's, not "forever" (None).
            old_value = old_value if key in before else APP_RETENTION
            new_value = new_value if key in after else APP_RETENTION
        if old_value != new_value:
            concern = _CONCERNS.get(key.split(".")[0], key)
            changes.append(ContractChange(key, old_value, new_value, concern))
    return changes


FINDING = "finding"
UNCHECKED = "unchecked"


class LintFinding(Struct, frozen=True):
    """A contract rule that is broken, with the evidence (``kind="finding"``), or one that
    could not be checked for want of recorded behaviour (``kind="unchecked"``; ``message``
    says what is missing). An unchecked rule is neither broken nor passed."""

    job_type: str
    version: str
    rule: str
    message: str
    kind: str = FINDING


class LockHold(Struct, frozen=True):
    """One observed lock hold: from ``lock.acquired`` to ``lock.released`` (or ``lock.expired``),
    with the TTL the lock was taken with (the contract's, or the one passed to ``ctx.lock``)."""

    resource: str
    ttl: float
    held: float
    expired: bool = False


def lint_contract(
    contract: JobContract,
    *,
    p99_duration: float | None,
    lock_holds: Sequence[LockHold] = (),
) -> list[LintFinding]:
    """Check a contract against the rules of seed 003 and recorded behaviour.

    ``p99_duration`` is the observed p99 run time; ``lock_holds`` the locks the
    version's jobs took, with the TTL each was taken with and how long it was held.
    """
    findings = []

    def flag(rule: str, message: str) -> None:
        findings.append(LintFinding(contract.name, contract.version, rule, message))

    short = [h for h in lock_holds if h.ttl < contract.lease]
    if short:
        worst = min(short, key=lambda h: h.ttl)
        flag(
            "lock-ttl-below-lease",
            f"lock {worst.resource!r} was taken with TTL {worst.ttl:g}s < lease "
            f"{contract.lease:g}s ({len(short)} of {len(lock_holds)} observed holds): it can "
            "expire while the job still legitimately runs",
        )
    overdue = [h for h in lock_holds if h.held > h.ttl or h.expired]
    if overdue:
        worst = max(overdue, key=lambda h: h.held - h.ttl)
        flag(
            "lock-held-past-ttl",
            f"lock {worst.resource!r} was held {worst.held:.3g}s with TTL {worst.ttl:g}s "
            f"({len(overdue)} of {len(lock_holds)} observed holds outlived their TTL): another "
            "holder could take it meanwhile and fencing refuses the late writes",
        )

    if p99_duration is not None and contract.lease < p99_duration:
        flag(
            "lease-below-p99",
            f"lease {contract.lease:g}s is shorter than the observed p99 duration "
            f"{p99_duration:.3g}s: slow runs will be re-delivered while still running",
        )
    if (
        not short
        and contract.lock is not None
        and contract.lock_ttl is not None
        and (contract.lock_ttl < contract.lease)
    ):
        # Declaring this is refused; a contract stored by older code can still carry it.
        flag(
            "lock-ttl-below-lease",
            f"lock TTL {contract.lock_ttl:g}s < lease {contract.lease:g}s",
        )
    if contract.retry.max_attempts > 1 and contract.retry.jitter == "none":
        flag("retry-without-jitter", "retries without jitter synchronise into retry storms")
    if "validation" in contract.retry.on:
        flag("validation-retried", "'validation' is listed as retryable; it can never succeed")
    if "unknown" in contract.retry.on:
        flag("unknown-retried", "every unclassified error is retried; classify errors instead")
    if contract.effects and contract.idempotency is None:
        flag(
            "effects-without-idempotency-key",
            f"declares effects ({', '.join(contract.effects)}) but no business idempotency key",
        )
    return findings


def unchecked_rules(
    contract: JobContract,
    *,
    attempts: int,
    lock_holds: Sequence[LockHold] = (),
    active_version: str | None = None,
    attempts_read: int | None = None,
    window: int = 1000,
) -> list[LintFinding]:
    """The behaviour rules ``lint_contract`` could not check, each with the reason.

    ``attempts``: how many production attempts of the version have a recorded outcome
    (the durations the p99 is taken from). With none, the lease was compared with no
    duration and no lock hold could have been seen: ``lint_contract``'s silence on
    ``lease-below-p99``, ``lock-ttl-below-lease`` (for ``ctx.lock``) and
    ``lock-held-past-ttl`` is not a pass. ``attempts_read``: how many jobs of the version
    that ran are among the last ``window`` production jobs of the type, where lock holds
    are read (``None``: not counted). The static rules are always checked.
    """
    unchecked: list[LintFinding] = []

    def skip(rule: str, reason: str) -> None:
        unchecked.append(LintFinding(contract.name, contract.version, rule, reason, UNCHECKED))

    if attempts == 0:
        why = f"no production attempt of {contract.name} {contract.version} has a recorded outcome"
        if active_version is not None and active_version != contract.version:
            why += f" (workers run {active_version} for new jobs; this version is not active)"
        else:
            why += " (never run, or its events were removed by gc)"
        skip("lease-below-p99", f"{why}: the lease {contract.lease:g}s was compared with no p99")
        declared = (
            f"; the contract's lock_ttl {contract.lock_ttl:g}s was checked"
            if contract.lock is not None and contract.lock_ttl is not None
            else ""
        )
        skip(
            "lock-ttl-below-lease",
            f"{why}: the TTLs of locks its handler takes (ctx.lock) are unobserved{declared}",
        )
        skip("lock-held-past-ttl", f"{why}: no lock hold could be observed")
    elif attempts_read == 0:
        why = (
            f"the last {window} production jobs of {contract.name} include no attempt of "
            f"{contract.version} (a backlog, or a newer version's jobs): its lock holds "
            "were not read"
        )
        skip("lock-ttl-below-lease", f"{why}; the TTLs its handler takes (ctx.lock) are unseen")
        skip("lock-held-past-ttl", why)
    elif contract.lock is not None and not lock_holds:
        # The contract's lock is taken around every attempt: attempts with no hold mean
        # the holds fall outside the window read, or their releases were never recorded.
        skip(
            "lock-held-past-ttl",
            f"the contract's lock {contract.lock!r} is taken around every attempt, but no "
            f"hold with its release is recorded in the last {window} production jobs of the type",
        )
    return unchecked
