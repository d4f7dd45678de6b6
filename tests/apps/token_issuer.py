"""A job type whose result holds secrets (an access token, a bearer credential)."""

from __future__ import annotations

from typing import Any

import replayq


def declare(app: replayq.App) -> replayq.App:
    @app.job("issue_token")
    def issue_token(ctx: replayq.Context, user: int) -> dict[str, Any]:
        with ctx.step("issue"):
            pass
        return {"user": user, "access_token": "tok-SECRET-4242", "note": "Bearer sk_live_77777777"}

    return app


app = declare(replayq.App())
