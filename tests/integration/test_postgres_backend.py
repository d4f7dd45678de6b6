"""The PostgreSQL backend against a real server: what SQLite cannot show.

Migrations under a lock, per-key ordering enforced by the database and across
two workers, transactional enqueue on the application's own psycopg connection,
and LISTEN/NOTIFY wake-ups. One fresh schema per test. The verbs themselves
(claims under concurrency included) are in ``tests/conformance/test_storage_verbs.py``,
run on both backends.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import psycopg  # a plain import: in CI a missing driver must fail, never skip
import pytest

import replayq
from replayq.clock import FrozenClock
from replayq.errors import ConfigurationError, DatabaseUnavailableError, StorageError
from replayq.model import JobState
from replayq.storage import open_storage
from replayq.storage.postgres import (
    PostgresStorage,
    PostgresTransaction,
    _json_rows,
    parse_postgres_url,
)
from replayq.storage.postgres.adapt import array_literal, arrays_as_literals
from replayq.storage.protocol import JobFilter, JobsComplete, TraceQuery
from replayq.worker import Worker
from tests.conformance.test_storage_verbs import insert, lease

pytestmark = pytest.mark.postgres


@pytest.fixture
def storage(pg_schema_url: str) -> Iterator[PostgresStorage]:
    store = PostgresStorage(pg_schema_url)
    store.migrate(1_700_000_000.0)
    yield store
    store.close()


@pytest.fixture
def conninfo(pg_schema_url: str) -> str:
    """libpq conninfo of the test's schema, for the application's own connections."""
    return parse_postgres_url(pg_schema_url)[0]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


# -- connection and schema ------------------------------------------------------------------


def test_url_options_for_replayq_are_stripped_and_libpq_ones_kept(pg_schema_url: str) -> None:
    store = open_storage(f"{pg_schema_url}&pool_size=2")
    try:
        assert isinstance(store, PostgresStorage)
        assert store.pool.max_size == 2
        assert "pool_size" not in store.conninfo
        assert "search_path" in store.conninfo
    finally:
        store.close()


def test_bad_pool_size_is_a_configuration_error(pg_schema_url: str) -> None:
    with pytest.raises(ConfigurationError, match="pool_size"):
        PostgresStorage(f"{pg_schema_url}&pool_size=zero")


def test_unreachable_server_is_database_unavailable_with_the_driver_error_as_cause() -> None:
    with pytest.raises(DatabaseUnavailableError) as caught:
        PostgresStorage("postgresql://postgres@127.0.0.1:1/test?connect_timeout=1")
    assert isinstance(caught.value.__cause__, psycopg.Error)


def test_two_workers_starting_at_once_apply_each_migration_once(pg_schema_url: str) -> None:
    stores = [PostgresStorage(pg_schema_url) for _ in range(4)]
    applied: list[list[int]] = []
    barrier = threading.Barrier(len(stores))

    def start(store: PostgresStorage) -> None:
        barrier.wait()
        applied.append([m.version for m in store.migrate(1_700_000_000.0)])

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert sorted(len(a) for a in applied)[:-1] == [0] * (len(stores) - 1)
        assert sum(len(a) for a in applied) == len(stores[0].migration_status())
    finally:
        for store in stores:
            store.close()


def test_a_driver_error_inside_a_transaction_is_a_storage_error(
    storage: PostgresStorage,
) -> None:
    with pytest.raises(StorageError) as caught, storage.transaction() as tx:
        tx.job_insert(insert(priority="not a number"))
    assert isinstance(caught.value.__cause__, psycopg.Error)
    with storage.transaction() as tx:  # the pool handed back a usable connection
        assert tx.job_list(JobFilter()) == []


def test_read_only_and_writing_transactions_alternate_on_one_pooled_connection(
    pg_schema_url: str,
) -> None:
    """A session's read-only mode is set only when it changes: each transaction still gets
    the mode it asked for when the pool hands the same connection back again and again."""
    separator = "&" if "?" in pg_schema_url else "?"
    store = PostgresStorage(f"{pg_schema_url}{separator}pool_size=1")
    try:
        store.migrate(1_700_000_000.0)
        for _ in range(2):
            with pytest.raises(StorageError) as refused, store.transaction(readonly=True) as tx:
                tx.job_insert(insert())
            assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
            assert not isinstance(refused.value, DatabaseUnavailableError), "asked for"
            with store.transaction() as tx:
                tx.job_insert(insert())
            with store.transaction(readonly=True) as tx:
                assert tx.connection.execute("SHOW transaction_read_only").fetchone() == ("on",)
            with store.transaction() as tx:
                assert tx.connection.execute("SHOW transaction_read_only").fetchone() == ("off",)
        with store.transaction(readonly=True) as tx:
            assert len(tx.job_list(JobFilter())) == 2
    finally:
        store.close()


def test_a_session_ended_by_idle_in_transaction_timeout_is_unavailability(
    pg_schema_url: str,
) -> None:
    """SQLSTATE 25P03 (psycopg's ``InternalError``) is the database gone for this session,
    retried like a killed one, not a ``StorageError`` that fails the job."""
    store = PostgresStorage(f"{pg_schema_url}&idle_in_transaction_timeout=0.2")
    try:
        with pytest.raises(DatabaseUnavailableError) as caught, store.transaction() as tx:
            tx.connection.execute("SELECT 1")
            time.sleep(1.0)  # idle inside the transaction: the server ends the session
            tx.execute("migrations_applied")
        assert isinstance(caught.value.__cause__, psycopg.errors.IdleInTransactionSessionTimeout)
        with store.transaction() as tx:  # the pool replaced the ended session
            assert tx.connection.execute("SELECT 1").fetchone() is not None
    finally:
        store.close()


# -- the verbs: tests/conformance/test_storage_verbs.py runs them on both backends ------------


# -- array parameters: sent as array literals (storage/postgres/adapt.py) --------------------

AWKWARD_TEXTS = [
    "",
    "NULL",
    "null",
    'a "quoted" word',
    'back\\slash and \\" both',
    "{braces},commas,and spaces ",
    "  leading and trailing  ",
    "tab\tnew\nline",
    "ünïcödé ✓ 日本",
    '{"json": ["a", "b\\"c"], "n": 1}',
]


@pytest.mark.parametrize(
    ("values", "cast"),
    [
        ([1, -2, 0, 2**62], "bigint[]"),
        (AWKWARD_TEXTS, "text[]"),
        (["x", None, "NULL", None], "text[]"),
        ([0.1, -0.0, 1e-300, 1.7976931348623157e308, float("inf"), float("-inf"), 60], "float8[]"),
        ([True, False, None], "boolean[]"),
        ([], "text[]"),
        ([None], "bigint[]"),
    ],
    ids=["ints", "awkward-texts", "nulls", "floats", "bools", "empty", "only-null"],
)
def test_an_array_literal_reads_back_as_the_list_it_was_made_from(
    storage: PostgresStorage, values: list[object], cast: str
) -> None:
    with storage.transaction(readonly=True) as tx:
        literal = array_literal(values)
        assert literal is not None
        (back,) = tx.connection.execute(f"SELECT %(v)s::{cast}", {"v": literal}).fetchone()
    assert back == values
    assert [type(v) for v in back] == [type(v) for v in values] or cast == "float8[]"


def test_nan_in_an_array_literal_reads_back_as_nan(storage: PostgresStorage) -> None:
    with storage.transaction(readonly=True) as tx:
        (back,) = tx.connection.execute(
            "SELECT %(v)s::float8[]", {"v": array_literal([float("nan")])}
        ).fetchone()
    assert len(back) == 1 and back[0] != back[0]


def _pack_rows(ts_values: list[float]) -> list[dict[str, object]]:
    """Pack rows (``PACK_COLUMNS``) with awkward texts, large integers and ``ts`` values."""
    return [
        {
            "trace_id": text,
            "job_id": 2**63 - 1 - n,
            "attempt": n,
            "worker_id": None if n % 3 == 0 else text,
            "hlc": 2**62 + n,
            "hlc_last": 2**62 + n + 1,
            "ts": ts,
            "events": text + "\u2028\x01\x1f",
        }
        for n, (text, ts) in enumerate(itertools.product(AWKWARD_TEXTS, ts_values))
    ]


_RECORDSET = """
    SELECT * FROM json_to_recordset(%s::json)
    AS r(trace_id text, job_id bigint, attempt integer, worker_id text, hlc bigint,
         hlc_last bigint, ts float8, events text)
"""


def test_pack_rows_json_reads_back_as_the_standard_encoders_text_does(
    storage: PostgresStorage,
) -> None:
    """The pack insert's JSON (orjson with the [fast] extra) gives the server the very
    values the standard encoder's text gives: stored rows do not change."""
    rows = _pack_rows([1_700_000_000.123456, 1e-05, 2.5e-07, 0.0, 1e16, 123.0, 5e-324])
    standard = json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = _json_rows(rows)
    assert text != standard, "orjson wrote it (its 0.00001 is the standard 1e-05)"
    with storage.transaction(readonly=True) as tx:
        ours = tx.connection.execute(_RECORDSET, (text,)).fetchall()
        theirs = tx.connection.execute(_RECORDSET, (standard,)).fetchall()
    assert ours == theirs
    assert [row[0] for row in ours] == [row["trace_id"] for row in rows]
    assert [row[6] for row in ours] == [row["ts"] for row in rows]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_pack_rows_json_refuses_a_time_that_is_not_finite(bad: float) -> None:
    # orjson would write ``null``: a pack with no time. The standard encoder refuses it.
    with pytest.raises(ValueError):
        _json_rows(_pack_rows([1.5, bad]))


def test_pack_rows_json_falls_back_where_orjson_refuses() -> None:
    rows = _pack_rows([1.5])
    rows[0]["job_id"] = 2**70  # beyond orjson's 64 bits
    rows[1]["trace_id"] = "lone \ud800 surrogate"  # not UTF-8
    assert json.loads(_json_rows(rows)) == rows


def test_a_list_of_containers_is_left_to_psycopg(storage: PostgresStorage) -> None:
    assert array_literal([[1, 2], [3, 4]]) is None
    assert array_literal([{"a": 1}]) is None
    params = {"ids": [1, 2], "nested": [[1], [2]], "n": 3}
    assert arrays_as_literals(params) == {"ids": "{1,2}", "nested": [[1], [2]], "n": 3}
    plain = {"n": 3}
    assert arrays_as_literals(plain) is plain


def test_awkward_texts_survive_every_array_path_of_a_job(pg_schema_url: str) -> None:
    """Payloads, results and trace events go through the batch statements' text arrays
    (bulk enqueue, grouped acks, trace packs): each awkward text comes back as it went."""
    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("echo")
    def echo(ctx: replayq.Context, text: str) -> dict[str, str]:
        with ctx.step("say"):
            ctx.decide("said", text, reasons=[text])
        return {"text": text}

    try:
        ids = app.enqueue_many(
            [replayq.EnqueueRequest("echo", {"text": text}) for text in AWKWARD_TEXTS]
        )
        stats = Worker(app, burst=True, concurrency=2).run()
        assert stats.succeeded == len(AWKWARD_TEXTS)
        for job_id, text in zip(ids, AWKWARD_TEXTS, strict=True):
            with app.storage.transaction(readonly=True) as tx:
                job = tx.job_get(job_id)
                events = tx.trace_query(TraceQuery(job_id=job_id))
            assert job is not None
            assert job.payload == {"text": text}
            assert job.result == {"text": text}
            decided = [e for e in events if e.name == "decision"]
            assert [e.data["value"] for e in decided] == [text], job_id
    finally:
        app.close()


# -- ordering keys --------------------------------------------------------------------------


def test_the_database_refuses_two_running_jobs_of_one_key(storage: PostgresStorage) -> None:
    with storage.transaction() as tx:
        tx.job_insert(insert(ordering_key="order:1"))
        second, _ = tx.job_insert(insert(ordering_key="order:1"))
        [first] = tx.job_lease(lease())
    assert first.id != second
    with pytest.raises(StorageError) as caught, storage.transaction() as tx:
        tx.execute(
            "job_lease_one",
            {
                "job_id": second,
                "owner_token": "sneaky",
                "worker_id": "w",
                "now": 1_700_000_001.0,
                "lease_now": 1_700_000_001.0,
                "lease_seconds": 30.0,
                "handler_version": None,
                "hlc": 9,
            },
        )
    assert isinstance(caught.value.__cause__, psycopg.errors.UniqueViolation)


def test_a_late_committed_older_job_does_not_run_beside_the_running_one(
    storage: PostgresStorage, conninfo: str
) -> None:
    """An enqueue that commits after a newer one of the same key waits its turn."""
    late = psycopg.connect(conninfo)
    try:
        late_tx = storage.adopt(late)
        late_id, _ = late_tx.job_insert(insert(ordering_key="k"))  # id reserved, not committed
        with storage.transaction() as tx:
            newer_id, _ = tx.job_insert(insert(ordering_key="k"))
        with storage.transaction() as tx:
            [running] = tx.job_lease(lease())
        assert running.id == newer_id > late_id
        late.commit()
        with storage.transaction() as tx:
            assert tx.job_lease(lease(owner="other")) == []
            assert tx.jobs_complete(JobsComplete(1_700_000_002.0, [(newer_id, "tok", None, 3)]))
            [next_job] = tx.job_lease(lease(owner="other"))
        assert next_job.id == late_id
    finally:
        late.close()


def wait_until_a_claim_waits(conninfo: str, first: PostgresTransaction, what: str) -> None:
    """Until a session other than ``first``'s waits on a lock of this schema's ``rq_jobs``:
    a claim of the older job of a key, on ``first``'s uncommitted index entry."""
    with psycopg.connect(conninfo, autocommit=True) as admin:

        def waits_on_the_index() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a"
                " USING (pid) WHERE l.relation = 'rq_jobs'::regclass"
                " AND a.wait_event_type = 'Lock' AND a.pid <> %s",
                [first.connection.info.backend_pid],
            ).fetchone()
            return row is not None and row[0] > 0

        wait_for(waits_on_the_index, 10, what)


