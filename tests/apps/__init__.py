"""Applications that the acceptance tests run in real worker subprocesses.

Each module builds its ``App`` with ``replayq.App()``, so the worker reads the
database from ``--db`` / ``$REPLAYQ_DB``; tests import the same module to
enqueue with the same contracts (ordering keys are computed from them).
"""
