"""Every benchmark still runs and prints its ``--json`` object.

The figures in docs/benchmarks.md come from these scripts; a script that no longer runs
on the current code (a renamed internal it reaches into, a size that only works at the
default) is found here, not by the next person who needs its numbers. Each runs at the
smallest size that takes its whole path, in its own process; nothing here is timed.
The peers a benchmark measures beside replayq on SQLite (Huey, the raw loop) are in the
test environment and run too; the PostgreSQL peers (``benchmarks/requirements.txt``,
``make bench``) are not, so the PostgreSQL sides run through the benchmarks that have
no peer there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PG_URL, require_postgres

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# (script and its arguments, the keys its JSON object must hold)
RUNS: list[tuple[str, list[str], set[str]]] = [
    ("context_overhead.py", ["--jobs", "20", "--repeat", "1"], {"sides", "overhead_pct"}),
    # --profile wraps sqlite3.connect and cProfile around the inline path
    ("context_overhead.py", ["--jobs", "10", "--repeat", "1", "--profile"], {"sides"}),
    (
        "context_overhead.py",
        ["--jobs", "10", "--repeat", "1", "--backend", "postgres"],
        {"sides", "overhead_pct"},
    ),
    # The handler under names packs.DICTIONARY_2 does not hold (the bytes row's check)
    (
        "context_overhead.py",
        ["--jobs", "20", "--repeat", "1", "--names", "other"],
        {"sides", "overhead_pct", "names"},
    ),
    ("dead_list.py", ["--history", "200", "--calls", "2"], {"sqlite", "postgres"}),
    ("enqueue_many.py", ["--jobs", "50", "--repeat", "1"], {"sqlite", "postgres"}),
    ("gc.py", ["--jobs", "50"], {"gc_deleted_jobs", "bytes_per_job"}),
    ("history.py", ["--history", "200", "--jobs", "50", "--repeat", "1"], {"figures"}),
    ("payload_types.py", ["--number", "100", "--repeat", "1"], {"results"}),
    ("replay_speed.py", ["--jobs", "10", "--runs", "3"], {"dry_run_ms_median", "bulk_jobs_per_s"}),
    ("rollout_verify.py", ["--jobs", "20"], {"foreground_attempts_per_s"}),
    ("seal_overhead.py", ["--jobs", "20", "--repeat", "1"], {"end_to_end_overhead_pct_median"}),
    ("throughput.py", ["--jobs", "50", "--repeat", "1"], {"figures"}),
    ("two_processes.py", ["--jobs", "50", "--runs", "1"], {"runs", "two_vs_one_median"}),
    ("web_jobs_list.py", ["--jobs", "100", "--requests", "2"], {"pages"}),
    ("worker_batch.py", ["--jobs", "50", "--repeat", "1"], {"rows"}),
    ("process_start.py", ["--repeat", "1"], {"figures"}),
    ("worker_cpu.py", ["--jobs", "50", "--runs", "1", "--no-peer"], {"per_job_median"}),
    # One callgrind-counted benchmark (the issue-11 instrument): valgrind makes it slow.
    (
        "context_instructions.py",
        ["--jobs", "4", "--base", "2", "--sides", "traced"],
        {"instructions_per_job"},
    ),
]


def _run(script: str, args: list[str], tmp_path: Path) -> dict[str, Any]:
    require_postgres()  # most of them measure a PostgreSQL side too
    env = dict(os.environ, REPLAYQ_TEST_PG=PG_URL, TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, script, *args, "--json"],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{script} {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )
    decoded = json.loads(proc.stdout)
    assert isinstance(decoded, dict), proc.stdout[:500]
    return decoded


@pytest.mark.parametrize(
    ("script", "args", "keys"), RUNS, ids=[" ".join([s, *a]) for s, a, _ in RUNS]
)
def test_benchmark_runs_and_prints_its_json(
    script: str, args: list[str], keys: set[str], tmp_path: Path
) -> None:
    printed = _run(script, args, tmp_path)
    assert keys <= printed.keys(), f"{script}: missing {sorted(keys - printed.keys())}"


def test_every_benchmark_script_is_run_here() -> None:
    """A new benchmark joins ``RUNS`` (the helpers it imports are not benchmarks)."""
    helpers = {
        "machine.py",
        "noop_app.py",
        "latency_proxy.py",
        "sqlite_baselines.py",
        "postgres_baselines.py",
    }
    # Counted by callgrind like context_instructions.py, which stands for them here.
    not_run = {"drain_instructions.py", "lock_instructions.py"}
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - helpers - not_run
    assert scripts == {script for script, _, _ in RUNS}
