"""Integrations with the frameworks that hold an application's transaction.

::

    contrib/
    ├── django/       enqueue on Django's connection inside ``atomic``; ``manage.py replayq_worker``
    └── sqlalchemy.py enqueue on a ``Session`` / ``AsyncSession``'s connection

Each is behind its extra (``replayq[django]``, ``replayq[sqlalchemy]``) and imports
only the public ``replayq`` package (checked by import-linter), like the CLI.
"""
