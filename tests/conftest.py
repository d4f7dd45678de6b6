"""Shared fixtures: real SQLite files and a real PostgreSQL server, one schema per test.

``app_factory`` is parametrized over every backend; tests that take it form the
conformance suite. With ``REPLAYQ_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) a
PostgreSQL test fails, never skips, when the server cannot be reached.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import replayq

PG_URL = os.environ.get("REPLAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("REPLAYQ_REQUIRE_POSTGRES") == "1"

BACKENDS = ["sqlite", "postgres"]

pytest_plugins = ["tests.services"]  # the `service` fixture: a real HTTP service process


def postgres_available() -> str | None:
    """``None`` when the server answers, else the reason."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {PG_URL} is not reachable: {exc}"
    return None


def require_postgres() -> None:
    reason = postgres_available()
    if reason is None:
        return
    if REQUIRE_PG:
        pytest.fail(f"PostgreSQL is required here (REPLAYQ_REQUIRE_POSTGRES=1): {reason}")
    pytest.skip(reason)


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards."""
    require_postgres()
    import psycopg

    schema = f"rq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(schema))
            )


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'replayq.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'replayq.db'}"
    return str(request.getfixturevalue("pg_schema_url"))


@pytest.fixture
def app_factory(db_url: str) -> Iterator[Callable[..., replayq.App]]:
    """Build ``App`` objects on the test's database (migrated); all closed afterwards."""
    made: list[replayq.App] = []

    def make(**kwargs: Any) -> replayq.App:
        app = replayq.App(db_url, auto_migrate=True, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
