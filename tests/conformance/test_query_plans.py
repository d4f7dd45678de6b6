"""Plans that stay good as history grows: every query the worker runs, the CLI's list
queries and gc's statements over a batch of jobs are served by an index at 100,000+ jobs
of history, on both backends.

The history is generated in one ``INSERT ... SELECT`` (a recursive CTE on SQLite,
``generate_series`` on PostgreSQL), not by draining: mostly succeeded jobs, a few dead and
cancelled ones, a small live queue and a few running leases, each with a trace pack.
A worker's queries then touch only the live jobs (the partial indexes on ``queued`` and
``running``), whatever the history; ``jobs list --state dead`` reads the partial index of
dead and cancelled jobs. Each backend is checked twice: before any statistics exist
(replayq never runs ``ANALYZE``; on PostgreSQL, a table autovacuum has not reached yet)
and after ``ANALYZE``, with sequential scans allowed: the question is which plan the
database really picks at this size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

import replayq

AppFactory = Callable[..., replayq.App]

HISTORY = 120_000
NOW = 2_000_000_000.0
LIVE_QUEUED = 50
LIVE_RUNNING = 10

# One job row per n; 1 in 1,000 died, 1 in 997 was cancelled, the newest are live.
_JOB_ROW = """
    'type-' || (n % 20), 'default', '{}',
    CASE WHEN n > :history - :running - :queued AND n <= :history - :queued THEN 'running'
         WHEN n > :history - :queued THEN 'queued'
         WHEN n % 1000 = 0 THEN 'dead'
         WHEN n % 997 = 0 THEN 'cancelled'
         ELSE 'succeeded' END,
    0, :now - 86400 + n * 0.5, :now - 86400 + n * 0.5, 1, 3,
    'trace-' || n, 'msg-' || n,
    CASE WHEN n % 10 = 0 THEN 'key-' || (n % 500) END,
    'w-' || (n % 50), 'v1', n * 8,
    CASE WHEN n > :history - :running - :queued AND n <= :history - :queued
         THEN 'token-' || n END,
    CASE WHEN n > :history - :running - :queued AND n <= :history - :queued
         THEN :now + 30 END,
    CASE WHEN n <= :history - :running - :queued THEN :now - 86400 + n * 0.5 + 0.1 END,
    CASE WHEN n % 1000 = 0 THEN 'lease_expired_attempts_exhausted' END
