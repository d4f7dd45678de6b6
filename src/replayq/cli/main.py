"""The ``replayq`` command line: a thin layer over the public Python API."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import click

from replayq import codec
from replayq.app import App
from replayq.cli import render
from replayq.errors import ReplayqError
from replayq.model import JobState
from replayq.queue.contracts import JobContract, diff_contracts, lint_contract
from replayq.worker import Worker


class Env:
    """What the root command collected: the database URL and, if given, the user's app."""

    def __init__(self, db: str | None) -> None:
        self.db = db
        self._app: App | None = None

    def app(self, spec: str | None = None) -> App:
        if self._app is None:
            self._app = load_app(spec) if spec else App(self.db)
            if spec and self.db:
                self._app = self._app.on_database(self.db)
        return self._app


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the ``App`` it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r}: use module:attribute, e.g. shop.jobs:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is not a replayq.App")
    return app


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


pass_env = click.make_pass_decorator(Env)


class Cli(click.Group):
    """Turns replayq errors into one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayqError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=Cli)
@click.option("--db", envvar="REPLAYQ_DB", help="Database URL (default: $REPLAYQ_DB).")
@click.pass_context
def main(ctx: click.Context, db: str | None) -> None:
    """replayq: a job queue whose executions can be traced, replayed, forked and reversed."""
    ctx.obj = Env(db)


@main.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--concurrency", default=1, show_default=True)
@click.option("--burst", is_flag=True, help="Exit when nothing is left to do.")
@click.option("--queues", default=None, help="Comma-separated queues (default: all).")
@click.option("--grace", default=30.0, show_default=True, help="Seconds in-flight jobs get.")
@click.option("--worker-id", default=None)
@click.option("--poll-interval", default=0.2, show_default=True)
@pass_env
def worker(
    env: Env,
    app_spec: str,
    concurrency: int,
    burst: bool,
    queues: str | None,
    grace: float,
    worker_id: str | None,
    poll_interval: float,
) -> None:
    """Run a worker."""
    app = env.app(app_spec)
    run = Worker(
        app,
        concurrency=concurrency,
        burst=burst,
        queues=queues.split(",") if queues else None,
        grace_period=grace,
        worker_id=worker_id,
        poll_interval=poll_interval,
    )
    stats = run.run()
    click.echo(
        f"worker {run.worker_id}: leased={stats.leased} succeeded={stats.succeeded} "
        f"retried={stats.retried} dead={stats.dead} rejected={stats.rejected} "
        f"released={stats.released}",
        err=True,
    )


@main.command()
@click.argument("job_type")
@click.option("--payload", default="{}", help="JSON object.")
@click.option("--message-id", default=None)
@click.option("--delay", default=None, help="e.g. 30s, 5m")
@click.option("--priority", default=0)
@click.option("--app", "app_spec", default=None, help="Validate against this app's handlers.")
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
    """Enqueue one job; prints its id."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"--payload is not valid JSON: {exc}") from exc
    app = env.app(app_spec)
    job_id = app.enqueue(
        job_type,
        body,
        message_id=message_id,
        delay=delay,
        priority=priority,
        check=app_spec is not None,
    )
    click.echo(job_id)


@main.group()
def jobs() -> None:
    """List, show and cancel jobs."""


@jobs.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice([s.value for s in JobState]))
@click.option("--type", "job_type", default=None)
@click.option("--limit", default=50, show_default=True)
@click.option("--all-origins", is_flag=True, help="Include replay, fork and rerun jobs.")
@click.option("--json", "as_json", is_flag=True)
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
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_env
def jobs_show(env: Env, job_id: int, as_json: bool) -> None:
    """Show one job."""
    job = env.app().get_job(job_id)
    if as_json:
        emit_json(job.to_dict())
    else:
        click.echo(render.job_detail(job))


