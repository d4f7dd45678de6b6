"""Committing a block in one round trip where the backend can: ``commit_at_once``.

A block of verbs sent in ``Transaction.pipelined(refusals=True)`` is not read before its
``COMMIT``: a compare-and-set that changes no row, a lock fence that finds the lock
taken again, or a fenced trace append that finds the lease gone, refuses in the server,
and the block fails with ``CommitRefused`` (nothing of it committed). ``commit_at_once``
then runs the block again the careful way, every answer read, so the refusal is never
what a caller sees. Only PostgreSQL refuses; on SQLite ``pipelined`` changes nothing and
the block runs once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from replayq.errors import StorageError
from replayq.storage.protocol import Storage, Transaction

__all__ = ["CommitRefused", "commit_at_once"]

_T = TypeVar("_T")


class CommitRefused(StorageError):
    """A ``pipelined(refusals=True)`` block refused in the server: one of its
    compare-and-sets changed no row, a lock fence found the lock's fencing token moved
    on, or its fenced trace append found the lease gone.
    Nothing of it committed; ``commit_at_once`` runs the block again without refusals,
    and it never reaches a handler (a ``StorageError`` only to stay in the one tree)."""


def commit_at_once(storage: Storage, block: Callable[[Transaction], _T]) -> _T:
    """``block`` in a transaction of its own, committed in one round trip where it can be.

    On PostgreSQL the block runs in ``pipelined(refusals=True)``: its compare-and-sets,
    lock fences and fenced trace append are sent with ``COMMIT`` and refuse in the
    server. A refusal (``CommitRefused``) committed nothing, and the block runs again in
    ``pipelined()``, every answer read: there a compare-and-set that changed nothing, a
    lock taken again or a lease that is gone is seen where it happens and said as such
    (a version conflict, ``StaleFencingTokenError``, ``LeaseLostError``).
    ``block`` must do the same work when run twice; whatever it returns the second time
    is the answer. Elsewhere (SQLite) ``pipelined`` changes nothing and it runs once.
    """
    try:
        with storage.transaction() as tx, tx.pipelined(refusals=True):
            return block(tx)
    except CommitRefused:
        with storage.transaction() as tx, tx.pipelined():
            return block(tx)
