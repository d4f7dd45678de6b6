"""The stored contracts: every declared version's contract, frozen once a worker registers it.

Beside the versions, ``rq_active_versions`` names per job type the version that
the last worker to register runs for new jobs: the *active* version. A producer
that does not declare the type (``replayq enqueue TYPE`` without ``--app``)
enqueues under that version's contract — its ordering key, idempotency key,
queue and attempt budget — never under defaults.
"""

from __future__ import annotations

from dataclasses import replace

from replayq import codec
from replayq.errors import ContractError
from replayq.queue.contracts import JobContract
from replayq.runtime import Runtime
from replayq.storage.params import ActiveVersion, ContractActivate, ContractPut, ContractQuery
from replayq.storage.protocol import Transaction


def register_contracts(runtime: Runtime) -> None:
    """Store every declared contract; a changed contract needs a new version."""
    now = runtime.clock.now()
    with runtime.storage.transaction() as tx:
        for handler in runtime.registry.handlers():
            contract = handler.contract
            body = codec.dumps(contract.to_dict())
            stored = tx.rollout_query(ContractQuery(contract.name, contract.version))
            # Compared as read back: a field a newer replayq added (``resume``) is absent
            # from an older stored body and takes its default, which is no change.
            # So is a payload schema a contract stored before schemas existed lacks.
            if stored and not _same(JobContract.from_dict(codec.loads(stored[0].body)), contract):
                raise ContractError(
                    f"the contract of {contract.name} {contract.version} differs from the one "
                    "stored; contracts are frozen per version: declare a new version "
                    f"(see: replayq contract diff {contract.name})"
                )
            if not stored:
                tx.rollout_update(ContractPut(contract.name, contract.version, body, now))
        for job_type in runtime.registry.job_types():
            active = runtime.registry.active_version(job_type)
            if active is not None:
                tx.rollout_update(ContractActivate(job_type, active, now))


def _same(stored: JobContract, declared: JobContract) -> bool:
    if stored.payload_schema is None:
        declared = replace(declared, payload_schema=None)
    return stored == declared


def stored_contracts(runtime: Runtime, job_type: str | None = None) -> list[JobContract]:
    """Contracts stored in the database (every version that a worker registered)."""
    with runtime.storage.transaction(readonly=True) as tx:
        rows = tx.rollout_query(ContractQuery(job_type))
    return [JobContract.from_dict(codec.loads(row.body)) for row in rows]


def active_contract(runtime: Runtime, tx: Transaction, job_type: str) -> JobContract | None:
    """The stored contract of ``job_type``'s active version (``None`` if none is stored).

    Without an active version recorded (registered by older code), a type with
    exactly one stored version uses it; with several, none is chosen.
    """
    active = tx.rollout_query(ActiveVersion(job_type))
    if active is not None:
        stored = tx.rollout_query(ContractQuery(job_type, active))
        return JobContract.from_dict(codec.loads(stored[0].body)) if stored else None
    versions = [row.body for row in tx.rollout_query(ContractQuery(job_type))]
    return JobContract.from_dict(codec.loads(versions[0])) if len(versions) == 1 else None
