"""Secrets a handler puts where replayq's own fields hold them never reach storage in clear.

docs/secrets.md promises that every value entering the recording is redacted, a step's
name included ("A step's name is searched once per process and text"), and that value
patterns apply "in any text". These tests hold that to the fields a handler controls
beyond the values themselves: the step's name, which every event inside the step
carries as its ``step`` field, and the object keys of a call's arguments and response
and of an effect's result (a map keyed by a card number, by an ``Authorization`` value).

Each reads every row replayq stored, on each backend: on SQLite through a connection
that unpacks trace packs (``register_sqlite``: a pack's events are deflated, so the
file's bytes alone would not show a secret in them), on PostgreSQL every row of the
test's schema as text.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import replayq
import replayq.testing
from replayq.storage.packs import register_sqlite

AppFactory = Callable[..., replayq.App]
TOKEN = "sk_live_7f3a9c2e5b8d1f4a"
CARD = "4111111111111111"
KEY = "test-redaction-key-0123456789"


def stored_rows(app: replayq.App) -> str:
    """Every row replayq stored (trace packs unpacked), as one text."""
    chunks: list[str] = []
    if app.url.startswith("sqlite"):
        connection = sqlite3.connect(app.url.removeprefix("sqlite:///"))
        register_sqlite(connection)
        try:
            names = connection.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            ).fetchall()
            for (name,) in names:
                query = f'SELECT * FROM "{name}"'  # noqa: S608 - a name sqlite_master gave
                chunks += map(repr, connection.execute(query))
        finally:
            connection.close()
        return "\n".join(chunks)
    import psycopg
    from psycopg import sql

    schema = app.url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(app.url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            query = sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(schema, table))
            chunks += [row[0] for row in conn.execute(query)]
    return "\n".join(chunks)


def _events(app: replayq.App, job: replayq.Job) -> list[dict[str, Any]]:
    return [vars(event) for event in app.trace(job.id)]


def test_a_step_name_holding_a_token_is_stored_redacted_in_every_event_of_the_step(
    app_factory: AppFactory,
) -> None:
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("sync", retry=replayq.Retry(max_attempts=1))
    def sync(ctx: replayq.Context, order: int) -> None:
        with ctx.step(f"sync with Bearer {TOKEN}"):
            ctx.state.put("order", order, {"synced": True})
            ctx.call("ping", lambda: {"ok": True})
            ctx.decide("route", "fast")

    job = replayq.testing.run_inline(app, "sync", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error

    events = _events(app, job)
    inside = [e for e in events if e["name"] in ("call", "decision", "state.write")]
    assert len(inside) == 3, [e["name"] for e in events]
    assert all(e["step"].startswith("sync with Bearer [redacted:") for e in inside), inside
    assert TOKEN not in json.dumps(events, default=str)
    assert TOKEN not in stored_rows(app)


def card_keyed_answer(request: dict[str, Any]) -> dict[str, Any]:
    return {"sessions": {f"Bearer {TOKEN}": "active"}, "cards": {CARD: "visa"}}


def test_secrets_in_object_keys_of_calls_and_effects_are_stored_redacted(
    app_factory: AppFactory,
) -> None:
    """A flat object (``{CARD: 1}``) and a nested one (a response's map of sessions):
    value patterns find a card number or a bearer credential in a key as in a value."""
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("charge", retry=replayq.Retry(max_attempts=1))
    def charge(ctx: replayq.Context, order: int) -> None:
        with ctx.step("charge"):
            ctx.call("gateway", card_keyed_answer, {CARD: 1})
            ctx.call("gateway", card_keyed_answer, {"by_card": {CARD: {"amount": 5}}})
            ctx.effect("ledger.book", lambda: {CARD: "booked"}, key=f"book:{order}")

    job = replayq.testing.run_inline(app, "charge", {"order": 1})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error

    events = json.dumps(_events(app, job), default=str)
    assert "[redacted:" in events
    stored = stored_rows(app)
    for secret in (CARD, TOKEN):
        assert secret not in events, f"{secret} is in the trace: {events}"
        assert secret not in stored, f"{secret} is stored"


PIN = "8642-unguessable"


def test_a_secret_field_mixing_a_redacted_payload_field_with_a_clear_secret_is_redacted_whole(
    app_factory: AppFactory,
) -> None:
    """A payload's card number reaches the handler as its marker; passed on under a secret
    field together with a secret the handler read itself, the whole field is still secret:
    the marker it holds does not make the rest pass as "redacted before"."""
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("store_card", retry=replayq.Retry(max_attempts=1))
    def store_card(ctx: replayq.Context, card_number: str) -> None:
        with ctx.step("vault"):
            ctx.call(
                "vault", lambda **_: {"stored": True}, secret={"card": card_number, "pin": PIN}
            )
            ctx.decide("stored", True, secret=[card_number, PIN])

    job = replayq.testing.run_inline(app, "store_card", {"card_number": CARD})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    assert job.payload["card_number"].startswith("[redacted:")

    events = json.dumps(_events(app, job), default=str)
    assert PIN not in events, events
    assert PIN not in stored_rows(app)
    report = replayq.dry_run(app, job.id, keep=False)
    assert not report.diverged, report.to_dict()


def test_a_mistyped_secret_field_is_quoted_redacted_in_the_refusal(
    app_factory: AppFactory,
) -> None:
    """A payload refused at enqueue was never redacted, and the refusal quotes the field's
    value. ``ctx.enqueue`` of a child whose ``api_key`` is not the declared type: the
    parent's failure (its trace, ``last_error``) quotes the key's marker. ``App.enqueue``
    (what ``replayq enqueue`` prints) likewise."""
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("child", retry=replayq.Retry(max_attempts=1))
    def child(ctx: replayq.Context, api_key: uuid.UUID, password: int = 0) -> None:
        return None

    @app.job("parent", retry=replayq.Retry(max_attempts=1))
    def parent(ctx: replayq.Context, order: int) -> None:
        with ctx.step("spawn"):
            ctx.enqueue("child", {"api_key": TOKEN})

    job = replayq.testing.run_inline(app, "parent", {"order": 1})
    assert job.state is replayq.JobState.DEAD
    assert "field 'api_key' expects UUID, got str '[redacted:" in (job.last_error or "")
    assert TOKEN not in json.dumps(_events(app, job), default=str)
    assert TOKEN not in stored_rows(app)

    with pytest.raises(replayq.PayloadError) as refused:
        app.enqueue("child", {"api_key": str(uuid.uuid4()), "password": PIN})
    assert "field 'password' expects int, got str '[redacted:" in str(refused.value)
    assert PIN not in str(refused.value)