@pytest.mark.parametrize("claim_first", [True, False], ids=["claim-first", "after-an-insert"])
def test_a_claim_that_collides_on_an_ordering_key_is_undone_alone_and_tried_again(
    storage: PostgresStorage, conninfo: str, claim_first: bool
) -> None:
    """Two claimers whose snapshots differ both pick a job of one key; the second waits
    on the unique index, collides when the first commits, and claims again with a fresh
    snapshot. Only its claim is undone: as the transaction's first statement (no
    savepoint) or after an insert of its own, which commits with the claim's retry."""
    late = psycopg.connect(conninfo)
    try:
        late_id, _ = storage.adopt(late).job_insert(insert(ordering_key="k"))  # not committed
        with storage.transaction() as tx:
            newer_id, _ = tx.job_insert(insert(ordering_key="k"))
        claimed: list[list[int]] = []
        errors: list[BaseException] = []
        with storage.transaction() as first:
            assert [j.id for j in first.job_lease(lease())] == [newer_id]
            late.commit()  # the older job is visible now; the newer one runs, uncommitted

            def second_claimer() -> None:
                try:
                    with storage.transaction() as tx:
                        if not claim_first:
                            tx.job_insert(insert(job_type="other"))
                        claimed.append([j.id for j in tx.job_lease(lease(owner="second"))])
                except BaseException as exc:  # reported by the test thread
                    errors.append(exc)

            thread = threading.Thread(target=second_claimer)
            thread.start()
            wait_until_a_claim_waits(conninfo, first, "the second claim to wait on the first")
        thread.join(10)
        assert not errors, errors
        with storage.transaction(readonly=True) as tx:
            others = [j.id for j in tx.job_list(JobFilter(job_type="other"))]
            jobs = {job_id: tx.job_get(job_id) for job_id in (late_id, newer_id, *others)}
        assert claimed == [others], "the retry claims what its own insert made, not job k"
        states = {job_id: (j.state, j.owner_token) for job_id, j in jobs.items() if j}
        assert states[late_id] == (JobState.QUEUED, None)
        assert states[newer_id] == (JobState.RUNNING, "tok")
        assert all(states[job_id] == (JobState.RUNNING, "second") for job_id in others)
    finally:
        late.close()


