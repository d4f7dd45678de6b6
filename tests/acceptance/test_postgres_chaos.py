"""PostgreSQL under fire, with real worker subprocesses: races, killed sessions, a server
restart and a network partition between two hosts (network namespaces).

What each test asserts is what a user relies on: every job enqueued finishes, each
business effect happens once (counted outside the queue's tables: by the counting HTTP
server of ``tests/services.py`` and in a file the effect itself appends to), no job is
ever held by two live leases, and a worker cut off from the database cannot write what
it did late. Every test ends with the chaos checker (``tests/chaos_check.py``) over its
database and the counting server, and prints its table.

``test_server_restart_*`` stops and starts a PostgreSQL server of its own (``initdb``
and ``pg_ctl``, a temp data directory, a free port), ``fast`` and ``immediate``: the
machine's shared server is never restarted. The other tests use the shared server
and end only their own workers' sessions.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import replayq
from replayq.storage.postgres import parse_postgres_url
from tests import chaos_check
from tests.acceptance.workers import (
    REPLAYQ,
    ROOT,
    WorkerLauncher,
    WorkerProcess,
    read_lines,
    show_worker_logs,
    wait_for,
)
from tests.apps import pg_effects
from tests.conftest import missing
from tests.services import SERVICE_ENV, Service

# In CI (not soak): each passed 3 runs in a row and more (docs/postgres.md, "Running the
# chaos tests"). Together they take about a minute.
pytestmark = [pytest.mark.postgres]

APP = "tests.apps.pg_effects:app"
# Workers' sessions carry this name and a per-test suffix, so the killer ends theirs and
# no one else's (not even those of the same test run concurrently by another suite).
WORKER_APPLICATION = "replayq-chaos-worker"


class PgWorkerLauncher(WorkerLauncher):
    """``WorkerLauncher`` on a PostgreSQL URL; workers may run inside a network namespace."""

    def __init__(self, url: str, directory: Path) -> None:
        super().__init__(directory / "unused.db", directory)
        self.pg_url = url

    @property
    def url(self) -> str:
        return self.pg_url

    def start(  # type: ignore[override]
        self,
        worker_id: str,
        *,
        concurrency: int = 2,
        grace: float = 5.0,
        poll_interval: float = 0.05,
        url: str | None = None,
        netns: str | None = None,
        queues: str | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        db = url or self.url
        argv = [REPLAYQ, "--db", db, "worker", "--app", APP, "--worker-id", worker_id]
        argv += ["--concurrency", str(concurrency), "--grace", str(grace)]
        argv += ["--poll-interval", str(poll_interval)]
        if queues:
            argv += ["--queues", queues]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]  # ip execs: the pid is the worker's
        output = self.directory / f"worker-{worker_id}.log"
        python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        full_env = {**os.environ, "REPLAYQ_DB": db, "PYTHONPATH": python_path, **(env or {})}
        with output.open("wb") as sink:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT
            )
        worker = WorkerProcess(worker_id, proc, output)
        self.started.append(worker)
        return worker


def with_options(url: str, **options: object) -> str:
    return url + "".join(f"&{key}={value}" for key, value in options.items())


@pytest.fixture
def pg_launcher(
    request: pytest.FixtureRequest, pg_schema_url: str, tmp_path: Path
) -> Iterator[PgWorkerLauncher]:
    migrator = replayq.App(pg_schema_url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the test's schema
    migrator.close()
    application = f"{WORKER_APPLICATION}-{uuid.uuid4().hex[:8]}"
    url = with_options(pg_schema_url, application_name=application, pool_size=6)
    workers = PgWorkerLauncher(url, tmp_path)
    yield workers
    workers.kill_all()
    show_worker_logs(request, workers.started, tail=6000)


@pytest.fixture
def chaos_app(pg_schema_url: str) -> Iterator[replayq.App]:
    """The ``pg_effects`` job types on the test's schema, to enqueue and read."""
    app = pg_effects.build(pg_schema_url)
    yield app
    app.close()


