"""A job type's routing record: which version a new job runs under, as data.

Weights per version (canary, ramp), pins (a payload field or the ordering key,
listed values or a hashed share → a version), a shadow version with a fraction
and a dual-run version. The record lives in ``rq_routing`` with a revision; it
is changed only through ``replayq rollout …`` or ``Rollout`` (each change an
event with who, when and why) and read by workers at lease time.

A job's version is chosen once, at its first lease, from a hash of its ordering
key (else its trace id), so the choice is deterministic, a key's jobs share a
version, and a ramp only ever moves keys from the baseline to the candidate:
bucket ``b`` in ``[0, 1)`` goes to the candidate while ``b < weight``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replayq import codec
from replayq.errors import ConfigurationError
from replayq.model import Job
from replayq.storage.protocol import RoutingRecord

ORDERING_KEY = "ordering_key"


def bucket(text: str) -> float:
    """A stable point in ``[0, 1)`` for ``text`` (the same in every process and release)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def parse_share(text: str | float) -> float:
    """``"5%"``, ``"0.05"`` or ``0.05`` → ``0.05``; refuses anything outside 0..100 %."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        raw = text.strip()
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    if not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"a share must be between 0% and 100%, got {text!r}")
    return value


@dataclass(frozen=True)
class PinRule:
    """Jobs whose ``field`` (a payload field, or ``ordering_key``) matches run ``version``.

    Matches when the value is one of ``values``, or, with ``share``, when the
    value's hash bucket is below ``share`` (a stable slice of keys).
    """

    field: str
    version: str
    values: tuple[str, ...] = ()
    share: float | None = None

    def value_of(self, job: Job) -> str | None:
        if self.field == ORDERING_KEY:
            return job.ordering_key
        value = job.payload.get(self.field)
        return None if value is None else str(value)

    def matches(self, job: Job) -> bool:
        value = self.value_of(job)
        if value is None:
            return False
        if value in self.values:
            return True
        return self.share is not None and bucket(f"pin:{self.field}:{value}") < self.share

    def describe(self) -> str:
        what = ",".join(self.values) if self.values else f"{self.share:.0%} hashed"
        return f"{self.field} in {what} → {self.version}"


@dataclass(frozen=True)
class Routing:
    """One job type's routing (immutable: ``evolve`` for a changed copy).

    ``baseline`` is the version jobs fall back to; ``weights`` the share of new
    jobs per other version (the baseline gets the rest).
    """

    job_type: str
    baseline: str
    weights: Mapping[str, float] = field(default_factory=dict)
    pins: tuple[PinRule, ...] = ()
    shadow_version: str | None = None
    shadow_fraction: float = 0.0
    dual_run_version: str | None = None
    # The candidate a rollout is moving to (gates compare it with the baseline).
    candidate: str | None = None
    revision: int = 0
    updated_at: float | None = None

    def evolve(self, **changes: Any) -> Routing:
        return dataclasses.replace(self, **changes)

    def share_of(self, version: str) -> float:
        if version == self.baseline:
            return max(0.0, 1.0 - sum(w for v, w in self.weights.items() if v != version))
        return float(self.weights.get(version, 0.0))

    def choose(self, job: Job) -> str:
        """The version ``job`` runs under (called once, at its first lease)."""
        for pin in self.pins:
            if pin.matches(job):
                return pin.version
        point = bucket(f"route:{job.ordering_key or job.trace_id}")
        edge = 0.0
        # Sorted, so every worker cuts the unit interval the same way.
        for version in sorted(self.weights):
            if version == self.baseline:
                continue
            edge += self.weights[version]
            if point < edge:
                return version
        return self.baseline

    def versions(self) -> list[str]:
        named = [self.baseline, *self.weights, *(p.version for p in self.pins)]
        named += [v for v in (self.shadow_version, self.dual_run_version) if v]
        return list(dict.fromkeys(named))

    def shadows(self, job: Job) -> bool:
        """Whether a job of the baseline is also run on the shadow version (sealed)."""
        if not self.shadow_version or self.shadow_fraction <= 0:
            return False
        return bucket(f"shadow:{job.trace_id}") < self.shadow_fraction

    def to_body(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "weights": dict(self.weights),
            "pins": [dataclasses.asdict(p) for p in self.pins],
            "shadow_version": self.shadow_version,
            "shadow_fraction": self.shadow_fraction,
            "dual_run_version": self.dual_run_version,
            "candidate": self.candidate,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_type": self.job_type,
            "revision": self.revision,
            "updated_at": self.updated_at,
            **self.to_body(),
        }

    @classmethod
    def from_row(cls, row: RoutingRecord) -> Routing:
        body = codec.loads(row.body)
        return cls(
            job_type=row.job_type,
            baseline=str(body["baseline"]),
            weights={str(k): float(v) for k, v in (body.get("weights") or {}).items()},
            pins=tuple(
                PinRule(
                    field=str(p["field"]),
                    version=str(p["version"]),
                    values=tuple(str(v) for v in p.get("values") or ()),
                    share=p.get("share"),
                )
                for p in body.get("pins") or ()
            ),
            shadow_version=body.get("shadow_version"),
            shadow_fraction=float(body.get("shadow_fraction") or 0.0),
            dual_run_version=body.get("dual_run_version"),
            candidate=body.get("candidate"),
            revision=row.revision,
            updated_at=row.updated_at,
        )
