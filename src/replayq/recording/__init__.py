"""The recording context: a handler's only door to the world.

::

    recording/
    ├── world.py     the World port: LIVE or a substituted answer for every outside read;
    │                LiveWorld (workers), LostFlag
    ├── attempt.py   Attempt: the port the views below are written against
    ├── context.py   Context (ctx): steps, decisions, calls, clock/random, child jobs,
    │                db_write; builds the views below on first use
    ├── recorder.py  Recorder (a base of Context): the attempt's pending events, writes
    │                and blobs, redacted and encoded, committed fenced by the lease
    ├── callbacks.py  the application's functions run inside replayq's commit (a
    │                ctx.db_write's): ctx refused in them (CallbackReentryError)
    ├── steps.py     ctx.step(name, fn): a step with a result; skipped on a retry once
    │                it committed (contract resume="step")
    ├── ledger.py    the step ledger: committed step positions of a job and their results
    ├── state.py     ctx.state: versioned, copy-on-write entities; StateStore from outside
    ├── locks.py     ctx.lock: lease locks with owner and fencing tokens; list/break
    ├── lock_release.py  their releases: at once, after the commit of the writes under
    │                them, or on their own when that commit never comes
    ├── effects.py   ctx.effect: side effects behind idempotency records
    ├── in_doubt.py  effects whose outcome was never recorded: list, resolve, reconcile
    ├── effects_facade.py  EffectsFacade: the App's methods over the ledger (in_doubt.py)
    ├── cache.py     ctx.cache: versioned keys, recorded reads, stale-read detection
    ├── outbox.py    ctx.outbox and the relay (sinks: job, Redis stream, webhook)
    └── blobs.py     large values by content hash, compressed, deduplicated

Imports: the runtime, the queue, storage and the foundations — never the
replay engine: replay behaviour arrives as another ``World``.
"""
