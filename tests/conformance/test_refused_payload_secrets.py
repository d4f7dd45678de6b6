"""Each way a payload's own type refuses it in words quoting a secret, on each backend.

``tests.apps.refused_secrets.REFUSED``: a pydantic validator's message, msgspec's, a
dataclass's ``__post_init__``'s, each quoting a declared secret field's value or a value
the patterns find. Refused at ``App.enqueue`` (the caller's error) and at ``ctx.enqueue``
(the parent's ``last_error`` and every event of its trace), and a payload stored before
its field became a secret one and changed type, refused at lease (its burial): markers
there, never the secret. (``tests/acceptance/test_refused_payload_secrets.py`` adds the
CLI, a worker subprocess and its log.)
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import replayq
import replayq.testing
from tests.apps import refused_secrets
from tests.conformance.test_secret_paths import stored_rows

AppFactory = Callable[..., replayq.App]
KEY = "test-redaction-key-0123456789"
CASES = range(len(refused_secrets.REFUSED))


def _assert_clear_of_secrets(text: str) -> None:
    for secret in refused_secrets.SECRETS:
        assert secret not in text, f"{secret!r} is in: {text}"


@pytest.mark.parametrize("case", CASES)
def test_an_enqueue_refused_in_the_types_words_quotes_markers(
    app_factory: AppFactory, case: int
) -> None:
    app = refused_secrets.build(
        app_factory().url, redaction=replayq.Redaction(key=KEY), auto_migrate=True
    )
    job_type, payload = refused_secrets.REFUSED[case]
    with pytest.raises(replayq.PayloadError) as refused:
        app.enqueue(job_type, payload)
    app.close()
    assert "[redacted:" in str(refused.value), refused.value
    _assert_clear_of_secrets(str(refused.value))


@pytest.mark.parametrize("case", CASES)
def test_a_child_refused_in_the_types_words_fails_its_parent_with_markers(
    app_factory: AppFactory, case: int
) -> None:
    app = refused_secrets.build(
        app_factory().url, redaction=replayq.Redaction(key=KEY), auto_migrate=True
    )
    try:
        job = replayq.testing.run_inline(app, "spawn", {"case": case})
        assert job.state is replayq.JobState.DEAD
        assert "[redacted:" in (job.last_error or ""), job.last_error
        _assert_clear_of_secrets(job.last_error or "")
        _assert_clear_of_secrets(json.dumps([vars(e) for e in app.trace(job.id)], default=str))
        _assert_clear_of_secrets(stored_rows(app))
    finally:
        app.close()


STALE = {
    "settle": ({"account_number": refused_secrets.ACCOUNT}, "expects int, got str '[redacted:"),
    "enroll": (
        {"holder": refused_secrets.ACCOUNT, "tier": "bronze"},
        "'Member': Member refused it: ValueError: tier bronze of [redacted:",
    ),
}


@pytest.mark.parametrize("job_type", sorted(STALE))
def test_a_stale_payload_refused_at_lease_is_buried_with_its_secret_redacted(
    app_factory: AppFactory, job_type: str
) -> None:
    """Stored before ``settle`` took an int and named ``account_number`` secret (before
    ``enroll`` took a ``Member`` and named ``holder`` secret): the payload keeps the value
    in clear, its burial (``last_error``, ``job.dead``) not. ``Member.__post_init__``'s
    error buries the job as a malformed payload; it used to escape the worker's
    ``execute``, leaving the job running."""
    payload, expected = STALE[job_type]
    url = app_factory().url
    rules = replayq.Redaction(key=KEY)
    before = refused_secrets.build(url, v1=True, redaction=rules, auto_migrate=True)
    job_id = before.enqueue(job_type, payload)
    before.close()
    app = refused_secrets.build(url, redaction=rules, auto_migrate=True)
    try:
        worker = replayq.Worker(app)
        app.register_contracts()
        (leased,) = worker.lease(1)
        worker.execute(leased)
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.DEAD
        assert expected in (job.last_error or ""), job.last_error
        assert job.dead_reason == "malformed_payload", job.dead_reason
        _assert_clear_of_secrets(job.last_error or "")
        _assert_clear_of_secrets(json.dumps([vars(e) for e in app.trace(job_id)], default=str))
    finally:
        app.close()


def test_a_secret_its_dataclass_checks_at_enqueue_reaches_the_handler_as_its_marker(
    app_factory: AppFactory,
) -> None:
    """``Vault.__post_init__`` accepts the real key at enqueue; the row holds its marker
    (docs/secrets.md: a redacted field reaches the handler as its marker). At lease the
    instance is made with the marker, its defaults filled, not run through the check that
    already passed: the job succeeds. It was buried as a malformed payload (before that,
    ``__post_init__``'s error escaped ``execute`` and left the job running)."""
    url = app_factory().url
    app = refused_secrets.build(url, redaction=replayq.Redaction(key=KEY), auto_migrate=True)
    try:
        job_id = app.enqueue("unlock", {"api_key": "ak_" + refused_secrets.API_KEY})
        stored = app.get_job(job_id).payload
        assert stored["api_key"].startswith("[redacted:"), stored
        worker = replayq.Worker(app)
        app.register_contracts()
        (leased,) = worker.lease(1)
        worker.execute(leased)
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.SUCCEEDED, job.last_error
        assert job.result == f"{stored['api_key']} in eu", job.result
    finally:
        app.close()


OPENED = "2026-01-02T03:04:05+00:00"
CHECKED_RECORDS = {
    # A validator, a pattern, a length and a ``Literal`` on its secret fields.
    "unlock_model": (
        {"api_key": "ak_" + refused_secrets.API_KEY, "password": "swordfish"},
        "{api_key} {password} in eu 2026",
    ),
    # ``Meta(pattern=..., min_length=...)`` on its secret field.
    "unlock_struct": ({"api_key": "ak_" + refused_secrets.API_KEY}, "{api_key} in eu 2026"),
}


@pytest.mark.parametrize("job_type", sorted(CHECKED_RECORDS))
def test_a_secret_its_model_or_struct_constrains_reaches_the_handler_as_its_marker(
    app_factory: AppFactory, job_type: str
) -> None:
    """``Keyring`` (pydantic) and ``Locker`` (msgspec) accept the real key at enqueue; the
    row holds its marker, which their constraints refuse. At lease the instance holds the
    marker and its other fields converted (``opened`` a datetime: the handler reads its
    year): the job succeeds. It was buried as a malformed payload on its first attempt."""
    secrets, expected = CHECKED_RECORDS[job_type]
    app = refused_secrets.build(
        app_factory().url, redaction=replayq.Redaction(key=KEY), auto_migrate=True
    )
    try:
        job_id = app.enqueue(job_type, {**secrets, "opened": OPENED})
        stored = app.get_job(job_id).payload
        assert all(stored[name].startswith("[redacted:") for name in secrets), stored
        worker = replayq.Worker(app)
        app.register_contracts()
        (leased,) = worker.lease(1)
        worker.execute(leased)
        job = app.get_job(job_id)
        assert job.state is replayq.JobState.SUCCEEDED, job.last_error
        assert job.result == expected.format(**stored), job.result
    finally:
        app.close()