@jobs.command("cancel")
@click.argument("job_id", type=int)
@pass_env
def jobs_cancel(env: Env, job_id: int) -> None:
    """Cancel a queued job."""
    if not env.app().cancel(job_id):
        raise click.ClickException(f"job {job_id} is not queued; only queued jobs can be cancelled")
    click.echo(f"job {job_id} cancelled")


@main.group()
def dead() -> None:
    """The investigation queue."""


@dead.command("list")
@click.option("--type", "job_type", default=None)
@click.option("--json", "as_json", is_flag=True)
@pass_env
def dead_list(env: Env, job_type: str | None, as_json: bool) -> None:
    """List dead jobs with their reasons."""
    found = env.app().list_jobs(states=["dead"], job_type=job_type)
    if as_json:
        emit_json([job.to_dict() for job in found])
    else:
        click.echo(render.job_table(found))


@dead.command("requeue")
@click.argument("job_id", type=int)
@click.option("--reason", required=True, help="Why; recorded in the job's trace.")
@pass_env
def dead_requeue(env: Env, job_id: int, reason: str) -> None:
    """Put a dead job back in the queue with one more attempt."""
    if not env.app().requeue(job_id, reason=reason):
        raise click.ClickException(f"job {job_id} is not dead")
    click.echo(f"job {job_id} requeued")


@main.group("trace")
def trace_group() -> None:
    """Read traces."""


@trace_group.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_env
def trace_show(env: Env, job_id: int, as_json: bool) -> None:
    """A job's timeline: every attempt, decision and transition."""
    app = env.app()
    app.get_job(job_id)
    events = app.trace(job_id)
    if as_json:
        emit_json([vars(e) for e in events])
    else:
        click.echo(render.timeline(events))


@trace_group.command("resource")
@click.argument("resource")
@click.option(
    "--leases", is_flag=True, help="Also show the lease transitions of the jobs that touched it."
)
@click.option("--json", "as_json", is_flag=True)
@pass_env
def trace_resource(env: Env, resource: str, leases: bool, as_json: bool) -> None:
    """Every event on one resource across jobs and workers, in happens-before order."""
    events = env.app().resource_trace(resource, leases=leases)
    if as_json:
        emit_json([vars(e) for e in events])
    else:
        click.echo(render.timeline(events, show_job=True))


@main.command()
@click.option("--json", "as_json", is_flag=True)
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


@main.command()
@click.option("--since", default=None, help="Only this recent, e.g. 1h, 30m.")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def signals(env: Env, since: str | None, as_json: bool) -> None:
    """Incident signals per job type, counted from the trace (re-deliveries, conflicts, ...)."""
    from replayq.durations import parse_duration
    from replayq.replay.signals import signal_counts

    app = env.app()
    cutoff = app.clock.now() - parse_duration(since, name="--since") if since else None
    counts = signal_counts(app, since=cutoff)
    if as_json:
        emit_json([vars(c) for c in counts])
        return
    if not counts:
        click.echo("(no signals)")
        return
    click.echo(f"{'type':<24} {'signal':<46} {'count':>7}")
    for c in counts:
        click.echo(f"{c.job_type:<24} {c.signal:<46} {c.count:>7}")


@main.group()
def db() -> None:
    """Schema migrations."""


@db.command("upgrade")
@pass_env
def db_upgrade(env: Env) -> None:
    """Apply pending migrations."""
    app = App(env.db, auto_migrate=False)
    applied = open_raw(app).migrate(app.clock.now())
    for status in applied:
        click.echo(f"applied {status.version:04d}_{status.name}")
    if not applied:
        click.echo("schema is up to date")


@db.command("status")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def db_status(env: Env, as_json: bool) -> None:
    """List migrations and whether each is applied."""
    statuses = open_raw(App(env.db, auto_migrate=False)).migration_status()
    if as_json:
        emit_json([vars(s) for s in statuses])
        return
    for status in statuses:
        state = "applied " + render.timestamp(status.applied_at) if status.applied_at else "PENDING"
        click.echo(f"{status.version:04d}_{status.name:<24} {state}")