"""
_JOB_COLUMNS = """(job_type, queue, payload, state, priority, run_at, created_at, attempt,
    max_attempts, trace_id, message_id, ordering_key, worker_id, handler_version, hlc,
    owner_token, lease_deadline, finished_at, dead_reason)"""
# One settled effect record per finished job: gc purges them by job id (idem_purge).
_IDEMPOTENCY = """INSERT INTO rq_idempotency (key, operation, status, claim_token, started_at,
    completed_at, trace_id, job_id, attempt)
    SELECT 'effect-' || id, 'charge', 'succeeded', 'claim-' || id, created_at, finished_at,
        trace_id, id, 1 FROM rq_jobs WHERE finished_at IS NOT NULL"""
_TRACE = """INSERT INTO rq_trace (trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts, events)
    SELECT trace_id, id, 1, worker_id, hlc, hlc + 3, created_at, '[]' FROM rq_jobs"""

# Built from this module's constants only; the values are bound parameters.
_PG_JOB_ROW = re.sub(r":(\w+)", r"%(\1)s", _JOB_ROW.replace(" % ", " %% "))
_GENERATE = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :history)"
HISTORY_SQL = {
    "sqlite": [
        _GENERATE + f" INSERT INTO rq_jobs {_JOB_COLUMNS} SELECT {_JOB_ROW} FROM g",  # noqa: S608
        _TRACE,
        _IDEMPOTENCY,
    ],
    "postgresql": [
        f"INSERT INTO rq_jobs {_JOB_COLUMNS} SELECT {_PG_JOB_ROW}"  # noqa: S608
        " FROM generate_series(1, %(history)s) AS g(n)",
        _TRACE,
        _IDEMPOTENCY,
    ],
}

WORKER = "w-7"
LIVE_ID = HISTORY - LIVE_QUEUED  # a running job
LEASE = {"job_id": LIVE_ID, "owner_token": f"token-{LIVE_ID}"}

# The queries a worker runs, with parameters; each must use an index. SQLite leases in two
# steps (candidates, then one statement for them all), PostgreSQL in one (job_lease_batch).
# ``rows_of``: (columns, rows) of a statement's many rows, passed as the backend does.
WORKER_QUERIES: dict[str, dict[str, Any]] = {
    "job_lease_candidates": {
        "now": NOW,
        "queues": None,
        "job_types": None,
        "skip_ids": None,
        "limit": 10,
    },
    "job_lease_one": {
        "lease_now": NOW,
        "job_id": HISTORY,
        "owner_token": "t",
        "worker_id": WORKER,
        "now": NOW,
        "hlc": 1,
        "lease_seconds": 30.0,
        "handler_version": "v1",
    },
    "job_lease_many": {
        "lease_now": NOW,
        "owner_token": "t",
        "worker_id": WORKER,
        "hlc": 1,
        "rows_of": (("job_ids", "lease_seconds", "versions"), [(HISTORY, 30.0, "v1")]),
    },
    "job_lease_batch": {
        "lease_now": NOW,
        "now": NOW,
        "queues": None,
        "job_types": None,
        "skip_ids": None,
        "limit": 10,
        "owner_token": "t",
        "worker_id": WORKER,
        "hlc": 1,
        "lease_for": "{}",
        "version_for": "{}",
        "default_lease_seconds": 30.0,
    },
    "lease_check": LEASE,
    "leases_extend": {
        "lease_now": NOW,
        "rows_of": (("job_ids", "owner_tokens", "lease_seconds"), [(*LEASE.values(), 30.0)]),
    },
    "job_cancel_requested": {"worker_id": WORKER},
    "jobs_complete": {
        "now": NOW,
        "rows_of": (("job_ids", "owner_tokens", "results", "hlcs"), [(*LEASE.values(), None, 1)]),
    },
    # SQLite's group commit (JobsComplete.ordered): the acks counted, and the rows named
    # after a group of which only some held.
    "jobs_complete_counted": {
        "now": NOW,
        "rows_of": (("job_ids", "owner_tokens", "results", "hlcs"), [(*LEASE.values(), None, 1)]),
    },
    "jobs_completed_by": {
        "now": NOW,
        "rows_of": (("job_ids", "hlcs"), [(LIVE_ID, 1)]),
    },
    "job_retry": {
        **LEASE,
        "now": NOW,
        "run_at": NOW,
        "error_class": "E",
        "error": "e",
        "hlc": 1,
    },
    "job_bury_owned": {
        **LEASE,
        "now": NOW,
        "reason": "r",
        "error_class": None,
        "error": None,
        "hlc": 1,
    },
    "lease_release": {**LEASE, "now": NOW, "hlc": 1},
    "lease_return": {**LEASE, "hlc": 1},
    "lease_reap": {"lease_now": NOW + 60, "limit": 100},
    "job_redeliver": {**LEASE, "now": NOW, "hlc": 1},
    "job_scheduled": {"now": NOW, "queues": None},
    "job_get": {"job_id": LIVE_ID},
    "trace_for_job": {"job_id": LIVE_ID},
}

_LIST = {"job_type": None, "origin": "production", "version": None, "before": 2**63 - 1}
# The CLI's and the dashboard's lists: by a live or failed state, newest first (and counted).
LIST_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("job_list", {**_LIST, "states": ["dead"], "limit": 100}),
    ("job_list", {**_LIST, "states": ["cancelled"], "limit": 100}),
    ("job_list", {**_LIST, "states": ["queued"], "limit": 100}),
    ("job_list", {**_LIST, "states": ["running"], "limit": 100}),
    ("job_list", {**_LIST, "states": ["queued", "running"], "limit": 1}),
    ("job_list", {**_LIST, "states": ["dead"], "job_type": "type-0", "limit": 100_000}),
    ("job_count", {**_LIST, "states": ["dead"]}),
    ("job_count", {**_LIST, "states": ["queued", "running"]}),
]

# gc's statements over one batch of finished jobs (ids in order, as a pass walks them): a
# batch read or deleted by id list must not read the whole trace either.
_BATCH = list(range(50_001, 50_501))
_IDS = {"job_ids": _BATCH, "low": _BATCH[0], "high": _BATCH[-1]}
GC_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("gc_jobs_lock", _IDS),
    ("gc_trace_for_jobs", _IDS),
    ("trace_packs_delete", {"ids": _BATCH}),
    ("jobs_hours_add", _IDS),
    ("jobs_trace_delete", _IDS),
    ("jobs_delete", _IDS),
    ("gc_trace_derived", {"trace_id": "trace-50001"}),
    ("gc_candidates", {"after": 50_000, "until": 54_000, "cutoff": NOW, "limit": 500, "now": NOW}),
    ("idem_purge", _IDS),
    ("job_message_forget", {"job_ids": _BATCH}),
]

# What ``trace show``, ``replay`` and the dashboard read of one job (or trace) of the
# history: each by an index, whatever the history's size.
_ONE = {"job_id": 50_001}
TRACE_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("trace_for_job", _ONE),
    ("trace_for_jobs", {"job_ids": _BATCH[:50], "trace_id": None}),
    ("trace_for_trace", {"trace_id": "trace-50001"}),
    ("idem_by_job", _ONE),
    ("step_by_job", _ONE),
    ("entity_versions_by_job", _ONE),
    ("outbox_by_job", _ONE),
]

# What selects by job type: dedup, rollback's reroute, the rollout gates' outcomes and the
# durations of `contract lint`. Served by the head of the unique rq_jobs_message
# (job_type, message_id), which holds every job (migration 0014 dropped rq_jobs_type, its
# duplicate). The type is a new one, with no history: a plan that scans is then all cost.
_NEW_TYPE = "type-new"
TYPE_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("job_by_message_id", {"job_type": _NEW_TYPE, "message_id": "msg-1"}),
    ("job_reroute", {"job_type": _NEW_TYPE, "from_version": "v1", "to_version": "v2"}),
    ("version_outcomes", {"job_type": _NEW_TYPE, "since": NOW}),
    ("job_durations", {"job_type": _NEW_TYPE, "version": None}),
]

# A scan is allowed only over the partial indexes of live (or failed) jobs, whose size is
# the queue's, not the history's.
LIVE_INDEXES = {
    "rq_jobs_ready",
    "rq_jobs_lease_deadline",
    "rq_jobs_ordering",
    "rq_jobs_one_running_per_key",
    "rq_jobs_running_worker",
    "rq_jobs_failed",
    # Pins and live holds: what operators and running forks asked to keep, not history.
    "rq_keep_pkey",
    "rq_gc_holds_job",
}
PG_HISTORY_TABLES = (
    *("rq_jobs", r"rq_trace\w*", "rq_idempotency", "rq_steps", "rq_entity_versions"),
    "rq_outbox",
)
SQLITE_SCAN = re.compile(r"\bSCAN (\w+)(?: USING (?:COVERING )?INDEX (\w+))?")
HISTORY_TABLES = {
    *("rq_jobs", "j", "k", "r", "rq_trace", "rq_trace_resources", "rq_idempotency"),
    *("rq_steps", "rq_entity_versions", "rq_outbox"),
}


def history(app: replayq.App) -> None:
    storage: Any = app.storage
    values = {
        "history": HISTORY,
        "queued": LIVE_QUEUED,
        "running": LIVE_RUNNING,
        "now": NOW,
    }
    with storage.transaction() as tx:
        generate(tx.connection, storage.dialect, values)


# SQLite's trigger that writes each inserted job's ``job.enqueued`` pack (migration 0020).
_ENQUEUED_TRIGGER = "rq_jobs_enqueued"


def generate(
    connection: Any,
    dialect: str,
    values: dict[str, Any],
    rewrite: Callable[[str], str] = lambda sql: sql,
) -> None:
    """``HISTORY_SQL`` run on ``connection`` (inside the caller's transaction), each
    statement through ``rewrite``: one row and one trace pack a job on both backends.

    On SQLite the trigger ``rq_jobs_enqueued`` would write a second pack for each
    generated row (its ``job.enqueued``): it is dropped while the rows go in and created
    again, in the same transaction, from its own text. A schema from before migration
    0020 has none, and is left so (``benchmarks/`` runs this on older versions too).
    """
    trigger = None
    if dialect == "sqlite":
        found = connection.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
            (_ENQUEUED_TRIGGER,),
        ).fetchone()
        if found is not None:
            trigger = found[0]
            connection.execute(f"DROP TRIGGER {_ENQUEUED_TRIGGER}")
    for sql in HISTORY_SQL[dialect]:
        connection.execute(rewrite(sql), values)
    if trigger is not None:
        connection.execute(trigger)


def plan_of(app: replayq.App, name: str, params: dict[str, Any]) -> str:
    # Here, not at the top: benchmarks/dead_list.py imports this module's history on
    # older versions of replayq too.
    from replayq.storage.report_verbs import by_state

    storage: Any = app.storage
    # job_list and job_count read a state's partial index when given only such states.
    sql = storage.queries[by_state(name, params["states"]) if "states" in params else name]
    with storage.transaction(readonly=True) as tx:
        conn = tx.connection
        params = {
            k: tx.list_param(v) if k in ("states", "queues", "job_ids", "ids") else v
            for k, v in params.items()
        }
        if "rows_of" in params:
            # The statement as the verb runs it (SQLite: the rows bound in its VALUES).
            columns, rows = params.pop("rows_of")
            sql, params = tx.rows_query(name, columns, rows, params)
        if storage.dialect == "sqlite":
            rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            return "\n".join(str(row[-1]) for row in rows)
        return "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, params).fetchall())


def full_scans(dialect: str, plan: str) -> list[str]:
    """The plan's lines that read a history table whole."""
    found = []
    for line in plan.splitlines():
        if dialect == "sqlite":
            match = SQLITE_SCAN.search(line)
            whole = match is not None and match[1] in HISTORY_TABLES
            # A range on the id with no other bound walks the history down from the top.
            if (whole and match[2] not in LIVE_INDEXES) or "PRIMARY KEY (rowid<?)" in line:
                found.append(line)
        elif re.search(rf"Seq Scan on ({'|'.join(PG_HISTORY_TABLES)})\b", line):
            found.append(line)
        elif re.search(r"Index (Only )?Scan (Backward )?using (\w+)", line):
            index = re.search(r"using (\w+)", line)
            assert index is not None
            # An index scan with no condition over a whole-table index reads every row.
            if index[1] not in LIVE_INDEXES and "Cond" not in plan.split(line, 1)[1].split("->")[0]:
                found.append(line)
    return found


def checked(app: replayq.App) -> dict[str, str]:
    """Every worker and list query's plan; asserts none scans the history."""
    storage: Any = app.storage
    plans = {}
    queries = [(n, p) for n, p in WORKER_QUERIES.items() if n in storage.queries]
    # Leases judged by the database's clock (``database_clock``: lease_now NULL) too.
    queries += [(n, {**p, "lease_now": None}) for n, p in queries if "lease_now" in p]
    for name, params in [*queries, *LIST_QUERIES, *GC_QUERIES, *TYPE_QUERIES, *TRACE_QUERIES]:
        plan = plan_of(app, name, params)
        scans = full_scans(storage.dialect, plan)
        assert not scans, f"{name} {params} reads the whole history:\n{plan}"
        plans[f"{name} {params.get('states', '')}"] = plan
    return plans


def test_every_worker_and_list_query_uses_an_index_at_100k_jobs_of_history(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    history(app)
    checked(app)  # no statistics: replayq never runs ANALYZE
    # The same once statistics exist (autovacuum's auto-analyze, or an operator's ANALYZE).
    with app.storage.transaction() as tx:
        tx.connection.execute("ANALYZE rq_jobs")
        tx.connection.execute("ANALYZE rq_trace")
        tx.connection.execute("ANALYZE rq_idempotency")
    checked(app)


@pytest.mark.parametrize("state", ["dead", "queued"])
def test_a_state_list_at_100k_jobs_of_history_finds_the_same_jobs_as_a_full_scan(
    app_factory: AppFactory, state: str
) -> None:
    app = app_factory()
    history(app)
    listed = app.list_jobs(states=[state], limit=1000)
    expected = [j for j in range(HISTORY, 0, -1) if _state_of(j) == state]
    assert [job.id for job in listed] == expected
    assert app.count_jobs(states=[state]) == len(expected)
    page = app.list_jobs(states=[state], limit=3, before=expected[2])
    assert [job.id for job in page] == expected[3:6]


def _state_of(n: int) -> str:
    if HISTORY - LIVE_RUNNING - LIVE_QUEUED < n <= HISTORY - LIVE_QUEUED:
        return "running"
    if n > HISTORY - LIVE_QUEUED:
        return "queued"
    if n % 1000 == 0:
        return "dead"
    if n % 997 == 0:
        return "cancelled"
    return "succeeded"


def test_the_history_holds_one_trace_pack_a_job_and_enqueues_after_it_are_traced(
    app_factory: AppFactory,
) -> None:
    """The generated history is the same on both backends: one job row and one trace pack
    a job (SQLite's trigger ``rq_jobs_enqueued`` writes no second one while it is made),
    and a job enqueued afterwards still gets its ``job.enqueued``."""
    app = app_factory()

    @app.job("after")
    def after(ctx: replayq.Context) -> None: ...

    history(app)
    with app.storage.transaction(readonly=True) as tx:
        jobs, packs = tx.connection.execute(
            "SELECT (SELECT COUNT(*) FROM rq_jobs), (SELECT COUNT(*) FROM rq_trace)"
        ).fetchone()
    assert (jobs, packs) == (HISTORY, HISTORY)
    job_id = app.enqueue("after", {})
    assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
