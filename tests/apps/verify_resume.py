"""A job type at two versions for the resumable-verification drill.

Every fifth payload raises ``ValueError`` (class ``unknown``): v1 does not retry
it (dead); v2 retries every exception (the seed's bug), so ``rollout verify`` finds a
``retry_decision`` difference on each refused job. v2 also takes a few
milliseconds per run, so a background verification lasts long enough to be
killed halfway.
"""

from __future__ import annotations

import time

import replayq

RETRY_V1 = replayq.Retry(max_attempts=3, base="0.05s", cap="0.1s", on=("transient",))
RETRY_V2 = replayq.Retry(
    max_attempts=3,
    base="0.05s",
    cap="0.1s",
    on=("transient", "dependency", "concurrency", "unknown"),
)
V2_SECONDS = 0.01


def _score(ctx: replayq.Context, n: int) -> dict[str, int]:
    with ctx.step("check"):
        if n % 5 == 0:
            raise ValueError(f"n={n} is refused")
    return {"n": n, "score": n * 2}


def build(url: str | None = None) -> replayq.App:
    built = replayq.App(url)

    @built.job("score", version="v1", retry=RETRY_V1)
    def score_v1(ctx: replayq.Context, n: int) -> dict[str, int]:
        return _score(ctx, n)

    @built.job("score", version="v2", retry=RETRY_V2, candidate=True)
    def score_v2(ctx: replayq.Context, n: int) -> dict[str, int]:
        time.sleep(V2_SECONDS)
        return _score(ctx, n)

    return built


app = build()
