"""The pictures: a job's attempts and a resource's workers as shapes for inline SVG.

Pure functions from trace events to ``Shape`` lists; the templates draw them
and Jinja escapes every string. A job's timeline has one row per attempt, each
on its own time axis (retries can be minutes apart): the lease as a band, steps
as bars, lock intervals, and markers for decisions, calls, effects (coloured by
ledger status), state reads and writes and cache reads. A resource's picture
has one swimlane per worker on a shared axis, with each job's lease and lock
intervals, and its reads and writes numbered in happens-before (HLC) order —
two workers inside one lease window show as overlapping bands.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from replayq import TraceEvent

WIDTH = 960
LABEL = 150
ROW = 64
# Kept as they are in a resource's link (the rest, ``/`` ``?`` ``#`` ``%`` included, quoted).
RESOURCE_SAFE = ":@!$&'()*+,;="
SETTLED = {"job.succeeded", "job.failed", "job.write_rejected", "lease.expired", "lease.lost"}
MARKERS = {
    "decision": "decision",
    "call": "call",
    "effect.succeeded": "effect",
    "effect.failed": "effect-failed",
    "effect.deduplicated": "effect-dedup",
    "effect.in_doubt": "effect-doubt",
    "effect.replayed": "effect",
    "state.read": "read",
    "state.write": "write",
    "state.conflict": "conflict",
    "state.write_rejected": "conflict",
    "write.fenced": "conflict",
    "cache.read": "cache",
    "cache.stale_read": "conflict",
    "cache.decode_error": "conflict",
    "cache.encode_error": "conflict",
    "lock.timeout": "conflict",
}


@dataclass(frozen=True)
class Shape:
    """One SVG element: a ``bar`` (x, y, w, h) or a ``mark`` (cx = x, cy = y), with a tooltip."""

    kind: str
    cls: str
    x: float
    y: float
    w: float = 0.0
    h: float = 0.0
    title: str = ""
    label: str = ""
    href: str | None = None


@dataclass
class Lane:
    """A row: its label, its shapes, and the span of time its axis covers."""

    label: str
    y: float
    shapes: list[Shape] = field(default_factory=list)
    span: float = 0.0


@dataclass
class Picture:
    lanes: list[Lane]
    height: float
    width: int = WIDTH
    label_width: int = LABEL
    span: float = 0.0


class _Axis:
    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.span = max(end - start, 1e-3)

    def x(self, ts: float) -> float:
        return LABEL + (ts - self.start) / self.span * (WIDTH - LABEL - 20)


def _summary(event: TraceEvent) -> str:
    parts = [event.name]
    if event.step:
        parts.append(f"step {event.step}")
    if event.resource:
        version = f" v{event.resource_version}" if event.resource_version is not None else ""
        parts.append(f"{event.resource}{version}")
    if event.status:
        parts.append(event.status)
    for key in ("decision", "value", "call", "kind", "key", "error", "reason"):
        if key in event.data and event.data[key] is not None:
            parts.append(f"{key}={event.data[key]}")
    return " · ".join(str(p) for p in parts)[:300]


def _lock_bar(
    axis: _Axis,
    y: float,
    opened: TraceEvent,
    closed: TraceEvent | None,
    end: float,
    title: str,
    href: str | None = None,
) -> Shape:
    """A lock's hold as a bar in a lane: acquired to released (or expired, marked so)."""
    cls = "lock lock-expired" if closed and closed.name == "lock.expired" else "lock"
    return Shape(
        "bar",
        cls,
        axis.x(opened.ts),
        y + ROW - 22,
        max(axis.x(end) - axis.x(opened.ts), 2),
        6,
        f"{title} (fencing {opened.data.get('fencing_token')})"
        + (f" · {closed.name}" if closed else ""),
        href=href,
    )


def _intervals(
    events: Sequence[TraceEvent], opens: set[str], closes: set[str], key: Any
) -> Iterable[tuple[TraceEvent, TraceEvent | None]]:
    """Pairs (opening event, closing event or None if still open) matched by ``key``."""
    open_: dict[Any, TraceEvent] = {}
    for event in events:
        if event.name in opens:
            open_[key(event)] = event
        elif event.name in closes and key(event) in open_:
            yield open_.pop(key(event)), event
    for event in open_.values():
        yield event, None


def resource_href(resource: str | None) -> str | None:
    """The link to ``resource``'s page, every character that means something in a URL
    quoted: a name is made from a payload (``order:{order_id}``), and a raw ``?``, ``#``
    or ``/..`` in it led to another resource's page, or off the resource pages."""
    return f"/resources/{quote(resource, safe=RESOURCE_SAFE)}" if resource else None


