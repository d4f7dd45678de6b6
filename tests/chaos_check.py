"""The chaos checker: reads a queue's database and the effects counted outside it, prints
one table, and says which counts are bad.

    python -m tests.chaos_check --db URL (--effects-url http://127.0.0.1:PORT | --effects-file
        sink.jsonl) [--expected N] [--recovery SECONDS] [--allow-dead REASON ...]

The effects are the ground truth of what really happened, counted where the
queue cannot touch them: the counting HTTP server of ``tests/services.py``
(``POST /effects/<key>``, read from ``GET /_counts``) or a JSON-lines sink file
the effect appended to (one ``{"event": "effect", "n": N}`` per effect; key
``n``). Exit 0 when every bad count is zero, 1 otherwise.

Rows: enqueued, succeeded, dead by reason, lost (expected but not in the
database), stuck (not finished when checked: queued or running), duplicate real
effects (per key, beyond the first), stale writes accepted (a job settled more
than once: a late worker's ``job.succeeded``/``job.dead`` after another's),
order violations per ordering key (a job leased before the job enqueued ahead of
it under the same key had finished), recovery seconds (as measured by the test).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import replayq

EFFECT_PATH = "/effects/"
SETTLED = ("job.succeeded", "job.dead")


@dataclass
class ChaosReport:
    enqueued: int
    succeeded: int
    dead: Counter[str]
    lost: int
    stuck: int
    duplicates: dict[str, int]
    stale_writes: int
    order_violations: dict[str, int]
    recovery_seconds: float | None
    allowed_dead: frozenset[str] = field(default_factory=frozenset)

    def bad(self) -> list[str]:
        """The rows above zero that must be zero."""
        rows = {
            "lost": self.lost,
            "stuck": self.stuck,
            "duplicate real effects": sum(self.duplicates.values()),
            "stale writes accepted": self.stale_writes,
            "order violations": sum(self.order_violations.values()),
        }
        bad = [f"{name} {count}" for name, count in rows.items() if count]
        bad += [
            f"dead ({reason}) {count}"
            for reason, count in sorted(self.dead.items())
            if reason not in self.allowed_dead
        ]
        return bad

    def table(self) -> str:
        def keys(counts: Mapping[str, int]) -> str:
            if not counts:
                return "0"
            shown = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())[:5])
            return f"{sum(counts.values())} ({shown}{', …' if len(counts) > 5 else ''})"

        dead = ", ".join(f"{r}: {c}" for r, c in sorted(self.dead.items())) or "none"
        recovery = "—" if self.recovery_seconds is None else f"{self.recovery_seconds:.1f}"
        rows = [
            ("enqueued", str(self.enqueued)),
            ("succeeded", str(self.succeeded)),
            ("dead by reason", f"{sum(self.dead.values())} ({dead})"),
            ("lost", str(self.lost)),
            ("stuck", str(self.stuck)),
            ("duplicate real effects per key", keys(self.duplicates)),
            ("stale writes accepted", str(self.stale_writes)),
            ("order violations per key", keys(self.order_violations)),
            ("recovery seconds", recovery),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"| {'count'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
        return "\n".join(lines)


def effects_from_server(base_url: str) -> Counter[str]:
    """Real effects per key, as the counting HTTP server saw them."""
    with urllib.request.urlopen(f"{base_url}/_counts", timeout=10) as response:  # noqa: S310
        counts: dict[str, int] = json.loads(response.read())
    return Counter(
        {p.removeprefix(EFFECT_PATH): c for p, c in counts.items() if p.startswith(EFFECT_PATH)}
    )


def effects_from_file(sink: Path) -> Counter[str]:
    """Real effects per key from a sink file (``{"event": "effect", "n": N}`` lines)."""
    if not sink.exists():
        return Counter()
    lines = [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]
    return Counter(str(line["n"]) for line in lines if line.get("event") == "effect")


def _rows(app: replayq.App, sql: str) -> list[tuple[Any, ...]]:
    with app.storage.transaction(readonly=True) as tx:
        return [tuple(row) for row in tx.connection.execute(sql).fetchall()]


def check(
    db_url: str,
    effects: Mapping[str, int],
    *,
    expected: int | None = None,
    recovery_seconds: float | None = None,
    allow_dead: Sequence[str] = (),
) -> ChaosReport:
    """Read the database at ``db_url`` (and ``effects``) into a ``ChaosReport``."""
    if db_url.startswith("sqlite:"):
        path = Path(db_url.removeprefix("sqlite:///").split("?", 1)[0])
        if not path.is_file():  # opening it would create an empty queue and call it clean
            raise FileNotFoundError(f"no SQLite database at {path}")
    app = replayq.App(db_url)
    try:
        states = Counter(
            {s: int(c) for s, c in _rows(app, "SELECT state, count(*) FROM rq_jobs GROUP BY state")}
        )
        dead = Counter(
            {
                str(r): int(c)
                for r, c in _rows(
                    app,
                    "SELECT dead_reason, count(*) FROM rq_jobs WHERE state = 'dead' "
                    "GROUP BY dead_reason",
                )
            }
        )
        settled = _rows(
            app,
            "SELECT job_id, count(*) FROM rq_events WHERE name IN ('job.succeeded', 'job.dead') "
            "GROUP BY job_id HAVING count(*) > 1",
        )
        ordered = _rows(
            app,
            "SELECT j.ordering_key, j.id, e.name, e.hlc FROM rq_jobs j JOIN rq_events e "
            "ON e.job_id = j.id WHERE j.ordering_key IS NOT NULL "
            "AND e.name IN ('job.leased', 'job.succeeded', 'job.dead') ORDER BY j.id, e.hlc",
        )
    finally:
        app.close()
    enqueued = sum(states.values())
    return ChaosReport(
        enqueued=enqueued,
        succeeded=states.get("succeeded", 0),
        dead=dead,
        lost=max(0, (expected or 0) - enqueued),
        stuck=states.get("queued", 0) + states.get("running", 0),
        duplicates={key: count - 1 for key, count in effects.items() if count > 1},
        stale_writes=len(settled),
        order_violations=_order_violations(ordered),
        recovery_seconds=recovery_seconds,
        allowed_dead=frozenset(allow_dead),
    )


def assert_clean(
    title: str,
    db_url: str,
    effects_url: str,
    *,
    expected: int,
    recovery_seconds: float | None = None,
    sink: Path | None = None,
    allow_dead: Sequence[str] = (),
) -> ChaosReport:
    """How every fault test ends: check the database at ``db_url`` against the effects
    the counting server at ``effects_url`` saw, print the table under ``title``, and
    fail on any bad count. With ``sink`` (the file each effect also appends to) the two
    counts of one truth must agree per key, so a server nobody posted to cannot pass."""
    effects = effects_from_server(effects_url)
    if sink is not None:
        in_sink = effects_from_file(sink)
        assert effects == in_sink, (
            f"the counting server and the sink disagree: server {sum(effects.values())} "
            f"effects, sink {sum(in_sink.values())}; keys differing: "
            f"{sorted(k for k in effects.keys() | in_sink.keys() if effects[k] != in_sink[k])[:10]}"
        )
    report = check(
        db_url,
        effects,
        expected=expected,
        recovery_seconds=recovery_seconds,
        allow_dead=allow_dead,
    )
    print(f"\nchaos checker: {title}\n{report.table()}")
    assert report.bad() == [], f"{'; '.join(report.bad())}\n{report.table()}"
    return report


def _order_violations(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    """Per ordering key: jobs first leased before the job ahead of them had settled."""
    first_lease: dict[int, int] = {}
    settled_at: dict[int, int] = {}
    jobs: dict[str, list[int]] = defaultdict(list)
    for key, job_id, name, hlc in rows:
        if job_id not in jobs[key]:
            jobs[key].append(job_id)
        if name == "job.leased":
            first_lease.setdefault(job_id, hlc)
        else:
            settled_at[job_id] = max(settled_at.get(job_id, hlc), hlc)
    violations: dict[str, int] = {}
    for key, ids in jobs.items():
        ids.sort()
        count = sum(
            1
            for ahead, behind in itertools.pairwise(ids)
            if behind in first_lease
            and (ahead not in settled_at or first_lease[behind] < settled_at[ahead])
        )
        if count:
            violations[key] = count
    return violations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the queue's database URL")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--effects-url", help="the counting HTTP server's base URL")
    source.add_argument("--effects-file", type=Path, help="a JSON-lines effect sink")
    parser.add_argument("--expected", type=int, help="how many jobs were enqueued")
    parser.add_argument("--recovery", type=float, help="recovery seconds measured by the run")
    parser.add_argument("--allow-dead", action="append", default=[], help="a dead reason allowed")
    args = parser.parse_args(argv)
    effects = (
        effects_from_server(args.effects_url)
        if args.effects_url
        else effects_from_file(args.effects_file)
    )
    try:
        report = check(
            args.db,
            effects,
            expected=args.expected,
            recovery_seconds=args.recovery,
            allow_dead=args.allow_dead,
        )
    except (FileNotFoundError, replayq.ReplayqError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    bad = report.bad()
    if bad:
        print(f"bad: {'; '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
