"""Storage: one typed seam (``storage.protocol``) and two backends behind it.

::

    storage/
    ├── protocol.py         Storage, Transaction (the verbs, composed of the families
    │                       below); Listener, SnapshotRead: optional capabilities
    ├── job_protocol.py     the job verbs and pipelined (implemented in sql_transaction.py)
    ├── rollout_protocol.py the contract and rollout verbs (likewise)
    ├── report_protocol.py  ``report`` (report_verbs.py)
    ├── trace_protocol.py   trace_append and trace_query (trace_verbs.py)
    ├── context_protocol.py the recording context's verbs and the schedules' (context_verbs.py)
    ├── retention_protocol.py
    │                       keep_transition, gc_scan and gc_apply (retention_verbs.py)
    ├── commits.py          commit_at_once: a block in one round trip where it can be, again
    │                       the careful way after a refusal (CommitRefused)
    ├── params.py           the frozen parameter structs of the queue, trace and
    │                       rollout verbs
    ├── context_params.py   those of the recording context's verbs
    ├── retention_params.py those of keep_transition, gc_scan and gc_apply
    ├── reports.py          the questions ``report`` answers
    ├── records.py          the frozen records the verbs return
    ├── sql_transaction.py  the queue and rollout verbs, once, over named queries
    ├── trace_verbs.py      trace_append and trace_query (the trace's packs), once, likewise
    ├── context_verbs.py    the recording context's verbs (state, locks, effects, cache,
    │                       outbox, steps, blobs, lineage, schedules), once, likewise
    ├── report_verbs.py     ``report``, once, likewise
    ├── retention_verbs.py  keep_transition, gc_scan and gc_apply, once, likewise
    ├── sql_statements.py   the statement plumbing those verb mixins run on, declared once
    ├── queries.py          loads ``-- name: NAME`` queries from a backend's *.sql files
    ├── sqlite/             SqliteStorage (+ Listener: watch.py, a data_version check; +
    │                       SnapshotRead: one-statement reads without BEGIN; fork.py: what
    │                       a forked child does with the connections it inherited), likewise
    ├── postgres/           PostgresStorage (+ Listener: LISTEN/NOTIFY wake-ups; +
    │                       SnapshotRead: reads in autocommit mode), likewise
    ├── migrate.py          applying and reporting migrations
    ├── adopted.py          verbs on the caller's own connection (transactional enqueue)
    ├── tap.py              tells listeners which trace events committed (metrics, OTel)
    ├── reconnect.py        backoff while the database is unreachable
    └── cache.py            where ``ctx.cache`` keeps entries: this database, or Redis

The verbs, by noun (``Transaction``; each takes a parameter struct or a few
scalars and returns records, never a mapping). A verb of many kinds takes a union
and has one ``@overload`` per kind, so each answer keeps its own type::

    jobs      job_insert job_enqueue (rows with their first trace packs) job_get
              job_lease lease_check lease_extend(LeasesExtend: every lease held, one
                  statement -> the ids still held) jobs_complete(JobsComplete: a group
                  commit's successes, one statement -> the ids still held)
                  jobs_complete_sent (the same, its answer read later: PostgreSQL sends it
                  with the group's lease, in ``pipelined``) job_match
              job_list(JobFilter | CancelRequested | LeasesExpired)
              job_transition(JobRetry | JobBury | JobCancel |
                  JobCancelRequest | JobCancelRunning | JobReleaseRunning | JobRequeue |
                  LeaseRelease | JobRedeliver | JobRoute | JobSetRecorded)  one CAS on one
                  job row -> bool;
                  | JobReroute (queued jobs of a type) -> how many
    reports   report(JobStats | JobCount | JobGauges | JobsScheduled | JobDurations |
                  OutOfOrder | VersionOutcomes | SignalCounts | SignalSeries | OutboxPending)
    trace     trace_append  trace_query(TraceQuery | TraceJobs | TraceWindow)
    ending    pipelined (a block that ends the transaction with its commit: on PostgreSQL
                  in pipeline mode, what was not waited for sent with COMMIT)
    rollouts  rollout_query(ContractQuery | ActiveVersion | RoutingQuery | RoutingHistory |
                  ComparisonQuery)
              rollout_update(ContractPut | ContractActivate | RoutingPut | ComparisonPut)
    state     entity_get(EntityGet) entity_list(EntityFilter) entity_put branch_get
              branch_create(BranchCreate, versions: a new branch with what a dry-run wrote)
    locks     lock_transition(LockAcquire | LockRenew | LockReleaseInTime |
                  LockRelease (owner None: break))
              lock_list(LockFilter)
    effects   idem_transition(IdemClaim | IdemTakeover | IdemSucceed | IdemFail |
                  IdemCompensate | IdemResolve)  idem_list(IdemFilter)
    others    cache_update(CachePut | CacheDelete) cache_get(CacheLookup)
              outbox_update(OutboxInsert | OutboxMark) outbox_claim(OutboxClaim) outbox_by_job
              step_complete step_by_job  blob_put blob_get
              lineage_put lineage_list(LineageQuery)
              schedule_update(ScheduleRegister | ScheduleAdvance | ScheduleMade) schedule_list
    retention keep_transition(KeepPin | KeepHold | KeepRelease)       pins and live holds
              gc_scan(KeptJobs | GcScan | GcCursor | GcHighestId | JobHours |
                      DerivedScan | BlobScan)
              gc_apply(TraceTrim | JobPurge | IdemPurge | MessageIdForget | LedgerPartitions |
                  LedgerDrop | DerivedPurge | BlobPurge | GcCursorPut | GcVacuum)
                                                  what gc removes, a batch of jobs at a time

A capability only some backends have is an optional protocol the caller checks
with ``isinstance`` (``Listener``), never a ``getattr`` probe. Imports: the
foundations only (``errors``, ``codec``, ``model``, ``seal``).
"""

from __future__ import annotations

from replayq.errors import ConfigurationError
from replayq.storage.protocol import Storage


def open_storage(url: str) -> Storage:
    """Open the backend a URL names: ``sqlite:///file.db`` (or a path) or ``postgresql://…``."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from replayq.storage.postgres import PostgresStorage
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ConfigurationError(
                "PostgreSQL support needs the extra: pip install 'replayq[postgres]'"
            ) from exc
        return PostgresStorage(url)
    if "://" in url and not url.startswith("sqlite:"):
        scheme = url.split("://", 1)[0]
        raise ConfigurationError(
            f"unknown database URL scheme {scheme!r}; use sqlite:///path.db or postgresql://…"
        )
    from replayq.storage.sqlite import SqliteStorage

    return SqliteStorage(url)
