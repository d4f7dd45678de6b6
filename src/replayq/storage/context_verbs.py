"""Verbs for what the recording context stores (state, locks, effects, cache, outbox, steps),
and the schedules of periodic jobs.

A mixin over ``SqlTransaction``'s plumbing (``execute``, ``fetchone``, ``fetchall``,
``changed``); the SQL lives in each backend's ``state.sql``, ``locks.sql``,
``effects.sql``, ``cache.sql``, ``outbox.sql``, ``steps.sql``, ``blobs.sql``,
``lineage.sql`` and ``schedules.sql``. Rows come back as plain dicts; the domain modules
turn them into records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Row = dict[str, Any]


class ContextVerbs:
    """Storage verbs of the recording context, shared by every SQL backend."""

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Row | None:
        raise NotImplementedError

    def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        raise NotImplementedError

    def changed(self, name: str, params: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    # -- state ------------------------------------------------------------------------------

    def entity_head(self, branch: str, namespace: str, key: str) -> Row | None:
        return self.fetchone("entity_head", {"branch": branch, "namespace": namespace, "key": key})

    def entity_version_get(self, branch: str, namespace: str, key: str, version: int) -> Row | None:
        params = {"branch": branch, "namespace": namespace, "key": key, "version": version}
        return self.fetchone("entity_version_get", params)

    def entity_version_at(self, branch: str, namespace: str, key: str, hlc: int) -> Row | None:
        params = {"branch": branch, "namespace": namespace, "key": key, "hlc": hlc}
        return self.fetchone("entity_version_at", params)

    def entity_put(self, row: Mapping[str, Any], expected_version: int) -> bool:
        """Compare-and-set the head from ``expected_version`` (0: new) and insert the version."""
        head = {
            "branch": row["branch"],
            "namespace": row["namespace"],
            "key": row["key"],
            "new_version": row["version"],
            "expected_version": expected_version,
            "hlc": row["hlc"],
        }
        query = "entity_head_insert" if expected_version == 0 else "entity_head_cas"
        if not self.changed(query, head):
            return False
        self.execute("entity_version_insert", row)
        return True

    def entity_version_insert(self, row: Mapping[str, Any]) -> None:
        """Insert a version row without moving the head (importing a recorded case)."""
        self.execute("entity_version_insert", row)

    def entity_history(self, branch: str, namespace: str, key: str) -> list[Row]:
        params = {"branch": branch, "namespace": namespace, "key": key}
        return self.fetchall("entity_history", params)

    def entity_versions_by_job(self, job_id: int) -> list[Row]:
        return self.fetchall("entity_versions_by_job", {"job_id": job_id})

    def entity_versions_after(
        self, branch: str, namespace: str, key: str, version: int
    ) -> list[Row]:
        params = {"branch": branch, "namespace": namespace, "key": key, "version": version}
        return self.fetchall("entity_versions_after", params)

    def branch_create(
        self, branch: str, base_branch: str, base_hlc: int, origin: str, now: float
    ) -> None:
        params = {
            "branch": branch,
            "base_branch": base_branch,
            "base_hlc": base_hlc,
            "origin": origin,
            "now": now,
        }
        self.execute("branch_create", params)

    def branch_get(self, branch: str) -> Row | None:
        return self.fetchone("branch_get", {"branch": branch})

    def branch_entities(self, branch: str) -> list[Row]:
        return self.fetchall("branch_entities", {"branch": branch})

    # -- locks ------------------------------------------------------------------------------

    def lock_acquire(self, params: Mapping[str, Any]) -> Row | None:
        """Take the lock if free or expired; returns its new fencing token and HLC."""
        return self.fetchone("lock_acquire", params)

    def lock_get(self, resource: str) -> Row | None:
        return self.fetchone("lock_get", {"resource": resource})

    def lock_renew(self, resource: str, owner_token: str, now: float, ttl: float) -> bool:
        params = {"resource": resource, "owner_token": owner_token, "now": now, "ttl": ttl}
        return self.changed("lock_renew", params)

    def lock_release(self, resource: str, owner_token: str, hlc: int) -> bool:
        params = {"resource": resource, "owner_token": owner_token, "hlc": hlc}
        return self.changed("lock_release", params)

    def lock_list(self) -> list[Row]:
        return self.fetchall("lock_list")

    def lock_break(self, resource: str, hlc: int) -> Row | None:
        return self.fetchone("lock_break", {"resource": resource, "hlc": hlc})

    def fence_current(self, resource: str) -> int | None:
        row = self.fetchone("fence_current", {"resource": resource})
        return None if row is None else int(row["fencing_token"])

    # -- idempotency records ----------------------------------------------------------------

    def idem_claim(self, params: Mapping[str, Any]) -> bool:
        return self.fetchone("idem_claim", params) is not None

    def idem_get(self, key: str) -> Row | None:
        return self.fetchone("idem_get", {"key": key})

    def idem_takeover(self, params: Mapping[str, Any]) -> bool:
        return self.changed("idem_takeover", params)

    def idem_succeed(self, params: Mapping[str, Any]) -> bool:
        return self.changed("idem_succeed", params)

    def idem_fail(self, params: Mapping[str, Any]) -> bool:
        return self.changed("idem_fail", params)

    def idem_compensate(self, key: str, now: float) -> bool:
        return self.changed("idem_compensate", {"key": key, "now": now})

    def idem_by_job(self, job_id: int) -> list[Row]:
        return self.fetchall("idem_by_job", {"job_id": job_id})

    def idem_list(self, operation: str | None, in_doubt: bool, limit: int) -> list[Row]:
        params = {"operation": operation, "in_doubt": in_doubt, "limit": limit}
        return self.fetchall("idem_list", params)

    def idem_resolve(self, params: Mapping[str, Any]) -> bool:
        return self.changed("idem_resolve", params)

    # -- cache ------------------------------------------------------------------------------

    def cache_put(self, params: Mapping[str, Any]) -> None:
        self.execute("cache_put", params)

    def cache_get(self, key: str, now: float) -> Row | None:
        return self.fetchone("cache_get", {"key": key, "now": now})

    def cache_latest(self, base_key: str, now: float) -> Row | None:
        return self.fetchone("cache_latest", {"base_key": base_key, "now": now})

    def cache_delete_base(self, base_key: str) -> None:
        self.execute("cache_delete_base", {"base_key": base_key})

    def cache_delete_source(self, namespace: str, key: str) -> None:
        """Drop database cache entries derived from one entity."""
        self.execute("cache_delete_source", {"namespace": namespace, "key": key})

    # -- outbox -----------------------------------------------------------------------------

    def outbox_insert(self, params: Mapping[str, Any]) -> bool:
        """Insert an outbox row; ``False`` when a row with its ``event_id`` already exists."""
        return self.changed("outbox_insert", params)

    def outbox_claim(self, now: float, claim_seconds: float, limit: int) -> list[Row]:
        params = {"now": now, "claim_seconds": claim_seconds, "limit": limit}
        return self.fetchall("outbox_claim", params)

    def outbox_mark_published(self, row_id: int, now: float) -> bool:
        return self.changed("outbox_mark_published", {"id": row_id, "now": now})

    def outbox_mark_failed(self, row_id: int, error: str) -> bool:
        return self.changed("outbox_mark_failed", {"id": row_id, "error": error})

    def outbox_backlog(self) -> Row:
        row = self.fetchone("outbox_backlog")
        assert row is not None
        return dict(row)

    def outbox_by_job(self, job_id: int) -> list[Row]:
        return self.fetchall("outbox_by_job", {"job_id": job_id})

    # -- steps ------------------------------------------------------------------------------

    def step_complete(self, params: Mapping[str, Any]) -> bool:
        """Record a committed step; ``False`` when its position was already recorded."""
        return self.changed("step_complete", params)

    def step_by_job(self, job_id: int) -> list[Row]:
        return self.fetchall("step_by_job", {"job_id": job_id})

    # -- blobs ------------------------------------------------------------------------------

    def blob_put(self, params: Mapping[str, Any]) -> None:
        self.execute("blob_put", params)

    def blob_get(self, digest: str) -> Row | None:
        return self.fetchone("blob_get", {"hash": digest})

    # -- lineage ----------------------------------------------------------------------------

    def lineage_put(self, params: Mapping[str, Any]) -> None:
        self.execute("lineage_put", params)

    def lineage_get(self, trace_id: str) -> Row | None:
        return self.fetchone("lineage_get", {"trace_id": trace_id})

    def lineage_for_source(self, source_trace_id: str) -> list[Row]:
        return self.fetchall("lineage_for_source", {"source_trace_id": source_trace_id})

    def lineage_page(self, after: tuple[float, str], limit: int) -> list[Row]:
        created_at, trace_id = after
        return self.fetchall(
            "lineage_page", {"created_at": created_at, "trace_id": trace_id, "limit": limit}
        )

    # -- schedules --------------------------------------------------------------------------

    def schedule_register(self, params: Mapping[str, Any]) -> None:
        self.execute("schedule_register", params)

    def schedule_get(self, name: str) -> Row | None:
        return self.fetchone("schedule_get", {"name": name})

    def schedule_advance(self, params: Mapping[str, Any]) -> bool:
        return self.changed("schedule_advance", params)

    def schedule_made(self, name: str, slot: float, job_id: int) -> None:
        self.execute("schedule_made", {"name": name, "last_slot": slot, "last_job_id": job_id})

    def schedule_list(self) -> list[Row]:
        return self.fetchall("schedule_list")
