"""The dashboard's actions and sessions in a real headless Chromium, against ``replayq web``.

An action posted twice (a double click, a resubmitted form) acts once: the second
requeue, cancel or resolve finds the job no longer in the state it acts on and answers
409, and the trace holds one event. An action replayq refuses (a dry-run of a job that
never ran, a fork from a step that is not recorded) shows the reason, not a bare 500.
The session cookie is ``HttpOnly`` and ``SameSite=Strict``; signing out ends it; every
response, an unexpected error's too, carries the security headers.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import replayq
from tests.apps import dashboard_shop
from tests.browser.conftest import TOKEN, Dashboard, start_dashboard
from tests.browser.test_dashboard import incident
from tests.conformance.test_in_doubt import _leave_in_doubt, _run, declare_charge
from tests.context_support import query

HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def sign_in(page: Any, web: Dashboard, job_id: int) -> str:
    """Sign in from the job's page; returns the CSRF token its forms carry."""
    page.goto(f"{web.url}/login?next=/jobs/{job_id}")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"**/jobs/{job_id}")
    return str(page.locator("input[name=csrf]").first.get_attribute("value"))


def names(app: replayq.App, job_id: int) -> list[str]:
    return [e.name for e in app.trace(job_id)]


def test_a_requeue_or_cancel_posted_twice_acts_once(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    dead = incident(app)
    queued = app.enqueue("ship_order", {"order_id": 2}, delay=3600)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page()
    csrf = sign_in(page, web, dead)

    page.fill("input[name=reason]", "v1 fixed")
    page.click("button:has-text('Requeue')")
    page.wait_for_url(f"**/jobs/{dead}")
    assert page.locator("h1 .state").inner_text() == "queued"
    # The same form again (the page as it was before): refused, nothing more written.
    again = page.request.post(
        f"{web.url}/jobs/{dead}/requeue", form={"reason": "v1 fixed", "csrf": csrf}
    )
    assert again.status == 409
    assert "is not dead" in again.text()
    assert names(app, dead).count("job.requeued") == 1
    job = app.get_job(dead)
    assert (job.state, job.max_attempts) == ("queued", 2)

    page.goto(f"{web.url}/jobs/{queued}")
    page.click("button:has-text('Cancel')")
    page.wait_for_url(f"**/jobs/{queued}")
    assert page.locator("h1 .state").inner_text() == "cancelled"
    again = page.request.post(f"{web.url}/jobs/{queued}/cancel", form={"csrf": csrf})
    assert again.status == 409
    assert names(app, queued).count("job.cancelled") == 1
    page.close()


def test_two_requeues_posted_at_once_requeue_once(
    app_factory: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    incident(app)
    dead = [job.id for job in app.list_jobs(states=["dead"])]
    assert len(dead) == 2
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    for job_id in dead:
        # Both posts sent together (a script's retry, two operators): whichever commits
        # first requeues, the other finds the job no longer dead.
        barrier = threading.Barrier(2)

        def post(job_id: int = job_id, barrier: threading.Barrier = barrier) -> int:
            request = urllib.request.Request(  # noqa: S310 -- http://127.0.0.1 only
                f"{web.url}/jobs/{job_id}/requeue",
                data=b"reason=retry",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            barrier.wait()
            try:
                with urllib.request.build_opener(_NoRedirect).open(request, timeout=30) as r:
                    return int(r.status)
            except urllib.error.HTTPError as answer:
                return answer.code

        with ThreadPoolExecutor(2) as pool:
            statuses = sorted(pool.map(lambda _: post(), range(2)))
        assert statuses == [303, 409], job_id
        assert names(app, job_id).count("job.requeued") == 1
        assert app.get_job(job_id).max_attempts == 2


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_an_effect_resolved_twice_is_resolved_once(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    declare_charge(app)
    job_id = app.enqueue("charge", {"n": 1})
    _leave_in_doubt(app, clock, job_id)
    _run(app)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page()
    csrf = sign_in(page, web, job_id)
    form = {"key": "charge-1", "outcome": "happened", "result": '{"charge": 1}', "csrf": csrf}

    first = page.request.post(f"{web.url}/jobs/{job_id}/resolve", form={**form, "reason": "a"})
    assert first.ok
    # A second operator, or the same form resubmitted, saying the opposite: refused.
    second = page.request.post(
        f"{web.url}/jobs/{job_id}/resolve",
        form={**form, "outcome": "not", "result": "", "reason": "b"},
    )
    assert second.status == 409
    [record] = app.effects()
    assert (record.status, record.result) == ("succeeded", {"charge": 1})
    resolved = [e for e in app.trace(job_id) if e.name == "effect.resolved"]
    assert [e.data["reason"] for e in resolved] == ["a"]
    page.close()


def test_an_action_replayq_refuses_shows_its_reason_not_a_bare_500(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    dead = incident(app)
    queued = app.enqueue("ship_order", {"order_id": 3}, delay=3600)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page()
    csrf = sign_in(page, web, queued)

    # The Dry-run button of a job that has not run yet: nothing to replay.
    with page.expect_navigation() as navigation:
        page.click("button:has-text('Dry-run')")
    assert navigation.value.status == 409
    assert page.locator("h1").inner_text() == "Not done"
    assert f"job {queued}" in page.locator("p.error").inner_text()
    assert names(app, queued) == ["job.enqueued"]

    fork = page.request.post(
        f"{web.url}/jobs/{dead}/fork", form={"from_step": "no_such_step", "csrf": csrf}
    )
    assert fork.status == 409
    assert "no_such_step" in fork.text()
    gone = page.request.post(f"{web.url}/jobs/999999/requeue", form={"reason": "x", "csrf": csrf})
    assert gone.status == 404
    for response in (fork, gone):
        assert "script-src 'none'" in response.headers["content-security-policy"]
    page.close()


def test_the_session_cookie_is_httponly_strict_and_ends_at_sign_out(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    dead = incident(app)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    context = browser.new_context()
    page = context.new_page()
    csrf = sign_in(page, web, dead)
    [cookie] = context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
        "replayq_session",
        True,
        "Strict",
    )
    assert TOKEN not in cookie["value"] and TOKEN not in page.content()
    session = cookie["value"]

    page.click("button:has-text('Sign out')")
    page.wait_for_url(web.url + "/")
    assert context.cookies() == []
    # The old session's cookie and CSRF token, replayed: the session is over.
    replayed = page.request.post(
        f"{web.url}/jobs/{dead}/requeue",
        form={"reason": "x", "csrf": csrf},
        headers={"Cookie": f"replayq_session={session}"},
    )
    assert replayed.status == 403
    assert app.get_job(dead).state == "dead"
    context.close()


def test_every_response_carries_the_security_headers_an_unexpected_error_too(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    incident(app)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page()
    responses = [page.goto(web.url + path) for path in ("/", "/jobs", "/dead", "/nowhere")]
    # The jobs table gone under the dashboard: its page fails unexpectedly (500).
    query(app.url, "ALTER TABLE rq_jobs RENAME TO rq_jobs_gone")
    try:
        broken = page.goto(web.url + "/jobs")
        assert broken is not None and broken.status == 500
        responses.append(broken)
    finally:
        query(app.url, "ALTER TABLE rq_jobs_gone RENAME TO rq_jobs")
    for response in responses:
        assert response is not None
        headers = response.headers
        assert "script-src 'none'" in headers["content-security-policy"], response.url
        assert "frame-ancestors 'none'" in headers["content-security-policy"], response.url
        assert {k: headers.get(k) for k in HEADERS} == HEADERS, response.url
    page.close()