def enqueue_charges(
    app: replayq.App, sink: Path, numbers: range, seconds: float = 0.0, accounts: int = 0
) -> list[int]:
    """One charge per number; with ``accounts``, every other one is an ``ordered_charge``
    of account ``n % accounts`` (per-key FIFO under fire, for the checker's order row)."""
    payload = {"sink": str(sink), "seconds": seconds}
    requests = [
        replayq.EnqueueRequest("ordered_charge", {**payload, "n": n, "account": n % accounts})
        if accounts and n % 2
        else replayq.EnqueueRequest("charge", {**payload, "n": n})
        for n in numbers
    ]
    return app.enqueue_many(requests)


def states(app: replayq.App) -> Counter[str]:
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute("SELECT state, count(*) FROM rq_jobs GROUP BY state")
        return Counter({state: count for state, count in rows.fetchall()})


def all_succeeded(app: replayq.App, total: int) -> bool:
    return states(app).get("succeeded", 0) >= total


def effects_per_key(sink: Path) -> Counter[int]:
    return Counter(line["n"] for line in read_lines(sink) if line["event"] == "effect")


def assert_each_effect_once(sink: Path, numbers: range) -> None:
    counts = effects_per_key(sink)
    twice = {n: c for n, c in counts.items() if c > 1}
    assert not twice, f"effects repeated: {twice}"
    missing = set(numbers) - set(counts)
    assert not missing, f"effects never made: {sorted(missing)[:20]}"


def succeeded_events_per_job(app: replayq.App) -> Counter[int]:
    with app.storage.transaction(readonly=True) as tx:
        rows = tx.connection.execute(
            "SELECT job_id, count(*) FROM rq_events WHERE name = 'job.succeeded' GROUP BY job_id"
        )
        return Counter({job_id: count for job_id, count in rows.fetchall()})


def listening_worker_sessions(conninfo: str) -> set[int]:
    """The server sessions (pids) from which this test's workers ``LISTEN``: a worker
    starts its listener as its dispatcher starts leasing. A listener's last statement
    reads which ``rq_jobs`` it listens for, and stays its last for five seconds (then a
    health check may follow): pollers a few milliseconds apart see each one."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
            [
                psycopg.conninfo.conninfo_to_dict(conninfo)["application_name"],
                "%to_regclass('rq_jobs')%",
            ],
        ).fetchall()
    return {pid for (pid,) in rows}


def kill_worker_sessions(conninfo: str) -> int:
    """``pg_terminate_backend`` every worker session (pools and listeners); how many."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            [psycopg.conninfo.conninfo_to_dict(conninfo)["application_name"]],
        ).fetchall()
    return sum(1 for (done,) in rows if done)


# -- 1. four workers racing --------------------------------------------------------------------


