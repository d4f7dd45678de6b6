"""A traced job's trace packs and joins on SQLite bind no ``bytes``: the ``sqlite3`` driver takes a
``bytearray`` as it is, while for ``bytes`` it first looks for an adapter (and, finding
none, raises and clears an ``AttributeError``) on every bind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import replayq
from tests.context_support import run_once


def test_a_traced_jobs_step_commits_append_to_its_pack_without_bytes_parameters(
    tmp_path: Path,
) -> None:
    app = replayq.App(f"sqlite:///{tmp_path / 'q.db'}", auto_migrate=True)

    @app.job("steps")
    def steps(ctx: replayq.Context) -> None:
        for name in ("one", "two", "three"):
            with ctx.step(name):
                ctx.state.put("thing", name, {"n": name})

    job_id = app.enqueue("steps", {})
    bound: list[bytes] = []

    def seen(value: bytes) -> bytes:
        bound.append(value)
        return value

    # An adapter for ``bytes`` sees every ``bytes`` parameter bound; the driver's registry
    # is process-wide, so it is removed again at once.
    assert (bytes, sqlite3.PrepareProtocol) not in sqlite3.adapters
    sqlite3.register_adapter(bytes, seen)
    try:
        run_once(replayq.Worker(app, worker_id="w"))
    finally:
        sqlite3.adapters.pop((bytes, sqlite3.PrepareProtocol), None)
    assert app.get_job(job_id).state is replayq.JobState.SUCCEEDED
    app.close()
    # The lease's pack is inserted as a ``bytearray`` too (``PackWriter.first``), and the
    # three steps' commits append their pieces to it (``trace_join``): no ``bytes`` at all.
    assert bound == []
