"""The ``replayq`` command line, one module per command group.

::

    cli/
    ├── main.py     the root group (--db) and the registration of every group
    ├── env.py      Env (database URL, the user's app), load_app, emit_json
    ├── jobs.py     worker, enqueue, jobs, dead, stats, signals
    ├── trace.py    trace show | resource | export
    ├── replay.py   replay, fork, diff, rerun, rollback
    ├── admin.py    db, contract, locks, outbox, state, demo
    └── render.py   text rendering of timelines and tables

Imports: only the public ``replayq`` package (checked by import-linter).
"""

from replayq.cli.main import main

__all__ = ["main"]
