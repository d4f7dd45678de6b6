"""Jobs whose ``ctx.db_write`` outlasts any ``statement_timeout``: the server cancels it
(SQLSTATE 57014) on every try.

``slow`` sleeps in the database for ``seconds`` inside its ``db_write``: in a step
(``where="step"``), or outside any, at its ack (``where="ack"``). ``quick`` writes
nothing; a worker running both must settle every ``quick`` job whatever ``slow`` meets.
"""

from __future__ import annotations

from typing import Any

import replayq


def _sleep(connection: Any, seconds: float) -> None:
    connection.execute("SELECT pg_sleep(%s)", (seconds,))


def slow(ctx: replayq.Context, n: int, where: str, seconds: float) -> dict[str, int]:
    if where == "step":
        with ctx.step("write"):
            ctx.db_write(lambda connection: _sleep(connection, seconds))
    else:
        ctx.db_write(lambda connection: _sleep(connection, seconds))
    return {"n": n}


def quick(ctx: replayq.Context, n: int) -> dict[str, int]:
    return {"n": n}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)
    retry = replayq.Retry(max_attempts=2, base="0.05s", cap="0.1s")
    built.job("slow", lease="30s", heartbeat="2s", retry=retry)(slow)
    built.job("quick", lease="30s", heartbeat="2s", retry=retry)(quick)
    return built


app = build()
