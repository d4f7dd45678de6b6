"""Rolling out a new version of a job type: routing as data, gates, verification.

The part, by module::

    rollout/
    ├── routing.py   the routing record (weights, pins, shadow, dual-run) and the
    │                choice of a job's version at its first lease
    ├── router.py    the worker's cached view of every type's routing (≤ 0.5 s old)
    ├── control.py   Rollout: start, pin, ramp (behind the gates), shadow, dual-run,
    │                rollback — each change a compare-and-set plus an event
    ├── gates.py     candidate against baseline per version: error rate per class,
    │                retry, DLQ, redeliveries, lock expiries, stale reads, p99/lease
    ├── verify.py    a candidate over recorded attempts in the sealed world, classed
    ├── background.py  verification as a job (``replayq.verify``), resumable per chunk
    └── lockfile.py  replayq.contracts.lock: contracts frozen in the app's repository

Above the replay engine (verification and shadow runs are dry-runs), below the
worker, which reads routing at lease time.
"""

from replayq.rollout.background import (
    VERIFY_JOB_TYPE,
    VerifyRun,
    start_verify,
    verify_handler,
    verify_run,
    verify_runs,
)
from replayq.rollout.control import RollbackResult, Rollout, RoutingChange
from replayq.rollout.gates import Gate, GateReport
from replayq.rollout.lockfile import LOCK_FILE, LockDifference
from replayq.rollout.lockfile import check as check_contracts
from replayq.rollout.lockfile import freeze as freeze_contracts
from replayq.rollout.routing import PinRule, Routing
from replayq.rollout.verify import (
    DIFFERENCE_CLASSES,
    AttemptComparison,
    VerifyReport,
    verify_rollout,
)

__all__ = [
    "DIFFERENCE_CLASSES",
    "LOCK_FILE",
    "VERIFY_JOB_TYPE",
    "AttemptComparison",
    "Gate",
    "GateReport",
    "LockDifference",
    "PinRule",
    "RollbackResult",
    "Rollout",
    "Routing",
    "RoutingChange",
    "VerifyReport",
    "VerifyRun",
    "check_contracts",
    "freeze_contracts",
    "start_verify",
    "verify_handler",
    "verify_rollout",
    "verify_run",
    "verify_runs",
]
