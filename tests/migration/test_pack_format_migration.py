"""Migration 0016: packs written as JSON text before it stay readable beside deflated ones.

The SQLite file is built by the migrations before 0016 and holds packs as replayq wrote
them then (format 1, JSON text): a job's first attempt, with a blob it names and a
resource. Opening it with this replayq applies 0016; the job's second attempt is then
written deflated (format 2) into the same table. Every reader — the trace of the job, of
a resource, the ``rq_events`` view, the by-time window, and gc's question which blobs
nothing names — must see both attempts' events as recorded. (PostgreSQL's 0016 changes
nothing: its packs stay JSON text, which tests/conformance/test_trace_packs.py checks.)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
from replayq.model import TraceEvent
from replayq.storage import packs
from replayq.storage.protocol import TraceQuery, TraceWindow
from replayq.storage.retention_params import BlobScan
from tests.migration.older import migrated_before

TRACE = "0123456789abcdef0123456789abcdef"
KEPT, LOOSE = "aa" * 32, "bb" * 32
NEW_BLOB = "cc" * 32


def event(name: str, hlc: int, attempt: int, **fields: object) -> TraceEvent:
    return TraceEvent(
        trace_id=TRACE, job_id=1, attempt=attempt, name=name, ts=hlc / 1000, hlc=hlc,
        worker_id="w1", **fields,  # type: ignore[arg-type]
    )  # fmt: skip


FIRST = [
    event("job.leased", 1_000, 1, kind="lifecycle", status="running", data={"version": "v1"}),
    event("state.read", 1_001, 1, seq=1, step="load", resource="order:1", resource_version=3,
          data={"branch": "main", "exists": True}),
    event("call", 1_002, 1, seq=2, step="price", status="success",
          output_ref=f"blob:sha256:{KEPT}", data={"call": "pricing.quote"}),
]  # fmt: skip
SECOND = [
    event("job.leased", 2_000, 2, kind="lifecycle", status="running", data={"version": "v1"}),
    event("state.write", 2_001, 2, seq=1, step="reserve", resource="order:1",
          resource_version=4, data={"delta": {"replace": {"status": "reserved"}}}),
    event("call", 2_002, 2, seq=2, step="price", status="success",
          output_ref=f"blob:sha256:{NEW_BLOB}", data={"call": "pricing.quote"}),
]  # fmt: skip


def old_database(path: Path) -> None:
    """Migrations before 0016 applied and recorded; a job and its first attempt's pack as
    replayq wrote them then (JSON text), and three blobs, one of which nothing names."""
    conn = sqlite3.connect(path)
    with conn:
        migrated_before(conn, 16)
        conn.execute(
            "INSERT INTO rq_jobs (id, job_type, payload, state, run_at, created_at, attempt,"
            " max_attempts, trace_id) VALUES (1, 'order.process', '{}', 'running', 0, 0, 2, 5, ?)",
            (TRACE,),
        )
        row = {**packs.pack_row(FIRST, packs.FORMAT_JSON), "id": 1}
        conn.execute(
            "INSERT INTO rq_trace (id, trace_id, job_id, attempt, worker_id, hlc, hlc_last, ts,"
            " events) VALUES (:id, :trace_id, :job_id, :attempt, :worker_id, :hlc, :hlc_last,"
            " :ts, :events)",
            row,
        )
        conn.executemany(
            "INSERT INTO rq_trace_resources (resource, hlc, pack_id) VALUES (:resource, :hlc,"
            " :pack_id)",
            packs.pack_resources(FIRST, 1),
        )
        for digest in (KEPT, LOOSE, NEW_BLOB):
            conn.execute(
                "INSERT INTO rq_blobs (hash, codec, size, stored_size, body, created_at,"
                " used_at) VALUES (?, 'raw', 2, 2, x'7b7d', 0, 0)",
                (digest,),
            )
    conn.close()


def test_packs_written_before_0016_read_back_beside_deflated_ones(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_database(path)
    app = replayq.App(f"sqlite:///{path}", auto_migrate=True)
    try:
        with app.storage.transaction() as tx:
            assert tx.trace_append(SECOND)
        with app.storage.transaction(readonly=True) as tx:
            stored = tx.connection.execute(
                "SELECT typeof(events), substr(events, 1, 1) FROM rq_trace ORDER BY id"
            ).fetchall()
            job = tx.trace_query(TraceQuery(job_id=1))
            order = tx.trace_query(TraceQuery(resource="order:1"))
            view = tx.connection.execute(
                "SELECT name, hlc, resource, output_ref FROM rq_events ORDER BY hlc, id"
            ).fetchall()
            window = tx.trace_query(TraceWindow(since_hlc=0, until_hlc=10_000, limit=100))
            loose = tx.gc_scan(BlobScan(after="", before=1.0, limit=10))
    finally:
        app.close()

    assert [tuple(r) for r in stored] == [("text", "["), ("blob", b"\x02")]
    recorded = [*FIRST, *SECOND]
    assert [(e.name, e.hlc, e.attempt, e.data, e.output_ref) for e in job] == [
        (e.name, e.hlc, e.attempt, e.data, e.output_ref) for e in recorded
    ]
    assert [e.name for e in order] == ["state.read", "state.write"]
    assert [tuple(r) for r in view] == [(e.name, e.hlc, e.resource, e.output_ref) for e in recorded]
    assert [w[0].name for w in window] == [e.name for e in recorded]
    # A blob named only by an old text pack, or only by a deflated one, is still in use.
    assert [candidate.hash for candidate in loose] == [LOOSE]