def open_raw(app: App) -> Any:
    from replayq.storage import open_storage

    return open_storage(app.url)


@main.group()
def contract() -> None:
    """Show, diff and lint stored job contracts."""


def _stored(app: App, job_type: str) -> dict[str, JobContract]:
    found = {c.version: c for c in app.contracts(job_type)}
    if not found:
        raise click.ClickException(
            f"no stored contract for {job_type!r}; contracts are stored when a worker starts"
        )
    return found


@contract.command("show")
@click.argument("job_type")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def contract_show(env: Env, job_type: str, as_json: bool) -> None:
    """Every stored version of a job type's contract."""
    found = _stored(env.app(), job_type)
    if as_json:
        emit_json({v: c.to_dict() for v, c in found.items()})
        return
    for version, item in found.items():
        click.echo(f"{job_type} {version}")
        for key, value in item.to_dict().items():
            if key not in ("name", "version"):
                click.echo(f"  {key:<18} {codec.dumps(value)}")


@contract.command("diff")
@click.argument("job_type")
@click.argument("old")
@click.argument("new")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def contract_diff(env: Env, job_type: str, old: str, new: str, as_json: bool) -> None:
    """Every operational difference between two versions (exit 1 if any)."""
    found = _stored(env.app(), job_type)
    for version in (old, new):
        if version not in found:
            raise click.ClickException(f"{job_type} has no stored version {version!r}")
    changes = diff_contracts(found[old], found[new])
    if as_json:
        emit_json([vars(c) for c in changes])
    elif not changes:
        click.echo(f"{job_type}: {old} and {new} have the same contract")
    else:
        for change in changes:
            click.echo(f"{change.concern:<28} {change.field:<20} {change.old!r} -> {change.new!r}")
    sys.exit(1 if changes else 0)


@contract.command("lint")
@click.argument("job_type", required=False)
@click.option("--json", "as_json", is_flag=True)
@pass_env
def contract_lint(env: Env, job_type: str | None, as_json: bool) -> None:
    """Flag contracts that break the rules (exit 1 if any finding)."""
    app = env.app()
    findings = []
    for item in app.contracts(job_type):
        with app.storage.transaction(readonly=True) as tx:
            durations = sorted(tx.job_durations(item.name, item.version))
        p99 = durations[min(len(durations) - 1, int(len(durations) * 0.99))] if durations else None
        findings.extend(lint_contract(item, p99_duration=p99))
    if as_json:
        emit_json([vars(f) for f in findings])
    elif not findings:
        click.echo("no findings")
    else:
        for finding in findings:
            click.echo(f"{finding.job_type} {finding.version}: {finding.rule}: {finding.message}")
    sys.exit(1 if findings else 0)


@main.group()
def locks() -> None:
    """Lease locks: who holds what, with fencing tokens."""


@locks.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def locks_list(env: Env, as_json: bool) -> None:
    """Held locks: resource, owner, fencing token, age, TTL left."""
    from replayq.recording.locks import list_locks

    app = env.app()
    held = list_locks(app)
    if as_json:
        emit_json([vars(lock) for lock in held])
        return
    if not held:
        click.echo("(no locks held)")
        return
    now = app.clock.now()
    click.echo(f"{'resource':<28} {'token':>6}  {'job':>6}  {'age':>8}  {'ttl left':>8}  owner")
    for lock in held:
        age = now - (lock.acquired_at or now)
        left = (lock.expires_at or now) - now
        click.echo(
            f"{lock.resource:<28} {lock.fencing_token:>6}  {lock.job_id or '-':>6}  "
            f"{age:>7.1f}s  {left:>7.1f}s  {lock.worker_id}"
        )