def test_a_group_commit_whose_claim_collides_on_a_key_is_done_again_whole(
    pg_schema_url: str, conninfo: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A group commit claims after its acks with no savepoint: a collision on an ordering
    key aborts its transaction, and the group is committed again at once (its claim in a
    savepoint then). The ack commits once, no job runs beside another of its key, and
    nothing waits for a retry."""
    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("ok")
    def ok(ctx: replayq.Context) -> None:
        return None

    @app.job("keyed", ordering="k:{k}")
    def keyed(ctx: replayq.Context, k: str) -> None:
        return None

    late = psycopg.connect(conninfo)
    try:
        acked = app.enqueue("ok", {})
        worker = Worker(app, worker_id="grouped", concurrency=1, prefetch=0)
        worker._grouping = True  # successes wait for a group commit, as in run()
        [job] = worker.lease(1)
        worker._execute(worker._work.get_nowait())
        late_id = app.enqueue("keyed", {"k": "x"}, conn=late)  # an id reserved, not committed
        newer_id = app.enqueue("keyed", {"k": "x"})
        caplog.set_level(logging.DEBUG, logger="replayq.worker")
        leased: list[list[replayq.Job]] = []
        errors: list[BaseException] = []
        with app.storage.transaction() as first:
            claim = lease(now=time.time() + 1, owner="first")
            assert [j.id for j in first.job_lease(claim)] == [newer_id]
            late.commit()  # the older job is visible now; the newer one runs, uncommitted

            def group_commit() -> None:
                try:
                    leased.append(worker._commit_group(worker._take_acks(), refill=True))
                except BaseException as exc:  # reported by the test thread
                    errors.append(exc)

            thread = threading.Thread(target=group_commit)
            thread.start()
            wait_until_a_claim_waits(conninfo, first, "the group's claim to wait on the first")
        thread.join(10)
        assert not errors, errors
        assert leased == [[]], "the older job waits: the newer one of its key runs"
        assert any("collided" in r.getMessage() for r in caplog.records), "it did collide"
        assert app.get_job(acked).state is JobState.SUCCEEDED
        assert [e.name for e in app.trace(acked)].count("job.succeeded") == 1
        assert app.get_job(late_id).state is JobState.QUEUED
        assert app.get_job(newer_id).owner_token == "first"
        assert worker._take_acks(all_of_them=True) == [], "nothing left for a retry"
        assert worker.stats.succeeded == 1 and job.id == acked
    finally:
        late.close()
        app.close()


def test_a_worker_whose_session_ends_between_claim_and_commit_holds_no_lease(
    pg_schema_url: str, conninfo: str
) -> None:
    """A worker's lease is one transaction: the claim and its ``job.leased`` packs. Here
    the server ends the worker's session as the packs go in (a trigger terminates its
    own backend, as when the worker is killed mid-lease): the job must stay queued,
    never leased without its event. It was left running under the dead lease, reaped
    later with no ``job.leased`` in its trace (seen once in the four-racer chaos test)."""
    app = replayq.App(pg_schema_url, auto_migrate=True)
    try:

        @app.job("noop")
        def noop(ctx: replayq.Context, n: int) -> None:
            return None

        worker = Worker(app, worker_id="doomed", routing_refresh=3600.0)
        # Nothing to lease yet: this lease reads the routing, the next one does not, so
        # that the next one's claim is its transaction's first statement.
        assert worker.lease(1) == []
        job_id = app.enqueue("noop", {"n": 1})
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION end_session_at_job_leased() RETURNS trigger LANGUAGE plpgsql "
                "AS $$ BEGIN IF NEW.events LIKE '%job.leased%' THEN "
                "PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN NEW; END $$"
            )
            admin.execute(
                "CREATE TRIGGER end_session BEFORE INSERT ON rq_trace "
                "FOR EACH ROW EXECUTE FUNCTION end_session_at_job_leased()"
            )
            try:
                with pytest.raises(DatabaseUnavailableError):
                    worker.lease(1)
            finally:
                admin.execute("DROP TRIGGER end_session ON rq_trace")
        job = app.get_job(job_id)
        assert (job.state, job.attempt, job.owner_token) == (JobState.QUEUED, 0, None)
        assert [e.name for e in app.trace(job_id)] == ["job.enqueued"]
        # The job is leased again at once, not after a dead lease runs out.
        [again] = worker.lease(1)
        assert again.id == job_id and again.attempt == 1
        assert [e.name for e in app.trace(job_id)] == ["job.enqueued", "job.leased"]
    finally:
        app.close()


def test_per_key_fifo_holds_with_two_workers_on_two_hosts(
    pg_schema_url: str,
) -> None:
    # Each account's jobs alternate between two queues, and each host serves one of them,
    # so every next job of a key is run by the other host: each of the 35 hand-overs
    # crosses hosts. With both hosts on one queue a key stayed on the host that first
    # leased it (a group commit acks a job and leases the next of its key in one
    # transaction), no key ever changed hosts, and one host could take all five keys
    # before the other's first lease (seen: 3 runs in 40 with one host idle).
    runs: list[tuple[str, int, float, float, str]] = []
    runs_lock = threading.Lock()
    queues = ["left", "right"]

    def build(host: str) -> replayq.App:
        app = replayq.App(pg_schema_url, auto_migrate=True)

        def step(ctx: replayq.Context, account: str, n: int) -> None:
            started = time.monotonic()
            time.sleep(0.01)
            with runs_lock:
                runs.append((account, n, started, time.monotonic(), host))

        for queue in queues:
            app.job(f"step_{queue}", queue=queue, ordering="account:{account}", lease="30s")(step)
        return app

    producer = build("producer")
    accounts = ["a", "b", "c", "d", "e"]
    per_account = 8
    producer.enqueue_many(
        [
            replayq.EnqueueRequest(f"step_{queues[n % 2]}", {"account": account, "n": n})
            for n in range(per_account)
            for account in accounts
        ]
    )
    hosts = [build(queue) for queue in queues]
    workers = [
        Worker(app, concurrency=4, poll_interval=0.05, queues=[queue])
        for app, queue in zip(hosts, queues, strict=True)
    ]
    threads = [threading.Thread(target=w.run) for w in workers]
    for thread in threads:
        thread.start()
    try:
        total = len(accounts) * per_account
        wait_for(
            lambda: len(producer.list_jobs(states=["succeeded"], limit=total)) == total,
            timeout=60,
            what="every job to succeed",
        )
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)
        for app in [producer, *hosts]:
            app.close()
    assert all(w.stats.succeeded > 0 for w in workers), "both hosts took part"
    by_account: dict[str, list[tuple[int, float, float, str]]] = defaultdict(list)
    for account, n, started, ended, host in runs:
        by_account[account].append((n, started, ended, host))
    assert sorted(by_account) == accounts
    for account, seen in by_account.items():
        seen.sort(key=lambda run: run[1])
        assert [n for n, _, _, _ in seen] == list(range(per_account)), account
        assert [host for _, _, _, host in seen] == [queues[n % 2] for n in range(per_account)]
        for (_, _, ended, _), (_, next_started, _, _) in itertools.pairwise(seen):
            assert ended <= next_started, f"two jobs of {account} overlapped"


# -- transactional enqueue ------------------------------------------------------------------


@pytest.fixture
def shop(pg_schema_url: str, conninfo: str) -> Iterator[replayq.App]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
    app = replayq.App(pg_schema_url, auto_migrate=True)

    @app.job("ship_order")
    def ship_order(ctx: replayq.Context, order_id: int) -> None:
        return None

    yield app
    app.close()


def orders_and_jobs(app: replayq.App, conninfo: str) -> tuple[list[int], list[int]]:
    with psycopg.connect(conninfo) as conn:
        orders = [row[0] for row in conn.execute("SELECT id FROM orders ORDER BY id")]
    jobs = [job.payload["order_id"] for job in app.list_jobs(job_type="ship_order")]
    return orders, jobs


def test_a_rolled_back_transaction_leaves_neither_the_business_row_nor_the_job(
    shop: replayq.App, conninfo: str
) -> None:
    with psycopg.connect(conninfo) as conn, pytest.raises(RuntimeError), conn.transaction():
        conn.execute("INSERT INTO orders (id, status) VALUES (1, 'paid')")
        shop.enqueue("ship_order", {"order_id": 1}, conn=conn)
        raise RuntimeError("payment provider said no")
    assert orders_and_jobs(shop, conninfo) == ([], [])


def test_a_committed_transaction_keeps_both_and_a_worker_runs_the_job(
    shop: replayq.App, conninfo: str
) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute("INSERT INTO orders (id, status) VALUES (2, 'paid')")
        job_id = shop.enqueue("ship_order", {"order_id": 2}, conn=conn)
        assert shop.list_jobs() == [], "invisible to others until the caller commits"
        conn.commit()
    assert orders_and_jobs(shop, conninfo) == ([2], [2])
    Worker(shop, burst=True).run()
    assert shop.get_job(job_id).state is JobState.SUCCEEDED


def test_a_bulk_enqueue_on_the_callers_connection_commits_with_it_and_wakes_listeners(
    shop: replayq.App, conninfo: str
) -> None:
    # Its own queue: the wake-up asserted is this enqueue's, not an earlier test's.
    queue = f"bulk-{time.monotonic_ns()}"

    @shop.job("ship_bulk", queue=queue)
    def ship_bulk(ctx: replayq.Context, order_id: int) -> None:
        return None

    storage = shop.storage
    assert isinstance(storage, PostgresStorage)
    woken: list[str | None] = []
    notifier = storage.listen(woken.append)
    try:
        wait_for(notifier.listening.is_set, 10, "LISTEN to be in place")
        requests = [replayq.EnqueueRequest("ship_bulk", {"order_id": n}) for n in (4, 5, 6)]
        with psycopg.connect(conninfo) as conn:
            conn.execute("INSERT INTO orders (id, status) VALUES (4, 'paid')")
            ids = shop.enqueue_many(requests, conn=conn)
            assert shop.list_jobs() == [], "invisible to others until the caller commits"
            time.sleep(0.2)
            assert queue not in woken, "no wake-up before the commit"
            conn.commit()
        wait_for(lambda: queue in woken, 5, "the wake-up sent with the bulk insert")
    finally:
        notifier.close()
    jobs = shop.list_jobs(job_type="ship_bulk")
    assert [job.payload["order_id"] for job in jobs] == [6, 5, 4]
    assert ids == sorted(ids) and {job.queue for job in jobs} == {queue}
    assert [e.name for e in shop.trace(ids[0])] == ["job.enqueued"]


def test_a_bulk_enqueue_on_the_callers_connection_goes_when_the_caller_rolls_back(
    shop: replayq.App, conninfo: str
) -> None:
    """Copied into the caller's transaction (whatever its row factory): rows, packs and
    wake-ups are the caller's to commit or roll back."""
    from psycopg.rows import dict_row

    requests = [replayq.EnqueueRequest("ship_order", {"order_id": n}) for n in range(20)]
    with psycopg.connect(conninfo, row_factory=dict_row) as conn:
        ids = shop.enqueue_many(requests, conn=conn)
        assert ids == sorted(ids) and len(set(ids)) == 20
        conn.rollback()
        kept = shop.enqueue_many(requests, conn=conn)
        conn.commit()
    assert {job.id for job in shop.list_jobs()} == set(kept) and not set(ids) & set(kept)
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM rq_trace").fetchone()
    assert row == (20, 20), "one pack per kept job, none of the rolled-back ones"
    assert [[e.name for e in shop.trace(i)] for i in kept] == [["job.enqueued"]] * 20


