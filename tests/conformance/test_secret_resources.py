"""The resource a trace names is stored redacted, and found by the id a user types.

An entity keyed by a card number (``ctx.state`` ``card:<number>``), a lock, an effect
key and a cache key named by it: docs/secrets.md promises that the trace's events and
its resource index (``rq_trace_resources``) hold the resource redacted by the value
patterns, while the state, the lock table, the effect ledger and the cache keep the real
key; that ``App.resource_trace`` given the raw id (or its redacted form) finds the
events; and that a dry-run, which matches the handler's live resources against the
recorded ones, still replays the job without divergence, the entity versions read
included. Each is held on both backends with the inline runner (``tests.apps
.secret_resources``); ``tests/acceptance/test_secret_resources.py`` runs it in a real
worker and reads it through the CLI and the dashboard.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import pytest

import replayq
import replayq.testing
from replayq.storage.packs import register_sqlite
from tests.apps import secret_resources
from tests.conformance.test_secret_paths import stored_rows

AppFactory = Callable[..., replayq.App]
CARD = "4111111111111111"
KEY = "test-redaction-key-0123456789"
# The trace's tables and views: its events (unpacked) and its resource index.
TRACE_VIEWS = ("rq_events", "rq_pack_events")


def trace_rows(app: replayq.App) -> str:
    """Every row of the trace's tables (``rq_trace*``) and event views, as one text."""
    chunks: list[str] = []
    if app.url.startswith("sqlite"):
        connection = sqlite3.connect(app.url.removeprefix("sqlite:///"))
        register_sqlite(connection)
        try:
            names = [
                name
                for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
                if name.startswith("rq_trace") or name in TRACE_VIEWS
            ]
            for name in names:
                query = f'SELECT * FROM "{name}"'  # noqa: S608 - a name sqlite_master gave
                chunks += map(repr, connection.execute(query))
        finally:
            connection.close()
        assert "rq_trace_resources" in names and "rq_events" in names, names
        return "\n".join(chunks)
    import psycopg
    from psycopg import sql

    schema = app.url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(app.url) as conn:
        tables = [
            table
            for (table,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
            if table.startswith("rq_trace") or table in TRACE_VIEWS
        ]
        for table in tables:
            query = sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(schema, table))
            chunks += [row[0] for row in conn.execute(query)]
    assert "rq_trace_resources" in tables, tables
    return "\n".join(chunks)


@pytest.fixture
def vault_app(app_factory: AppFactory, monkeypatch: pytest.MonkeyPatch) -> replayq.App:
    monkeypatch.setenv("VAULT_CARD", CARD)
    app = app_factory(redaction=replayq.Redaction(key=KEY))
    app.job("vault", retry=replayq.Retry(max_attempts=1))(secret_resources.vault)
    return app


def test_resources_named_by_a_card_number_are_stored_redacted_and_state_keeps_the_real_key(
    vault_app: replayq.App,
) -> None:
    first = replayq.testing.run_inline(vault_app, "vault", {"order": 1})
    second = replayq.testing.run_inline(vault_app, "vault", {"order": 2})
    assert first.state is replayq.JobState.SUCCEEDED, first.last_error
    assert second.state is replayq.JobState.SUCCEEDED, second.last_error
    # The second job read the version the first wrote, by the real key.
    assert second.result == {"uses": 2, "token": "tok_1"}, second.result

    events = [e for job in (first, second) for e in vault_app.trace(job.id)]
    named = {e.resource for e in events if e.resource}
    for prefix in ("card:", "card-lock:", "tokenize:"):
        assert any(r.startswith(f"{prefix}[redacted:") for r in named), named
    assert CARD not in json.dumps([vars(e) for e in events], default=str)
    rows = trace_rows(vault_app)
    assert "card:[redacted:" in rows
    assert CARD not in rows, "a card number is in the trace's rows"
    # The application's own state keeps the key it was given.
    assert CARD in stored_rows(vault_app)


def test_a_resource_timeline_is_found_by_the_raw_id_and_by_its_redacted_form(
    vault_app: replayq.App,
) -> None:
    jobs = [replayq.testing.run_inline(vault_app, "vault", {"order": n}) for n in (1, 2)]
    by_raw = vault_app.resource_trace(f"card:{CARD}")
    assert {e.job_id for e in by_raw} == {j.id for j in jobs}, [vars(e) for e in by_raw]
    assert {e.name for e in by_raw} >= {"state.read", "state.write"}
    redacted = next(e.resource for e in by_raw if e.resource)
    assert redacted.startswith("card:[redacted:")
    assert [e.id for e in vault_app.resource_trace(redacted)] == [e.id for e in by_raw]
    lock = vault_app.resource_trace(f"card-lock:{CARD}")
    assert {e.name for e in lock} >= {"lock.acquired", "lock.released"}, [e.name for e in lock]
    assert vault_app.resource_trace(f"tokenize:{CARD}")
    assert vault_app.resource_trace("card:4000000000000002") == []


def test_a_job_whose_resources_were_redacted_dry_runs_without_divergence(
    vault_app: replayq.App,
) -> None:
    replayq.testing.run_inline(vault_app, "vault", {"order": 1})
    job = replayq.testing.run_inline(vault_app, "vault", {"order": 2})
    report = replayq.dry_run(vault_app, job.id, keep=False)
    assert not report.diverged, report.to_dict()
    assert report.outcome_now.result == {"uses": 2, "token": "tok_1"}, report.to_dict()
    kept = replayq.dry_run(vault_app, job.id)
    assert not kept.diverged, kept.to_dict()
    assert CARD not in trace_rows(vault_app)


