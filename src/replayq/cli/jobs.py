"""``replayq worker``, ``enqueue``, ``jobs``, ``dead``, ``stats``, ``signals``: the queue."""

from __future__ import annotations

import json
from typing import Any

import click

import replayq
from replayq.cli import bulk, render
from replayq.cli.env import Env, JobId, emit_json, log_options, pass_env


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Jobs run at once.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=replayq.Worker.default_prefetch,
    show_default=True,
    help="Jobs leased ahead of the free executors (given back at once on stop).",
)
@click.option(
    "--prefetch-window",
    type=click.FloatRange(min=0),
    default=replayq.Worker.default_prefetch_window,
    show_default=True,
    help="Lease ahead only the jobs the executors finish in this many seconds at the recent "
    "pace (inf: always --prefetch).",
)
@click.option(
    "--ack-window",
    type=click.FloatRange(min=0),
    default=replayq.Worker.default_ack_window,
    show_default=True,
    help="Seconds a success's ack may wait in memory to commit with others.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit when no job is due (and --burst-wait finds none due soon); says how many "
    "are scheduled later.",
)
@click.option(
    "--burst-wait",
    default=0.0,
    show_default=True,
    help="With --burst: wait for delayed and retrying jobs due within this many seconds.",
)
@click.option("--queues", default=None, help="Comma-separated queues (default: all).")
@click.option("--grace", default=30.0, show_default=True, help="Seconds in-flight jobs get.")
@click.option("--worker-id", default=None, help="Name in traces (default: host:pid:random).")
@click.option(
    "--poll-interval",
    default=0.2,
    show_default=True,
    help="Seconds between looks for work when idle (a wake-up comes sooner: NOTIFY on "
    "PostgreSQL, a watch of the file on SQLite).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve this worker's Prometheus metrics on /metrics (needs replayq[metrics]).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics server binds to.",
)
@click.option(
    "--otel",
    is_flag=True,
    help="Export an OpenTelemetry span per attempt (needs replayq[otel]); the exporter and "
    "its settings come from the standard OTEL_* variables (OTEL_TRACES_EXPORTER: otlp by "
    "default, or console; OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_ENDPOINT...).",
)
@click.option(
    "--no-scheduler",
    "no_scheduler",
    is_flag=True,
    help="Do not enqueue the app's periodic jobs here (each slot is enqueued once anyway).",
)
@log_options
@pass_env
def worker(
    env: Env,
    app_spec: str,
    concurrency: int,
    prefetch: int,
    prefetch_window: float,
    ack_window: float,
    burst: bool,
    burst_wait: float,
    queues: str | None,
    grace: float,
    worker_id: str | None,
    poll_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    otel: bool,
    no_scheduler: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Run a worker (and, unless --no-scheduler, the scheduler of periodic jobs)."""
    replayq.configure_logging(log_level, log_format)
    app = env.app(app_spec)
    observers: list[replayq.Observer] = []
    if metrics_port is not None:
        # A lambda: the storage opens at the first scrape, not here, so a worker started
        # while the database is unavailable waits for it instead of exiting.
        metrics = replayq.WorkerMetrics(
            app.get_job_or_none, connections=lambda: app.storage.connections()
        )
        replayq.serve_metrics(metrics.registry, metrics_port, metrics_host)
        observers.append(metrics)
    provider = None
    if otel:
        try:
            provider = replayq.otel_provider_from_env()
        except replayq.ConfigurationError as exc:
            raise click.ClickException(str(exc)) from exc
    if provider is not None:
        from opentelemetry import trace

        # Global too: the handler's own spans and ctx.enqueue's producer spans export alike.
        trace.set_tracer_provider(provider)
        observers.append(replayq.AttemptTracer(provider))
    run = replayq.Worker(
        app,
        concurrency=concurrency,
        prefetch=prefetch,
        prefetch_window=prefetch_window,
        ack_window=ack_window,
        burst=burst,
        burst_wait=burst_wait,
        queues=queues.split(",") if queues else None,
        grace_period=grace,
        worker_id=worker_id,
        poll_interval=poll_interval,
        observers=observers,
        scheduler=not no_scheduler,
    )
    try:
        stats = run.run()
    finally:
        if provider is not None:
            provider.shutdown()  # flush the batch of spans not yet exported
    click.echo(
        f"worker {run.worker_id}: leased={stats.leased} succeeded={stats.succeeded} "
        f"retried={stats.retried} dead={stats.dead} rejected={stats.rejected} "
        f"released={stats.released} cancelled={stats.cancelled} lost={stats.lost}",
        err=True,
    )
    if stats.scheduled_later and stats.next_run_at is not None:
        due_in = max(0.0, stats.next_run_at - app.clock.now())
        click.echo(
            f"worker {run.worker_id}: {stats.scheduled_later} job(s) scheduled later, the "
            f"first due in {due_in:.1f}s (--burst-wait SECONDS waits for them)",
            err=True,
        )


@click.command()
@click.argument("job_type")
@click.option("--payload", default="{}", help="JSON object.")
@click.option("--message-id", default=None, help="Dedup key: the same id yields the same job.")
@click.option("--delay", default=None, help="e.g. 30s, 5m")
@click.option("--priority", default=0, help="Higher runs first.")
@click.option(
    "--app",
    "app_spec",
    default=None,
    help="Validate against this app's handlers (default: the active version's stored contract).",
)
@pass_env
def enqueue(
    env: Env,
    job_type: str,
    payload: str,
    message_id: str | None,
    delay: str | None,
    priority: int,
    app_spec: str | None,
) -> None:
    """Enqueue one job under its contract (ordering, idempotency, attempts); prints its id."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"--payload is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise click.UsageError("--payload nests too deeply to be read") from exc
    app = env.app(app_spec)
    job_id = app.enqueue(
        job_type,
        body,
        message_id=message_id,
        delay=delay,
        priority=priority,
        check=app_spec is not None,
        # Without --app: the stored contract of the active version, or a clear refusal.
        require_contract=app_spec is None,
    )
    click.echo(job_id)


@click.group()
def jobs() -> None:
    """List, show and cancel jobs."""


@jobs.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in replayq.JobState]),
    help="Only jobs in this state (repeatable).",
)
@click.option("--type", "job_type", default=None, help="Only jobs of this type.")
@click.option("--limit", default=50, show_default=True, help="Show at most this many.")
@click.option("--all-origins", is_flag=True, help="Include replay, fork and rerun jobs.")
@click.option(
    "--version", "version", default=None, help="Only jobs routed to this handler version."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_list(
    env: Env,
    states: tuple[str, ...],
    job_type: str | None,
    limit: int,
    all_origins: bool,
    version: str | None,
    as_json: bool,
) -> None:
    """List jobs, newest first (``--version v2 --state running``: what is still on v2)."""
    found = env.app().list_jobs(
        states=states or None,
        job_type=job_type,
        origin=None if all_origins else "production",
        limit=limit,
        version=version,
    )
    if as_json:
        emit_json([job.to_dict() for job in found])
    else:
        click.echo(render.job_table(found))


@jobs.command("show")
@click.argument("job_id", type=JobId)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_show(env: Env, job_id: int, as_json: bool) -> None:
    """Show one job."""
    job = env.app().get_job(job_id)
    if as_json:
        emit_json(job.to_dict())
    else:
        click.echo(render.job_detail(job))


@jobs.command("cancel")
@click.argument("job_id", type=JobId, required=False)
@bulk.filter_options
@click.option("--reason", default=None, help="Why; recorded in each job's trace (bulk).")
@click.option("--yes", is_flag=True, help="Act; without it a bulk cancel only previews.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_cancel(
    env: Env, /, job_id: int | None, reason: str | None, yes: bool, as_json: bool, **filters: Any
) -> None:
    """Cancel a queued job or stop a running one; no JOB_ID: every job the filters select."""
    if job_id is None:
        bulk.run_bulk(env, "cancel", reason, yes, as_json, **filters)
        return
    app = env.app()
    if not app.cancel(job_id):
        raise click.ClickException(
            f"job {job_id} is neither queued nor running; only those can be cancelled"
        )
    if app.get_job(job_id).state == replayq.JobState.RUNNING:
        click.echo(f"job {job_id} asked to stop; it stops at its next step boundary")
    else:
        click.echo(f"job {job_id} cancelled")


@jobs.command("requeue")
@bulk.filter_options
@click.option("--reason", default=None, help="Why; recorded in each job's trace.")
@click.option("--yes", is_flag=True, help="Act; without it only a preview is printed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_requeue(env: Env, /, reason: str | None, yes: bool, as_json: bool, **filters: Any) -> None:
    """Requeue every dead job the filters select, one more attempt each (preview, then --yes)."""
    bulk.run_bulk(env, "requeue", reason, yes, as_json, **filters)


@jobs.command("dry-run")
@bulk.filter_options
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--with-version", "with_version", default=None, help="Replay with this version.")
@click.option("--no-keep", is_flag=True, help="Write nothing (no derived traces, branches).")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes (each imports --app and opens the database itself).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_dry_run(
    env: Env,
    /,
    app_spec: str,
    with_version: str | None,
    no_keep: bool,
    processes: int,
    as_json: bool,
    **filters: Any,
) -> None:
    """Dry-run every recorded job the filters select; print a summary of the divergences.

    Each dry-run writes its derived trace, branch state and lineage at its end
    (a batch's together); --no-keep writes nothing (verification only).
    """
    bulk.bulk_dry_run(
        env, app_spec, with_version, as_json, keep=not no_keep, processes=processes, **filters
    )


@click.group()
def dead() -> None:
    """The investigation queue."""


@dead.command("list")
@click.option("--type", "job_type", default=None, help="Only jobs of this type.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def dead_list(env: Env, job_type: str | None, as_json: bool) -> None:
    """List dead jobs with their reasons."""
    found = env.app().list_jobs(states=["dead"], job_type=job_type)
    if as_json:
        emit_json([job.to_dict() for job in found])
    else:
        click.echo(render.job_table(found))


@dead.command("requeue")
@click.argument("job_ids", type=JobId, nargs=-1)
@click.option("--reason", required=True, help="Why; recorded in the job's trace.")
@click.option("--type", "job_type", default=None, help="Every dead job of this type (no JOB_IDS).")
@click.option(
    "--version", "version", default=None, help="With --type: only those that ran this version."
)
@click.option(
    "--to-version",
    default=None,
    help="Run them under this version (default: routed afresh at their next lease).",
)
@pass_env
def dead_requeue(
    env: Env,
    job_ids: tuple[int, ...],
    reason: str,
    job_type: str | None,
    version: str | None,
    to_version: str | None,
) -> None:
    """Put dead jobs back in the queue with one more attempt each."""
    app = env.app()
    if not job_ids and job_type is None:
        raise click.UsageError("give JOB_IDS, or --type (and --version) to requeue a selection")
    ids = list(job_ids) or [
        job.id
        for job in app.list_jobs(states=["dead"], job_type=job_type, version=version, limit=100_000)
    ]
    from rich.progress import Progress

    # A bar when a selection is requeued (--type); job ids given one by one need none.
    with Progress(disable=bool(job_ids)) as bar:
        task = bar.add_task("requeue", total=len(ids))
        for job_id in ids:
            if not app.requeue(job_id, reason=reason, to_version=to_version):
                raise click.ClickException(f"job {job_id} is not dead")
            target = f" to {to_version}" if to_version else ""
            click.echo(f"job {job_id} requeued{target}")
            bar.advance(task)
    if not ids:
        click.echo("no dead jobs match")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def stats(env: Env, as_json: bool) -> None:
    """Depth per type and state, oldest queued age."""
    app = env.app()
    rows = app.stats()
    if as_json:
        emit_json([vars(r) for r in rows])
    else:
        click.echo(render.stats_table(rows, app.clock.now()))


@click.command()
@click.option(
    "--since",
    default=None,
    help="Only this recent (1h, 30m), or from a time (2026-11-30T18:00).",
)
@click.option("--until", default=None, help="With --by: up to this time (same forms).")
@click.option(
    "--by",
    type=click.Choice(["second", "minute", "hour"]),
    default=None,
    help="A time series: counts per bucket, job type and version.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def signals(env: Env, since: str | None, until: str | None, by: str | None, as_json: bool) -> None:
    """Incident signals per job type, counted from the trace (re-deliveries, conflicts, ...)."""

    app = env.app()
    now = app.clock.now()
    cutoff = bulk.parse_moment(since, now, "--since")
    if by is not None:
        series = replayq.signal_series(
            app, by=by, since=cutoff, until=bulk.parse_moment(until, now, "--until")
        )
        if as_json:
            emit_json([vars(p) for p in series])
        elif not series:
            click.echo("(no signals)")
        else:
            click.echo(f"{'time':<20} {'type':<20} {'version':<8} {'signal':<40} {'count':>6}")
            for p in series:
                click.echo(
                    f"{render.date_time(p.bucket):<20} {p.job_type:<20} {p.version or '-':<8} "
                    f"{p.signal:<40} {p.count:>6}"
                )
        return
    counts = replayq.signal_counts(app, since=cutoff)
    if as_json:
        emit_json([vars(c) for c in counts])
        return
    if not counts:
        click.echo("(no signals)")
        return
    click.echo(f"{'type':<24} {'signal':<46} {'count':>7}")
    for c in counts:
        click.echo(f"{c.job_type:<24} {c.signal:<46} {c.count:>7}")