def test_four_workers_racing_never_hold_one_job_with_two_live_leases(
    pg_launcher: PgWorkerLauncher, chaos_app: replayq.App, tmp_path: Path, effects_service: Service
) -> None:
    # No ctx.effect here: a worker SIGKILLed inside an effect leaves it in doubt (parked
    # for a human, by design); this test is about leases, so its jobs only log executions.
    sink = tmp_path / "runs.jsonl"
    total = 600
    payload = {"sink": str(sink), "seconds": 0.002}
    conninfo = parse_postgres_url(pg_launcher.url)[0]
    workers = [pg_launcher.start(f"racer-{i}", concurrency=3) for i in range(4)]
    # The jobs go in once all four are leasing, so that all four race for them: under
    # load the racers' start-ups were hundreds of milliseconds apart, the first ones
    # drained the queue before racer-0 leased anything, and it was never caught
    # holding a job (seen: 2 runs in 6 at load average 4-6).
    listeners: set[int] = set()

    def all_listening() -> bool:
        listeners.update(listening_worker_sessions(conninfo))
        return len(listeners) >= len(workers)

    wait_for(all_listening, timeout=60, what="all four racers to listen")
    chaos_app.enqueue_many(
        [replayq.EnqueueRequest("touch", {**payload, "n": n}) for n in range(total)]
    )

    # One racer crashes mid-run while it holds jobs: they are re-leased by the others after
    # the lease. Jobs last milliseconds, so "it holds one" is checked while it is frozen
    # (SIGSTOP): a racer that holds nothing is thawed and caught again, one that does is
    # SIGKILLed without running another instruction, so it dies holding exactly those.
    def ended() -> set[int]:
        return {line["n"] for line in read_lines(sink) if line["event"] == "end"}

    wait_for(lambda: len(ended()) > total // 4, timeout=60, what="a quarter done")

    def held_by_racer_0() -> set[int]:
        with chaos_app.storage.transaction(readonly=True) as tx:
            rows = tx.connection.execute(
                "SELECT id FROM rq_jobs WHERE state = 'running' AND worker_id = 'racer-0'"
            ).fetchall()
        return {job_id for (job_id,) in rows}

    def racer_0_frozen_holding_jobs() -> set[int]:
        workers[0].signal(signal.SIGSTOP)
        held = held_by_racer_0()
        if held:
            # A COMMIT it sent just before it froze still lands (seen: an ack in flight):
            # give the server time to apply it, then read what it really dies holding.
            time.sleep(0.2)
            held = held_by_racer_0()
        if not held:
            workers[0].signal(signal.SIGCONT)
        return held

    held = wait_for(racer_0_frozen_holding_jobs, timeout=20, what="racer-0 to hold a job")
    workers[0].proc.kill()  # SIGKILL ends a stopped process; no SIGCONT in between
    workers[0].proc.wait(10)
    workers[0].stopped = False
    wait_for(lambda: all_succeeded(chaos_app, total), timeout=60, what=f"{total} succeeded")

    assert states(chaos_app) == Counter({"succeeded": total})
    assert set(succeeded_events_per_job(chaos_app).values()) == {1}
    assert ended() == set(range(total))
    # From the trace: two leases of one job never overlap. (A job's row holds one owner at
    # a time, so no query of rq_jobs can see two: a second lease shows only in the trace.)
    # A lease lives from its job.leased until its settle or release, or else until its last
    # deadline (extended by heartbeats) when it was reaped.
    with chaos_app.storage.transaction(readonly=True) as tx:
        events = tx.connection.execute(
            "SELECT job_id, worker_id, name, ts, data FROM rq_events "
            "WHERE job_id IS NOT NULL ORDER BY job_id, hlc, id"
        ).fetchall()
    windows: dict[int, list[list[Any]]] = defaultdict(list)  # [start, end, worker]
    closing = {"job.succeeded", "lease.released", "retry.scheduled", "job.dead"}
    for job_id, worker_id, name, ts, raw in events:
        data = replayq.codec.loads(raw)
        if name == "job.leased":
            windows[job_id].append([ts, data["lease_deadline"], worker_id])
        elif windows[job_id] and name == "lease.extended" and data.get("lease_deadline"):
            current = windows[job_id][-1]
            current[1] = max(current[1], data["lease_deadline"])
        elif windows[job_id] and name in closing and worker_id == windows[job_id][-1][2]:
            current = windows[job_id][-1]
            current[1] = min(current[1], ts)
    for job_id, spans in windows.items():
        for (_, end, _), (start, _, _) in itertools.pairwise(sorted(spans)):
            assert start >= end, f"job {job_id}: leases overlap: {spans}"
    # What the kill was for: every job racer-0 died holding was leased again by another
    # racer, after racer-0's lease ran out, and finished there.
    for job_id in held:
        owners = [worker for _, _, worker in windows[job_id]]
        trail = [(w, name, round(ts, 3)) for j, w, name, ts, _ in events if j == job_id]
        assert owners[0] == "racer-0" and len(owners) >= 2, f"job {job_id}: {owners} {trail}"
        assert chaos_app.get_job(job_id).worker_id != "racer-0"
        assert chaos_app.get_job(job_id).redelivery_count >= 1
    print(f"\nracer-0 SIGKILLed holding jobs {sorted(held)}: each re-leased and finished")
    # Its jobs make no effect (see above): the server counts none, the table's other rows
    # (lost, stuck, stale settles, dead) are what this run puts to the test.
    chaos_check.assert_clean(
        "PostgreSQL, four racing workers, one SIGKILLed holding jobs",
        pg_launcher.url,
        effects_service.base_url,
        expected=total,
    )
    for worker in workers[1:]:
        worker.signal(signal.SIGTERM)
        assert worker.wait(15) == 0


# -- 2. session kill loop ----------------------------------------------------------------------

# Half of the kill loop's charges are ordered by account: 50 accounts, 20 jobs each.
ACCOUNTS = 50


@pytest.mark.timeout(300)  # 17-30 s alone; timed out once at 120 s with other suites running
def test_killed_sessions_lose_nothing_repeat_no_effect_and_listen_comes_back(
    pg_launcher: PgWorkerLauncher, chaos_app: replayq.App, tmp_path: Path, effects_service: Service
) -> None:
    sink = tmp_path / "effects.jsonl"
    probes = tmp_path / "probes.jsonl"
    conninfo = parse_postgres_url(pg_launcher.url)[0]
    # A long poll interval: an idle worker finds a probe in time only through LISTEN.
    workers = [pg_launcher.start(f"w{i}", concurrency=4, poll_interval=30) for i in range(2)]
    rounds, per_round = 10, 200
    total = rounds * per_round
    killed: list[int] = []
    recovery: list[float] = []
    probe_n = 0

    def probe_latency() -> float:
        """Seconds from a probe's enqueue to its handler starting."""
        nonlocal probe_n
        probe_n += 1
        n = probe_n
        enqueued = time.time()
        chaos_app.enqueue("probe", {"n": n, "sink": str(probes)})
        started = wait_for(
            lambda: [line["t"] for line in read_lines(probes) if line["n"] == n],
            timeout=40,
            what=f"probe {n} to start",
            interval=0.005,
        )
        return float(started[0]) - enqueued

    def listening_again() -> float:
        """Seconds after the kill until a probe was picked up in under 100 ms."""
        killed_at = time.monotonic()
        deadline = killed_at + 3.0
        while True:
            latency = probe_latency()
            if latency < 0.1:
                return time.monotonic() - killed_at
            assert time.monotonic() < deadline, f"pickup latency still {latency:.3f}s after 3s"
            time.sleep(0.05)

    wait_for(lambda: probe_latency() < 0.1, timeout=30, what="workers to start listening")
    for r in range(rounds):
        numbers = range(r * per_round, (r + 1) * per_round)
        enqueue_charges(chaos_app, sink, numbers, accounts=ACCOUNTS)
        time.sleep(random.uniform(0.05, 0.3))
        killed.append(kill_worker_sessions(conninfo))  # mid-run: pools, listeners, in-flight
        wait_for(
            lambda end=numbers.stop: all_succeeded(chaos_app, end + probe_n),  # type: ignore[misc]
            timeout=60,
            what=f"round {r} to finish",
        )
        time.sleep(0.2)  # idle: the next kill hits listeners waiting for notifications
        killed.append(kill_worker_sessions(conninfo))
        recovery.append(listening_again())

    print(
        f"\n{len(killed)} kills ended {sum(killed)} sessions; LISTEN back (probe < 100 ms) "
        f"after max {max(recovery) * 1000:.0f} ms, "
        f"median {statistics.median(recovery) * 1000:.0f} ms"
    )
    assert all(count >= 2 for count in killed), f"every kill must hit both listeners: {killed}"
    wait_for(lambda: all_succeeded(chaos_app, total + probe_n), timeout=20, what="the last probe")
    assert states(chaos_app) == Counter({"succeeded": total + probe_n})
    assert set(succeeded_events_per_job(chaos_app).values()) == {1}
    assert_each_effect_once(sink, range(total))
    chaos_check.assert_clean(
        f"PostgreSQL, worker sessions terminated {len(killed)} times (LISTEN ones included)",
        pg_launcher.url,
        effects_service.base_url,
        expected=total + probe_n,
        recovery_seconds=max(recovery),
        sink=sink,
    )
    for worker in workers:
        assert worker.proc.poll() is None, f"worker {worker.worker_id} died\n{worker.log()}"
        assert worker.log().count("LISTEN connection lost") >= rounds
        worker.signal(signal.SIGTERM)
        assert worker.wait(15) == 0


# -- 2b. one worker host's clock 30 s fast ------------------------------------------------------


def test_a_worker_whose_clock_runs_30_s_fast_reaps_no_live_lease(
    pg_launcher: PgWorkerLauncher,
    chaos_app: replayq.App,
    tmp_path: Path,
    effects_service: Service,
) -> None:
    """Leases are judged by the server's clock: a worker 30 s fast (leases of 2 s,
    heartbeats every 0.5 s) would, by its own clock, see every other worker's lease as
    expired 28 s ago and reap it; by the server's it reaps none."""
    sink = tmp_path / "effects.jsonl"
    total = 300
    enqueue_charges(chaos_app, sink, range(total), seconds=0.01)
    started = time.monotonic()
    workers = [pg_launcher.start(f"w{i}", concurrency=3) for i in range(2)]
    workers.append(pg_launcher.start("fast", concurrency=3, env={"CHAOS_CLOCK_OFFSET": "30"}))
    # Settled, not succeeded: judged by its own clock the fast worker buries jobs whose
    # effect another worker had started (in doubt), and the checker must say so.
    wait_for(
        lambda: states(chaos_app)["succeeded"] + states(chaos_app)["dead"] >= total,
        timeout=90,
        what=f"{total} settled",
    )
    with chaos_app.storage.transaction(readonly=True) as tx:
        reaps = tx.connection.execute(
            "SELECT worker_id, count(*) FROM rq_events WHERE name = 'lease.expired' "
            "GROUP BY worker_id"
        ).fetchall()
        leased_by_fast = tx.connection.execute(
            "SELECT count(*) FROM rq_events WHERE name = 'job.leased' AND worker_id = 'fast'"
        ).fetchone()
    assert reaps == [], f"live leases reaped: {reaps}"
    assert leased_by_fast is not None and leased_by_fast[0] > 0, "the fast worker took part"
    chaos_check.assert_clean(
        "PostgreSQL, one worker of three with its clock 30 s fast",
        pg_launcher.url,
        effects_service.base_url,
        expected=total,
        recovery_seconds=time.monotonic() - started,
        sink=sink,
    )
    for worker in workers:
        assert worker.proc.poll() is None, f"worker {worker.worker_id} died\n{worker.log()}"


# -- 3. server restart -------------------------------------------------------------------------


PG_BINARIES = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class OwnServer:
    """A PostgreSQL server of the suite's own: its own data directory (a temp dir) and port.

    Started with ``initdb`` + ``pg_ctl`` (as the ``postgres`` user when run as root, which
    ``initdb`` refuses to be), stopped ``fast`` or ``immediate`` by the test, removed
    afterwards. The machine's shared server is never stopped or restarted.
    """

    def __init__(self, bin_dir: Path, root: Path, port: int) -> None:
        self.bin_dir, self.root, self.port = bin_dir, root, port
        self.data = root / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin_dir / tool), *args],
            capture_output=True,
            timeout=120,
            check=True,
        )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


