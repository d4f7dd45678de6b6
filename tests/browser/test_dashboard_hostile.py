"""Strings a job's payload controls, on the dashboard in a real headless Chromium.

A resource name is made from the payload (``acct:{name}``), and so are an error, a
decision's reason and a job type enqueued unchecked. Each is shown as text on every page
that shows it (never markup, in HTML or in the timeline's SVG), and a link to a resource
leads to that resource's own page, whatever the name holds (``?``, ``#``, ``/..``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import replayq
from tests.apps import token_issuer
from tests.browser.conftest import TOKEN, Dashboard, start_dashboard

# Markup that would show as an element if any page rendered it unescaped.
MARKUP = '<i class="injected">i</i><img class="injected" src="x">'
SECRETS = ("tok-SECRET-4242", "sk_live_77777777")
NAMES = {
    "query": "7?x=1",  # once sent to /resources/acct:7
    "fragment": "7#x",  # likewise
    "climb": "7/../../../dead",  # once resolved by the browser to /dead
    "markup": f"7{MARKUP}",
}


def declare(app: replayq.App) -> replayq.App:
    @app.job("touch", retry=replayq.Retry(max_attempts=1))
    def touch(ctx: replayq.Context, name: str) -> None:
        with ctx.step("read"):
            ctx.state.get("acct", name)
        with ctx.step("judge"):
            ctx.decide("refuse", True, why=name)
        raise replayq.ValidationError(f"refused {name}")

    return app


def test_payload_strings_show_as_text_and_resource_links_reach_their_own_page(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = declare(app_factory())
    app.state.put("acct", 7, {"owner": "plain"}, expected_version=0)
    jobs = {case: app.enqueue("touch", {"name": name}) for case, name in NAMES.items()}
    plain = app.enqueue("touch", {"name": "7"})
    odd_type = app.enqueue(f"odd{MARKUP}", {"note": MARKUP}, check=False)
    replayq.Worker(app, burst=True, worker_id="host-a:1").run()
    assert {app.get_job(j).state for j in (*jobs.values(), plain)} == {"dead"}
    web = start_dashboard(app.url, tmp_path, token=None)
    dashboards.append(web)
    page = browser.new_page()

    for path in ("/", "/jobs", "/dead", f"/jobs/{jobs['markup']}", f"/jobs/{odd_type}"):
        page.goto(web.url + path)
        assert page.locator(".injected").count() == 0, path
        assert MARKUP in page.locator("main").inner_text(), path
    diff = f"/diff?a={jobs['markup']}&b={app.get_job(jobs['markup']).trace_id}"
    for path in ("/rollout", diff, f"/jobs?type={odd_type}"):
        page.goto(web.url + path)
        assert page.locator(".injected").count() == 0, path

    for case, name in NAMES.items():
        resource = f"acct:{name}"
        page.goto(f"{web.url}/jobs/{jobs[case]}")
        with page.expect_navigation():
            page.locator("a.chip", has_text=resource).click()
        # The page of this resource, holding this job's read and no other job's.
        assert page.locator("h1 code").inner_text() == resource, case
        rows = page.locator("table.events tbody tr td:nth-child(2)").all_inner_texts()
        assert set(rows) == {str(jobs[case])}, case
        assert page.locator(".injected").count() == 0, case
        # The timeline's marks link the same page (a click event: marks may overlap).
        page.goto(f"{web.url}/jobs/{jobs[case]}")
        with page.expect_navigation():
            page.locator("svg.timeline a").first.dispatch_event("click")
        assert page.locator("h1 code").inner_text() == resource, case
    page.close()


def test_a_secret_in_a_jobs_result_is_shown_as_a_marker_on_its_page_and_its_dry_run(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = token_issuer.declare(app_factory())
    job_id = app.enqueue("issue_token", {"user": 1})
    replayq.Worker(app, burst=True).run()
    # Stored as returned, for the caller to read back (docs/secrets.md).
    assert app.get_job(job_id).result["access_token"] == "tok-SECRET-4242"
    web = start_dashboard(app.url, tmp_path, token=TOKEN, app_spec="tests.apps.token_issuer:app")
    dashboards.append(web)
    page = browser.new_page()
    page.goto(f"{web.url}/jobs/{job_id}")  # reading needs no sign-in
    shown = page.locator("pre.payload").last.inner_text()
    assert '"user": 1' in shown and '"access_token": "[redacted' in shown
    assert not any(secret in page.content() for secret in SECRETS)

    # A dry-run reruns the handler: the result it returns now is shown as markers too.
    page.click("text=Sign in with the token")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"**/jobs/{job_id}")
    with page.expect_navigation():
        page.click("button:has-text('Dry-run')")
    assert "No divergence" in page.locator("main").inner_text()
    outcomes = page.locator("table.side-by-side pre").all_inner_texts()
    assert len(outcomes) == 2
    assert all('"access_token": "[redacted' in shown for shown in outcomes)
    assert not any(secret in page.content() for secret in SECRETS)
    page.close()
