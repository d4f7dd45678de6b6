"""What starting a worker costs: an empty-queue run, replayq beside its peers.

``benchmarks/throughput.py`` times every drain from spawn to exit, so a worker's start
(the interpreter, the imports, opening the database, registering the contracts) is part
of each whole-run figure, and of the 2-processes-vs-1 ratio most of all. This measures
that start alone: each system's drain command on a queue that is already empty, run
``--repeat`` times, interleaved, reporting the median wall seconds and CPU seconds (user
+ system, ``getrusage`` of the waited child). With ``--callgrind`` each command also runs
once under ``valgrind --tool=callgrind``: its instruction count, which unlike the
seconds does not move with the machine's load.

    python benchmarks/process_start.py [--backend sqlite|postgres] [--repeat 9]
                                       [--callgrind] [--json]

The commands: replayq ``replayq worker --app benchmarks.noop_app:app --burst`` (on
PostgreSQL ``--concurrency 4``, as throughput.py runs it); on SQLite Huey's consumer loop
and the raw ``sqlite3`` loop of ``benchmarks/sqlite_baselines.py``; on PostgreSQL
PgQueuer's and Procrastinate's drains of ``benchmarks/postgres_baselines.py``. The peers
must be importable (``pip install --no-deps --target /tmp/benchdeps -r
benchmarks/requirements.txt``, then ``PYTHONPATH=/tmp/benchdeps:<tree>/src``). The tree
measured is the one ``replayq`` is imported from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import sqlite_baselines
import throughput
from machine import commit
from noop_app import make_app

REPO = Path(__file__).resolve().parent.parent


def replayq_worker(url: str) -> list[str]:
    return [*throughput.replayq_command(), "--db", url, "worker", "--app", throughput.APP_SPEC]


@contextmanager
def sqlite_commands(workdir: Path) -> Iterator[dict[str, list[str]]]:
    """Each system's drain on its own empty SQLite database."""
    url = throughput.sqlite_url(workdir / "replayq.db", "NORMAL")
    make_app(url).close()  # created and migrated, as the drains find it
    huey, raw = workdir / "huey.db", workdir / "raw.db"
    sqlite_baselines.huey_app(str(huey)).storage.close()
    sqlite_baselines.raw_enqueue(str(raw), 0)
    baselines = [sys.executable, "benchmarks/sqlite_baselines.py"]
    yield {
        "replayq": [*replayq_worker(url), "--burst"],
        "huey": [*baselines, "huey-drain", str(huey), "NORMAL"],
        "raw": [*baselines, "raw-drain", str(raw), "NORMAL"],
    }


@contextmanager
def postgres_commands(workdir: Path) -> Iterator[dict[str, list[str]]]:
    """Each system's drain on its own empty schema."""
    import postgres_baselines

    baselines = [sys.executable, "benchmarks/postgres_baselines.py"]
    with ExitStack() as schemas:
        url = schemas.enter_context(throughput.pg_schema("replayq"))
        throughput.pg_replayq_app(url).close()
        concurrency = str(throughput.PG_CONCURRENCY)
        worker_url = f"{url}&pool_size={throughput.PG_CONCURRENCY + 2}"
        commands = {
            "replayq": [*replayq_worker(worker_url), "--burst", "--concurrency", concurrency]
        }
        for system in ("pgqueuer", "procrastinate"):
            peer = schemas.enter_context(throughput.pg_schema(system))
            enqueue = getattr(postgres_baselines, f"{system}_enqueue")
            enqueue(peer, 0, bulk=False)  # the peer's tables, no jobs
            commands[system] = [*baselines, f"{system}-drain", peer]
        yield commands


def run_once(argv: Sequence[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run of ``argv``, timed as throughput.py times a drain."""
    cpu = throughput.children_cpu()
    wall = throughput.timed_process(argv, lambda _: None)
    return wall, throughput.children_cpu() - cpu


def instructions(argv: Sequence[str]) -> int:
    """User-space instructions of one run of ``argv`` under callgrind."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg", *argv]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"callgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
        for line in done.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(":", 1)[1])
    raise SystemExit("callgrind printed no instruction count")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--repeat", type=int, default=9, help="timed runs of each command")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)
    load_before = throughput.load_average()
    commands = sqlite_commands if opts.backend == "sqlite" else postgres_commands
    timed: dict[str, list[tuple[float, float]]] = {}
    counted: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as workdir, commands(Path(workdir)) as systems:
        for command in systems.values():
            run_once(command)  # a first run: the page cache, the bytecode
        for _ in range(opts.repeat):
            for name, command in systems.items():  # interleaved
                timed.setdefault(name, []).append(run_once(command))
        if opts.callgrind:
            counted = {name: instructions(command) for name, command in systems.items()}
    figures = [
        {
            "system": name,
            "runs": len(runs),
            "wall_s": round(statistics.median(w for w, _ in runs), 4),
            "cpu_s": round(statistics.median(c for _, c in runs), 4),
            **({"instructions": counted[name]} if name in counted else {}),
        }
        for name, runs in timed.items()
    ]
    result = {
        "backend": opts.backend,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": {"before": load_before, "after": throughput.load_average()},
        "figures": figures,
    }
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{opts.backend}: an empty-queue drain, median of {opts.repeat} runs, interleaved")
    print(f"commit {result['commit']}, load average {load_before} -> {throughput.load_average()}")
    for f in figures:
        counts = f" {f['instructions'] / 1e6:,.0f} M instructions" if "instructions" in f else ""
        print(f"  {f['system']:<14} wall {f['wall_s']:.3f} s  CPU {f['cpu_s']:.3f} s{counts}")


if __name__ == "__main__":
    os.chdir(REPO)
    main()
