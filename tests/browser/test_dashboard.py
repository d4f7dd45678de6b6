"""The dashboard in a real headless Chromium, against a real ``replayq web`` process.

An operator opens the overview, follows the dead count to the dead job, sees its
attempt drawn as a timeline, signs in with the token and forks the job onto v2
from the page, and lands on the diff that shows v2 would have shipped. Without
the token (or without the form's CSRF token) the same fork is refused with 403
and nothing is written. A payload carrying ``<script>`` shows as text and never runs.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

import replayq
from replayq.storage.context_params import LineageQuery
from tests.apps import dashboard_shop
from tests.browser.conftest import TOKEN, Dashboard, start_dashboard
from tests.conformance.test_in_doubt import _leave_in_doubt, _run, declare_charge

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "<script>document.title='pwned';window.pwned=1</script>"
# Screenshots for docs/dashboard.md: REPLAYQ_SCREENSHOTS=1 writes them into docs/img/.
SHOTS = ROOT / "docs" / "img" if os.environ.get("REPLAYQ_SCREENSHOTS") else None


def incident(app: replayq.App) -> int:
    """Order 1 is paid; v1 misreads the status and the job dies. A second job for the
    same order runs on another worker (the resource page's two lanes)."""
    app.state.put("order", 1, {"status": "paid", "sku": "sku-1"}, expected_version=0)
    dead = app.enqueue("ship_order", {"order_id": 1, "note": SCRIPT})
    replayq.Worker(app, burst=True, worker_id="host-a:41").run()
    # The second delivery for the same order, on another worker.
    app.enqueue("ship_order", {"order_id": 1, "note": "second delivery"})
    replayq.Worker(app, burst=True, worker_id="host-b:42").run()
    assert app.get_job(dead).state == "dead"
    return dead


def forks_of(app: replayq.App, job_id: int) -> list[Any]:
    trace_id = app.get_job(job_id).trace_id
    with app.storage.transaction(readonly=True) as tx:
        return list(tx.lineage_list(LineageQuery(source_trace_id=trace_id)))


def shot(page: Any, name: str, tmp_path: Path, selector: str | None = None) -> Path:
    path = (SHOTS or tmp_path) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if selector:
        page.locator(selector).screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=True)
    return path


def test_overview_to_dead_job_to_timeline_to_fork_on_v2_to_diff(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    job_id = incident(app)
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    page.goto(web.url + "/")
    assert page.locator(".card.alarm .n").inner_text() == "2"
    page.click("text=dead")
    # A click returns once the new page starts loading; wait_for_url also waits for its
    # load event, so the reads below never see the old or a half-parsed page.
    page.wait_for_url("**/dead")
    page.click(f"a[href='/jobs/{job_id}']")
    page.wait_for_url(f"**/jobs/{job_id}")

    # The attempt drawn: a lane, its lease, its steps as bars, its decision and lock.
    lanes = page.locator("svg.timeline .lane-label").all_text_contents()
    assert lanes == ["attempt 1 · host-a:41"]
    steps = page.locator("svg.timeline .bar-label").all_text_contents()
    assert steps == ["load_order", "check_stock", "decide"]
    assert page.locator("svg.timeline rect.step-fail").count() == 1
    assert page.locator("svg.timeline circle.mark-decision").count() == 1
    assert page.locator("svg.timeline rect.lock").count() == 1
    assert page.locator("svg.timeline rect.lease").count() == 1
    # The payload and the error carry <script>: shown as text, never run.
    assert SCRIPT in page.locator("pre.payload").first.inner_text()
    assert SCRIPT in page.locator("dd.error").last.inner_text()
    assert page.evaluate("window.pwned") is None
    assert page.title() == f"Job {job_id} · replayq"
    shot(page, "job-timeline.png", tmp_path, "main")

    # Signed out, the fork button is disabled; sign in with the token.
    assert page.locator("form.fork button").is_disabled()
    page.click("text=Sign in with the token")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"**/jobs/{job_id}")

    page.select_option("form.fork select[name=from_step]", "decide")
    page.select_option("form.fork select[name=version]", "v2")
    # v2 ships where the recorded v1 attempt never did: the fork is told what the warehouse says.
    page.fill("form.fork textarea[name=stubs]", 'warehouse.create_shipment={"id": "shp-fork"}')
    page.click("form.fork button")
    page.wait_for_url("**/diff?**")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert query["a"] == [str(job_id)]
    [fork] = forks_of(app, job_id)
    assert query["b"] == [fork.trace_id]
    table = page.locator("table.side-by-side").inner_text()
    assert "decision ship" in table
    assert "false" in table and "true" in table
    assert "shipped" in table
    assert "warehouse.create_shipment [ship:1]" in table
    outcome = page.locator("tr:has(th:text-is('outcome')) td").all_inner_texts()
    assert outcome[0].startswith("dead") and outcome[1] == "succeeded"
    shot(page, "fork-diff.png", tmp_path, "main")

    # The resource: one lane per worker, both jobs' leases and locks on order:1.
    page.goto(f"{web.url}/jobs/{job_id}")
    page.click("a.chip:text-is('order:1')")
    page.wait_for_url("**/resources/order:1")
    assert page.locator("svg.timeline .lane-label").all_text_contents() == [
        "host-a:41",
        "host-b:42",
    ]
    assert page.locator("svg.timeline rect.lease").count() == 2
    assert page.locator("svg.timeline rect.lock").count() == 2
    shot(page, "resource-swimlanes.png", tmp_path, "main")
    page.goto(web.url + "/")
    shot(page, "overview.png", tmp_path, "main")
    page.close()


