"""Bulk actions on every backend: the filters select exactly the matching jobs, a preview
changes nothing, and each changed job's trace names the bulk action and its reason."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import replayq
from replayq.cli import main
from replayq.storage.context_params import LineageQuery

T0 = 1_700_000_000.0


def iso(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.UTC).isoformat()


def failing(ctx: replayq.Context, kind: str, n: int) -> None:
    if kind == "validation":
        raise replayq.ValidationError(f"bad input {n}")
    raise replayq.DependencyError(f"upstream down {n}")


def dead_jobs(app: replayq.App, clock: replayq.FrozenClock) -> dict[str, list[int]]:
    """Two batches of dead jobs, two hours apart: validation and dependency failures."""
    made: dict[str, list[int]] = {}
    for batch, at in (("old", T0), ("new", T0 + 7200)):
        clock.set(at)
        for n, kind in enumerate(["validation", "dependency", "validation"]):
            job_id = app.enqueue("fail", {"kind": kind, "n": n})
            made.setdefault(f"{batch}-{kind}", []).append(job_id)
        replayq.Worker(app, burst=True).run()
    return made


def test_bulk_requeue_touches_exactly_the_dead_jobs_of_the_error_class_and_window(
    app_factory: Callable[..., replayq.App], db_url: str
) -> None:
    clock = replayq.FrozenClock(T0)
    app = app_factory(clock=clock)
    app.job("fail", retry=replayq.Retry(max_attempts=1))(failing)
    made = dead_jobs(app, clock)
    assert all(app.get_job(i).state == replayq.JobState.DEAD for ids in made.values() for i in ids)
    filters = ["--error-class", "validation", "--since", iso(T0 + 3600), "--until", iso(T0 + 9000)]
    runner = CliRunner()

    preview = runner.invoke(main, ["--db", db_url, "jobs", "requeue", *filters, "--json"])
    assert preview.exit_code == 0, preview.output
    assert json.loads(preview.output)["job_ids"] == made["new-validation"]
    assert all(app.get_job(i).state == replayq.JobState.DEAD for ids in made.values() for i in ids)

    done = runner.invoke(
        main,
        ["--db", db_url, "jobs", "requeue", *filters, "--yes", "--reason", "fixed the parser"],
    )
    assert done.exit_code == 0, done.output
    action_id = done.output.strip().splitlines()[-1].split(":")[0]
    assert action_id.startswith("bulk-")
    for key, ids in made.items():
        for job_id in ids:
            job = app.get_job(job_id)
            requeued = [e for e in app.trace(job_id) if e.name == "job.requeued"]
            if key == "new-validation":
                assert job.state == replayq.JobState.QUEUED
                (event,) = requeued
                assert event.data["bulk_action"] == action_id
                assert event.data["reason"] == "fixed the parser"
            else:
                assert job.state == replayq.JobState.DEAD and requeued == []


def test_bulk_cancel_needs_a_reason_and_skips_jobs_no_longer_queued(
    app_factory: Callable[..., replayq.App],
) -> None:
    app = app_factory()
    app.job("fail")(failing)
    ids = [app.enqueue("fail", {"kind": "validation", "n": n}) for n in range(3)]
    assert app.cancel(ids[0])
    match = replayq.JobMatch(job_type="fail")
    try:
        app.bulk("cancel", match, reason=" ")
    except replayq.ConfigurationError:
        pass
    else:
        raise AssertionError("a bulk cancel without a reason must be refused")
    result = app.bulk("cancel", match, reason="type retired", by="ops", job_ids=ids)
    assert result.changed == ids[1:] and result.skipped == ids[:1]
    (event,) = [e for e in app.trace(ids[1]) if e.name == "job.cancelled"]
    assert event.data == {"reason": "type retired", "by": "ops", "bulk_action": result.action_id}


def recorded(ctx: replayq.Context, n: int) -> int:
    return int(ctx.call("lookup", lambda: n + 1))


def recorded_jobs(
    app_factory: Callable[..., replayq.App], tmp_path: Path, monkeypatch: Any, count: int
) -> tuple[replayq.App, list[int]]:
    """``count`` recorded jobs, and an importable ``bulk_dry_run_app:app`` for ``--app``."""
    (tmp_path / "bulk_dry_run_app.py").write_text(
        "import replayq\n"
        "from tests.conformance.test_bulk_actions import recorded\n"
        "app = replayq.App()\n"
        "app.job('recorded')(recorded)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    app = app_factory()
    app.job("recorded")(recorded)
    ids = [app.enqueue("recorded", {"n": n}) for n in range(count)]
    replayq.Worker(app, burst=True).run()
    return app, ids


def test_bulk_dry_run_summarises_the_divergences_of_every_matching_job(
    app_factory: Callable[..., replayq.App], db_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    _, ids = recorded_jobs(app_factory, tmp_path, monkeypatch, 3)
    result = CliRunner().invoke(
        main,
        [
            "--db",
            db_url,
            "jobs",
            "dry-run",
            "--app",
            "bulk_dry_run_app:app",
            "--type",
            "recorded",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["matched"] == len(ids)
    assert summary["outcomes"] == {"same": 3} and summary["diverged"] == []


def test_bulk_dry_run_in_worker_processes_with_no_keep_writes_nothing(
    app_factory: Callable[..., replayq.App], db_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    app, ids = recorded_jobs(app_factory, tmp_path, monkeypatch, 4)
    command = ["--db", db_url, "jobs", "dry-run", "--app", "bulk_dry_run_app:app"]
    command += ["--type", "recorded", "--json"]

    traces = [app.get_job(i).trace_id for i in ids]

    unkept = CliRunner().invoke(main, [*command, "--no-keep", "--processes", "2"])
    with app.storage.transaction(readonly=True) as tx:
        derived = [tx.lineage_list(LineageQuery(source_trace_id=trace_id)) for trace_id in traces]
    kept = CliRunner().invoke(main, [*command, "--processes", "2"])

    assert unkept.exit_code == 0 and kept.exit_code == 0, unkept.output + kept.output
    assert json.loads(unkept.output) == json.loads(kept.output)
    assert json.loads(unkept.output)["outcomes"] == {"same": 4}
    assert derived == [[], [], [], []], "a --no-keep dry-run wrote a derived trace"
    with app.storage.transaction(readonly=True) as tx:
        assert all(
            len(tx.lineage_list(LineageQuery(source_trace_id=trace_id))) == 1 for trace_id in traces
        )
