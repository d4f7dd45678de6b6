"""``replayq db``, ``contract``, ``locks``, ``outbox``, ``state``, ``demo``: the shared parts."""

from __future__ import annotations

import sys
import time

import click
from msgspec import structs

import replayq
from replayq import codec
from replayq.cli import render
from replayq.cli.env import Env, emit_json, load_app, pass_env


@click.group()
def db() -> None:
    """Schema migrations."""


@db.command("upgrade")
@pass_env
def db_upgrade(env: Env) -> None:
    """Apply pending migrations."""
    applied = replayq.App(env.db, auto_migrate=False).schema_upgrade()
    for status in applied:
        click.echo(f"applied {status.version:04d}_{status.name}")
    if not applied:
        click.echo("schema is up to date")


@db.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def db_status(env: Env, as_json: bool) -> None:
    """List migrations and whether each is applied."""
    statuses = replayq.App(env.db, auto_migrate=False).schema_status()
    if as_json:
        emit_json([structs.asdict(s) for s in statuses])
        return
    for status in statuses:
        state = "applied " + render.timestamp(status.applied_at) if status.applied_at else "PENDING"
        click.echo(f"{status.version:04d}_{status.name:<24} {state}")


@click.group()
def contract() -> None:
    """Show, diff and lint stored job contracts; freeze and check the app's lock file."""


def _stored(app: replayq.App, job_type: str) -> dict[str, replayq.JobContract]:
    found = {c.version: c for c in app.contracts(job_type)}
    if not found:
        raise click.ClickException(
            f"no stored contract for {job_type!r}; contracts are stored when a worker starts"
        )
    return found


@contract.command("show")
@click.argument("job_type")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def contract_diff(env: Env, job_type: str, old: str, new: str, as_json: bool) -> None:
    """Every operational difference between two versions (exit 1 if any)."""
    found = _stored(env.app(), job_type)
    for version in (old, new):
        if version not in found:
            raise click.ClickException(f"{job_type} has no stored version {version!r}")
    changes = replayq.diff_contracts(found[old], found[new])
    if as_json:
        emit_json([structs.asdict(c) for c in changes])
    elif not changes:
        click.echo(f"{job_type}: {old} and {new} have the same contract")
    else:
        for change in changes:
            click.echo(f"{change.concern:<28} {change.field:<20} {change.old!r} -> {change.new!r}")
    sys.exit(1 if changes else 0)


@contract.command("lint")
@click.argument("job_type", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 also when a rule could not be checked (nothing recorded to check it against).",
)
@pass_env
def contract_lint(env: Env, job_type: str | None, as_json: bool, strict: bool) -> None:
    """Flag contracts that break the rules (exit 1 if any finding).

    A rule with nothing recorded to check against (a version no production attempt of
    has finished) is printed as ``unchecked`` with the reason: not a finding, not a pass.
    Alone it exits 0 (1 with ``--strict``). A type with no stored contract (a misspelled
    name), or a database with none at all, is an error (exit 2): nothing was linted.
    """
    app = env.app()
    if job_type is not None:
        _stored(app, job_type)
    elif not app.contracts():
        raise click.ClickException(
            "no stored contract to lint; contracts are stored when a worker starts"
        )
    results = app.lint(job_type, unchecked=True)
    findings = [r for r in results if r.kind == "finding"]
    unchecked = [r for r in results if r.kind == "unchecked"]
    lines = [f"{r.job_type} {r.version}: unchecked {r.rule}: {r.message}" for r in unchecked]
    if as_json:
        # The array lists exactly what makes the exit 1, as before: the unchecked rules
        # join it under --strict; otherwise they are notices on stderr.
        emit_json([structs.asdict(r) for r in (results if strict else findings)])
        for line in [] if strict else lines:
            click.echo(line, err=True)
    else:
        for finding in findings:
            click.echo(f"{finding.job_type} {finding.version}: {finding.rule}: {finding.message}")
        for line in lines:
            click.echo(line)
        if not findings and not unchecked:
            click.echo("no findings")
        elif not findings:
            click.echo(
                f"no findings in the rules checked; {len(unchecked)} could not be checked "
                "(above): an unchecked rule is not a pass"
            )
    sys.exit(1 if findings or (strict and unchecked) else 0)


@contract.command("freeze")
@click.argument("job_types", nargs=-1)
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option(
    "--lock",
    "lock_path",
    default="replayq.contracts.lock",
    show_default=True,
    help="The lock file.",
)
def contract_freeze(job_types: tuple[str, ...], app_spec: str, lock_path: str) -> None:
    """Write the app's contracts to the lock file (only TYPEs if given; the others kept)."""
    frozen = replayq.freeze_contracts(load_app(app_spec), lock_path, job_types)
    click.echo(f"froze {len(frozen)} contract version(s) in {lock_path}")


