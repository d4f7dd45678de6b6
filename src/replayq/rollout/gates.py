"""The ramp's gates: the candidate against the baseline, per version, over a window.

Each gate is a rate per attempt (or the p99 duration against the lease) read
from the committed trace. The candidate is *worse* on a rate gate when its rate
exceeds the baseline's by more than chance allows: a one-sided two-proportion
test at z = 2.33 (1 % false alarms), and at least ``RATE_MARGIN`` (one point),
so a ramp is not held up by noise nor waved through by a small sample. Below
``min_sample`` candidate attempts the ``sample`` gate fails: no evidence yet.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from replayq.rollout.routing import Routing
from replayq.runtime import Runtime
from replayq.storage.reports import VersionOutcomes

Z_ONE_SIDED_99 = 2.33
RATE_MARGIN = 0.01
# A candidate whose p99 duration comes this close to its lease risks redeliveries.
P99_LEASE_SHARE = 0.8


@dataclass
class VersionFigures:
    """What one version did over the window."""

    version: str
    attempts: int = 0
    succeeded: int = 0
    failed_by_class: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    dead: int = 0
    redelivered: int = 0
    lock_expired: int = 0
    cache_reads: int = 0
    stale_reads: int = 0
    durations: list[float] = field(default_factory=list)

    def rate(self, count: int, of: int | None = None) -> float:
        base = self.attempts if of is None else of
        return count / base if base else 0.0

    @property
    def p99(self) -> float | None:
        if not self.durations:
            return None
        ordered = sorted(self.durations)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "attempts": self.attempts,
            "succeeded": self.succeeded,
            "failed_by_class": dict(self.failed_by_class),
            "retry_rate": self.rate(self.retries),
            "dlq_rate": self.rate(self.dead),
            "redelivery_rate": self.rate(self.redelivered),
            "lock_expiry_rate": self.rate(self.lock_expired),
            "stale_read_rate": self.rate(self.stale_reads, self.cache_reads),
            "p99_seconds": self.p99,
        }


@dataclass(frozen=True)
class Gate:
    """One gate's verdict."""

    name: str
    baseline: float | None
    candidate: float | None
    passed: bool
    detail: str

    def describe(self) -> str:
        return f"{self.name}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass(frozen=True)
class GateReport:
    baseline: VersionFigures
    candidate: VersionFigures
    gates: list[Gate]
    # The figures shown side by side (``rollout status``, the dashboard), in order.
    FIGURES: ClassVar[tuple[str, ...]] = (
        "attempts",
        "retry_rate",
        "dlq_rate",
        "redelivery_rate",
        "lock_expiry_rate",
        "stale_read_rate",
        "p99_seconds",
    )
    min_sample: int

    def failing(self) -> list[Gate]:
        return [g for g in self.gates if not g.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
            "min_sample": self.min_sample,
            "gates": [g.to_dict() for g in self.gates],
        }


def figures(runtime: Runtime, job_type: str, since: float) -> dict[str, VersionFigures]:
    """Per version: attempts, failures by class, retries, dead, redeliveries, durations."""
    with runtime.storage.transaction(readonly=True) as tx:
        rows = tx.report(VersionOutcomes(job_type, since))
    by_version: dict[str, VersionFigures] = {}
    # An attempt's decision (retry, dead) belongs to the version whose attempt failed,
    # even if a rollback has since moved the queued job to another version.
    attempt_version: dict[tuple[Any, Any], str | None] = {}

    def of(version: str | None) -> VersionFigures:
        name = version or "?"
        return by_version.setdefault(name, VersionFigures(name))

    for row in rows:
        name, key = row.name, (row.job_id, row.attempt)
        if name in ("job.succeeded", "job.failed"):
            attempt_version[key] = row.version
            figures_ = of(row.version)
            figures_.attempts += 1
            if row.duration is not None:
                figures_.durations.append(float(row.duration))
            if name == "job.succeeded":
                figures_.succeeded += 1
            else:
                figures_.failed_by_class[row.error_class or "unknown"] += 1
            continue
        figures_ = of(attempt_version.get(key, row.version))
        if name == "retry.scheduled":
            figures_.retries += 1
        elif name == "job.dead":
            figures_.dead += 1
        elif name in ("job.redelivered", "lease.expired"):
            figures_.redelivered += 1 if name == "job.redelivered" else 0
        elif name == "lock.expired":
            figures_.lock_expired += 1
        elif name == "cache.read":
            figures_.cache_reads += 1
            figures_.stale_reads += 1 if row.stale else 0
    return by_version