def test_a_copied_bulk_enqueue_wakes_the_queues_of_its_due_jobs_only(shop: replayq.App) -> None:
    """A batch with no message id is copied (rows and packs by ``COPY``); its wake-ups go
    with the ids, one per queue with a job due now, and are heard once it commits."""
    due, later = f"due-{time.monotonic_ns()}", f"later-{time.monotonic_ns()}"
    for job_type, queue in (("ship_due", due), ("ship_later", later)):
        shop.job(job_type, queue=queue)(lambda ctx, order_id: None)
    storage = shop.storage
    assert isinstance(storage, PostgresStorage)
    woken: list[str | None] = []
    notifier = storage.listen(woken.append)
    try:
        wait_for(notifier.listening.is_set, 10, "LISTEN to be in place")
        ids = shop.enqueue_many(
            [replayq.EnqueueRequest("ship_later", {"order_id": n}, delay="1h") for n in (1, 2)]
            + [replayq.EnqueueRequest("ship_due", {"order_id": n}) for n in (3, 4)]
        )
        wait_for(lambda: due in woken, 5, "the wake-up of the due jobs' queue")
        time.sleep(0.2)
        assert later not in woken, "no wake-up for a queue whose jobs are all delayed"
        assert woken.count(due) == 1, "one wake-up per queue, not per job"
    finally:
        notifier.close()
    assert ids == sorted(ids)
    assert [shop.get_job(i).queue for i in ids] == [later, later, due, due]
    assert [[e.name for e in shop.trace(i)] for i in ids] == [["job.enqueued"]] * 4


