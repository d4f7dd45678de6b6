"""``replayq effects``: list the idempotency ledger and settle in-doubt effects.

An effect is in doubt when the attempt that started it ended (crash, lost
lease) before recording its outcome; under the ``park`` policy its job waits in
``dead`` (``effect_in_doubt``). Check the real world, then::

    replayq effects resolve KEY --succeeded --result '{"charge": "ch_1"}'
    replayq effects resolve KEY --failed --reason "provider has no such charge"
    replayq dead requeue JOB --reason "effect settled"

or let the kind's reconciler ask the provider: ``replayq effects resolve --auto``.
Imports only the public ``replayq`` package.
"""

from __future__ import annotations

import json
from typing import Any

import click

from replayq.cli.env import Env, emit_json, pass_env


@click.group("effects")
def effects() -> None:
    """The effect ledger: what ran under which key, and settling in-doubt effects."""


@effects.command("list")
@click.option("--in-doubt", is_flag=True, help="Only effects whose outcome nobody recorded.")
@click.option("--kind", default=None, help="Only this effect kind (e.g. payment.charge).")
@click.option("--limit", default=100, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def effects_list(env: Env, in_doubt: bool, kind: str | None, limit: int, as_json: bool) -> None:
    """List effect records, newest first."""
    records = env.app().effects(in_doubt=in_doubt, kind=kind, limit=limit)
    if as_json:
        emit_json([record.to_dict() for record in records])
        return
    if not records:
        click.echo("no in-doubt effects" if in_doubt else "no effects")
        return
    for r in records:
        status = "IN DOUBT" if r.in_doubt else r.status
        where = f"job {r.job_id} attempt {r.attempt}"
        detail = f"  error: {r.error}" if r.error else ""
        click.echo(f"{status:<11} {r.kind:<20} {r.key}  ({where}){detail}")


@effects.command("resolve")
@click.argument("key", required=False)
@click.option("--succeeded", "outcome", flag_value="succeeded", help="It happened.")
@click.option("--failed", "outcome", flag_value="failed", help="It did not happen.")
@click.option("--result", "result_json", default=None, help="JSON result (with --succeeded).")
@click.option("--reason", default=None, help="Why; recorded in the job's trace.")
@click.option("--by", default=None, help="Who resolves it (default: the OS user).")
@click.option("--auto", is_flag=True, help="Ask each kind's reconciler (needs --app).")
@click.option("--kind", default=None, help="With --auto: only this effect kind.")
@click.option("--app", "app_spec", default=None, help="module:attribute of your replayq.App")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def effects_resolve(
    env: Env,
    key: str | None,
    outcome: str | None,
    result_json: str | None,
    reason: str | None,
    by: str | None,
    auto: bool,
    kind: str | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Settle an in-doubt effect KEY (--succeeded or --failed), or all of them with --auto."""
    if auto:
        if key or outcome:
            raise click.UsageError("--auto settles from the reconcilers: give no KEY or outcome")
        if not app_spec:
            raise click.UsageError("--auto needs --app: the reconcilers are in your app")
        results = env.app(app_spec).reconcile_effects(kind=kind, by=by)
        if as_json:
            emit_json(
                [
                    {
                        "key": record.key,
                        "kind": record.kind,
                        "outcome": answer.outcome if answer else "unknown",
                        "error": error,
                    }
                    for record, answer, error in results
                ]
            )
            return
        if not results:
            click.echo("no in-doubt effect has a reconciler")
        for record, answer, error in results:
            said = answer.outcome if answer else "unknown (left in doubt)"
            click.echo(f"{record.key}: {said}" + (f"  ({error})" if error else ""))
        return
    if key is None or outcome is None:
        raise click.UsageError("give KEY and --succeeded or --failed (or --auto)")
    result: Any = None
    if result_json is not None:
        if outcome != "succeeded":
            raise click.UsageError("--result goes with --succeeded")
        try:
            result = json.loads(result_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"--result is not JSON: {exc}") from exc
    record = env.app(app_spec).resolve_effect(
        key, succeeded=outcome == "succeeded", result=result, reason=reason, by=by
    )
    if as_json:
        emit_json(record.to_dict())
        return
    click.echo(
        f"{record.key}: resolved {record.status}; requeue job {record.job_id} to continue "
        f"(replayq dead requeue {record.job_id} --reason ...)"
    )