def _rate_gate(
    name: str,
    base: VersionFigures,
    cand: VersionFigures,
    base_count: int,
    cand_count: int,
    base_n: int,
    cand_n: int,
) -> Gate:
    p1 = base_count / base_n if base_n else 0.0
    p2 = cand_count / cand_n if cand_n else 0.0
    pooled = (base_count + cand_count) / (base_n + cand_n) if base_n + cand_n else 0.0
    spread = math.sqrt(pooled * (1 - pooled) * ((1 / base_n if base_n else 1) + 1 / max(cand_n, 1)))
    allowed = max(RATE_MARGIN, Z_ONE_SIDED_99 * spread)
    worse = cand_n > 0 and p2 - p1 > allowed
    detail = (
        f"{cand.version} {p2:.1%} vs {base.version} {p1:.1%} "
        f"({(p2 - p1) * 100:+.1f} points, allowed +{allowed * 100:.1f}; "
        f"{cand_n} vs {base_n} attempts)"
    )
    return Gate(name, p1, p2, not worse, detail)


def evaluate_gates(
    runtime: Runtime, routing: Routing, *, since: float, min_sample: int
) -> GateReport:
    """Every gate for the routing's candidate against its baseline since ``since``."""
    assert routing.candidate is not None
    found = figures(runtime, routing.job_type, since)
    base = found.get(routing.baseline, VersionFigures(routing.baseline))
    cand = found.get(routing.candidate, VersionFigures(routing.candidate))
    gates = [
        Gate(
            "sample",
            float(base.attempts),
            float(cand.attempts),
            cand.attempts >= min_sample,
            f"{cand.version} ran {cand.attempts} attempts, the gates need {min_sample}",
        )
    ]
    classes = sorted(set(base.failed_by_class) | set(cand.failed_by_class))
    for failure_class in classes:
        gates.append(
            _rate_gate(
                f"error rate ({failure_class})",
                base,
                cand,
                base.failed_by_class[failure_class],
                cand.failed_by_class[failure_class],
                base.attempts,
                cand.attempts,
            )
        )
    for name, attr in (
        ("retry rate", "retries"),
        ("DLQ rate", "dead"),
        ("duplicate deliveries", "redelivered"),
        ("lock expiries", "lock_expired"),
    ):
        gates.append(
            _rate_gate(
                name,
                base,
                cand,
                getattr(base, attr),
                getattr(cand, attr),
                base.attempts,
                cand.attempts,
            )
        )
    if base.cache_reads or cand.cache_reads:
        gates.append(
            _rate_gate(
                "stale cache reads",
                base,
                cand,
                base.stale_reads,
                cand.stale_reads,
                base.cache_reads,
                cand.cache_reads,
            )
        )
    lease = _lease(runtime, routing.job_type, routing.candidate)
    p99 = cand.p99
    if lease and p99 is not None:
        ok = p99 <= P99_LEASE_SHARE * lease
        gates.append(
            Gate(
                "p99 vs lease",
                base.p99,
                p99,
                ok,
                f"{cand.version} p99 {p99:.3f}s is {p99 / lease:.0%} of its "
                f"{lease:g}s lease (limit {P99_LEASE_SHARE:.0%})",
            )
        )
    return GateReport(base, cand, gates, min_sample)


def _lease(runtime: Runtime, job_type: str, version: str) -> float | None:
    registry = runtime.registry
    if registry.declares(job_type):
        try:
            return float(registry.handler(job_type, version).contract.lease)
        except Exception:  # a version only stored, not declared here: no lease to compare
            return None
    return None
