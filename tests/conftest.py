"""Shared fixtures: real SQLite files and a real PostgreSQL server, one schema per test.

``app_factory`` is parametrized over every backend; tests that take it form the
conformance suite. In CI (``CI=true``, or ``REPLAYQ_REQUIRE_POSTGRES=1`` as set by
``.ci/run``) nothing skips silently: a test whose service or capability is missing
(PostgreSQL, Redis, ``pg_ctlcluster``, network namespaces) fails with what to install.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

import replayq

PG_URL = os.environ.get("REPLAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("REPLAYQ_REQUIRE_POSTGRES") == "1"
IN_CI = REQUIRE_PG or os.environ.get("CI", "").lower() == "true"

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


def missing(reason: str, *, install: str) -> NoReturn:
    """Skip on a developer's machine; in CI fail, saying what to install or start."""
    if IN_CI:
        pytest.fail(f"{reason}; CI runs every test, so provide it: {install}", pytrace=False)
    pytest.skip(reason)


def require_postgres() -> None:
    reason = postgres_available()
    if reason is not None:
        missing(
            reason,
            install=f"install and start PostgreSQL (apt-get install postgresql) at {PG_URL}",
        )


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
