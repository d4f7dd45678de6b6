"""A real worker's trace names a card-keyed entity, lock and effect redacted; the CLI and
the dashboard find them by the raw id.

``tests.apps.secret_resources`` keys an entity, a lock, an effect and a cache entry by a
card number it reads from its environment. A real worker runs it twice on each backend;
then the trace's rows (events unpacked, the resource index) hold no card number, while
the state keeps it; ``replayq trace resource card:<number>`` (what a user types) and the
dashboard's resource page at that address list both jobs' reads and writes; ``trace
show``, ``trace export``, ``events --resource`` and the job's page show only markers; and
the CLI's dry-run of the second job, which read the first one's version, does not diverge.
"""

from __future__ import annotations

import html
import json
import re
import urllib.request
from urllib.parse import quote

import pytest

import replayq
from tests.acceptance.workers import WorkerLauncher
from tests.apps import secret_resources
from tests.browser.conftest import start_dashboard
from tests.conformance.test_secret_paths import stored_rows
from tests.conformance.test_secret_resources import trace_rows
from tests.replay_support import cli_ok

CARD = "4111111111111111"
KEY = "test-redaction-key-0123456789"
SPEC = "tests.apps.secret_resources:app"


def test_a_workers_card_keyed_resources_are_traced_redacted_and_found_by_the_raw_id(
    launcher: WorkerLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"REPLAYQ_REDACTION_KEY": KEY, "VAULT_CARD": CARD}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = secret_resources.build(launcher.url)
    try:
        first = app.enqueue("vault", {"order": 1})
        worker = launcher.start("w1", app=SPEC, burst=True, env=env)
        assert worker.wait(60) == 0, worker.log()
        second = app.enqueue("vault", {"order": 2})
        worker = launcher.start("w2", app=SPEC, burst=True, env=env)
        assert worker.wait(60) == 0, worker.log()
        jobs = [app.get_job(j) for j in (first, second)]
        assert [j.state for j in jobs] == [replayq.JobState.SUCCEEDED] * 2, worker.log()
        assert jobs[1].result == {"uses": 2, "token": "tok_1"}, jobs[1].result

        rows = trace_rows(app)
        assert "card:[redacted:" in rows and "card-lock:[redacted:" in rows, rows
        assert CARD not in rows, "a card number is in the trace's rows"
        assert CARD in stored_rows(app), "the state no longer keeps the key it was given"

        timeline = json.loads(
            cli_ok(launcher.url, "trace", "resource", f"card:{CARD}", "--json").stdout
        )
        assert {e["job_id"] for e in timeline} == {first, second}, timeline
        assert {e["name"] for e in timeline} >= {"state.read", "state.write"}, timeline
        assert all(e["resource"].startswith("card:[redacted:") for e in timeline), timeline
        locks = json.loads(
            cli_ok(launcher.url, "trace", "resource", f"card-lock:{CARD}", "--json").stdout
        )
        assert {e["name"] for e in locks} >= {"lock.acquired", "lock.released"}, locks
        outputs = [json.dumps(timeline), json.dumps(locks)]
        outputs.append(cli_ok(launcher.url, "trace", "resource", f"tokenize:{CARD}").stdout)
        assert "effect." in outputs[-1], outputs[-1]
        for job in (first, second):
            outputs.append(cli_ok(launcher.url, "trace", "show", str(job)).stdout)
            outputs.append(cli_ok(launcher.url, "trace", "export", str(job), "--app", SPEC).stdout)
        assert "card:[redacted:" in outputs[-1], outputs[-1]
        listed = cli_ok(launcher.url, "events", "--resource", f"card:{CARD}").stdout
        assert listed.count("state.write") == 2, listed
        outputs.append(listed)

        dry = cli_ok(
            launcher.url, "replay", str(second), "--app", SPEC, "--mode", "dry-run", "--json"
        )
        report = json.loads(dry.stdout)
        assert report["diverged"] is False, dry.stdout
        assert report["outcome_now"]["result"] == {"uses": 2, "token": "tok_1"}, dry.stdout

        dashboard = start_dashboard(launcher.url, launcher.directory, token=None, app_spec=SPEC)
        try:
            pages: list[str] = []
            for path in (f"/jobs/{second}", f"/resources/{quote(f'card:{CARD}')}", None):
                if path is None:
                    # The job page's own link to the entity's page: its redacted name.
                    found = re.search(r'href="(/resources/card:[^"]*)"', pages[0])
                    assert found, pages[0]
                    path = html.unescape(found.group(1))
                with urllib.request.urlopen(dashboard.url + path, timeout=30) as page:  # noqa: S310 -- http://127.0.0.1 only
                    pages.append(page.read().decode())
        finally:
            dashboard.proc.terminate()
            dashboard.proc.wait(30)
        job_page, typed, linked = pages
        assert "card:[redacted:" in job_page, job_page
        for resource_page in (typed, linked):
            assert "state.write" in resource_page, resource_page
            assert f"/jobs/{first}" in resource_page, resource_page
        outputs += pages
        for text in outputs:
            assert CARD not in text, f"the card number is in an output: {text}"
    finally:
        app.close()
