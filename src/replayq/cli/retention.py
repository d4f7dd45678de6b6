"""``replayq gc`` and ``replayq keep``: retention in tiers, applied; jobs pinned against it."""

from __future__ import annotations

import dataclasses
import logging
import sys

import click

from replayq.cli.env import Env, emit_json, pass_env


@click.command()
@click.option("--app", "app_spec", default=None, help="The app whose retention applies.")
@click.option("--dry-run", is_flag=True, help="Count what would be collected; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (no bar).")
@click.option("--batch", default=500, show_default=True, help="Jobs per transaction.")
@click.option(
    "--pause",
    default=0.05,
    show_default=True,
    help="Seconds to sleep between batches (the throttle beside running workers).",
)
@click.option(
    "--max-batches",
    type=int,
    default=None,
    help="Stop after this many batches (the next gc resumes where this one stopped).",
)
@pass_env
def gc(
    env: Env,
    app_spec: str | None,
    dry_run: bool,
    as_json: bool,
    batch: int,
    pause: float,
    max_batches: int | None,
) -> None:
    """Apply the retention tiers: trim finished jobs past their full tier to their
    lifecycle, effects and state writes; delete those past their ledger tier.

    Resumable (where a pass got to is recorded), throttled, and safe beside running
    workers: only finished jobs past their tier, never a kept one, never one a
    younger replay, fork or rerun was derived from, never one a live fork or rerun holds.
    Then the derived traces past their days, then the blobs nothing references.
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    app = env.app(app_spec)
    # A kept ledger day is printed below as this command's error, once: not a second time
    # by a handler on the root logger (the command's own, which loads --app) nor by
    # logging's last resort (none configured); restored after the pass.
    retention_log = logging.getLogger("replayq.retention")
    quiet = logging.NullHandler()
    retention_log.addHandler(quiet)
    propagates, retention_log.propagate = retention_log.propagate, False
    show = not as_json and sys.stderr.isatty()
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        TextColumn("{task.completed} jobs scanned"),
        TimeElapsedColumn(),
        disable=not show,
        transient=True,
    ) as bar:
        task = bar.add_task("gc (dry run)" if dry_run else "gc", total=None)
        try:
            report = app.gc(
                dry_run=dry_run,
                batch=batch,
                pause=pause,
                max_batches=max_batches,
                progress=lambda done, _cursor: bar.update(task, completed=done),
            )
        finally:
            retention_log.removeHandler(quiet)
            retention_log.propagate = propagates
    if as_json:
        emit_json(dataclasses.asdict(report))
        if report.partitions_kept:
            raise SystemExit(1)
        return
    if not app.retention_policy().configured():
        click.echo(
            "no retention configured (App(retention=Retention(full_days=...)) or a job "
            "contract's retention=): nothing to do"
        )
        return
    verb = "would trim" if dry_run else "trimmed"
    gone = "would delete" if dry_run else "deleted"
    click.echo(
        f"scanned {report.scanned} finished jobs past their full tier "
        f"(from job id > {report.resumed_from}); {verb} {report.trimmed_jobs} to the ledger "
        f"({report.events_removed} events); {gone} {report.purged_jobs}; "
        + (
            f"dropped {report.partitions_dropped} ledger day partitions; "
            if report.partitions_dropped
            else ""
        )
        + f"{gone} {report.derived_traces} derived traces and {report.blobs} unreferenced "
        f"blobs ({report.blob_bytes} bytes); {report.seconds:.2f}s"
        + ("" if report.complete else "; stopped early, resumes next run")
    )
    if report.partitions_kept:
        # Retention is a promise: an expired day kept is an error the operator must see.
        for kept in report.partitions_kept:
            click.echo(
                f"error: kept the expired ledger day partition {kept} (objects of yours "
                "depend on it; drop or move them and run gc again)",
                err=True,
            )
        raise SystemExit(1)


@click.command()
@click.argument("job_id", type=int)
@click.option(
    "--reason", required=True, help="Why the job is kept (App.kept() lists the kept jobs and why)."
)
@click.option("--app", "app_spec", default=None, help="Import the app from module:attribute.")
@pass_env
def keep(env: Env, job_id: int, reason: str, app_spec: str | None) -> None:
    """Pin JOB_ID: gc never collects any of it, whatever its retention tier."""
    env.app(app_spec).keep(job_id, reason)
    click.echo(f"job {job_id} kept: {reason}")
