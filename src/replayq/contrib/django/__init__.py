"""Enqueue on Django's own database connection, inside its transaction.

::

    from django.db import transaction
    from replayq.contrib.django import enqueue

    with transaction.atomic():
        order = Order.objects.create(status="paid")
        enqueue(app, "ship_order", {"order_id": order.id})   # exists only if this commits

``enqueue`` uses the connection of ``using`` (default: ``default``) inside the current
``atomic`` block, so the job commits or rolls back with the order; outside one it opens
its own. replayq's tables must be in the same database: build the app with
``App(database_url())``. Add ``"replayq.contrib.django"`` to ``INSTALLED_APPS`` for
``manage.py replayq_worker`` (``settings.REPLAYQ_APP = "module:attribute"``).

Known limit: replayq's schema is not a Django migration. On SQLite the app creates it
on first use; on PostgreSQL run ``replayq --db URL db upgrade`` (or
``App(..., auto_migrate=True)``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from django.db import DEFAULT_DB_ALIAS, connections, transaction

import replayq

__all__ = ["database_url", "enqueue"]

# OPTIONS keys Django reads itself; the rest are libpq connection parameters.
_DJANGO_ONLY_OPTIONS = {
    "isolation_level",
    "server_side_binding",
    "pool",
    "assume_role",
    "cursor_factory",
}


def enqueue(
    app: replayq.App,
    job_type: str,
    payload: dict[str, Any] | None = None,
    *,
    using: str | None = None,
    **options: Any,
) -> int:
    """Enqueue on Django's connection ``using``, in its current transaction; returns the id.

    Inside ``transaction.atomic()`` the job is visible to workers only once that block
    commits, and never if it rolls back. ``options`` are ``App.enqueue``'s.
    """
    alias = using or DEFAULT_DB_ALIAS
    connection = connections[alias]
    if connection.in_atomic_block:
        connection.ensure_connection()
        return app.enqueue(job_type, payload, conn=connection.connection, **options)
    # Not inside atomic(): Django is in autocommit, so give the insert its own transaction.
    with transaction.atomic(using=alias):
        return app.enqueue(job_type, payload, conn=connection.connection, **options)


def database_url(using: str | None = None) -> str:
    """A replayq URL for Django's database ``using``: SQLite's file or PostgreSQL's DSN."""
    settings = connections[using or DEFAULT_DB_ALIAS].settings_dict
    engine = settings["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    if engine.endswith(("postgresql", "postgis")):
        user = quote(settings.get("USER") or "", safe="")
        password = settings.get("PASSWORD") or ""
        auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
        host = settings.get("HOST") or ""
        port = f":{settings['PORT']}" if settings.get("PORT") else ""
        params = {
            key: str(value)
            for key, value in (settings.get("OPTIONS") or {}).items()
            if key not in _DJANGO_ONLY_OPTIONS
        }
        query = f"?{urlencode(params)}" if params else ""
        return f"postgresql://{auth}{host}{port}/{quote(settings['NAME'], safe='')}{query}"
    raise replayq.ConfigurationError(
        f"replayq runs on SQLite or PostgreSQL; Django's {using or DEFAULT_DB_ALIAS!r} is {engine}"
    )