def test_enqueue_on_an_autocommit_connection_is_refused(shop: replayq.App, conninfo: str) -> None:
    with (
        psycopg.connect(conninfo, autocommit=True) as conn,
        pytest.raises(ConfigurationError, match="autocommit"),
    ):
        shop.enqueue("ship_order", {"order_id": 3}, conn=conn)


# -- LISTEN/NOTIFY --------------------------------------------------------------------------


def test_the_listener_comes_back_after_its_session_is_killed(storage: PostgresStorage) -> None:
    woken: list[str | None] = []
    notifier = storage.listen(woken.append)
    try:
        wait_for(notifier.listening.is_set, 10, "LISTEN to be in place")
        with psycopg.connect(storage.conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [notifier.backend_pid])
        wait_for(lambda: notifier.connects >= 2, 10, "the listener to reconnect")
        wait_for(notifier.listening.is_set, 10, "LISTEN to be back")
        woken.clear()
        now = time.time()
        with storage.transaction() as tx:
            tx.job_insert(insert(now=now, run_at=now))
        wait_for(lambda: "default" in woken, 5, "a notification after the reconnect")
    finally:
        notifier.close()


def test_closing_the_listener_does_not_wait_out_a_timeout(storage: PostgresStorage) -> None:
    """An idle worker's shutdown closes its LISTEN connection at once (it used to wait up
    to 0.5 s for the LISTEN loop's timeout): each of five closes takes well under that."""
    took = []
    for _ in range(5):
        notifier = storage.listen(lambda queue: None)
        wait_for(notifier.listening.is_set, 10, "LISTEN to be in place")
        time.sleep(0.05)  # inside its wait on the socket
        started = time.monotonic()
        notifier.close()
        took.append(time.monotonic() - started)
        assert not notifier._thread.is_alive()
    assert max(took) < 0.15, took