def server_answers(conninfo: str) -> bool:
    try:
        psycopg.connect(conninfo, connect_timeout=1).close()
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture
def own_server() -> Iterator[OwnServer]:
    """A PostgreSQL server for this test alone, on a free port; removed afterwards."""
    if not PG_BINARIES:
        missing(
            "PostgreSQL's server binaries (initdb, pg_ctl) are not installed",
            install="apt-get install postgresql",
        )
    root = Path(tempfile.mkdtemp(prefix="replayq-chaos-pg-"))
    server = OwnServer(PG_BINARIES[-1].parent, root, free_port())
    if server.as_user:
        shutil.chown(root, "postgres", "postgres")
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_mid_run_loses_nothing_and_sigterm_during_the_outage_exits(
    own_server: OwnServer, mode: str, tmp_path: Path, effects_service: Service
) -> None:
    migrator = replayq.App(own_server.url, auto_migrate=True)
    migrator.storage  # noqa: B018 - opening it migrates the server's database
    migrator.close()
    application = f"{WORKER_APPLICATION}-{uuid.uuid4().hex[:8]}"
    pg_launcher = PgWorkerLauncher(
        f"{own_server.url}?application_name={application}&pool_size=6", tmp_path
    )
    chaos_app = pg_effects.build(own_server.url)
    try:
        _restart_mid_run(own_server, mode, pg_launcher, chaos_app, tmp_path, effects_service)
    except BaseException:
        for worker in pg_launcher.started:
            print(f"--- worker {worker.worker_id} ---\n{worker.log()[-6000:]}")
        raise
    finally:
        pg_launcher.kill_all()
        chaos_app.close()


