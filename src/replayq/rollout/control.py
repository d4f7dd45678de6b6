"""Changing a job type's routing: every change a compare-and-set plus an event (who, why).

``Rollout(app, "charge")`` is the one way in (the ``replayq rollout`` commands
call it): ``start`` a canary, ``pin`` keys, ``ramp`` (behind the gates),
``shadow``, ``dual_run``, then one of the two ends: ``finish`` (behind the gates:
the candidate becomes the baseline and the only route) or ``rollback`` — one
switch that routes new and queued jobs back to the baseline while in-flight
attempts finish where they run.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import structs

from replayq import codec
from replayq.errors import RolloutRefusedError
from replayq.model import TraceEvent
from replayq.queue import lifecycle
from replayq.queue.actions import request_release
from replayq.rollout.background import VerifyRun, verify_runs
from replayq.rollout.gates import GateReport, evaluate_gates
from replayq.rollout.routing import PinRule, Routing, parse_share
from replayq.runtime import Runtime, RuntimeSource
from replayq.storage.params import (
    ActiveVersion,
    ComparisonQuery,
    ContractQuery,
    RoutingHistory,
    RoutingQuery,
)
from replayq.storage.protocol import JobFilter, JobReroute, RoutingPut, Transaction

_CAS_TRIES = 5

# A routing change: the new routing from the current one (None: the type has none yet),
# computed inside the change's transaction, which is passed for any read it needs.
Change = Callable[["Routing | None", Transaction], "Routing"]


def default_actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers) and no $USER
        return "unknown"


@dataclass(frozen=True)
class RoutingChange:
    """One recorded change of a type's routing."""

    revision: int
    action: str
    actor: str
    reason: str | None
    ts: float
    routing: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass(frozen=True)
class RollbackResult:
    """What ``rollback`` (or ``finish``) did: the routing now, how many queued jobs it
    moved to the baseline, how many attempts still run on other versions, and how many
    of those were asked to go back to the queue on the baseline (``release_inflight``)."""

    routing: Routing
    requeued_to_baseline: int
    in_flight: int
    released: int = 0


