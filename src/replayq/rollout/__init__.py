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
    ├── verify_job.py  that job type's contract, declared by every App
    ├── verify_steps.py  that job's steps, loaded when a worker first runs one
    └── lockfile.py  replayq.contracts.lock: contracts frozen in the app's repository

Above the replay engine (verification and shadow runs are dry-runs), below the
worker, which reads routing at lease time.

The package re-exports nothing, as its siblings: a worker imports ``router`` and
``verify_job`` and should not pay for ``control``, ``gates`` and ``lockfile`` too (nor,
until a type has routing or a verification runs, for ``routing``, ``shadow``,
``verify``, ``verify_steps`` and ``background``). The public names are ``replayq``'s
(``replayq.Rollout``, ``replayq.verify_rollout``, …).
"""
