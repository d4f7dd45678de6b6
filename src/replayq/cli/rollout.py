"""``replayq rollout``: move a job type to a new version in stages, and back in one switch.

``start`` a canary, ``pin`` keys, ``ramp`` behind the gates, ``shadow`` and
``dual-run`` for comparisons, then ``finish`` (the candidate becomes the only
route) or ``rollback``, and ``status``/``history``/``verify``/``verify-status``
to see the evidence. Every change is recorded with who (``--by``) and why
(``--reason``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

import replayq
from replayq.cli.env import Env, emit_json, pass_env
from replayq.cli.main import EXIT_FINDINGS, EXIT_OK, EXIT_UNFINISHED

# ``verify-status JOB``'s exit, by the run's verdict: a script gates on 0 alone. A run
# that ended without a report (dead, cancelled) is 1, not 5: asking again never helps.
VERDICT_EXIT = {
    "passed": EXIT_OK,
    "findings": EXIT_FINDINGS,
    "no_report": EXIT_FINDINGS,
    "unfinished": EXIT_UNFINISHED,
}

APP_HELP = "module:attribute of your replayq.App (else the contracts stored by workers)"


def _common(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--reason", default=None, help="Why; recorded with the change.")(command)
    command = click.option("--by", "actor", default=None, help="Who (default: your user name).")(
        command
    )
    return click.option("--app", "app_spec", default=None, help=APP_HELP)(command)


def _rollout(env: Env, app_spec: str | None, job_type: str, actor: str | None) -> replayq.Rollout:
    return env.app(app_spec).rollout(job_type, actor=actor)


def describe(routing: replayq.Routing | None) -> str:
    if routing is None:
        return "no routing: every worker runs its active version"
    lines = [f"{routing.job_type}  revision {routing.revision}  baseline {routing.baseline}"]
    for version in routing.versions():
        share = routing.share_of(version)
        if version == routing.baseline or version in routing.weights:
            lines.append(f"  {version:<10} {share:>7.1%} of new jobs")
    for pin in routing.pins:
        lines.append(f"  pin        {pin.describe()}")
    if routing.shadow_version:
        lines.append(
            f"  shadow     {routing.shadow_version} on {routing.shadow_fraction:.0%} (sealed)"
        )
    if routing.dual_run_version:
        lines.append(f"  dual-run   {routing.dual_run_version} (observe-only)")
    return "\n".join(lines)


@click.group()
def rollout() -> None:
    """Roll a job type out to a new version: verify, shadow, canary, pin, ramp, finish or
    rollback."""


@rollout.command("start")
@click.argument("job_type")
@click.option("--to", "to", required=True, help="The candidate version.")
@click.option("--canary", default="5%", show_default=True, help="Share of new jobs it gets.")
@click.option("--from", "baseline", default=None, help="The baseline (default: active version).")
@_common
@pass_env
def rollout_start(
    env: Env,
    job_type: str,
    to: str,
    canary: str,
    baseline: str | None,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Start a canary: CANARY of new jobs go to --to, the rest stay on the baseline."""
    routing = _rollout(env, app_spec, job_type, actor).start(
        to, canary=canary, baseline=baseline, reason=reason
    )
    click.echo(describe(routing))


