"""The project's replayq app, on Django's own database."""

import replayq
from replayq.contrib.django import database_url

app = replayq.App(database_url(), auto_migrate=True)


@app.job("confirm_order")
def confirm_order(ctx: replayq.Context, order_id: int) -> dict[str, int]:
    return {"confirmed": order_id}
