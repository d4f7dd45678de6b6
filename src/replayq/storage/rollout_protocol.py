"""The rollouts' verbs of the storage seam: contracts, routing and comparisons.

Part of ``Transaction`` (``protocol.py``); implemented once in
``sql_transaction.SqlTransaction``, with the parameter structs of ``params.py``.
"""

from __future__ import annotations

from typing import Protocol, overload

from replayq.storage.params import (
    ActiveVersion,
    ComparisonPut,
    ComparisonQuery,
    ContractActivate,
    ContractPut,
    ContractQuery,
    RolloutChange,
    RolloutQuery,
    RoutingHistory,
    RoutingPut,
    RoutingQuery,
)
from replayq.storage.records import Comparison, ContractRecord, RoutingEvent, RoutingRecord


class RolloutTransaction(Protocol):
    """The contract and rollout verbs of a ``Transaction``."""

    @overload
    def rollout_query(self, query: ContractQuery) -> list[ContractRecord]: ...

    @overload
    def rollout_query(self, query: ActiveVersion) -> str | None: ...

    @overload
    def rollout_query(self, query: RoutingQuery) -> list[RoutingRecord]: ...

    @overload
    def rollout_query(self, query: RoutingHistory) -> list[RoutingEvent]: ...

    @overload
    def rollout_query(self, query: ComparisonQuery) -> list[Comparison]: ...

    def rollout_query(self, query: RolloutQuery) -> object:
        """Contracts, the active version, routing records and their history, comparisons."""
        ...

    @overload
    def rollout_update(self, change: RoutingPut) -> int | None: ...

    @overload
    def rollout_update(self, change: ContractPut | ContractActivate | ComparisonPut) -> None: ...

    def rollout_update(self, change: RolloutChange) -> int | None:
        """Store a contract, activate a version, write a routing record (compare-and-set on
        its revision: the new one, or ``None`` when it changed since it was read) or a
        comparison."""
        ...