def test_a_frozen_clock_app_uses_the_callers_now(pg_schema_url: str) -> None:
    clock = FrozenClock(1_800_000_000.0)
    app = replayq.App(pg_schema_url, auto_migrate=True, clock=clock)

    @app.job("later")
    def later(ctx: replayq.Context) -> None:
        return None

    try:
        job_id = app.enqueue("later", {}, delay="10s")
        assert app.get_job(job_id).run_at == 1_800_000_010.0
        assert Worker(app, burst=True).run().leased == 0
        clock.advance(10)
        assert Worker(app, burst=True).run().succeeded == 1
    finally:
        app.close()


def test_a_wake_up_reaches_only_the_listeners_of_its_own_installation(
    storage: PostgresStorage,
) -> None:
    """Two installations in sibling schemas of one database share the channel; each
    listener hears its own schema's enqueues (and reconnects) only."""
    import uuid

    from tests.conftest import PG_URL

    sibling = f"rq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(sibling)))
    sep = "&" if "?" in PG_URL else "?"
    other = replayq.App(f"{PG_URL}{sep}options=-csearch_path%3D{sibling}", auto_migrate=True)
    mine = replayq.App(storage.url)
    for app in (other, mine):
        app.job("ping")(lambda ctx: None)
    woken: list[str | None] = []
    notifier = storage.listen(woken.append)
    try:
        wait_for(notifier.listening.is_set, 10, "LISTEN to be in place")
        woken.clear()  # the callback(None) of the connect
        other.enqueue("ping", {})
        time.sleep(0.3)
        assert woken == [], "the sibling schema's enqueue woke this installation's listener"
        mine.enqueue("ping", {})
        wait_for(lambda: woken == ["default"], 5, "this installation's own wake-up")
    finally:
        notifier.close()
        other.close()
        mine.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(sibling))
            )
