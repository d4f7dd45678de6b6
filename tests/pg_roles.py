"""A login role of a test's own on the shared PostgreSQL server, with settings of its own.

Faults that PostgreSQL sets per role (``ALTER ROLE … SET statement_timeout``, ``CONNECTION
LIMIT``) are caused on a role that only the test uses, so that no other user of the
shared server (other suites run beside) meets them. The role may use the test's schema
(``pg_schema_url``, migrated first); it and what it owns are dropped at the end, its
sessions ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import replayq
from tests.conftest import PG_URL


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (trust authentication: no password)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@contextmanager
def login_role(
    pg_schema_url: str, *, connection_limit: int = -1, settings: dict[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """(the schema's URL as a new role, the role's name), the schema migrated, the role
    given ``connection_limit`` and ``ALTER ROLE … SET`` each of ``settings``."""
    import psycopg
    from psycopg import sql

    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    role = f"rq_role_{uuid.uuid4().hex[:10]}"
    schema = pg_schema_url.rsplit("search_path%3D", 1)[1]
    ident, space = sql.Identifier(role), sql.Identifier(schema)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT {}").format(
                ident, sql.Literal(connection_limit)
            )
        )
        for name, value in (settings or {}).items():
            admin.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(
                    ident, sql.Identifier(name), sql.Literal(value)
                )
            )
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(space, ident))
        for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
            admin.execute(
                sql.SQL("GRANT ALL ON ALL {} IN SCHEMA {} TO {}").format(
                    sql.SQL(kind), space, ident
                )
            )
    try:
        yield as_role(pg_schema_url, role), role
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))