class Rollout:
    """The routing of one job type, read and changed (each change recorded)."""

    def __init__(self, source: RuntimeSource, job_type: str, *, actor: str | None = None) -> None:
        self.runtime: Runtime = source.runtime
        self.job_type = job_type
        self.actor = actor or default_actor()

    # -- reading ----------------------------------------------------------------------------

    def routing(self) -> Routing | None:
        with self.runtime.storage.transaction(readonly=True) as tx:
            rows = tx.rollout_query(RoutingQuery(self.job_type))
        return Routing.from_row(rows[0]) if rows else None

    def history(self) -> list[RoutingChange]:
        with self.runtime.storage.transaction(readonly=True) as tx:
            rows = tx.rollout_query(RoutingHistory(self.job_type))
        return [
            RoutingChange(r.revision, r.action, r.actor, r.reason, r.ts, codec.loads(r.body))
            for r in rows
        ]

    def comparisons(self, mode: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """Stored shadow and dual-run comparisons, newest first."""
        with self.runtime.storage.transaction(readonly=True) as tx:
            rows = tx.rollout_query(ComparisonQuery(self.job_type, mode, limit))
        return [
            {
                **structs.asdict(row),
                "classes": codec.loads(row.classes),
                "report": codec.loads(row.report),
            }
            for row in rows
        ]

    def comparison_summary(self) -> dict[str, dict[str, Any]]:
        """Per mode (shadow, dual-run): how many compared, how many differed, by class."""
        summary: dict[str, dict[str, Any]] = {}
        for row in self.comparisons():
            mode = summary.setdefault(row["mode"], {"compared": 0, "differing": 0, "classes": {}})
            mode["compared"] += 1
            if row["classes"]:
                mode["differing"] += 1
            for name in row["classes"]:
                mode["classes"][name] = mode["classes"].get(name, 0) + 1
        return summary

    def verify_runs(self, limit: int = 20) -> list[VerifyRun]:
        """Background verifications of this type (``rollout verify --background``), newest first."""
        return verify_runs(self.runtime, self.job_type, limit=limit)

    def gates(self, *, since: float | None = None, min_sample: int = 50) -> GateReport:
        """The candidate against the baseline on every gate (see ``rollout.gates``)."""
        routing = self._require()
        if routing.candidate is None:
            raise RolloutRefusedError(f"{self.job_type}: no rollout under way (rollout start)")
        return evaluate_gates(
            self.runtime,
            routing,
            since=since if since is not None else _started_at(self.history()),
            min_sample=min_sample,
        )

    # -- changing ---------------------------------------------------------------------------

    def start(
        self,
        to: str,
        *,
        canary: str | float,
        baseline: str | None = None,
        reason: str | None = None,
    ) -> Routing:
        """Route ``canary`` of new jobs to ``to``; the rest stay on the baseline."""
        self._declared(to)
        share = parse_share(canary)

        def change(current: Routing | None, tx: Transaction) -> Routing:
            base = baseline or (current.baseline if current else self._active(tx))
            if base == to:
                raise RolloutRefusedError(f"{self.job_type}: {to} is already the baseline")
            self._declared(base, tx)
            routing = current or Routing(self.job_type, base)
            return routing.evolve(baseline=base, candidate=to, weights={to: share})

        return self._change("start", change, reason)

    def ramp(
        self,
        share: str | float,
        *,
        force: bool = False,
        reason: str | None = None,
        min_sample: int = 50,
    ) -> Routing:
        """Move the candidate's share to ``share``: refused while a gate says it is worse.

        ``force`` ramps anyway and records the override with the failing gates.
        """
        target = parse_share(share)
        routing = self._require()
        if routing.candidate is None:
            raise RolloutRefusedError(f"{self.job_type}: no rollout under way (rollout start)")
        action = "ramp"
        if target > routing.share_of(routing.candidate):
            action = self._gated("ramp", f"ramp to {target:.0%}", force, min_sample)
        candidate = routing.candidate
        return self._change(
            action,
            lambda current, _tx: self._have(current).evolve(weights={candidate: target}),
            reason,
        )

    def finish(
        self, *, force: bool = False, reason: str | None = None, min_sample: int = 50
    ) -> RollbackResult:
        """Accept the candidate: it becomes the baseline and the only route.

        Refused while a gate says the candidate is worse (``force`` records an
        override, as ``ramp`` does). Weights, pins, shadow and dual-run are cleared,
        and queued jobs of other versions move to the new baseline in the same
        transaction (their next attempt runs it); running attempts finish where they
        run. The mirror of ``rollback``: the rollout ends, one way or the other.
        """
        routing = self._require()
        if routing.candidate is None:
            raise RolloutRefusedError(f"{self.job_type}: no rollout under way (rollout start)")
        candidate = routing.candidate
        action = self._gated("finish", f"finish on {candidate}", force, min_sample)

        def change(current: Routing | None, _tx: Transaction) -> Routing:
            if self._have(current).candidate != candidate:
                raise RolloutRefusedError(f"{self.job_type}: the rollout changed under finish")
            return self._have(current).evolve(
                baseline=candidate,
                candidate=None,
                weights={},
                pins=(),
                shadow_version=None,
                shadow_fraction=0.0,
                dual_run_version=None,
            )

        return self._settle(action, change, reason)

    def _gated(self, action: str, what: str, force: bool, min_sample: int) -> str:
        """``action``, or refused while a gate fails; with ``force`` the override is named."""
        failing = self.gates(min_sample=min_sample).failing()
        if failing and not force:
            raise RolloutRefusedError(
                f"{self.job_type}: {what} refused: "
                + "; ".join(g.describe() for g in failing)
                + " (--force records an override)"
            )
        if failing:
            return f"{action} (forced over: " + "; ".join(g.describe() for g in failing) + ")"
        return action

    def pin(
        self,
        field: str,
        *,
        to: str,
        values: Sequence[str] = (),
        share: str | float | None = None,
        reason: str | None = None,
    ) -> Routing:
        """Jobs whose ``field`` (payload field or ``ordering_key``) matches run ``to``."""
        self._declared(to)
        if not values and share is None:
            raise RolloutRefusedError("a pin needs values or a hashed share")
        rule = PinRule(field, to, tuple(values), parse_share(share) if share is not None else None)

        def change(current: Routing | None, tx: Transaction) -> Routing:
            routing = current or Routing(self.job_type, self._active(tx))
            kept = tuple(p for p in routing.pins if p.field != field or p.version != to)
            return routing.evolve(pins=(*kept, rule))

        return self._change("pin", change, reason)

    def unpin(self, field: str, *, reason: str | None = None) -> Routing:
        return self._change(
            "unpin",
            lambda c, _tx: self._have(c).evolve(
                pins=tuple(p for p in self._have(c).pins if p.field != field)
            ),
            reason,
        )

    def shadow(
        self, version: str | None, *, fraction: str | float = 0.0, reason: str | None = None
    ) -> Routing:
        """Also run ``fraction`` of the baseline's jobs on ``version``, sealed (no effects)."""
        if version is not None:
            self._declared(version)
        share = parse_share(fraction) if version else 0.0

        def change(current: Routing | None, tx: Transaction) -> Routing:
            routing = current or Routing(self.job_type, self._active(tx))
            return routing.evolve(shadow_version=version, shadow_fraction=share)

        return self._change("shadow", change, reason)

    def dual_run(self, version: str | None, *, reason: str | None = None) -> Routing:
        """Run every baseline job on ``version`` too, observe-only (compared per job)."""
        if version is not None:
            self._declared(version)

        def change(current: Routing | None, tx: Transaction) -> Routing:
            routing = current or Routing(self.job_type, self._active(tx))
            return routing.evolve(dual_run_version=version)

        return self._change("dual-run", change, reason)

    def rollback(
        self, *, reason: str | None = None, release_inflight: bool = False
    ) -> RollbackResult:
        """One switch: new and queued jobs go to the baseline at once.

        Weights, pins, shadow and dual-run are cleared in one change; queued jobs
        already routed to another version (retries waiting, backlog) move to the
        baseline in the same transaction. Running attempts are left alone: each
        finishes on the version it started on, and is never run by two at once.
        With ``release_inflight`` each running attempt on another version is asked,
        in the same transaction, to stop at its next step boundary and go back to
        the queue on the baseline (``job.release_requested``, then ``job.released``
        in its trace); its committed steps stay committed.
        """

        def change(current: Routing | None, _tx: Transaction) -> Routing:
            routing = self._have(current)
            return routing.evolve(
                weights={},
                pins=(),
                shadow_version=None,
                shadow_fraction=0.0,
                dual_run_version=None,
            )

        action = "rollback --release-inflight" if release_inflight else "rollback"
        return self._settle(action, change, reason, release=release_inflight)

    def _settle(
        self,
        action: str,
        change: Change,
        reason: str | None,
        release: bool = False,
    ) -> RollbackResult:
        """A change to one route (rollback, finish): queued jobs of other versions move to
        the baseline in the same transaction; running attempts are counted, and left
        alone unless ``release`` asks them back to the queue at their next step."""
        moved = 0
        in_flight = 0
        released = 0

        def also(tx: Transaction, before: Routing, after: Routing) -> None:
            nonlocal moved, in_flight, released
            moved = released = 0
            for version in before.versions():
                if version != after.baseline:
                    moved += tx.job_transition(JobReroute(self.job_type, version, after.baseline))
            running = [
                job
                for job in tx.job_list(JobFilter(["running"], self.job_type, None, 100_000))
                if job.handler_version not in (None, after.baseline)
            ]
            in_flight = len(running)
            if release:
                now = self.runtime.clock.now()
                why = f"{action}: {reason}" if reason else action
                for job in running:
                    released += request_release(
                        tx, job, after.baseline, now=now, hlc=self.runtime.hlc.tick(), reason=why
                    )

        routing = self._change(action, change, reason, also=also)
        return RollbackResult(routing, moved, in_flight, released)

    # -- plumbing ---------------------------------------------------------------------------

    def _change(
        self,
        action: str,
        change: Change,
        reason: str | None,
        also: Callable[[Transaction, Routing, Routing], None] | None = None,
    ) -> Routing:
        runtime = self.runtime
        for _ in range(_CAS_TRIES):
            with runtime.storage.transaction() as tx:
                rows = tx.rollout_query(RoutingQuery(self.job_type))
                current = Routing.from_row(rows[0]) if rows else None
                wanted = change(current, tx)
                now = runtime.clock.now()
                expected = current.revision if current else 0
                revision = tx.rollout_update(
                    RoutingPut(
                        job_type=self.job_type,
                        body_json=codec.dumps(wanted.to_body()),
                        expected_revision=expected,
                        action=action,
                        actor=self.actor,
                        reason=reason,
                        now=now,
                    )
                )
                if revision is None:
                    continue  # changed under us: read again and re-apply
                if also is not None:
                    also(tx, current or wanted, wanted)
                tx.trace_append([self._event(action, wanted, revision, reason, now)])
                return wanted.evolve(revision=revision, updated_at=now)
        raise RolloutRefusedError(f"{self.job_type}: routing kept changing under this change")

    def _event(
        self, action: str, routing: Routing, revision: int, reason: str | None, now: float
    ) -> TraceEvent:
        return TraceEvent(
            trace_id=f"rollout:{self.job_type}",
            name=lifecycle.ROUTING_CHANGED,
            ts=now,
            hlc=self.runtime.hlc.tick(),
            kind="domain",
            worker_id=self.actor,
            status=action,
            resource=f"routing:{self.job_type}",
            resource_version=revision,
            data={
                "action": action,
                "actor": self.actor,
                "reason": reason,
                "routing": routing.to_body(),
            },
        )

    def _require(self) -> Routing:
        routing = self.routing()
        if routing is None:
            raise RolloutRefusedError(
                f"{self.job_type}: no routing yet (rollout start {self.job_type} --to VERSION)"
            )
        return routing

    def _have(self, current: Routing | None) -> Routing:
        if current is None:
            raise RolloutRefusedError(f"{self.job_type}: no routing yet")
        return current

    def _active(self, tx: Transaction) -> str:
        """The version new jobs run without routing: the app's, else the one the last
        worker to start recorded, read in ``tx`` (the change's own: transactions do not
        nest on one connection)."""
        registry = self.runtime.registry
        active = (
            registry.active_version(self.job_type) if registry.declares(self.job_type) else None
        )
        if active is None:
            active = tx.rollout_query(ActiveVersion(self.job_type))
        if active is None:
            raise RolloutRefusedError(f"{self.job_type}: no active version known; give --from")
        return active

    def _declared(self, version: str, tx: Transaction | None = None) -> None:
        """Refused unless the app declares ``version`` (else a worker stored its contract),
        read in ``tx`` when called inside a change's transaction."""
        registry = self.runtime.registry
        if registry.declares(self.job_type):
            known = registry.versions(self.job_type)
        elif tx is not None:
            known = [c.version for c in tx.rollout_query(ContractQuery(self.job_type))]
        else:
            with self.runtime.storage.transaction(readonly=True) as read:
                known = [c.version for c in read.rollout_query(ContractQuery(self.job_type))]
        if version not in known:
            raise RolloutRefusedError(
                f"{self.job_type} has no version {version!r} "
                f"(declared: {', '.join(known) or 'none'})"
            )


def _started_at(history: list[RoutingChange]) -> float:
    """When the current rollout started (its last ``start``), for the gates' window."""
    for change in reversed(history):
        if change.action == "start":
            return change.ts
    return 0.0
