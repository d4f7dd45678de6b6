"""A payload refused in its type's own words quotes no secret, wherever the refusal goes.

docs/secrets.md: a refused payload's message is screened whole by its job type's rules
before it is stored, logged or printed. ``tests.apps.refused_secrets`` refuses payloads
in messages it does not control: a pydantic validator's ``unknown key …``, msgspec's
``Invalid enum value …``, a dataclass's ``__post_init__``; each quotes a declared secret
field's value (no pattern finds it) or a value the patterns find (a bearer token, a card
number). On each backend, with a real worker and the real CLI: ``App.enqueue``'s error,
``replayq enqueue``'s output, a child refused at ``ctx.enqueue`` (its parent's trace,
``last_error``, the worker's log) and a payload stored before its type changed and a rule
named its field secret, refused at lease (its burial), show markers, not the secrets.
"""

from __future__ import annotations

import json

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher
from tests.apps import refused_secrets
from tests.replay_support import cli

KEY = "test-redaction-key-0123456789"
SPEC = "tests.apps.refused_secrets:app"


def test_a_refusal_in_the_types_own_words_quotes_no_secret(
    launcher: WorkerLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYQ_REDACTION_KEY", KEY)
    app = refused_secrets.build(launcher.url)
    before = refused_secrets.build(launcher.url, v1=True)
    outputs: list[str] = []
    try:
        for job_type, payload in refused_secrets.REFUSED:
            with pytest.raises(replayq.PayloadError) as refused:
                app.enqueue(job_type, payload)
            assert "[redacted:" in str(refused.value), refused.value
            outputs.append(str(refused.value))
            args = ("enqueue", job_type, "--app", SPEC, "--payload", json.dumps(payload))
            done = cli(launcher.url, *args)
            assert done.returncode != 0, done.stdout
            assert "[redacted:" in done.stdout + done.stderr, done.stderr
            outputs += [done.stdout, done.stderr]

        parents = [app.enqueue("spawn", {"case": i}) for i in range(len(refused_secrets.REFUSED))]
        stale = before.enqueue("settle", {"account_number": refused_secrets.ACCOUNT})
        worker = launcher.start("w1", app=SPEC, burst=True, env={"REPLAYQ_REDACTION_KEY": KEY})
        assert worker.wait(60) == 0, worker.log()
        outputs.append(worker.log())
        for job_id in (*parents, stale):
            job = app.get_job(job_id)
            assert job.state is replayq.JobState.DEAD, job.last_error
            assert "[redacted:" in (job.last_error or ""), job.last_error
            outputs.append(job.last_error or "")
            outputs.append(json.dumps([vars(event) for event in app.trace(job_id)], default=str))
            # Its ``payload`` line shows the stale payload as stored, before the rule.
            shown = cli(launcher.url, "jobs", "show", str(job_id)).stdout.splitlines()
            outputs += [line for line in shown if "last error" in line]
            assert outputs[-1].count("[redacted:"), shown
        assert "expects int, got str '[redacted:" in (app.get_job(stale).last_error or "")
    finally:
        app.close()
        before.close()
    for text in outputs:
        for secret in refused_secrets.SECRETS:
            assert secret not in text, f"{secret!r} is in: {text}"


def test_a_secret_its_record_constrains_reaches_a_real_worker_as_its_marker(
    launcher: WorkerLauncher,
) -> None:
    """docs/secrets.md (What a handler sees): a pydantic model (a validator, a pattern,
    a ``Literal``) and a msgspec Struct (``Meta(pattern=...)``) check the real key at
    enqueue; the row holds its marker. ``replayq worker --burst`` runs both jobs with the
    marker, its other fields converted; each was buried ``malformed_payload`` on its
    first attempt."""
    app = refused_secrets.build(launcher.url, redaction=replayq.Redaction(key=KEY))
    opened = "2026-01-02T03:04:05+00:00"
    key = "ak_" + refused_secrets.API_KEY
    try:
        model = app.enqueue(
            "unlock_model", {"api_key": key, "password": "swordfish", "opened": opened}
        )
        struct = app.enqueue("unlock_struct", {"api_key": key, "opened": opened})
        worker = launcher.start("w1", app=SPEC, burst=True, env={"REPLAYQ_REDACTION_KEY": KEY})
        assert worker.wait(60) == 0, worker.log()
        stored = app.get_job(model).payload
        marker, password = stored["api_key"], stored["password"]
        assert marker.startswith("[redacted:") and password.startswith("[redacted:"), stored
        for job_id, result in (
            (model, f"{marker} {password} in eu 2026"),
            (struct, f"{marker} in eu 2026"),
        ):
            job = app.get_job(job_id)
            assert job.state is replayq.JobState.SUCCEEDED, (job.last_error, worker.log())
            assert job.result == result, job.result
        assert refused_secrets.API_KEY not in worker.log()
    finally:
        app.close()