@contract.command("check")
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option(
    "--lock",
    "lock_path",
    default="replayq.contracts.lock",
    show_default=True,
    help="The lock file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def contract_check(app_spec: str, lock_path: str, as_json: bool) -> None:
    """Compare the app's contracts with the lock file, field by field (exit 1 if they differ)."""
    differences = replayq.check_contracts(load_app(app_spec), lock_path)
    if as_json:
        emit_json([vars(d) for d in differences])
    elif not differences:
        click.echo(f"contracts match {lock_path}")
    else:
        for difference in differences:
            click.echo(difference.describe())
        click.echo(
            f"{len(differences)} difference(s): declare a new version, or re-freeze "
            "(replayq contract freeze) if the change is meant"
        )
    sys.exit(1 if differences else 0)


@click.group()
def locks() -> None:
    """Lease locks: who holds what, with fencing tokens."""


@locks.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def locks_list(env: Env, as_json: bool) -> None:
    """Held locks: resource, owner, fencing token, age, TTL left."""

    app = env.app()
    held = replayq.list_locks(app)
    if as_json:
        emit_json([structs.asdict(lock) for lock in held])
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
@click.option(
    "--wait",
    default="10s",
    show_default=True,
    help="How long to wait for the lock's row while a commit writing under the lock holds "
    "it (PostgreSQL; a frozen worker's holds it until it thaws); past it exit 3.",
)
@pass_env
def locks_break(env: Env, resource: str, reason: str, wait: str) -> None:
    """Force a lock free; the old holder's later writes are fenced off."""

    seconds = replayq.parse_duration(wait, name="--wait")
    broken = replayq.break_lock(env.app(), resource, reason=reason, wait=seconds)
    if broken is None:
        raise click.ClickException(f"no lock is held on {resource!r}")
    click.echo(f"broke lock {resource} (was held by {broken.worker_id}, job {broken.job_id})")


@click.group()
def outbox() -> None:
    """The transactional outbox."""


@outbox.command("run")
@click.option("--sink", default="job", show_default=True, help="job, redis://..., http(s)://...")
@click.option("--app", "app_spec", default=None, help="module:attribute of your replayq.App")
@click.option("--once", is_flag=True, help="Publish what is pending, then exit.")
@click.option(
    "--interval", default=1.0, show_default=True, help="Seconds between publishing rounds."
)
@pass_env
def outbox_run(env: Env, sink: str, app_spec: str | None, once: bool, interval: float) -> None:
    """Publish outbox rows to a sink, at least once, with a stable event id."""

    app = env.app(app_spec)
    target = replayq.open_sink(app, sink)
    while True:
        result = replayq.publish_pending(app, target)
        if result.published or result.failed:
            click.echo(f"published={result.published} failed={result.failed}")
        if once and result.published + result.failed == 0:
            return
        if not once and result.published == 0:
            time.sleep(interval)


@click.group()
def state() -> None:
    """Versioned entity state."""


@state.command("history")
@click.argument("namespace")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def state_history(env: Env, namespace: str, key: str, as_json: bool) -> None:
    """Every version of an entity with the job that wrote it."""
    versions = env.app().state.history(namespace, key)
    if as_json:
        emit_json([structs.asdict(v) for v in versions])
        return
    click.echo(render.state_history(versions))


@click.group("demo", invoke_without_command=True)
@click.option("--db", "demo_db", default=None, help="Database (default: a temporary SQLite file).")
@click.option("--keep", is_flag=True, help="Keep the database, logs and case.json afterwards.")
@click.pass_context
def demo_command(ctx: click.Context, demo_db: str | None, keep: bool) -> None:
    """Reproduce the ShipOrder incident on local services, investigate it, prove the fix.

    On PostgreSQL (--db postgresql://...) the demo works in a fresh schema that it
    drops at the end. $REPLAYQ_DB is ignored: the demo writes only where it is told.
    ``replayq demo rollout``: the rollout demo instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from click.core import ParameterSource

    from replayq.demo import run_demo

    root = ctx.find_root()
    if demo_db is None and root.get_parameter_source("db") is ParameterSource.COMMANDLINE:
        demo_db = root.params.get("db")
    run_demo(demo_db, keep)


@demo_command.command("rollout")
@click.option("--keep", "keep_files", is_flag=True, help="Keep the demo's database afterwards.")
def demo_rollout(keep_files: bool) -> None:
    """A v2 that retries every exception: caught by verify, held by a gate, rolled back;
    then v3, the fix, verified, canaried and finished."""
    from replayq.demo.rollout import run_rollout_demo

    run_rollout_demo(keep=keep_files)