def job_picture(events: Sequence[TraceEvent]) -> Picture:
    """One lane per attempt (attempt 0, the enqueue, is left out)."""
    attempts: dict[int, list[TraceEvent]] = {}
    for event in events:
        if event.attempt:
            attempts.setdefault(event.attempt, []).append(event)
    lanes = []
    for index, (number, chunk) in enumerate(sorted(attempts.items())):
        chunk.sort(key=lambda e: (e.ts, e.hlc))
        axis = _Axis(chunk[0].ts, chunk[-1].ts)
        y = 10 + index * ROW
        worker = next((e.worker_id for e in chunk if e.name == "job.leased"), None)
        lane = Lane(f"attempt {number}" + (f" · {worker}" if worker else ""), y, span=axis.span)
        for opened, closed in _intervals(chunk, {"job.leased"}, SETTLED, lambda e: e.job_id):
            end = closed.ts if closed else chunk[-1].ts
            cls = f"lease lease-{closed.name.replace('.', '-')}" if closed else "lease"
            title = f"lease held by {opened.worker_id}" + (
                f" until {closed.name}" if closed else ""
            )
            lane.shapes.append(
                Shape(
                    "bar",
                    cls,
                    axis.x(opened.ts),
                    y,
                    max(axis.x(end) - axis.x(opened.ts), 2),
                    ROW - 14,
                    title,
                )
            )
        for opened, closed in _intervals(
            chunk, {"lock.acquired"}, {"lock.released", "lock.expired"}, lambda e: e.resource
        ):
            end = closed.ts if closed else chunk[-1].ts
            title = f"lock {opened.resource}"
            href = resource_href(opened.resource)
            lane.shapes.append(_lock_bar(axis, y, opened, closed, end, title, href))
        for opened, closed in _intervals(
            chunk,
            {"step.started"},
            {"step.finished", "step.abandoned"},  # abandoned: still running at the end
            lambda e: e.data.get("step_name"),
        ):
            end = closed.ts if closed else chunk[-1].ts
            status = closed.status if closed else "running"
            name = str(opened.data.get("step_name"))
            lane.shapes.append(
                Shape(
                    "bar",
                    f"step step-{status}",
                    axis.x(opened.ts),
                    y + 6,
                    max(axis.x(end) - axis.x(opened.ts), 3),
                    18,
                    f"step {name}: {status}",
                    label=name,
                )
            )
        for event in chunk:
            if event.name == "step.skipped":
                lane.shapes.append(
                    Shape(
                        "bar",
                        "step step-skipped",
                        axis.x(event.ts),
                        y + 6,
                        3,
                        18,
                        _summary(event),
                        str(event.data.get("step_name")),
                    )
                )
            marker = MARKERS.get(event.name)
            if marker is None:
                continue
            cls = marker
            if event.name == "cache.read" and event.data.get("stale"):
                cls = "conflict"
            lane.shapes.append(
                Shape(
                    "mark",
                    f"mark mark-{cls}",
                    axis.x(event.ts),
                    y + 34,
                    title=_summary(event),
                    href=resource_href(event.resource),
                )
            )
        lanes.append(lane)
    return Picture(lanes, 20 + len(lanes) * ROW)


def resource_picture(events: Sequence[TraceEvent]) -> Picture:
    """One swimlane per worker on a shared axis; reads and writes numbered in HLC order."""
    # Production only: replays and forks (no job id) are kept apart from the real timeline.
    timed = [e for e in events if e.worker_id and e.job_id is not None]
    if not timed:
        return Picture([], 20)
    axis = _Axis(min(e.ts for e in timed), max(e.ts for e in timed))
    workers = sorted({e.worker_id for e in timed if e.worker_id})
    lanes = {w: Lane(w, 10 + i * ROW, span=axis.span) for i, w in enumerate(workers)}
    by_hlc = sorted(timed, key=lambda e: (e.hlc, e.id or 0))
    for worker, lane in lanes.items():
        mine = [e for e in by_hlc if e.worker_id == worker]
        y = lane.y
        for opened, closed in _intervals(
            mine, {"job.leased"}, SETTLED | {"job.dead", "retry.scheduled"}, lambda e: e.job_id
        ):
            end = closed.ts if closed else axis.start + axis.span
            lane.shapes.append(
                Shape(
                    "bar",
                    "lease",
                    axis.x(opened.ts),
                    y,
                    max(axis.x(end) - axis.x(opened.ts), 2),
                    ROW - 14,
                    f"job {opened.job_id} attempt {opened.attempt}: lease"
                    + (f" until {closed.name}" if closed else ""),
                    label=f"job {opened.job_id}",
                    href=f"/jobs/{opened.job_id}",
                )
            )
        for opened, closed in _intervals(
            mine, {"lock.acquired"}, {"lock.released", "lock.expired"}, lambda e: e.job_id
        ):
            end = closed.ts if closed else axis.start + axis.span
            title = f"job {opened.job_id}: lock"
            lane.shapes.append(_lock_bar(axis, y, opened, closed, end, title))
    for rank, event in enumerate(e for e in by_hlc if e.name in MARKERS):
        lane = lanes[str(event.worker_id)]
        cls = MARKERS[event.name]
        if event.name == "cache.read" and event.data.get("stale"):
            cls = "conflict"
        lane.shapes.append(
            Shape(
                "mark",
                f"mark mark-{cls}",
                axis.x(event.ts),
                lane.y + 30,
                title=f"#{rank + 1} (HLC order) job {event.job_id}: {_summary(event)}",
                label=str(rank + 1),
                href=f"/jobs/{event.job_id}" if event.job_id else None,
            )
        )
    return Picture(list(lanes.values()), 20 + len(lanes) * ROW, span=axis.span)


def describe(event: TraceEvent) -> str:
    """A one-line summary of an event for the tables under a picture."""
    return _summary(event)
