"""The stored contracts: every declared version's contract, frozen once a worker registers it."""

from __future__ import annotations

from replayq import codec
from replayq.errors import ContractError
from replayq.queue.contracts import JobContract
from replayq.runtime import Runtime


def register_contracts(runtime: Runtime) -> None:
    """Store every declared contract; a changed contract needs a new version."""
    now = runtime.clock.now()
    with runtime.storage.transaction() as tx:
        for handler in runtime.registry.handlers():
            contract = handler.contract
            body = codec.dumps(contract.to_dict())
            stored = tx.contract_get(contract.name, contract.version)
            if stored is not None and stored != body:
                raise ContractError(
                    f"the contract of {contract.name} {contract.version} differs from the one "
                    "stored; contracts are frozen per version: declare a new version "
                    f"(see: replayq contract diff {contract.name})"
                )
            if stored is None:
                tx.contract_put(contract.name, contract.version, body, now)


def stored_contracts(runtime: Runtime, job_type: str | None = None) -> list[JobContract]:
    """Contracts stored in the database (every version that a worker registered)."""
    with runtime.storage.transaction(readonly=True) as tx:
        rows = tx.contract_list(job_type)
    return [JobContract.from_dict(codec.loads(body)) for _, _, body, _ in rows]
