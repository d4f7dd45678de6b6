"""Facts about the machine a benchmark ran on, printed beside its numbers."""

from __future__ import annotations

import compileall
import os
import platform
import re
import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def machine(workdir: Path, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """CPU, OS, Python, SQLite, load average and the disk the databases are on."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    device = "unknown"
    mounts = Path("/proc/mounts")
    if mounts.exists():
        best = ""
        for line in mounts.read_text().splitlines():
            dev, mount, fstype, *_ = line.split()
            if str(workdir.resolve()).startswith(mount) and len(mount) >= len(best):
                best, device = mount, f"{dev} ({fstype}, mounted at {mount})"
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return [
        ("nproc", str(len(os.sched_getaffinity(0)))),
        ("cpu", cpu),
        ("os", platform.platform()),
        ("python", platform.python_version()),
        ("sqlite", sqlite3.sqlite_version),
        *extra,
        ("load average at the end (1/5/15 min)", load),
        ("databases in", f"{workdir} on {device}"),
    ]


# ``git archive`` writes the commit it exports here (``export-subst`` in .gitattributes).
_ARCHIVED_FROM = "$Format:%h$"


def commit() -> str:
    """The commit the benchmark ran on (``+dirty`` when the work tree has changes).

    A tree exported with ``git archive`` (as the before/after comparisons in
    docs/benchmarks.md use) names the commit it was exported from;
    ``$REPLAYQ_BENCH_COMMIT`` names it for any other tree that is not a git work tree.
    """
    import subprocess

    named = os.environ.get("REPLAYQ_BENCH_COMMIT")
    if named:
        return named
    if not _ARCHIVED_FROM.startswith("$Format"):
        return _ARCHIVED_FROM

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (empty where the OS has none)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else []


def callgrind_count(
    program: Sequence[str], out: str, what: str, *, separate_threads: bool = False
) -> int:
    """Instructions callgrind counts in ``program`` (user space, every thread), its profile
    written to ``out`` (with ``separate_threads``, one file a thread beside it). A failed
    run or a missing count ends the benchmark, naming ``what`` with the run's stderr."""
    threads = ["--separate-threads=yes"] if separate_threads else []
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", *threads, f"--callgrind-out-file={out}", *program],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


PG_URL = os.environ.get("REPLAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


class PgSchemas:
    """Fresh PostgreSQL schemas for benchmark databases, dropped by ``drop_all``."""

    def __init__(self, url: str = PG_URL) -> None:
        self.url = url
        self.made: list[str] = []

    def fresh(self, label: str) -> str:
        """A URL whose search_path is a new, empty schema."""
        import uuid

        import psycopg

        schema = f"rq_bench_{label.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
        self.made.append(schema)
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}options=-csearch_path%3D{schema}"

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for schema in self.made:
                conn.execute(
                    psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        psycopg.sql.Identifier(schema)
                    )
                )
        self.made.clear()


def schema_of(url: str) -> str:
    """The schema a ``PgSchemas.fresh`` URL points at."""
    return url.rsplit("search_path%3D", 1)[1]


def compile_package(package_dir: Path) -> str:
    """Compile a package's bytecode, as ``pip install`` does for a wheel, so that worker
    processes do not recompile it on every start: a checkout run from source (an
    editable install, and always with ``PYTHONDONTWRITEBYTECODE`` set) recompiles it,
    while its peers, installed from wheels, have theirs. Says what was done."""
    compileall.compile_dir(package_dir, quiet=1)
    return f"bytecode of {package_dir.name} compiled before the runs, as an installed wheel has it"


@contextmanager
def delayed_url(url: str, rtt_ms: float) -> Iterator[str]:
    """``url`` through ``latency_proxy.py`` (a process of its own) adding ``rtt_ms`` to
    every round trip, as to a server on another host; ``url`` itself when ``rtt_ms`` is 0.
    The proxy is stopped when the block ends."""
    if not rtt_ms:
        yield url
        return
    import subprocess
    import sys
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    upstream = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("latency_proxy.py")),
            "--upstream",
            upstream,
            "--rtt-ms",
            str(rtt_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        port = int(proxy.stdout.readline())
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        proxy.terminate()
        proxy.wait(10)
