"""A paid order, then its shipping job: enqueued by a script, never at import."""

from shop import app

app.state.put("order", 123, {"status": "paid", "items": 2}, expected_version=0)
job_id = app.enqueue("ship_order", {"order_id": 123}, message_id="evt-9")
print(f"enqueued job {job_id}")