def test_an_exported_case_carries_the_version_read_under_its_redacted_name_and_replays(
    vault_app: replayq.App,
) -> None:
    """The export finds the version the job read through the job that wrote it (no raw key
    in the trace to find it by); the case names it redacted, and replays in a fresh
    database, where the handler reads it by its own key."""
    replayq.testing.run_inline(vault_app, "vault", {"order": 1})
    job = replayq.testing.run_inline(vault_app, "vault", {"order": 2})
    case = replayq.export_case(vault_app, job.id)
    text = json.dumps(case)
    assert CARD not in text, text
    assert [(s["namespace"], s["version"], s["data"]) for s in case["state"]] == [
        ("card", 1, {"order": 1, "uses": 1})
    ], case["state"]
    assert case["state"][0]["key"].startswith("[redacted:")
    # In a throw-away database of its own (``replay_case``), with the app's handlers.
    report = replayq.testing.assert_replays(case, vault_app)
    assert report.outcome_now.result == {"uses": 2, "token": "tok_1"}, report.to_dict()


def test_a_fork_and_a_rollback_of_a_job_with_redacted_resources_work_by_the_real_key(
    vault_app: replayq.App,
) -> None:
    replayq.testing.run_inline(vault_app, "vault", {"order": 1})
    job = replayq.testing.run_inline(vault_app, "vault", {"order": 2})
    forked = replayq.fork(vault_app, job.id, from_step="tokenize")
    assert not forked.diverged and forked.outcome_now.status == "succeeded", forked.to_dict()

    plan = replayq.rollback(vault_app, job.id)
    assert [(c.namespace, c.key, c.restore_version) for c in plan.changes] == [("card", CARD, 1)]
    assert vault_app.state.get("card", CARD).data == {"order": 1, "uses": 1}
    undone = [e for e in vault_app.resource_trace(f"card:{CARD}") if e.name == "state.rolled_back"]
    assert len(undone) == 1 and undone[0].resource.startswith("card:[redacted:"), undone
    assert CARD not in trace_rows(vault_app)


def test_a_broken_lock_named_by_a_card_number_is_traced_redacted_and_found_by_the_raw_name(
    vault_app: replayq.App,
) -> None:
    """``break_lock`` writes its own event (no job's recorder): its resource and the trace
    it opens are redacted too, and its timeline is found by the name the lock table keeps."""
    lock = f"card-lock:{CARD}"

    @vault_app.job("hold", retry=replayq.Retry(max_attempts=1))
    def hold(ctx: replayq.Context) -> None:
        with ctx.step("hold"), ctx.lock(lock, ttl="30s"):
            [held] = replayq.list_locks(vault_app)
            assert held.resource == lock  # the lock table keeps the real name
            replayq.break_lock(vault_app, lock, reason="operator: holder looked stuck")

    replayq.testing.run_inline(vault_app, "hold", {})
    broken = [e for e in vault_app.resource_trace(lock) if e.name == "lock.broken"]
    assert len(broken) == 1, [e.name for e in vault_app.resource_trace(lock)]
    assert broken[0].resource.startswith("card-lock:[redacted:"), broken
    assert broken[0].trace_id.startswith("admin:card-lock:[redacted:"), broken
    assert CARD not in trace_rows(vault_app)


def test_a_job_types_own_pattern_redacts_its_resources_and_the_look_up_applies_it_too(
    app_factory: AppFactory,
) -> None:
    app = app_factory(redaction=replayq.Redaction(key=KEY))

    @app.job("statement", redact=replayq.Redaction(patterns=[r"acct-(\d+)"]))
    def statement(ctx: replayq.Context) -> None:
        with ctx.step("read"):
            ctx.state.put("ledger", "acct-20931", {"balance": 5})

    job = replayq.testing.run_inline(app, "statement", {})
    assert job.state is replayq.JobState.SUCCEEDED, job.last_error
    found = app.resource_trace("ledger:acct-20931")
    assert [e.name for e in found] == ["state.write"], found
    assert found[0].resource.startswith("ledger:acct-[redacted:"), found
    assert "acct-20931" not in trace_rows(app)


def card_ledger(ctx: replayq.Context, amount: int) -> int:
    with ctx.step("book"), ctx.lock(f"card-lock:{CARD}", ttl="30s"):
        seen = ctx.state.get("card", CARD)
        total = (seen.data or {}).get("total", 0) + amount if seen.exists else amount
        ctx.state.put("card", CARD, {"total": total})
    return int(total)


def test_a_recording_that_named_a_resource_in_clear_still_dry_runs_under_the_rules_now(
    app_factory: AppFactory,
) -> None:
    """A job recorded while no rule found the card number in its resources (an earlier
    release, or the rule added since) names them in clear; a dry-run now names them
    redacted, and compares and answers the recording's names as redacted too."""
    before = app_factory(redaction=replayq.Redaction(defaults=False, key=KEY))
    before.job("ledger", retry=replayq.Retry(max_attempts=1))(card_ledger)
    replayq.testing.run_inline(before, "ledger", {"amount": 5})
    job = replayq.testing.run_inline(before, "ledger", {"amount": 7})
    assert job.result == 12
    assert f"card:{CARD}" in {e.resource for e in before.trace(job.id)}

    now = app_factory(redaction=replayq.Redaction(key=KEY))
    now.job("ledger", retry=replayq.Retry(max_attempts=1))(card_ledger)
    report = replayq.dry_run(now, job.id)
    assert not report.diverged, report.to_dict()
    assert report.outcome_now.result == 12, report.to_dict()
    assert [e.resource for e in now.trace(job.id) if e.name == "state.read"] == [f"card:{CARD}"]
