"""The dashboard's job list filters in the query: full pages, true counts, pages that chain.

Over HTTP against a real ``replayq web`` process (no browser needed). The version
filter is the case that broke when it was applied to a fetched page: the newest jobs
are all v1, so filtering the first 100 rows after fetching them showed no v2 job at
all although 150 exist.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import replayq
from tests.browser.conftest import Dashboard, start_dashboard

LINK = re.compile(r'<td><a href="/jobs/(\d+)">')
OLDER = re.compile(r'<a href="([^"]+)" rel="next">Older jobs</a>')


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 -- http://127.0.0.1 only
        return str(response.read().decode())


def listed(page: str) -> list[int]:
    return [int(found) for found in LINK.findall(page)]


def older_link(page: str) -> str | None:
    found = OLDER.search(page)
    return found.group(1).replace("&amp;", "&") if found else None


def two_versions(app_factory: Any) -> tuple[list[int], list[int]]:
    """150 jobs run by v2's deployment, then 150 newer ones by v1's: the newest page is v1.

    The version is the one a job was routed to when leased, so each deployment runs its own.
    """
    v2 = app_factory()
    v2.job("ship", version="v2")(lambda ctx, n: n)
    v2_ids = v2.enqueue_many([replayq.EnqueueRequest("ship", {"n": n}) for n in range(150)])
    replayq.Worker(v2, burst=True).run()
    v1 = app_factory()
    v1.job("ship", version="v1")(lambda ctx, n: n)
    v1_ids = v1.enqueue_many([replayq.EnqueueRequest("ship", {"n": n}) for n in range(150)])
    replayq.Worker(v1, burst=True).run()
    assert {v1.get_job(i).handler_version for i in v1_ids} == {"v1"}
    assert {v1.get_job(i).handler_version for i in v2_ids} == {"v2"}
    return v1_ids, v2_ids


def test_version_filter_pages_through_every_matching_job_with_a_true_count(
    app_factory: Any, db_url: str, dashboards: list[Dashboard], tmp_path: Path
) -> None:
    v1_ids, v2_ids = two_versions(app_factory)
    dashboards.append(start_dashboard(db_url, tmp_path, token=None))
    base = dashboards[-1].url

    first = fetch(base + "/jobs?version=v2")
    assert "150 jobs match" in first
    assert listed(first) == sorted(v2_ids, reverse=True)[:100]
    next_page = older_link(first)
    assert next_page is not None and "version=v2" in next_page
    second = fetch(base + next_page)
    assert listed(second) == sorted(v2_ids, reverse=True)[100:]
    assert older_link(second) is None  # a short page is the last

    both = fetch(base + "/jobs?version=v1&type=ship&limit=200")
    assert "150 jobs match" in both
    assert listed(both) == sorted(v1_ids, reverse=True)
    everything = fetch(base + "/jobs?limit=1000")
    assert "300 jobs match" in everything
    assert fetch(base + "/jobs?version=v3").count("<td><a href=") == 0


@pytest.mark.parametrize("query", ["before=abc", "limit=-5", "before=0"])
def test_a_malformed_page_parameter_is_a_400_not_a_crash(
    sqlite_url: str, dashboards: list[Dashboard], tmp_path: Path, query: str
) -> None:
    replayq.App(sqlite_url, auto_migrate=True).close()
    dashboards.append(start_dashboard(sqlite_url, tmp_path, token=None))
    with pytest.raises(urllib.error.HTTPError) as refused:
        fetch(dashboards[-1].url + "/jobs?" + query)
    refused.value.close()
    assert refused.value.code == 400
