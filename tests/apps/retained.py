"""A job type that leaves every kind of event (state read and write, an effect, a
step), with a 1-day full tier: the app the gc tests and ``replayq gc --app`` use."""

from __future__ import annotations

from typing import Any

import replayq

RETENTION = replayq.Retention(full_days=1)


def declare(app: replayq.App, **contract: Any) -> replayq.App:
    """Declare ``credit`` on ``app``; ``contract``: more of its contract (``retention=``)."""

    @app.job("credit", retry=replayq.Retry(max_attempts=1), **contract)
    def credit(ctx: replayq.Context, account: str, amount: int) -> int:
        with ctx.step("credit"):
            balance = ctx.state.get("account", account)
            total = (balance.data or {}).get("balance", 0) + amount
            ctx.state.put("account", account, {"balance": total})
            ctx.effect("ledger.notify", lambda: total, key=f"notify:{account}:{ctx.job_id}")
        return int(total)

    return app


app = declare(replayq.App(retention=RETENTION))