def test_without_the_token_an_action_is_refused_and_nothing_changes(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    job_id = incident(app)
    before = (app.get_job(job_id), len(app.trace(job_id)))
    fork_form = {"from_step": "decide", "version": "v2", "csrf": "guessed"}

    # A dashboard started without REPLAYQ_WEB_TOKEN: read-only, every action 403.
    readonly = start_dashboard(app.url, tmp_path, token=None)
    dashboards.append(readonly)
    page = browser.new_page()
    page.goto(f"{readonly.url}/jobs/{job_id}")
    assert "read-only" in page.locator("header .who").inner_text()
    response = page.request.post(f"{readonly.url}/jobs/{job_id}/fork", form=fork_form)
    assert response.status == 403
    response = page.request.post(
        f"{readonly.url}/jobs/{job_id}/requeue",
        form={"reason": "x"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status == 403

    # With a token configured: no session, a wrong bearer, a session without the form's
    # CSRF token (a cross-site post) are all refused.
    guarded = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(guarded)
    url = f"{guarded.url}/jobs/{job_id}"
    assert page.request.post(f"{url}/fork", form=fork_form).status == 403
    assert (
        page.request.post(
            f"{url}/requeue", form={"reason": "x"}, headers={"Authorization": "Bearer nope"}
        ).status
        == 403
    )
    page.goto(f"{guarded.url}/login?next=/jobs/{job_id}")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"**/jobs/{job_id}")
    assert page.request.post(f"{url}/fork", form=fork_form).status == 403
    assert page.request.post(f"{url}/requeue", form={"reason": "x", "csrf": ""}).status == 403
    page.close()

    assert forks_of(app, job_id) == []
    assert (app.get_job(job_id), len(app.trace(job_id))) == before


def test_the_rollout_panel_shows_routing_both_versions_gates_and_the_stored_verify_report(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    app = dashboard_shop.declare(app_factory())
    for order_id in range(1, 61):
        app.state.put("order", order_id, {"status": "paid"}, expected_version=0)
    # History: v1 misreads the status, every job dies.
    app.enqueue_many([replayq.EnqueueRequest("ship_order", {"order_id": n}) for n in range(1, 21)])
    replayq.Worker(app, burst=True).run()
    # A stored verify report, from a background run: v2 ships where v1 died.
    run_id = replayq.start_verify(app, "ship_order", from_version="v1", to_version="v2")
    replayq.Worker(app, burst=True).run()
    run = replayq.verify_run(app, run_id)
    assert run.finished and not run.report.passed
    # A canary: half the new jobs on v2, so both versions have figures.
    app.rollout("ship_order", actor="ops").start("v2", canary="50%", reason="canary")
    app.enqueue_many([replayq.EnqueueRequest("ship_order", {"order_id": n}) for n in range(21, 61)])
    replayq.Worker(app, burst=True, routing_refresh=0).run()

    web = start_dashboard(app.url, tmp_path, token=None)
    dashboards.append(web)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(web.url + "/rollout")
    panel = page.locator("#rollout-ship_order")

    routing = panel.locator("table.routing").inner_text()
    assert "baseline\tv1" in routing and "candidate\tv2" in routing
    assert "v1 50.0 %" in routing and "v2 50.0 %" in routing

    gates = panel.locator("table.gates")
    assert gates.locator("thead th").all_inner_texts() == [
        "figure",
        "v1 (baseline)",
        "v2 (candidate)",
    ]
    figures = {
        row.locator("th").inner_text(): row.locator("td").all_inner_texts()
        for row in gates.locator("tbody tr").all()
    }
    assert list(figures) == list(replayq.GateReport.FIGURES)
    report = app.rollout("ship_order").gates()
    assert figures["attempts"] == [str(report.baseline.attempts), str(report.candidate.attempts)]
    assert figures["dlq_rate"] == [
        f"{report.baseline.to_dict()['dlq_rate']:.3f}",
        f"{report.candidate.to_dict()['dlq_rate']:.3f}",
    ]
    verdicts = panel.locator("ul.gate-verdicts li").all_inner_texts()
    assert len(verdicts) == len(report.gates)

    [row] = panel.locator("table.verify-runs tbody tr").all()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == str(run_id) and cells[1] == "v1 → v2" and cells[2] == "succeeded"
    assert cells[3] == f"{run.total}/{run.total}" and cells[-1] == "failed"
    header = panel.locator("table.verify-runs thead th").all_inner_texts()
    counted = {
        name: cells[header.index(name)]
        for name in replayq.VerifyReport.CLASSES
        if cells[header.index(name)]
    }
    assert counted == {name: str(n) for name, n in run.report.counts.items()}
    assert f"replayq fork {run.report.examples()[0].job_id}" in panel.inner_text()
    assert "ops: start — canary" in panel.locator("ul.history").inner_text()
    shot(page, "rollout-panel.png", tmp_path)
    page.close()


def test_an_in_doubt_effect_is_resolved_from_the_job_page_and_the_requeued_job_uses_it(
    app_factory: Any, browser: Any, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    clock = replayq.FrozenClock()
    app = app_factory(clock=clock)
    calls = declare_charge(app)
    job_id = app.enqueue("charge", {"n": 1})
    _leave_in_doubt(app, clock, job_id)  # the attempt's lease ran out mid-effect
    _run(app)  # the next attempt parks the job: the outcome is unknown
    assert app.get_job(job_id).dead_reason == "effect_in_doubt"
    web = start_dashboard(app.url, tmp_path, token=TOKEN)
    dashboards.append(web)
    page = browser.new_page()

    page.goto(f"{web.url}/jobs/{job_id}")
    assert page.locator("table.in-doubt code").all_inner_texts() == ["charge-1"]
    assert page.locator("form.resolve button").is_disabled()  # read-only until signed in
    page.click("text=Sign in with the token")
    page.fill("input[name=token]", TOKEN)
    page.click("button:has-text('Sign in')")
    # The operator checked the payment provider: the charge went through.
    page.select_option("form.resolve select[name=outcome]", "happened")
    page.fill("form.resolve input[name=result]", '{"charge": 1}')
    page.fill("form.resolve input[name=reason]", "provider shows ch_1 captured")
    page.click("form.resolve button")
    page.wait_for_url(f"**/jobs/{job_id}")
    assert page.locator("table.in-doubt").count() == 0
    assert app.effects_in_doubt() == []
    [record] = app.effects()
    assert (record.key, record.status, record.result) == ("charge-1", "succeeded", {"charge": 1})

    # Requeued, the job takes the result from the ledger: the charge is not made again.
    page.fill("input[name=reason]", "charge resolved by hand")
    page.click("button:has-text('Requeue')")
    page.wait_for_url(f"**/jobs/{job_id}")
    clock.advance(max(0.0, time.time() - clock.now()) + 1)  # the dashboard requeued at wall time
    _run(app)
    finished = app.get_job(job_id)
    assert (finished.state, finished.result) == ("succeeded", {"charge": 1})
    assert calls == [1]
    page.close()