@locks.command("break")
@click.argument("resource")
@click.option("--reason", required=True, help="Why; recorded in the trace.")
@pass_env
def locks_break(env: Env, resource: str, reason: str) -> None:
    """Force a lock free; the old holder's later writes are fenced off."""
    from replayq.recording.locks import break_lock

    broken = break_lock(env.app(), resource, reason=reason)
    if broken is None:
        raise click.ClickException(f"no lock is held on {resource!r}")
    click.echo(f"broke lock {resource} (was held by {broken.worker_id}, job {broken.job_id})")


@main.group()
def outbox() -> None:
    """The transactional outbox."""


@outbox.command("run")
@click.option("--sink", default="job", show_default=True, help="job, redis://..., http(s)://...")
@click.option("--app", "app_spec", default=None, help="module:attribute of your replayq.App")
@click.option("--once", is_flag=True, help="Publish what is pending, then exit.")
@click.option("--interval", default=1.0, show_default=True)
@pass_env
def outbox_run(env: Env, sink: str, app_spec: str | None, once: bool, interval: float) -> None:
    """Publish outbox rows to a sink, at least once, with a stable event id."""
    import time

    from replayq.recording.outbox import open_sink, publish_pending

    app = env.app(app_spec)
    target = open_sink(app, sink)
    while True:
        result = publish_pending(app, target)
        if result.published or result.failed:
            click.echo(f"published={result.published} failed={result.failed}")
        if once and result.published + result.failed == 0:
            return
        if not once and result.published == 0:
            time.sleep(interval)


@main.group()
def state() -> None:
    """Versioned entity state."""


@state.command("history")
@click.argument("namespace")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def state_history(env: Env, namespace: str, key: str, as_json: bool) -> None:
    """Every version of an entity with the job that wrote it."""
    versions = env.app().state.history(namespace, key)
    if as_json:
        emit_json([vars(v) for v in versions])
        return
    for v in versions:
        click.echo(
            f"v{v.version:<4} parent={v.parent_version or '-':<4} job={v.job_id or '-':<6} "
            f"token={v.fencing_token or '-':<4} {render.timestamp(v.created_at)}  "
            f"delta={codec.dumps(v.delta)}"
        )


def _parse_assignments(items: tuple[str, ...], what: str) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: use {what} field=value")
        try:
            parsed[name] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[name] = raw
    return parsed


def _print_report(report: Any, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_dict())
        return
    click.echo(
        f"{report.mode} of job {report.job_id} attempt {report.attempt} with {report.version}"
    )
    click.echo(f"  derived trace: {report.trace_id} (branch {report.branch})")
    if report.fork_step:
        click.echo(f"  fork point: step {report.fork_step!r} (reached: {report.reached_fork})")
    click.echo(
        f"  outcome: recorded {report.outcome_recorded.status}, now {report.outcome_now.status}"
    )
    if report.error:
        click.echo(f"  stopped: {report.error}")
    where = report.first_divergence
    if where is None:
        click.echo("  no divergence: the run matched the recording event by event")
    else:
        click.echo(f"  FIRST DIVERGENCE at step {where.step!r}, event #{where.index}")
        click.echo(f"    recorded (seq {where.recorded_seq}): {where.recorded}")
        click.echo(f"    now      (seq {where.now_seq}): {where.now}")
        click.echo(f"    {where.reason}")
    for row in report.decisions:
        click.echo(f"  decision {row['decision']}: recorded {row['recorded']} now {row['now']}")
    for row in report.state_writes:
        click.echo(f"  state {row['resource']}: recorded {row['recorded']} now {row['now']}")