@rollout.command("ramp")
@click.argument("job_type")
@click.argument("share")
@click.option("--force", is_flag=True, help="Ramp even if a gate fails (recorded as an override).")
@click.option(
    "--min-sample", default=50, show_default=True, help="Candidate attempts the gates need."
)
@_common
@pass_env
def rollout_ramp(
    env: Env,
    job_type: str,
    share: str,
    force: bool,
    min_sample: int,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Move the candidate to SHARE of new jobs; refused while a gate says it is worse."""
    routing = _rollout(env, app_spec, job_type, actor).ramp(
        share, force=force, reason=reason, min_sample=min_sample
    )
    click.echo(describe(routing))


@rollout.command("pin")
@click.argument("job_type")
@click.option("--field", "field_name", required=True, help="A payload field, or ordering_key.")
@click.option("--values", default=None, help="Comma-separated values pinned.")
@click.option("--share", default=None, help="Or a hashed share of the field's values, e.g. 10%.")
@click.option("--to", "to", required=True, help="The version they run.")
@_common
@pass_env
def rollout_pin(
    env: Env,
    job_type: str,
    field_name: str,
    values: str | None,
    share: str | None,
    to: str,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Pin jobs whose FIELD matches to one version (a key never moves while pinned)."""
    listed = [v.strip() for v in values.split(",") if v.strip()] if values else []
    routing = _rollout(env, app_spec, job_type, actor).pin(
        field_name, to=to, values=listed, share=share, reason=reason
    )
    click.echo(describe(routing))


@rollout.command("unpin")
@click.argument("job_type")
@click.option("--field", "field_name", required=True, help="The field whose pins are dropped.")
@_common
@pass_env
def rollout_unpin(
    env: Env,
    job_type: str,
    field_name: str,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Drop the pins on FIELD."""
    routing = _rollout(env, app_spec, job_type, actor).unpin(field_name, reason=reason)
    click.echo(describe(routing))


@rollout.command("shadow")
@click.argument("job_type")
@click.option("--version", "version", default=None, help="The version run in the shadow.")
@click.option("--fraction", default="10%", show_default=True, help="Share of jobs shadowed.")
@click.option("--off", is_flag=True, help="Stop shadowing.")
@_common
@pass_env
def rollout_shadow(
    env: Env,
    job_type: str,
    version: str | None,
    fraction: str,
    off: bool,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Also run FRACTION of jobs on VERSION, sealed, with the real run's answers."""
    if not off and version is None:
        raise click.UsageError("give --version, or --off")
    routing = _rollout(env, app_spec, job_type, actor).shadow(
        None if off else version, fraction=fraction, reason=reason
    )
    click.echo(describe(routing))


@rollout.command("dual-run")
@click.argument("job_type")
@click.option("--version", "version", default=None, help="The observe-only version.")
@click.option("--off", is_flag=True, help="Stop the dual-run.")
@_common
@pass_env
def rollout_dual_run(
    env: Env,
    job_type: str,
    version: str | None,
    off: bool,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Run every job on VERSION too, observe-only; only the authoritative run's effects are real."""
    if not off and version is None:
        raise click.UsageError("give --version, or --off")
    routing = _rollout(env, app_spec, job_type, actor).dual_run(
        None if off else version, reason=reason
    )
    click.echo(describe(routing))


@rollout.command("rollback")
@click.argument("job_type")
@click.option(
    "--release-inflight",
    is_flag=True,
    help="Also send running attempts on other versions back to the queue on the baseline, "
    "each at its next step boundary (never run twice at once).",
)
@_common
@pass_env
def rollout_rollback(
    env: Env,
    job_type: str,
    release_inflight: bool,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """One switch: new and queued jobs go to the baseline now; running attempts finish."""
    result = _rollout(env, app_spec, job_type, actor).rollback(
        reason=reason, release_inflight=release_inflight
    )
    click.echo(describe(result.routing))
    baseline = result.routing.baseline
    if release_inflight:
        click.echo(
            f"moved {result.requeued_to_baseline} queued job(s) to {baseline}; "
            f"{result.released} running attempt(s) on other versions go back to the queue "
            f"on {baseline} at their next step boundary "
            f"(replayq trace show JOB_ID shows job.release_requested, then job.released)"
        )
        return
    click.echo(
        f"moved {result.requeued_to_baseline} queued job(s) to {baseline}; "
        f"{result.in_flight} attempt(s) still running on other versions finish where they are "
        f"(replayq jobs list --type {job_type} --state running --version VERSION)"
    )


@rollout.command("finish")
@click.argument("job_type")
@click.option(
    "--force", is_flag=True, help="Finish even if a gate fails (recorded as an override)."
)
@click.option(
    "--min-sample", default=50, show_default=True, help="Candidate attempts the gates need."
)
@_common
@pass_env
def rollout_finish(
    env: Env,
    job_type: str,
    force: bool,
    min_sample: int,
    app_spec: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Accept the candidate: it becomes the baseline and the only route (behind the gates)."""
    result = _rollout(env, app_spec, job_type, actor).finish(
        force=force, reason=reason, min_sample=min_sample
    )
    click.echo(describe(result.routing))
    click.echo(
        f"moved {result.requeued_to_baseline} queued job(s) to {result.routing.baseline}; "
        f"{result.in_flight} attempt(s) still running on other versions finish where they are"
    )


@rollout.command("history")
@click.argument("job_type")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rollout_history(env: Env, job_type: str, as_json: bool) -> None:
    """Every routing change: revision, when, who, what and why."""
    changes = env.app().rollout(job_type).history()
    if as_json:
        emit_json([c.to_dict() for c in changes])
        return
    for change in changes:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(change.ts))
        click.echo(
            f"r{change.revision:<4} {when}  {change.actor:<12} {change.action}"
            f"{'  — ' + change.reason if change.reason else ''}"
        )


@rollout.command("status")
@click.argument("job_type")
@click.option("--app", "app_spec", default=None, help=APP_HELP)
@click.option(
    "--min-sample", default=50, show_default=True, help="Candidate attempts the gates need."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rollout_status(
    env: Env, job_type: str, app_spec: str | None, min_sample: int, as_json: bool
) -> None:
    """The routing, open jobs per version, and both versions' figures side by side."""
    app = env.app(app_spec)
    control = app.rollout(job_type)
    routing = control.routing()
    open_jobs = [row for row in app.queue_overview() if row["job_type"] == job_type]
    gates = None
    if routing is not None and routing.candidate is not None:
        gates = control.gates(min_sample=min_sample)
    comparisons = control.comparison_summary()
    runs = control.verify_runs(limit=5)
    if as_json:
        emit_json(
            {
                "routing": routing.to_dict() if routing else None,
                "open_jobs": open_jobs,
                "gates": gates.to_dict() if gates else None,
                "comparisons": comparisons,
                "verify_runs": [run.to_dict() for run in runs],
            }
        )
        return
    click.echo(describe(routing))
    click.echo("open jobs:")
    for row in open_jobs:
        click.echo(f"  {row['version'] or '-':<10} {row['state']:<8} {row['count']}")
    if gates is not None:
        base, cand = gates.baseline.to_dict(), gates.candidate.to_dict()
        click.echo(f"{'figure':<20} {base['version']:>12} {cand['version']:>12}")
        for key in replayq.GateReport.FIGURES:
            click.echo(f"  {key:<18} {_fmt(base[key]):>12} {_fmt(cand[key]):>12}")
        for gate in gates.gates:
            click.echo(f"  [{'ok' if gate.passed else 'FAIL'}] {gate.describe()}")
    for mode, summary in comparisons.items():
        click.echo(
            f"{mode}: {summary['compared']} compared, {summary['differing']} differing "
            f"{summary['classes']}"
        )
    for run in runs:
        click.echo(f"verify: {describe_run(run)}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


@rollout.command("verify")
@click.argument("job_type")
@click.option("--app", "app_spec", required=True, help="module:attribute of your replayq.App")
@click.option("--from", "from_version", required=True, help="The recorded (baseline) version.")
@click.option("--to", "to_version", required=True, help="The candidate version to run.")
@click.option("--sample", type=int, default=None, help="At most this many recorded attempts.")
@click.option("--since", default=None, help="Only jobs created this recently, e.g. 24h.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in replayq.JobState]),
    help="Only jobs now in this state (repeatable).",
)
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    type=click.Choice(list(replayq.VerifyReport.CLASSES)),
    help="A difference class that does not fail the run (repeatable).",
)
@click.option("--rate", type=float, default=None, help="At most this many attempts a second.")
@click.option(
    "--background",
    is_flag=True,
    help="Enqueue it as a job a worker runs in chunks (resumable); prints the job id.",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="With --background: attempts per chunk (the most a killed run does again).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rollout_verify(
    env: Env,
    job_type: str,
    app_spec: str,
    from_version: str,
    to_version: str,
    sample: int | None,
    since: str | None,
    states: tuple[str, ...],
    allowed: tuple[str, ...],
    rate: float | None,
    background: bool,
    chunk: int,
    as_json: bool,
) -> None:
    """Run --to over recorded attempts of --from in the sealed world; exit 1 on differences."""
    app = env.app(app_spec)
    cutoff = app.clock.now() - replayq.parse_duration(since, name="since") if since else None
    selection: dict[str, Any] = {
        "from_version": from_version,
        "to_version": to_version,
        "sample": sample,
        "since": cutoff,
        "states": states or None,
        "allow": allowed,
        "max_per_second": rate,
    }
    if background:
        job_id = replayq.start_verify(app, job_type, chunk=chunk, app=app_spec, **selection)
        if as_json:
            emit_json({"job_id": job_id})
        else:
            click.echo(
                f"verification enqueued as job {job_id}; a worker runs it "
                f"(replayq rollout verify-status {job_id})"
            )
        return
    with _progress_bar(enabled=not as_json and sys.stderr.isatty()) as progress:
        report = replayq.verify_rollout(app, job_type, progress=progress, **selection)
    report.point_forks_at(app_spec)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(render_verify(report))
    raise SystemExit(EXIT_OK if report.passed else EXIT_FINDINGS)


@contextmanager
def _progress_bar(*, enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (a terminal only): ``update(done, total)``."""
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("verifying", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@rollout.command("verify-status")
@click.argument("job_id", type=int, required=False)
@click.option("--type", "job_type", default=None, help="Only verifications of this job type.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_env
def rollout_verify_status(
    env: Env, job_id: int | None, job_type: str | None, as_json: bool
) -> None:
    """Background verifications: progress, and the report so far (or final).

    With JOB_ID it exits by the run's verdict, so a script can gate on it: 0 passed
    (finished, nothing outside --allow), 1 findings (or it ended without a report:
    dead, cancelled), 5 unfinished (queued or running: no verdict yet; ask again
    later). The list exits 0.
    """
    app = env.app()
    if job_id is not None:
        run = replayq.verify_run(app, job_id)
        if as_json:
            emit_json(run.to_dict())
        else:
            click.echo(describe_run(run))
            if run.report.attempts:
                if not run.finished:
                    click.echo("so far (not a verdict: the run has not finished):")
                click.echo(render_verify(run.report))
        raise SystemExit(VERDICT_EXIT[run.verdict])
    runs = replayq.verify_runs(app, job_type)
    if as_json:
        emit_json([run.to_dict() for run in runs])
        return
    if not runs:
        click.echo("no background verification (rollout verify ... --background)")
    for run in runs:
        click.echo(describe_run(run))


def describe_run(run: replayq.VerifyRun) -> str:
    report = run.report
    total = "?" if run.total is None else str(run.total)
    verdict = {
        "passed": "  passed",
        "findings": f"  FAILED {report.disallowed}",
        "unfinished": "  not finished: no verdict yet",
        "no_report": f"  NO REPORT: ended {run.state} before it finished (not verified)",
    }[run.verdict]
    return (
        f"job {run.job_id}  {report.job_type} {report.from_version} → {report.to_version}  "
        f"{run.state} (attempt {run.attempt})  {run.done}/{total} attempts, "
        f"{run.chunks_done} chunk(s) committed{verdict}"
        + (f"  last error: {run.error}" if run.error and not run.finished else "")
    )


def render_verify(report: replayq.VerifyReport) -> str:
    """The report as text, each example with the fork command that reproduces it."""
    lines = [
        f"{report.job_type}: {report.to_version} over {report.attempts} recorded attempt(s) of "
        f"{report.from_version} in {report.seconds:.2f}s ({report.throughput:.0f}/s), sealed",
    ]
    if not report.counts:
        lines.append("no differences")
    for name in replayq.VerifyReport.CLASSES:
        if report.counts.get(name):
            mark = "allowed" if name in report.allowed else "FAIL"
            lines.append(f"  {name:<16} {report.counts[name]:>6}  {mark}")
    if report.first_divergence_steps:
        lines.append("first divergence by step:")
        for step, count in report.first_divergence_steps.most_common():
            lines.append(f"  {step:<20} {count:>6} {'#' * min(40, count)}")
    for example in report.examples():
        lines.append(
            f"job {example.job_id} attempt {example.attempt}: {', '.join(example.classes)}"
        )
        for name in example.classes:
            detail = json.dumps(example.details[name], default=str, ensure_ascii=False)
            lines.append(f"    {name}: {detail[:160]}")
        lines.append(f"    {example.fork_command}")
    if report.forks_need_app:
        lines.append(
            "the fork commands need your app: put its module:attribute (the --app your "
            "workers run) for MODULE:APP; this verification was started without --app"
        )
    return "\n".join(lines)
