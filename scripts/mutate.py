"""Plant named bugs in replayq's critical conditions, one at a time, and see the tests catch them.

Usage::

    .venv/bin/python scripts/mutate.py            # every bug; exit 1 if one survives
    .venv/bin/python scripts/mutate.py --list     # the bugs, where they go, their tests
    .venv/bin/python scripts/mutate.py --only ack-owner-token-sqlite --only fencing-token-off-by-one

Each bug is a code snippet found by searching ``src/replayq/**/*.py`` and ``**/*.sql``
(never a hard-coded path: modules move) and replaced by its broken form. A snippet
that is not found exactly once stops the run before anything is planted. The tree is
copied to a temporary directory first and the bugs are planted *there*, with
``PYTHONPATH`` pointing at the copy: the checkout is never modified, so an interrupted
run (Ctrl-C, a killed terminal) cannot leave a bug behind. The copy is deleted at the end.

For each bug the script runs that bug's tests with ``pytest -x`` (stop at the first
failure): a failure means the bug was *caught*; all passing means it *survived*.
Before planting anything it runs the union of those tests on the unmodified copy, so
a test that fails anyway is never counted as a catch (``--skip-baseline`` skips that).
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("src", "tests", "pyproject.toml")
PER_BUG_TIMEOUT = 1800.0

BARRIER = "tests/conformance/test_owner_token_barrier.py"
HEARTBEAT_ZERO = "tests/conformance/test_fixed_visibility_timeout_worker.py"
LOST_LEASE = "tests/conformance/test_worker_lost_lease.py"
LOST_LEASE_RUNNING = "tests/conformance/test_worker_lost_lease_running.py"
SQLITE_DISK_FAULTS = (
    "tests/acceptance/test_sqlite_faults.py::"
    "test_a_read_only_or_failing_disk_is_waited_out_and_the_worker_resumes_when_it_clears"
)


# The check of a closed SQLite storage before a new connection (``_connection``).
_SQLITE_CLOSED_RAISE = '            raise storage_closed(f"SQLite database {self.path!r}")\n'


@dataclass(frozen=True)
class Bug:
    """A named bug: ``find`` (unique in the source tree) becomes ``plant``."""

    name: str
    area: str
    find: str
    plant: str
    tests: tuple[str, ...]
    suffix: str = ".py"  # the kind of file the snippet lives in: ".py" or ".sql"


# The fence of a SQLite pack join or rewrite (``trace_join_fenced``, ``trace_rewrite_fenced``):
# the same text in both, told apart by the query that follows it.
_FENCE_CONDITION = " AND fence.owner_token = :fence_owner_token"
_FENCE = (
    "WHERE fence.id = :fence_job_id"
    + _FENCE_CONDITION
    + "\n                AND fence.state = 'running');"
)


def _owner_token_sql(query_after: str, *, postgres: bool) -> tuple[str, str]:
    """The owner-token condition of the UPDATE just before ``-- name: {query_after}``."""
    cond = "owner_token = %(owner_token)s AND " if postgres else "owner_token = :owner_token AND "
    job_id = "%(job_id)s" if postgres else ":job_id"
    find = f"WHERE id = {job_id} AND {cond}state = 'running';\n\n-- name: {query_after}"
    return find, find.replace(cond, "")


def _both_backends(name: str, area: str, query_after: str, tests: tuple[str, ...]) -> list[Bug]:
    bugs = []
    for backend in ("sqlite", "postgres"):
        find, plant = _owner_token_sql(query_after, postgres=backend == "postgres")
        bugs.append(Bug(f"{name}-{backend}", area, find, plant, tests, ".sql"))
    return bugs


# ctx.call's branch that answers from the recording (the World) instead of calling.
_CALL_SUBSTITUTION = 'if {condition}:\n        ctx.record("call", call=name'

BUGS: list[Bug] = [
    # -- owner token: only the lease holder settles the job -------------------------------------
    # A group commit's acks: one statement, each row compared with its own token. On
    # SQLite the worker's counts the rows it changed (jobs_complete_counted); a caller that
    # does not know the jobs' ordering keys gets the one with RETURNING (jobs_complete).
    Bug(
        "ack-owner-token-sqlite",
        "owner token",
        "  AND rq_jobs.owner_token = c.column2;\n\n-- name: jobs_completed_by",
        ";\n\n-- name: jobs_completed_by",
        (BARRIER,),
        ".sql",
    ),
    Bug(
        "ack-owner-token-sqlite-returning",
        "owner token",
        "  AND rq_jobs.owner_token = c.column2 AND rq_jobs.state = 'running'",
        "  AND rq_jobs.state = 'running'",
        ("tests/conformance/test_storage_verbs.py",),
        ".sql",
    ),
    Bug(
        "ack-owner-token-postgres",
        "owner token",
        "WHERE j.id = c.id AND j.owner_token = c.owner_token AND j.state = 'running'",
        "WHERE j.id = c.id AND j.state = 'running'",
        (BARRIER,),
        ".sql",
    ),
    *_both_backends("retry-owner-token", "owner token", "job_bury_owned", (BARRIER,)),
    *_both_backends("bury-owner-token", "owner token", "job_bury_queued", (BARRIER,)),
    # The worker's heartbeat: every lease it holds, each by its own length, in one statement
    # that answers the ids still held; a row matched without its token is a stale extend.
    Bug(
        "worker-heartbeat-owner-token-sqlite",
        "owner token",
        "  AND owner_token = (SELECT json_extract(l.value, '$[1]') FROM json_each(:rows) AS l\n"
        "                     WHERE json_extract(l.value, '$[0]') = rq_jobs.id)\nRETURNING id;",
        "\nRETURNING id;",
        (BARRIER,),
        ".sql",
    ),
    Bug(
        "worker-heartbeat-owner-token-postgres",
        "owner token",
        "WHERE j.id = l.id AND j.owner_token = l.owner_token AND j.state = 'running'\n"
        "RETURNING j.id;",
        "WHERE j.id = l.id AND j.state = 'running'\nRETURNING j.id;",
        (BARRIER,),
        ".sql",
    ),
    # Every commit of a job (step writes, effect claims and results, outbox, child jobs)
    # checks the owner token in the database: drop it and a stale worker's writes land.
    *[
        Bug(
            f"commit-fencing-owner-token-{backend}",
            "owner token",
            f"WHERE id = {job_id} AND owner_token = {token} AND state = 'running'{end}",
            f"WHERE id = {job_id} AND state = 'running'{end}",
            (BARRIER, "tests/conformance/test_fencing.py"),
            ".sql",
        )
        for backend, job_id, token, end in (
            ("sqlite", ":job_id", ":owner_token", ";\n\n-- name: leases_extend"),
            ("postgres", "%(job_id)s", "%(owner_token)s", "\nFOR SHARE;"),
        )
    ],
    # A step's commit and an effect's claim and result check the lease in the insert of
    # their trace pack (``trace_append_fenced``): drop the token there and they land.
    *[
        Bug(
            f"commit-fencing-append-owner-token-{backend}",
            "owner token",
            f"WHERE id = {job_id} AND owner_token = {token}",
            f"WHERE id = {job_id}",
            (BARRIER, "tests/conformance/test_fencing.py"),
            ".sql",
        )
        for backend, job_id, token in (
            ("sqlite", ":fence_job_id", ":fence_owner_token"),
            ("postgres", "%(fence_job_id)s::bigint", "%(fence_owner_token)s::text"),
        )
    ],
    # On SQLite a commit that joins its attempt's open pack checks the lease in that
    # append (``trace_join_fenced``): drop the token there and a stale commit lands.
    Bug(
        "commit-fencing-join-owner-token-sqlite",
        "owner token",
        _FENCE + "\n\n-- name: trace_rewrite\n",
        _FENCE.replace(_FENCE_CONDITION, "") + "\n\n-- name: trace_rewrite\n",
        ("tests/conformance/test_trace_packs.py",),
        ".sql",
    ),
    # The first join of a lifecycle pack (format 3 or 4) rewrites it whole, and that
    # rewrite is the lease check too (``trace_rewrite_fenced``).
    Bug(
        "commit-fencing-rewrite-owner-token-sqlite",
        "owner token",
        _FENCE + "\n\n-- name: trace_resources_append\n",
        _FENCE.replace(_FENCE_CONDITION, "") + "\n\n-- name: trace_resources_append\n",
        ("tests/conformance/test_trace_packs.py",),
        ".sql",
    ),
    # One beat extends every lease held: a fixed visibility timeout must stay out of it.
    Bug(
        "heartbeat-zero-lease-extended",
        "lease deadline",
        "held = [f for f in self._inflight.values() if f.heartbeat_seconds > 0]",
        "held = list(self._inflight.values())",
        (HEARTBEAT_ZERO,),
    ),
    # A held job starts only while its lease is surely held; past that it is renewed first.
    Bug(
        "held-job-started-past-its-lease",
        "lease deadline",
        "if now < flight.held_until:",
        "if True:",
        (LOST_LEASE,),
    ),
    # A lease the heartbeat found lost is never started, whatever the local bound says.
    Bug(
        "lost-lease-bound-kept",
        "lease deadline",
        "flight.held_until = -math.inf",
        "flight.held_until = flight.held_until",
        (LOST_LEASE,),
    ),
    # A running handler whose lease the heartbeat found lost stops at its next cancel point.
    Bug(
        "lost-lease-handler-runs-on",
        "lease deadline",
        "                flight.lost.set()\n                flight.cancel.set()\n",
        "                flight.lost.set()\n",
        (LOST_LEASE_RUNNING,),
    ),
    # A fixed visibility timeout counts from the lease: such a job is never leased ahead.
    Bug(
        "fixed-window-leased-ahead",
        "lease deadline",
        "fixed = self._fixed_window_types() if ahead > 0 else set()",
        "fixed: set[str] = set()",
        (HEARTBEAT_ZERO,),
    ),
    # -- fencing token: a write under a lock that was re-acquired since is refused ---------------
    Bug(
        "fencing-token-off-by-one",
        "fencing token",
        "if query.newer_than is not None and lock.fencing_token <= query.newer_than:",
        "if query.newer_than is not None and lock.fencing_token <= query.newer_than + 1:",
        ("tests/conformance/test_context_state.py", "tests/acceptance/test_context_fencing.py"),
    ),
    # -- a lock guards its writes until they commit: released by their commit, not before -----
    Bug(
        "lock-released-before-its-writes-commit",
        "lock guards its writes",
        'getattr(write, "fences", {}).get(resource) == fencing_token',
        "False",
        ("tests/conformance/test_context_state.py", "tests/acceptance/test_lock_guards_writes.py"),
    ),
    # -- lease deadline: the reaper takes only expired leases ------------------------------------
    Bug(
        "reaper-ignores-deadline-sqlite",
        "lease deadline",
        "  AND lease_deadline < COALESCE(:lease_now, (julianday('now') - 2440587.5) * 86400.0)\n"
        "ORDER BY lease_deadline",
        "ORDER BY lease_deadline",
        ("tests/conformance/test_worker_lifecycle.py",),
        ".sql",
    ),
    Bug(
        "reaper-ignores-deadline-postgres",
        "lease deadline",
        "  AND lease_deadline < COALESCE(%(lease_now)s::float8,"
        " extract(epoch FROM statement_timestamp())::float8)\n"
        "ORDER BY lease_deadline",
        "ORDER BY lease_deadline",
        ("tests/conformance/test_worker_lifecycle.py",),
        ".sql",
    ),
    # -- per-key ordering: one job of a key runs at a time, oldest first --------------------------
    Bug(
        "ordering-key-ignored-sqlite",
        "per-key ordering",
        "AND (j.ordering_key IS NULL OR (\n        j.id = (",
        "AND (1 = 1 OR (\n        j.id = (",
        ("tests/conformance/test_enqueue.py", "tests/conformance/test_review_regressions.py"),
        ".sql",
    ),
    Bug(
        "ordering-key-ignored-postgres",
        "per-key ordering",
        "AND (j.ordering_key IS NULL OR (\n            j.id = (",
        "AND (1 = 1 OR (\n            j.id = (",
        ("tests/conformance/test_enqueue.py", "tests/conformance/test_review_regressions.py"),
        ".sql",
    ),
    # -- idempotency record: a succeeded effect is not run again ---------------------------------
    Bug(
        "idempotency-record-ignored",
        "idempotency record",
        'if status in ("succeeded", "compensated"):',
        'if status in ("compensated",):',
        ("tests/conformance/test_context_effects.py",),
    ),
    Bug(
        "in-doubt-effect-run-again",
        "idempotency record",
        'if status == "started" and policy == "park":',
        'if status == "started" and policy == "never":',
        ("tests/acceptance/test_effect_kill.py", "tests/conformance/test_context_effects.py"),
    ),
    # -- storage faults: a read-only or failing disk is waited out, not fatal --------------------
    Bug(
        "sqlite-eio-read-not-waited-out",
        "storage faults",
        "_UNAVAILABLE_CODES = frozenset({5, 6, 7, 8, 10, 11, 13, 14, 15})",
        "_UNAVAILABLE_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})",
        (SQLITE_DISK_FAULTS,),
    ),
    Bug(
        "sqlite-read-only-connection-kept",
        "storage faults",
        "            self._discard(conn)\n",
        "            pass\n",
        (SQLITE_DISK_FAULTS,),
    ),
    # -- SQLite across fork and after close --------------------------------------------------
    Bug(
        "sqlite-fork-inherited-left-open",
        "fork",
        "            conn.close()\n        del _INHERITED[key]",
        "            pass\n        del _INHERITED[key]",
        (
            "tests/integration/test_sqlite_fork.py::"
            "test_a_child_of_an_idle_app_enqueues_through_it_and_its_jobs_outlive_the_parents_close",
        ),
    ),
    Bug(
        "sqlite-fork-busy-connection-closed",
        "fork",
        "busy = conn.inside != 0 or _in_transaction(conn)",
        "busy = False",
        (
            "tests/integration/test_sqlite_fork.py::"
            "test_a_child_forked_while_a_thread_used_the_file_is_refused_at_once_and_the_parent_goes_on",
        ),
    ),
    Bug(
        "sqlite-closed-storage-reopens",
        "closed storage",
        "        if self._closed:\n" + _SQLITE_CLOSED_RAISE + "        # A forked child's",
        "        # A forked child's",
        ("tests/conformance/test_storage_closed.py",),
    ),
    # -- retry classification: validation is never retried; the contract's map wins -------------
    Bug(
        "validation-failure-retried",
        "retry classification",
        "never = (FailureClass.VALIDATION, FailureClass.IN_DOUBT)",
        "never = (FailureClass.IN_DOUBT,)",
        ("tests/unit/test_retry_policy.py", "tests/conformance/test_worker_lifecycle.py"),
    ),
    Bug(
        "contract-error-map-ignored",
        "retry classification",
        "for table in (mapping or {}, DEFAULT_ERROR_MAP):",
        "for table in (DEFAULT_ERROR_MAP, mapping or {}):",
        ("tests/unit/test_retry_policy.py", "tests/conformance/test_worker_lifecycle.py"),
    ),
    # -- replay substitution: a replay answers from the recording, never the real world ----------
    Bug(
        "dry-run-calls-the-real-function",
        "replay substitution",
        _CALL_SUBSTITUTION.format(condition="answer is not LIVE"),
        _CALL_SUBSTITUTION.format(condition="False"),
        ("tests/conformance/test_replay_dry_run.py", "tests/conformance/test_replay_cases.py"),
    ),
    Bug(
        "replay-ignores-call-arguments",
        "replay substitution",
        'if name == "call" and fingerprint != event.data.get("fingerprint"):',
        'if False and fingerprint != event.data.get("fingerprint"):',
        ("tests/conformance/test_replay_dry_run.py",),
    ),
    # -- rollback version: restore the version before the job's first write ----------------------
    Bug(
        "rollback-restores-wrong-version",
        "rollback version",
        "restore_version = first.parent_version",
        "restore_version = first.version",
        ("tests/conformance/test_replay_rollback.py",),
    ),
]


def source_files(tree: Path, suffix: str) -> list[Path]:
    return sorted(p for p in (tree / "src" / "replayq").rglob(f"*{suffix}") if p.is_file())


def locate(tree: Path, bug: Bug) -> Path:
    """The one file holding ``bug.find`` exactly once; anything else is an error."""
    hits = [
        (path, path.read_text().count(bug.find))
        for path in source_files(tree, bug.suffix)
        if bug.find in path.read_text()
    ]
    total = sum(count for _, count in hits)
    if total != 1:
        where = ", ".join(f"{p.relative_to(tree)} ({n}x)" for p, n in hits) or "nowhere"
        raise SystemExit(
            f"mutate: bug {bug.name!r}: its snippet must occur exactly once under "
            f"src/replayq/**/*{bug.suffix}, found {total} times ({where}):\n{bug.find}"
        )
    return hits[0][0]


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore)
        else:
            shutil.copy2(source, dest / name)


def pytest_env(tree: Path) -> dict[str, str]:
    # The copy first: its replayq (and its .sql files) shadow the editable install's.
    path = os.pathsep.join([str(tree / "src"), str(tree)])
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def check_copy_is_imported(tree: Path) -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import replayq; print(replayq.__file__)"],
        cwd=tree,
        env=pytest_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"mutate: the tests would import replayq from {found}, not the copy")


def run_tests(tree: Path, tests: tuple[str, ...], *, stop_early: bool) -> tuple[bool, str, float]:
    """(passed, last lines of output, seconds)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not soak"]
    if stop_early:
        argv.append("-x")
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*argv, *tests],
            cwd=tree,
            env=pytest_env(tree),
            capture_output=True,
            text=True,
            timeout=PER_BUG_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {PER_BUG_TIMEOUT:.0f}s", time.monotonic() - started
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return done.returncode == 0, tail, time.monotonic() - started


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0].removeprefix("FAILED ").removeprefix("ERROR ")
    return output.splitlines()[-1] if output else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run only this bug (repeat)")
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    parser.add_argument("--skip-baseline", action="store_true", help="trust the unmodified tests")
    args = parser.parse_args(argv)

    bugs = [b for b in BUGS if not args.only or b.name in args.only]
    unknown = set(args.only) - {b.name for b in BUGS}
    if unknown:
        raise SystemExit(f"mutate: unknown bug(s): {', '.join(sorted(unknown))}")
    sites = {bug.name: locate(ROOT, bug) for bug in BUGS}  # every snippet, even if --only
    if args.list:
        for bug in bugs:
            print(f"{bug.name:34} {bug.area:22} {sites[bug.name].relative_to(ROOT)}")
            print(f"{'':34} tests: {' '.join(bug.tests)}")
        return 0

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="replayq-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        check_copy_is_imported(tree)
        if not args.skip_baseline:
            union = tuple(dict.fromkeys(t for bug in bugs for t in bug.tests))
            print(f"baseline: {len(union)} test files on the unmodified copy ...", flush=True)
            passed, output, seconds = run_tests(tree, union, stop_early=False)
            if not passed:
                print(output)
                raise SystemExit("mutate: the tests fail without any bug planted; fix that first")
            print(f"baseline: passed in {seconds:.0f}s", flush=True)
        rows = []
        for bug in bugs:
            target = tree / sites[bug.name].relative_to(ROOT)
            original = target.read_text()
            target.write_text(original.replace(bug.find, bug.plant, 1))
            try:
                passed, output, seconds = run_tests(tree, bug.tests, stop_early=True)
            finally:
                target.write_text(original)
            verdict = "SURVIVED" if passed else "caught"
            rows.append((bug, verdict, seconds, "" if passed else first_failure(output)))
            print(f"{verdict:8} {seconds:6.1f}s  {bug.name}", flush=True)

    print()
    print(f"| {'bug':32} | {'area':20} | {'file':34} | result   | time   | caught by")
    print(f"|{'-' * 34}|{'-' * 22}|{'-' * 36}|----------|--------|----------")
    for bug, verdict, seconds, caught_by in rows:
        site = str(sites[bug.name].relative_to(ROOT / "src" / "replayq"))
        print(
            f"| {bug.name:32} | {bug.area:20} | {site:34} | {verdict:8} | {seconds:5.0f}s | "
            f"{caught_by}"
        )
    survived = [bug.name for bug, verdict, _, _ in rows if verdict == "SURVIVED"]
    total = time.monotonic() - started
    print(f"\n{len(rows) - len(survived)} of {len(rows)} planted bugs caught in {total:.0f}s")
    if survived:
        print(f"survived: {', '.join(survived)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