@main.command()
@click.argument("job_id", type=int)
@click.option("--app", "app_spec", default=None, help="module:attribute (needed to execute).")
@click.option("--mode", type=click.Choice(["trace", "dry-run"]), default="trace", show_default=True)
@click.option("--attempt", type=int, default=None)
@click.option("--version", default=None, help="Run this declared handler version.")
@click.option("--handler", "handler_spec", default=None, help="Run module:function instead.")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def replay(
    env: Env,
    job_id: int,
    app_spec: str | None,
    mode: str,
    attempt: int | None,
    version: str | None,
    handler_spec: str | None,
    as_json: bool,
) -> None:
    """Trace replay (no execution) or deterministic dry-run (exit 1 if it diverged)."""
    from replayq.replay.engine import dry_run, trace_replay

    app = env.app(app_spec)
    if mode == "trace":
        timelines = trace_replay(app, job_id)
        if as_json:
            emit_json(
                [
                    {
                        "attempt": t.attempt,
                        "worker": t.worker_id,
                        "side_effect_steps": t.side_effect_steps,
                        "events": [vars(e) for e in t.events],
                    }
                    for t in timelines
                ]
            )
            return
        for t in timelines:
            label = "enqueue" if t.attempt == 0 else f"attempt {t.attempt}"
            effects = ", ".join(t.side_effect_steps) or "none"
            click.echo(f"== {label} (worker {t.worker_id or '-'}; real side effects in: {effects})")
            click.echo(render.timeline(t.events))
        return
    if app_spec is None:
        raise click.UsageError("--mode dry-run executes handler code: give --app module:app")
    report = dry_run(app, job_id, attempt=attempt, version=version, handler=handler_spec)
    _print_report(report, as_json)
    sys.exit(1 if report.diverged else 0)


