"""The chaos checker counts what it must, on both backends, and fails on every bad count.

Real jobs are run through a real worker (``run_inline``); the faults the checker
must catch are then written as a faulty worker would have left them: a job never
finished, an effect counted twice, a second settle of a job, a job leased under
its ordering key before the one ahead of it settled, a job the producer sent
that never arrived.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import replayq
from replayq.testing import run_inline
from tests import chaos_check
from tests.services import Service, request


def _app(app_factory: Callable[..., replayq.App]) -> replayq.App:
    app = app_factory()

    @app.job("pay", ordering="acct:{acct}")
    def pay(ctx: replayq.Context, acct: str, n: int) -> None: ...

    return app


def _event(job: replayq.Job, name: str, hlc: int) -> replayq.TraceEvent:
    return replayq.TraceEvent(trace_id=job.trace_id, name=name, ts=0.0, hlc=hlc, job_id=job.id)


def test_a_clean_run_has_no_bad_count(
    app_factory: Callable[..., replayq.App], db_url: str, tmp_path: Path
) -> None:
    app = _app(app_factory)
    for n in range(3):
        run_inline(app, "pay", {"acct": "a", "n": n})
    sink = tmp_path / "effects.jsonl"
    sink.write_text("".join(json.dumps({"event": "effect", "n": n}) + "\n" for n in range(3)))
    report = chaos_check.check(db_url, chaos_check.effects_from_file(sink), expected=3)
    assert report.bad() == []
    assert (report.enqueued, report.succeeded, report.stuck) == (3, 3, 0)
    assert chaos_check.main(["--db", db_url, "--effects-file", str(sink), "--expected", "3"]) == 0


def test_every_bad_count_is_found_and_fails_the_check(
    app_factory: Callable[..., replayq.App],
    db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = _app(app_factory)
    first = run_inline(app, "pay", {"acct": "a", "n": 0})
    second = run_inline(app, "pay", {"acct": "a", "n": 1})
    app.enqueue("pay", {"acct": "b", "n": 2})  # never run: stuck
    settle = max(e.hlc for e in app.trace(first.id) if e.name == "job.succeeded")
    with app.storage.transaction() as tx:
        # A late worker's settle accepted, and a lease taken before the job ahead settled.
        tx.trace_append([_event(first, "job.succeeded", settle + 1)])
        tx.trace_append([_event(second, "job.leased", settle - 1)])
    effects = Counter({"0": 1, "1": 2})
    report = chaos_check.check(db_url, effects, expected=4, recovery_seconds=1.5)
    assert report.lost == 1 and report.stuck == 1
    assert report.duplicates == {"1": 1}
    assert report.stale_writes == 1
    assert report.order_violations == {"acct:a": 1}
    assert len(report.bad()) == 5
    table = report.table()
    for row in ("enqueued", "dead by reason", "lost", "stuck", "recovery seconds"):
        assert f"| {row}" in table

    sink = tmp_path / "effects.jsonl"
    sink.write_text("".join(json.dumps({"event": "effect", "n": n}) + "\n" for n in (0, 1, 1)))
    assert chaos_check.main(["--db", db_url, "--effects-file", str(sink), "--expected", "4"]) == 1
    out = capsys.readouterr()
    assert "| duplicate real effects per key | 1 (1: 1) |" in out.out
    assert "bad: lost 1; stuck 1; duplicate real effects 1" in out.err


def test_effects_are_read_from_the_counting_server(service: Service) -> None:
    for key in ("charge:1", "charge:2", "charge:2"):
        request("POST", f"{service.base_url}/effects/{key}", {})
    request("GET", f"{service.base_url}/inventory/sku-1")  # not an effect: not counted as one
    assert chaos_check.effects_from_server(service.base_url) == Counter(
        {"charge:1": 1, "charge:2": 2}
    )
