"""Trace packs: the events of one commit of one job attempt (or derived trace), as one row.

A traced job commits a handful of transactions, each with a few events. Storing each
event as a row repeated its trace id, job id, attempt and worker id and paid its index
entries; ``rq_trace`` stores one row per commit and group instead:

* the group's fields once (``trace_id``, ``job_id``, ``attempt``, ``worker_id``) and the
  HLC range of its events (``hlc`` .. ``hlc_last``, for the by-time index);
* ``events``: a JSON array, one object per event with short keys, absent fields left
  out, the HLC as an offset from the row's ``hlc`` and the time as whole microseconds
  from the row's ``ts`` (the first event's, kept exactly; see ``_KEYS``);
* one ``rq_trace_resources`` entry per resource the pack's events name (the index of
  ``trace resource``).

An event's id is ``pack id * PACK_SIZE + its place``: ids still grow in commit order, so
``ORDER BY hlc, id`` sorts as it did when each event was a row. The view ``rq_events``
unpacks the rows in SQL for the queries that count or filter events by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from replayq import codec
from replayq.model import TraceEvent

# Events per pack at most: an event id is pack id * PACK_SIZE + the event's place.
PACK_SIZE = 1024

# TraceEvent field -> key in a packed event. ``kind`` is left out when "domain",
# ``hlc`` is an offset (``h``) from the pack's first, falsy side_effect and data too.
_KEYS = (
    ("name", "n"),
    ("seq", "q"),
    ("step", "s"),
    ("status", "st"),
    ("resource", "r"),
    ("resource_version", "v"),
    ("input_ref", "i"),
    ("output_ref", "o"),
)
_GROUP = ("trace_id", "job_id", "attempt", "worker_id")


def _group_key(event: TraceEvent) -> tuple[Any, ...]:
    return (event.trace_id, event.job_id, event.attempt, event.worker_id)


def same_pack(earlier: Sequence[TraceEvent], group: Sequence[TraceEvent]) -> bool:
    """Whether ``group`` may join the pack holding ``earlier`` (same group, room left)."""
    return _group_key(earlier[0]) == _group_key(group[0]) and len(earlier) + len(group) <= PACK_SIZE


def groups(events: Sequence[TraceEvent]) -> Iterator[list[TraceEvent]]:
    """``events`` cut into packs: runs of the same trace, job, attempt and worker, in order."""
    run: list[TraceEvent] = []
    key: tuple[Any, ...] = ()
    for event in events:
        this = (event.trace_id, event.job_id, event.attempt, event.worker_id)
        if run and (this != key or len(run) == PACK_SIZE):
            yield run
            run = []
        if not run:
            key = this
        run.append(event)
    if run:
        yield run


def _packed(event: TraceEvent, base_hlc: int, base_ts: float) -> dict[str, Any]:
    """One event as a pack item: the fields of ``_KEYS`` that are set, under short keys."""
    item: dict[str, Any] = {"n": event.name}
    # Unrolled ``_KEYS`` (one attribute read each, no getattr loop: ~17 events a job).
    if event.seq is not None:
        item["q"] = event.seq
    if event.step is not None:
        item["s"] = event.step
    if event.status is not None:
        item["st"] = event.status
    if event.resource is not None:
        item["r"] = event.resource
    if event.resource_version is not None:
        item["v"] = event.resource_version
    if event.input_ref is not None:
        item["i"] = event.input_ref
    if event.output_ref is not None:
        item["o"] = event.output_ref
    if event.kind != "domain":
        item["k"] = event.kind
    if event.hlc != base_hlc:
        item["h"] = event.hlc - base_hlc
    offset = round((event.ts - base_ts) * 1e6)
    if offset:
        item["dt"] = offset
    if event.side_effect:
        item["x"] = 1
    if event.data:
        item["d"] = event.data
    return item


def pack_row(events: Sequence[TraceEvent]) -> dict[str, Any]:
    """The ``rq_trace`` row of one group (from ``groups``), ``events`` as compact JSON.

    Lifecycle data is built by replayq (string keys, scalars) and the user values in
    domain data were checked once when recorded (``Context.encoded``): no walk here.
    """
    first = events[0]
    hlcs = [e.hlc for e in events]
    base = min(hlcs)
    items = [_packed(e, base, first.ts) for e in events]
    try:
        text = codec.dumps_own(items, what="trace events")
    except Exception:
        # Name the event whose data cannot be stored.
        for event, item in zip(events, items, strict=True):
            codec.dumps_own(item, what=f"event {event.name} data")
        raise
    return {
        "trace_id": first.trace_id,
        "job_id": first.job_id,
        "attempt": first.attempt,
        "worker_id": first.worker_id,
        "hlc": base,
        "hlc_last": max(hlcs),
        "ts": first.ts,
        "events": text,
    }


def pack_resources(events: Sequence[TraceEvent], pack_id: int) -> list[dict[str, Any]]:
    """The ``rq_trace_resources`` entries of a pack: each resource once, at its first HLC."""
    first: dict[str, int] = {}
    for event in events:
        if event.resource is not None and (
            event.resource not in first or event.hlc < first[event.resource]
        ):
            first[event.resource] = event.hlc
    return [
        {"resource": resource, "hlc": hlc, "pack_id": pack_id} for resource, hlc in first.items()
    ]


def unpack(row: Mapping[str, Any]) -> list[TraceEvent]:
    """The events of one ``rq_trace`` row, in the order they were appended."""
    base, base_ts, pack_id = row["hlc"], row["ts"], row["id"]
    trace_id, job_id, attempt, worker_id = (row[name] for name in _GROUP)
    first = pack_id * PACK_SIZE
    built = TraceEvent.built  # every field named: no dataclass ``__init__`` per event
    out = []
    for place, item in enumerate(codec.loads(row["events"])):
        get = item.get
        out.append(
            built(
                {
                    "trace_id": trace_id,
                    "job_id": job_id,
                    "attempt": attempt,
                    "worker_id": worker_id,
                    "name": item["n"],
                    "ts": base_ts + get("dt", 0) / 1e6,
                    "hlc": base + get("h", 0),
                    "kind": get("k") or "domain",
                    "seq": get("q"),
                    "step": get("s"),
                    "status": get("st"),
                    "resource": get("r"),
                    "resource_version": get("v"),
                    "side_effect": bool(get("x")),
                    "input_ref": get("i"),
                    "output_ref": get("o"),
                    "data": get("d") or {},
                    "id": first + place,
                }
            )
        )
    return out


def unpack_sorted(rows: Sequence[Mapping[str, Any]]) -> list[TraceEvent]:
    """The events of ``rows`` in trace order: by HLC, then by id (commit order)."""
    events = [event for row in rows for event in unpack(row)]
    events.sort(key=lambda e: (e.hlc, e.id))
    return events
