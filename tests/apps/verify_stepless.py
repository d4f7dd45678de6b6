"""Job types that take no ``ctx.step``, at two versions each.

``tally`` makes one ``ctx.call`` outside any step and its v2 fails where v1 succeeded, so
``rollout verify`` flags ``outcome``; the attempt has no step to fork from, so the
command printed to reproduce it is the attempt's sealed dry-run. ``silent`` uses no
``ctx`` at all: its attempts record nothing a replay can re-run, so a verification of
it selects none.
"""

from __future__ import annotations

import replayq


def declare(app: replayq.App) -> replayq.App:
    @app.job("tally", version="v1")
    def tally_v1(ctx: replayq.Context, n: int) -> int:
        return int(ctx.call("counter.read", lambda: n))

    @app.job("tally", version="v2", candidate=True)
    def tally_v2(ctx: replayq.Context, n: int) -> int:
        raise ValueError(f"v2 refuses n={n}")

    @app.job("silent", version="v1")
    def silent_v1(ctx: replayq.Context, n: int) -> int:
        return n

    @app.job("silent", version="v2", candidate=True)
    def silent_v2(ctx: replayq.Context, n: int) -> int:
        return n + 1

    return app


app = declare(replayq.App())