@main.command("fork")
@click.argument("job_id", type=int)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--from-step", required=True)
@click.option("--attempt", type=int, default=None)
@click.option("--version", default=None)
@click.option("--handler", "handler_spec", default=None)
@click.option("--override", "overrides", multiple=True, help="payload field=value (JSON)")
@click.option("--stub", "stubs", multiple=True, help="call-or-effect-name=JSON result")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def fork_command(
    env: Env,
    job_id: int,
    app_spec: str,
    from_step: str,
    attempt: int | None,
    version: str | None,
    handler_spec: str | None,
    overrides: tuple[str, ...],
    stubs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Branch state before a step and run another version from there; never the real world."""
    from replayq.replay.engine import fork

    report = fork(
        env.app(app_spec),
        job_id,
        from_step=from_step,
        attempt=attempt,
        version=version,
        handler=handler_spec,
        overrides=_parse_assignments(overrides, "--override"),
        stubs=_parse_assignments(stubs, "--stub"),
    )
    _print_report(report, as_json)
    if not as_json:
        click.echo(f"  compare: replayq diff {job_id} {report.trace_id}")


@main.command("diff")
@click.argument("original")
@click.argument("other")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def diff_command(env: Env, original: str, other: str, as_json: bool) -> None:
    """Compare two traces (job ids or trace ids): state, decisions, effects, outcome."""
    from replayq.replay.diff import diff_traces
    from replayq.replay.diff import render as render_diff

    result = diff_traces(env.app(), original, other)
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(render_diff(result))


@main.command()
@click.argument("job_id", type=int, required=False)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--allow-effects", default="", help="Comma-separated effect kinds that may run.")
@click.option("--rate", default=None, help="Bulk reruns per second, e.g. 5/s")
@click.option("--type", "job_type", default=None, help="Bulk: jobs of this type...")
@click.option("--state", "job_state", default=None, help="...in this state...")
@click.option("--since", default=None, help="...finished within this long, e.g. 1h")
@click.option("--yes", is_flag=True, help="Confirm: this touches the real world.")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def rerun(
    env: Env,
    job_id: int | None,
    app_spec: str,
    allow_effects: str,
    rate: str | None,
    job_type: str | None,
    job_state: str | None,
    since: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Re-execute for real, only the named effect kinds running (guarded, never default)."""
    from replayq.durations import parse_duration
    from replayq.replay.rerun import rerun_many

    kinds = [k for k in allow_effects.split(",") if k]
    if not kinds:
        raise click.UsageError("refusing: name the effect kinds that may run (--allow-effects)")
    if not yes:
        raise click.UsageError("refusing: a rerun touches the real world; confirm with --yes")
    app = env.app(app_spec)
    if job_id is not None:
        ids = [job_id]
    elif job_type and job_state:
        cutoff = app.clock.now() - parse_duration(since) if since else None
        ids = [
            j.id
            for j in app.list_jobs(states=[job_state], job_type=job_type, limit=10_000)
            if cutoff is None or (j.finished_at or j.created_at) >= cutoff
        ]
    else:
        raise click.UsageError("give a JOB_ID, or --type and --state for a bulk rerun")
    per_second = float(rate.removesuffix("/s")) if rate else None
    reports = rerun_many(app, ids, allow_effects=kinds, rate=per_second)
    if as_json:
        emit_json([r.to_dict() for r in reports])
        return
    for r in reports:
        click.echo(
            f"job {r.job_id}: {r.outcome.status} (trace {r.trace_id}); allowed={r.allowed} "
            f"substituted={r.substituted} refused={r.refused}"
        )


@main.command()
@click.argument("job_id", type=int)
@click.option("--simulate", is_flag=True, help="Show what would change; write nothing.")
@click.option("--force", is_flag=True, help="Restore even if later jobs wrote the entities.")
@click.option("--compensate", is_flag=True, help="Also run registered effect compensators.")
@click.option("--attempt", type=int, default=None, help="Undo only this attempt's writes.")
@click.option("--app", "app_spec", default=None, help="module:app (for compensators).")
@click.option("--json", "as_json", is_flag=True)
@pass_env
def rollback(
    env: Env,
    job_id: int,
    simulate: bool,
    force: bool,
    compensate: bool,
    attempt: int | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Restore the entities a job wrote to their versions before it (as new versions)."""
    from replayq.replay.rollback import compensate as run_compensators
    from replayq.replay.rollback import rollback as do_rollback

    app = env.app(app_spec)
    plan = do_rollback(app, job_id, simulate=simulate, force=force, attempt=attempt)
    if compensate and not simulate:
        plan.compensated = run_compensators(app, job_id)
    if as_json:
        emit_json(plan.to_dict())
        return
    verb = "would restore" if simulate else "restored"
    if not plan.changes:
        which = f"job {job_id}" + (f" attempt {attempt}" if attempt is not None else "")
        click.echo(f"{which} wrote no entities; nothing to roll back")
    for change in plan.changes:
        target = f"v{change.restore_version}" if change.restore_version else "(absent)"
        click.echo(
            f"{verb} {change.resource}: v{change.current_version} {change.current_data!r} "
            f"-> {target} {change.restored_data!r}"
        )
        if change.later_writers:
            click.echo(f"  later writers: jobs {change.later_writers}")
    for key in plan.compensated:
        click.echo(f"compensated effect {key}")


@trace_group.command("export")
@click.argument("job_id", type=int)
@click.option("--attempt", type=int, default=None)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@pass_env
def trace_export(env: Env, job_id: int, attempt: int | None, app_spec: str) -> None:
    """Write a self-contained regression case (JSON) for replayq.testing."""
    from replayq.replay.export import export_case

    click.echo(json.dumps(export_case(env.app(app_spec), job_id, attempt), indent=1))


@main.command("demo")
@click.option("--db", "demo_db", default=None, help="Database (default: a temporary SQLite file).")
@click.option("--keep", is_flag=True, help="Keep the database, logs and case.json afterwards.")
@click.pass_context
def demo_command(ctx: click.Context, demo_db: str | None, keep: bool) -> None:
    """Reproduce the ShipOrder incident on local services, investigate it, prove the fix.

    On PostgreSQL (--db postgresql://...) the demo works in a fresh schema that it
    drops at the end. $REPLAYQ_DB is ignored: the demo writes only where it is told.
    """
    from click.core import ParameterSource

    from replayq.demo import run_demo

    root = ctx.find_root()
    if demo_db is None and root.get_parameter_source("db") is ParameterSource.COMMANDLINE:
        demo_db = root.params.get("db")
    run_demo(demo_db, keep)
