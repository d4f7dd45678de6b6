"""gc beyond the jobs' own tiers (issue 16), on both backends: retention set in the job
contract, derived traces collected by age, a live fork held against gc, blobs collected
by reachability, message ids forgotten after their own retention.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import replayq
import replayq.testing
from replayq.queue import lifecycle
from replayq.queue.retention import in_ledger, to_ledger
from replayq.replay.engine import dry_run, fork
from replayq.storage.context_params import LineageQuery
from replayq.storage.params import TraceQuery
from replayq.storage.retention_params import GcScan, JobPurge, KeepHold, KeepRelease, TraceTrim
from tests.apps import retained
from tests.replay_support import cli, cli_ok

AppFactory = Callable[..., replayq.App]
DAY = 86_400.0
START = 1_700_000_000.0


def shape(events: list[replayq.TraceEvent]) -> list[tuple[object, ...]]:
    return [(e.name, e.hlc, e.resource, e.status, e.attempt) for e in events]


def derived_traces(app: replayq.App) -> set[str]:
    with app.storage.transaction(readonly=True) as tx:
        return {lineage.trace_id for lineage in tx.lineage_list(LineageQuery())}


def derived_events(app: replayq.App, trace_id: str) -> list[replayq.TraceEvent]:
    with app.storage.transaction(readonly=True) as tx:
        return tx.trace_query(TraceQuery(trace_id=trace_id))


# -- retention in the contract ----------------------------------------------------------


def test_a_contracts_retention_overrides_the_apps_for_its_type(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    # The app keeps everything for 10 days; the contract of "credit" says 1 day.
    app = app_factory(clock=clock, retention=replayq.Retention(full_days=10))
    retained.declare(app, retention={"full_days": 1})

    @app.job("audit", retry=replayq.Retry(max_attempts=1))
    def audit(ctx: replayq.Context, account: str) -> None:
        ctx.state.get("account", account)

    credited = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    audited = replayq.testing.run_inline(app, "audit", {"account": "a"})
    before = {job.id: app.trace(job.id) for job in (credited, audited)}
    clock.advance(2 * DAY)

    report = app.gc()

    assert report.trimmed_jobs == 1
    assert shape(app.trace(credited.id)) == [
        (e.name, e.hlc, e.resource, e.status, e.attempt)
        for e in before[credited.id]
        if in_ledger(e)
    ]
    assert app.trace(audited.id) == before[audited.id], "the app's 10 days still apply"
    policy = app.retention_policy()
    assert policy.of("credit").full_days == 1
    assert policy.of("audit").full_days == 10


def test_contract_diff_and_check_show_a_retention_change(
    app_factory: AppFactory, tmp_path: Path
) -> None:
    app = app_factory()
    retained.declare(app, retention={"full_days": 7})

    @app.job("credit", version="v2", candidate=True)
    def credit_v2(ctx: replayq.Context, account: str, amount: int) -> int:
        return amount

    app.register_contracts()
    app.job("credit", version="v3", candidate=True, retention=replayq.Retention(full_days=30))(
        credit_v2
    )
    app.register_contracts()

    changed = cli(app.url, "contract", "diff", "credit", "v1", "v3", "--json")
    assert changed.returncode == 1
    fields = {c["field"]: (c["old"], c["new"], c["concern"]) for c in json.loads(changed.stdout)}
    assert fields["retention.full_days"] == (7, 30, "retention")
    # v3's Retention sets every field: "forever" (None) where v1 left it to the app.
    assert fields["retention.ledger_days"] == ("(the app's)", None, "retention")
    assert "retention" in cli_ok(app.url, "contract", "show", "credit").stdout

    lock = tmp_path / "replayq.contracts.lock"
    replayq.freeze_contracts(app, lock)
    assert replayq.check_contracts(app, lock) == []
    text = lock.read_text().replace('"full_days": 7', '"full_days": 3')
    lock.write_text(text)
    (difference,) = replayq.check_contracts(app, lock)
    assert (difference.version, difference.field, difference.concern) == (
        "v1",
        "retention.full_days",
        "retention",
    )
    assert (difference.locked, difference.code) == (3, 7)


def test_a_contract_retention_with_an_unknown_field_is_refused(app_factory: AppFactory) -> None:
    app = app_factory()
    with pytest.raises(replayq.ContractError, match="full_dayz"):
        retained.declare(app, retention={"full_dayz": 1})


# -- derived traces and live forks --------------------------------------------------------


def test_derived_traces_are_collected_after_their_days_and_a_live_fork_loses_nothing(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, derived_days=1))
    )
    gate, inside = threading.Event(), threading.Event()

    @app.job("credit", version="slow", candidate=True, retry=replayq.Retry(max_attempts=1))
    def credit_slow(ctx: replayq.Context, account: str, amount: int) -> int:
        with ctx.step("credit"):
            balance = ctx.state.get("account", account)
            total = (balance.data or {}).get("balance", 0) + amount
            ctx.state.put("account", account, {"balance": total})
            inside.set()
            assert gate.wait(60), "the test never let the fork go on"
        return int(total)

    forked = replayq.testing.run_inline(app, "credit", {"account": "f", "amount": 1})
    other = replayq.testing.run_inline(app, "credit", {"account": "o", "amount": 1})
    # Derived traces made on day 0: a dry-run of each job.
    old_of_forked = dry_run(app, forked.id).trace_id
    old_of_other = dry_run(app, other.id).trace_id
    clock.advance(DAY + 60)
    source_before = app.trace(forked.id)
    old_before = derived_events(app, old_of_forked)
    assert old_before, "the dry-run wrote its derived trace"

    reports: list[replayq.ReplayReport] = []
    live = threading.Thread(
        target=lambda: reports.append(fork(app, forked.id, from_step="credit", version="slow"))
    )
    live.start()
    try:
        assert inside.wait(30), "the fork reached its step"
        during = app.gc()
        # The live fork holds its job: neither the recording it reads nor the derived
        # traces of it are collected; the other job is, with its old dry-run.
        assert app.trace(forked.id) == source_before
        assert derived_events(app, old_of_forked) == old_before
        assert shape(app.trace(other.id)) != [], "other keeps its ledger"
        assert old_of_other not in derived_traces(app)
        assert derived_events(app, old_of_other) == []
        assert (during.trimmed_jobs, during.derived_traces) == (1, 1)
    finally:
        gate.set()
        live.join(60)
    (report,) = reports
    assert report.outcome_now.status == "succeeded"
    fork_trace = derived_events(app, report.trace_id)
    assert any(e.name == "state.write" for e in fork_trace), "the fork's own trace is whole"

    clock.advance(DAY + 60)
    after = app.gc()

    # Released: the job is trimmed to its ledger, its old dry-run and now-old fork collected.
    assert after.trimmed_jobs == 1
    assert after.derived_traces == 2
    assert derived_traces(app) == set()
    assert derived_events(app, report.trace_id) == []
    assert {e.name for e in app.trace(forked.id)} >= {"job.succeeded", "state.write"}
    # The fork's branch went with it; main's state versions stay.
    assert len(app.state.history("account", "f")) == 1


def test_a_hold_spares_its_job_until_released_or_expired(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(app_factory(clock=clock, retention=retained.RETENTION))
    job = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    clock.advance(2 * DAY)
    scan = GcScan(after=0, until=job.id, cutoff=clock.now() - DAY, limit=10, now=clock.now())
    with app.storage.transaction() as tx:
        assert tx.keep_transition(KeepHold("fork-test", job.id, clock.now() + 60))
        assert not tx.keep_transition(KeepHold("fork-none", 10**9, clock.now() + 60))
    with app.storage.transaction() as tx:
        assert tx.gc_scan(scan) == []
    clock.advance(120)  # the holder died: its hold expires
    with app.storage.transaction() as tx:
        assert [c.job_id for c in tx.gc_scan(scan)] == []  # scan's own `now` is older
        later = GcScan(after=0, until=job.id, cutoff=clock.now() - DAY, limit=10, now=clock.now())
        assert [c.job_id for c in tx.gc_scan(later)] == [job.id]
        assert tx.keep_transition(KeepRelease("fork-test"))
        assert not tx.keep_transition(KeepRelease("fork-test"))


# -- blobs by reachability ----------------------------------------------------------------


def declare_archive(app: replayq.App) -> replayq.App:
    @app.job("archive", retry=replayq.Retry(max_attempts=1))
    def archive(ctx: replayq.Context, key: str, size: int) -> int:
        text = key * size
        # Both above the inline limit: a step result and a state value, each a blob.
        rendered = ctx.step("render", lambda: {"text": "r" + text})
        ctx.state.put("doc", key, {"text": text})
        return len(rendered["text"])

    return app


def blob_exists(app: replayq.App, ref: str) -> bool:
    with app.storage.transaction(readonly=True) as tx:
        return tx.blob_get(ref.removeprefix("blob:sha256:")) is not None


def test_gc_collects_the_blobs_nothing_references_and_keeps_the_referenced(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(START)
    app = declare_archive(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, ledger_days=2))
    )
    gone = replayq.testing.run_inline(app, "archive", {"key": "a", "size": 5000})
    clock.advance(DAY + 60)
    trimmed = replayq.testing.run_inline(app, "archive", {"key": "b", "size": 5000})
    clock.advance(DAY + 60)
    fresh = replayq.testing.run_inline(app, "archive", {"key": "c", "size": 5000})
    steps = {
        job.id: next(e.output_ref for e in app.trace(job.id) if e.output_ref)
        for job in (gone, trimmed, fresh)
    }
    assert all(ref and blob_exists(app, ref) for ref in steps.values())
    documents = {key: app.state.get("doc", key).data for key in "abc"}

    dry = app.gc(dry_run=True)
    assert all(blob_exists(app, str(ref)) for ref in steps.values()), "a dry run keeps all"
    report = app.gc()

    assert report.purged_jobs == 1
    # The deleted job's step result: referenced by nothing any more.
    assert not blob_exists(app, str(steps[gone.id]))
    assert report.blobs == 1 and report.blob_bytes > 0
    # Its state value outlives it (state versions are never collected); the trimmed job's
    # step result is named by its ledger (step.finished); the fresh job keeps everything.
    assert blob_exists(app, str(steps[trimmed.id])) and blob_exists(app, str(steps[fresh.id]))
    assert {key: app.state.get("doc", key).data for key in "abc"} == documents
    # A dry run found the same (its blob scan runs before the jobs are deleted: 0).
    assert dry.purged_jobs == 1
    assert app.gc().blobs == 0, "a second pass finds nothing more"


def test_a_blob_stored_again_is_not_collected_within_the_grace(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = declare_archive(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, ledger_days=2))
    )
    first = replayq.testing.run_inline(app, "archive", {"key": "a", "size": 5000})
    ref = next(e.output_ref for e in app.trace(first.id) if e.output_ref)
    clock.advance(3 * DAY)
    # The same value again, three days later: the same blob, touched, referenced anew.
    again = replayq.testing.run_inline(app, "archive", {"key": "a", "size": 5000})
    assert next(e.output_ref for e in app.trace(again.id) if e.output_ref) == ref

    report = app.gc()

    assert report.purged_jobs == 1
    assert blob_exists(app, str(ref))
    assert app.state.get("doc", "a").data == {"text": "a" * 5000}


# -- message ids ----------------------------------------------------------------------------


def test_message_ids_are_forgotten_after_their_own_retention(app_factory: AppFactory) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(
        app_factory(clock=clock, retention=replayq.Retention(full_days=1, message_id_days=2))
    )
    old = replayq.testing.run_inline(
        app, "credit", {"account": "a", "amount": 1}, message_id="m-old"
    )
    clock.advance(DAY + 60)
    young = replayq.testing.run_inline(
        app, "credit", {"account": "a", "amount": 1}, message_id="m-young"
    )
    clock.advance(DAY + 60)

    report = app.gc()

    assert report.message_id_jobs == 1
    assert app.enqueue("credit", {"account": "a", "amount": 1}, message_id="m-old") != old.id
    assert app.enqueue("credit", {"account": "a", "amount": 1}, message_id="m-young") == young.id
    assert app.get_job(old.id).state is replayq.JobState.SUCCEEDED, "the job row stays"


# -- heartbeats -----------------------------------------------------------------------------


def test_the_ledger_keeps_an_attempts_heartbeats_as_one_lease_interval(
    app_factory: AppFactory,
) -> None:
    clock = replayq.FrozenClock(START)
    app = retained.declare(app_factory(clock=clock, retention=retained.RETENTION))
    job = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    # Three heartbeats of its attempt, as the worker's heartbeat thread records them.
    beats = []
    for n in range(3):
        beats.append(
            lifecycle.lifecycle(
                lifecycle.LEASE_EXTENDED,
                job,
                now=START + 10 * n,
                hlc=app.runtime.hlc.tick(),
                worker_id="w1",
                lease_deadline=START + 10 * n + 30,
            )
        )
    with app.storage.transaction() as tx:
        tx.trace_append(beats)
    before = app.trace(job.id)
    assert [e.name for e in before].count("lease.extended") == 3
    clock.advance(2 * DAY)

    dry = app.gc(dry_run=True)
    report = app.gc()

    (interval,) = [e for e in app.trace(job.id) if e.name == "lease.extended"]
    assert interval.data["beats"] == 3
    assert interval.data["extended_from"] == START
    assert interval.data["lease_deadline"] == START + 20 + 30
    rest = [e for e in app.trace(job.id) if e.name != "lease.extended"]
    assert shape(rest) == shape([e for e in before if in_ledger(e)])
    assert dry.events_removed == report.events_removed == len(before) - len(rest) - 1
    # A later pass over the ledger-tier job (trimmed in place: no ledger_days) keeps the
    # interval as it is: an interval is not one beat.
    clock.advance(DAY)
    assert app.gc().events_removed == 0
    (again,) = [e for e in app.trace(job.id) if e.name == "lease.extended"]
    assert (again.data["beats"], again.data["extended_from"]) == (3, START)


def test_message_id_dedup_is_per_job_type(app_factory: AppFactory) -> None:
    app = retained.declare(app_factory())

    @app.job("audit")
    def audit(ctx: replayq.Context, account: str) -> None:
        return None

    credit = app.enqueue("credit", {"account": "a", "amount": 1}, message_id="evt-1")
    audited = app.enqueue("audit", {"account": "a"}, message_id="evt-1")

    assert credit != audited, "the same message id for another type is another job"
    assert app.enqueue("credit", {"account": "a", "amount": 1}, message_id="evt-1") == credit
    assert app.enqueue("audit", {"account": "a"}, message_id="evt-1") == audited
    # In one batch too (one statement on PostgreSQL).
    many = app.enqueue_many(
        [
            replayq.EnqueueRequest("credit", {"account": "b", "amount": 1}, message_id="evt-2"),
            replayq.EnqueueRequest("audit", {"account": "b"}, message_id="evt-2"),
            replayq.EnqueueRequest("audit", {"account": "b"}, message_id="evt-2"),
        ]
    )
    assert many[0] != many[1] and many[1] == many[2]


@pytest.mark.parametrize("protect", ["hold", "pin"])
def test_a_hold_or_a_pin_and_a_trim_of_the_same_job_are_ordered(
    app_factory: AppFactory, protect: str
) -> None:
    """A fork's hold or a ``keep`` pin that comes while gc's batch trims the job waits for
    gc to commit; once it is in, the changes gc had planned for the job apply nothing."""
    clock = replayq.FrozenClock(START)
    app = retained.declare(app_factory(clock=clock, retention=retained.RETENTION))
    job = replayq.testing.run_inline(app, "credit", {"account": "a", "amount": 1})
    before = app.trace(job.id)
    clock.advance(2 * DAY)
    now = clock.now()
    trimming, protected = threading.Event(), threading.Event()

    def protect_job() -> None:
        assert trimming.wait(30)
        if protect == "hold":
            with app.storage.transaction() as tx:
                tx.keep_transition(KeepHold("fork-late", job.id, now + 60))
        else:
            app.keep(job.id, "incident 9")
        protected.set()

    other = threading.Thread(target=protect_job)
    other.start()
    # gc's batch trims the job and has not committed yet: the hold or pin waits for it.
    with app.storage.transaction() as tx:
        assert tx.gc_apply(TraceTrim([job.id], to_ledger, now)) > 0
        trimming.set()
        assert not protected.wait(0.5), f"the {protect} waited for gc's transaction"
    other.join(30)
    assert protected.is_set()
    assert shape(app.trace(job.id)) == shape([e for e in before if in_ledger(e)])

    # Now held or pinned (after gc scanned it): gc's changes of that job apply nothing.
    with app.storage.transaction() as tx:
        assert tx.gc_apply(TraceTrim([job.id], lambda events: [], now)) == 0
        assert tx.gc_apply(JobPurge([job.id], now)) == 0
    assert app.get_job(job.id).state is replayq.JobState.SUCCEEDED
    assert app.trace(job.id), "nothing trimmed while held"
    assert shape(app.trace(job.id)) == shape([e for e in before if in_ledger(e)])


def test_a_version_whose_contract_sets_no_retention_gets_the_apps(
    app_factory: AppFactory,
) -> None:
    app = app_factory(retention=replayq.Retention(full_days=10))
    retained.declare(app)  # v1: no retention in its contract
    app.job("credit", version="v2", retention={"full_days": 1})(lambda ctx, account, amount: 0)

    policy = app.retention_policy()

    assert policy.of("credit", "v1").full_days == 10
    assert policy.of("credit", "v2").full_days == 1
    assert policy.of("credit", "gone").full_days == 1, "an undeclared version: the active one's"
    assert policy.shortest_full_days() == 1
