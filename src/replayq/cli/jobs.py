"""``replayq worker``, ``enqueue``, ``jobs``, ``dead``, ``stats``, ``signals``: the queue."""

from __future__ import annotations

import json

import click

import replayq
from replayq.cli import render
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
    help="Seconds between looks for work when idle (PostgreSQL also wakes on NOTIFY).",
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
@log_options
@pass_env
def worker(
    env: Env,
    app_spec: str,
    concurrency: int,
    burst: bool,
    burst_wait: float,
    queues: str | None,
    grace: float,
    worker_id: str | None,
    poll_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    log_format: str,
) -> None:
    """Run a worker."""
    replayq.configure_logging(log_level, log_format)
    app = env.app(app_spec)
    observers: list[replayq.Observer] = []
    if metrics_port is not None:
        metrics = replayq.WorkerMetrics(app.get_job_or_none)
        replayq.serve_metrics(metrics.registry, metrics_port, metrics_host)
        observers.append(metrics)
    run = replayq.Worker(
        app,
        concurrency=concurrency,
        burst=burst,
        burst_wait=burst_wait,
        queues=queues.split(",") if queues else None,
        grace_period=grace,
        worker_id=worker_id,
        poll_interval=poll_interval,
        observers=observers,
    )
    stats = run.run()
    click.echo(
        f"worker {run.worker_id}: leased={stats.leased} succeeded={stats.succeeded} "
        f"retried={stats.retried} dead={stats.dead} rejected={stats.rejected} "
        f"released={stats.released}",
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def jobs_list(
    env: Env,
    states: tuple[str, ...],
    job_type: str | None,
    limit: int,
    all_origins: bool,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    found = env.app().list_jobs(
        states=states or None,
        job_type=job_type,
        origin=None if all_origins else "production",
        limit=limit,
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
@click.argument("job_id", type=JobId)
@pass_env
def jobs_cancel(env: Env, job_id: int) -> None:
    """Cancel a queued job."""
    if not env.app().cancel(job_id):
        raise click.ClickException(f"job {job_id} is not queued; only queued jobs can be cancelled")
    click.echo(f"job {job_id} cancelled")


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
@click.argument("job_id", type=JobId)
@click.option("--reason", required=True, help="Why; recorded in the job's trace.")
@pass_env
def dead_requeue(env: Env, job_id: int, reason: str) -> None:
    """Put a dead job back in the queue with one more attempt."""
    if not env.app().requeue(job_id, reason=reason):
        raise click.ClickException(f"job {job_id} is not dead")
    click.echo(f"job {job_id} requeued")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def stats(env: Env, as_json: bool) -> None:
    """Depth per type and state, oldest queued age."""
    app = env.app()
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.job_stats()
    if as_json:
        emit_json([vars(r) for r in rows])
    else:
        click.echo(render.stats_table(rows, app.clock.now()))


@click.command()
@click.option("--since", default=None, help="Only this recent, e.g. 1h, 30m.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def signals(env: Env, since: str | None, as_json: bool) -> None:
    """Incident signals per job type, counted from the trace (re-deliveries, conflicts, ...)."""

    app = env.app()
    cutoff = app.clock.now() - replayq.parse_duration(since, name="--since") if since else None
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