def _restart_mid_run(
    server: OwnServer,
    mode: str,
    pg_launcher: PgWorkerLauncher,
    chaos_app: replayq.App,
    tmp_path: Path,
    effects_service: Service,
) -> None:
    sink = tmp_path / "effects.jsonl"
    total = 600
    enqueue_charges(chaos_app, sink, range(total), seconds=0.005)
    # Leases outlast the outage: an effect cut off mid-record is then finished by its own
    # attempt once the server is back, not found in doubt by a redelivery.
    long_lease = {"PG_EFFECTS_LEASE": "8s"}
    workers = [
        pg_launcher.start(f"w{i}", concurrency=4, env=long_lease, queues="default")
        for i in range(2)
    ]
    # The worker stopped during the outage is the only one on queue "slow", and holds both
    # of its jobs, mid-handler, when the server goes: at the end of its grace it cannot
    # release them (the database is down) and exits anyway; they are reaped after their
    # lease and finished by a worker started on "slow" once the server is back. (One lease
    # for every process: a job type's contract, lease included, is frozen per version.)
    doomed = pg_launcher.start(
        "stopped-in-outage", concurrency=2, grace=2.0, queues="slow", env=long_lease
    )
    wait_for(lambda: len(effects_per_key(sink)) > total // 4, timeout=60, what="a quarter done")
    slow_sink = tmp_path / "slow.jsonl"
    slow = [
        chaos_app.enqueue("touch", {"n": n, "sink": str(slow_sink), "seconds": 5.0}, queue="slow")
        for n in range(2)
    ]
    wait_for(lambda: len(read_lines(slow_sink)) >= 2, timeout=20, what="slow jobs to start")
    with chaos_app.storage.transaction(readonly=True) as tx:
        held = tx.connection.execute(
            "SELECT count(*) FROM rq_jobs WHERE state = 'running' AND worker_id = %s",
            [doomed.worker_id],
        ).fetchone()
    assert held == (2,), f"the worker to stop must hold both slow jobs, holds {held}"

    server.stop(mode)  # the outage: every connection drops, new ones are refused
    try:
        time.sleep(0.5)
        doomed.signal(signal.SIGTERM)
        started = time.monotonic()
        assert doomed.wait(10) == 0
        exit_after = time.monotonic() - started
        assert not server_answers(parse_postgres_url(pg_launcher.url)[0])
    finally:
        server.start()
    back = time.monotonic()
    pg_launcher.start("rescuer", concurrency=2, queues="slow", env=long_lease)

    wait_for(lambda: all_succeeded(chaos_app, total + len(slow)), timeout=60, what="the run")
    recovery = time.monotonic() - back
    # The worker stopped in the outage never settled its two jobs (5 s handlers, it exited
    # within its 2 s grace): it met the dead database with the jobs in hand (releasing or
    # a settle failed, and it says so), and the rescuer settled each of them once.
    assert "could not release job" in doomed.log() or "gave up settling" in doomed.log()
    for job_id in slow:
        events = chaos_app.trace(job_id)
        assert not [e for e in events if e.name == "lease.released"], "released while down"
        settled = [e.worker_id for e in events if e.name in ("job.succeeded", "job.dead")]
        assert settled == ["rescuer"], f"job {job_id} settled by {settled}"
    print(
        f"\nSIGTERM during the outage ({mode} stop): worker exited after {exit_after:.2f}s "
        f"(grace 2s), holding 2 jobs"
    )
    assert exit_after < 2.0 + 2.0
    # The slow jobs make no effect; the charges one each.
    chaos_check.assert_clean(
        f"PostgreSQL, its server stopped {mode} mid-run and started again",
        server.url,
        effects_service.base_url,
        expected=total + len(slow),
        recovery_seconds=recovery,
        sink=sink,
    )
    assert states(chaos_app) == Counter({"succeeded": total + len(slow)})
    assert_each_effect_once(sink, range(total))
    for worker in workers:
        assert "database unavailable" in worker.log()
        assert worker.proc.poll() is None, f"worker {worker.worker_id} died\n{worker.log()}"
        worker.signal(signal.SIGTERM)
        assert worker.wait(15) == 0


# -- 4. network partition between two hosts ----------------------------------------------------


class Forwarder:
    """A TCP relay in the root namespace: ``listen`` addresses → the local PostgreSQL.

    PostgreSQL listens on 127.0.0.1 only; relaying from the veth addresses reaches it
    without touching its configuration. The relay's host-side sockets use short TCP
    keepalives, as a server with ``tcp_keepalives_*`` set would: when a host is cut
    off, its sessions (and any row locks they hold) end within seconds.
    """

    def __init__(self, addresses: list[str], target: tuple[str, int]) -> None:
        self.target = target
        self.listeners: list[socket.socket] = []
        self.port = 0
        self.closed = threading.Event()
        for address in addresses:
            listener = socket.create_server((address, self.port))
            self.port = listener.getsockname()[1]
            self.listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            client.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3000)
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.closed.set()
        for listener in self.listeners:
            listener.close()


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture
def two_hosts() -> Iterator[dict[str, tuple[str, str]]]:
    """Two network namespaces, each joined to the root namespace by a veth pair.

    Yields ``{host: (namespace, root-side address)}``; the root-side interface of
    host ``a`` is ``{namespace}h``. Everything is removed afterwards, even on failure.
    """
    tag = f"rq{os.getpid() % 10000}{uuid.uuid4().hex[:3]}"
    probe = f"{tag}p"
    try:
        ip("netns", "add", probe)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc)
        missing(
            f"network namespaces are not permitted here (ip netns add: {detail!r})",
            install="apt-get install iproute2 and run as root or with CAP_NET_ADMIN "
            "(a container needs --cap-add NET_ADMIN)",
        )
    ip("netns", "del", probe)
    hosts: dict[str, tuple[str, str]] = {}
    subnet = random.randint(16, 250)
    try:
        for index, host in enumerate(("a", "b"), start=1):
            ns = f"{tag}{host}"
            host_if, ns_if = f"{ns}h", f"{ns}n"
            root_ip, ns_ip = f"10.{subnet}.{index}.1", f"10.{subnet}.{index}.2"
            ip("netns", "add", ns)
            hosts[host] = (ns, root_ip)
            ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            ip("link", "set", ns_if, "netns", ns)
            ip("addr", "add", f"{root_ip}/24", "dev", host_if)
            ip("link", "set", host_if, "up")
            ip("-n", ns, "addr", "add", f"{ns_ip}/24", "dev", ns_if)
            ip("-n", ns, "link", "set", ns_if, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _ in hosts.values():
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", f"{ns}h")  # deleting one end removes the pair
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", ns)


def test_a_partitioned_host_is_fenced_and_its_jobs_finish_elsewhere_once(
    two_hosts: dict[str, tuple[str, str]],
    pg_launcher: PgWorkerLauncher,
    chaos_app: replayq.App,
    tmp_path: Path,
    effects_service: Service,
) -> None:
    target = psycopg.conninfo.conninfo_to_dict(parse_postgres_url(pg_launcher.url)[0])
    here = f"{target['host']}:{target['port']}"
    assert here in pg_launcher.url, "the test URL names host:port"
    addresses = [address for _, address in two_hosts.values()]
    relay = Forwarder(addresses, (str(target["host"]), int(target["port"])))
    # The counting server listens on 127.0.0.1 of this namespace: relayed the same way.
    service_port = int(effects_service.base_url.rsplit(":", 1)[1])
    service_relay = Forwarder(addresses, ("127.0.0.1", service_port))
    try:
        urls = {
            name: pg_launcher.url.replace(
                f"{target['host']}:{target['port']}", f"{addr}:{relay.port}"
            )
            for name, (_, addr) in two_hosts.items()
        }
        sink = tmp_path / "effects.jsonl"
        total = 40
        enqueue_charges(chaos_app, sink, range(total), seconds=1.0)
        counter = {
            name: {SERVICE_ENV: f"http://{addr}:{service_relay.port}"}
            for name, (_, addr) in two_hosts.items()
        }
        cut = pg_launcher.start(
            "host-a", concurrency=4, url=urls["a"], netns=two_hosts["a"][0], env=counter["a"]
        )
        other = pg_launcher.start(
            "host-b", concurrency=4, url=urls["b"], netns=two_hosts["b"][0], env=counter["b"]
        )

        def held_by_a_mid_sleep() -> list[int]:
            # Cut while a's handlers sleep (before their effect): a cut inside an effect
            # would leave it in doubt, parked for a human by design, not re-run.
            with chaos_app.storage.transaction(readonly=True) as tx:
                rows = tx.connection.execute(
                    "SELECT id, extract(epoch FROM now())::float8 - leased_at FROM rq_jobs "
                    "WHERE state = 'running' AND worker_id = 'host-a'"
                ).fetchall()
            if rows and all(age < 0.5 for _, age in rows):
                return [job_id for job_id, _ in rows]
            return []

        wait_for(lambda: len(effects_per_key(sink)) >= 4, timeout=60, what="both hosts at work")
        stranded = wait_for(held_by_a_mid_sleep, timeout=20, what="host a mid-job", interval=0.01)
        ip("link", "set", f"{two_hosts['a'][0]}h", "down")  # host a is cut off mid-job
        cut_at = time.monotonic()
        # Longer than the lease (2 s) plus a reap: b takes over a's jobs meanwhile.
        wait_for(
            lambda: all(
                chaos_app.get_job(job_id).state is replayq.JobState.SUCCEEDED for job_id in stranded
            ),
            timeout=30,
            what="host b to finish the cut-off host's jobs",
        )
        # The recovery here: from the cut until the cut-off host's jobs were done elsewhere.
        taken_over = time.monotonic() - cut_at
        time.sleep(max(0.0, 6.0 - (time.monotonic() - cut_at)))
        ip("link", "set", f"{two_hosts['a'][0]}h", "up")

        wait_for(lambda: all_succeeded(chaos_app, total), timeout=60, what="every job to succeed")

        def rejected() -> set[int]:
            with chaos_app.storage.transaction(readonly=True) as tx:
                rows = tx.connection.execute(
                    "SELECT DISTINCT job_id FROM rq_events "
                    "WHERE name = 'job.write_rejected' AND worker_id = 'host-a'"
                ).fetchall()
            return {job_id for (job_id,) in rows}

        late = wait_for(
            lambda: rejected() & set(stranded), timeout=40, what="host a's late writes, rejected"
        )
        for job_id in stranded:
            job = chaos_app.get_job(job_id)
            assert job.worker_id == "host-b", f"job {job_id} was finished by {job.worker_id}"
            assert job.redelivery_count >= 1
        print(f"\nhost a held {sorted(stranded)} when cut; late writes rejected: {sorted(late)}")
        assert states(chaos_app) == Counter({"succeeded": total})
        assert set(succeeded_events_per_job(chaos_app).values()) == {1}
        assert_each_effect_once(sink, range(total))
        chaos_check.assert_clean(
            "PostgreSQL, one of two hosts cut off mid-job (network partition)",
            pg_launcher.url,
            effects_service.base_url,
            expected=total,
            recovery_seconds=taken_over,
            sink=sink,
        )
        assert cut.proc.poll() is None, "the cut-off worker survives the partition"
        for worker in (cut, other):
            worker.signal(signal.SIGTERM)
            assert worker.wait(20) == 0
    finally:
        relay.close()
        service_relay.close()
