"""Packs of one lifecycle event of a known shape: trace pack formats 3 and 4.

Every drained job writes three packs that each hold one lifecycle event whose fields are
all fixed but its data's values: its ``job.enqueued``, its lease's ``job.leased`` and its
ack's ``job.succeeded``. Deflating each (a new stream and a sync flush) cost ~50,000
instructions; these formats store the data's values alone:

* format 3 (SQLite since 0019): a new job's ``job.enqueued``, ``b"\\x03"`` and the JSON
  array of its data's values (``LIFECYCLE_SHAPES[0]``, trailing nulls left out), kept in
  the job's row since 0023 (``rq_jobs.enqueued``);
* format 4 (SQLite since 0021): ``b"\\x04"``, the shape's code (one byte, its place in
  ``LIFECYCLE_SHAPES``) and the JSON array of its data's values in that shape's key order.

``lifecycle_json`` turns either back into the JSON text a format 1 pack holds
(``packs.pack_json`` calls it); ``packs`` has the other formats, the rows and the joins
(a later event of the attempt rewrites such a pack whole as format 2, ``CompactPack``).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from replayq import codec
from replayq.model import TraceEvent

if TYPE_CHECKING:
    from replayq.storage.protocol import JobInsert

FORMAT_ENQUEUED = 3
FORMAT_LIFECYCLE = 4
ENQUEUED_MARK = bytes([FORMAT_ENQUEUED])
LIFECYCLE_MARK = bytes([FORMAT_LIFECYCLE])

# ``LIFECYCLE_SHAPES``: the event name, its status and the keys of its data, in the order
# the pack stores their values; a pack's shape code is its place here. Frozen: packs
# written with a code are decoded with it, so shapes are only ever added at the end,
# never reordered, changed or removed (tests/unit/test_packs.py checks its digest). An
# event of a shape that is not here (other data keys, another status) is deflated as
# before. Shape 0 is format 3's (``job.enqueued``, no shape code stored). The failure
# path's events (``job.failed`` with ``retry.scheduled`` or ``job.dead``, a reaped
# ``lease.expired`` with ``job.redelivered`` or ``job.dead``) are committed in pairs, never
# a pack of one: they are not here.
JOB_ENQUEUED = "job.enqueued"
LIFECYCLE_SHAPES: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    # 0: a new job's (queue/enqueue.py); format 3.
    (JOB_ENQUEUED, "queued", ("run_at", "priority", "message_id", "ordering_key", "causation_id")),
    # 1: a lease's (worker/lease.py), 2: one whose routing moved it off its version.
    ("job.leased", "running", ("lease_deadline", "owner_token", "redelivery_count", "version")),
    (
        "job.leased",
        "running",
        ("lease_deadline", "owner_token", "redelivery_count", "version", "version_moved_from"),
    ),
    # 3: an ack's (worker/acks.py).
    ("job.succeeded", "succeeded", ("duration", "owner_token", "version")),
)
LIFECYCLE_SHAPES_SHA256 = "6d51b8e0a50e2dbbeda1f0e49d5dd603d8a8bc905dee6dffd82a9b8e828383f7"
# By event name: (shape code, status, the set of its data's keys, the values of those keys
# in stored order as a tuple, read in C), and each code's first bytes: format 3's mark for
# shape 0, else format 4's and the code.
_SHAPES: dict[str, list[tuple[int, str | None, frozenset[str], Any]]] = {}
for _code, (_name, _status, _fields) in enumerate(LIFECYCLE_SHAPES):
    assert len(_fields) > 1  # ``itemgetter`` of one key would not give a tuple
    _SHAPES.setdefault(_name, []).append(
        (_code, _status, frozenset(_fields), operator.itemgetter(*_fields))
    )
_SHAPE_MARKS = [ENQUEUED_MARK] + [
    bytes((FORMAT_LIFECYCLE, code)) for code in range(1, len(LIFECYCLE_SHAPES))
]


def enqueued_event(params: JobInsert) -> TraceEvent:
    """A new job's ``job.enqueued`` event, made from what is inserted (no re-read of the
    row); its ``job_id`` is set by ``job_enqueue`` from the insert. On SQLite the insert
    keeps the same event's pack in the job's row (``rq_jobs.enqueued``, migration 0023).

    Built with every field named (``TraceEvent.built``): the frozen dataclass's
    ``__init__`` was ~5 µs of each enqueue."""
    return TraceEvent.built(
        {
            "trace_id": params.trace_id,
            "name": JOB_ENQUEUED,
            "ts": params.now,
            "hlc": params.hlc,
            "job_id": None,
            "attempt": 0,
            "kind": "lifecycle",
            "seq": None,
            "step": None,
            "worker_id": None,
            "status": "queued",
            "resource": None,
            "resource_version": None,
            "side_effect": False,
            "input_ref": None,
            "output_ref": None,
            "data": {
                "message_id": params.message_id,
                "priority": params.priority,
                "run_at": params.run_at,
                "ordering_key": params.ordering_key,
                "causation_id": params.causation_id,
            },
            "id": None,
        }
    )


def lifecycle_pack(event: TraceEvent) -> bytearray | None:
    """The ``events`` of a pack holding ``event`` alone in format 3 (a new job's
    ``job.enqueued``) or 4 (another event of ``LIFECYCLE_SHAPES``), or ``None`` if it is
    not a job's lifecycle event of a shape there, as ``pack_json`` rebuilds it (then it is
    deflated).

    A ``bytearray``, as ``PackWriter``'s pieces: the ``sqlite3`` driver binds it at once,
    where ``bytes`` first costs it a failed adapter lookup (~3.7 K instructions)."""
    shapes = _SHAPES.get(event.name)
    if (
        shapes is None
        or event.kind != "lifecycle"
        or event.job_id is None
        or event.seq is not None
        or event.step is not None
        or event.resource is not None
        or event.resource_version is not None
        or event.input_ref is not None
        or event.output_ref is not None
        or event.side_effect
    ):
        return None
    data = event.data
    keys = data.keys()
    status = event.status
    for shape in shapes:
        if status == shape[1] and keys == shape[2]:
            break
    else:
        return None
    code, _, _, values_of = shape
    values = values_of(data)
    if values[-1] is None:  # trailing nulls left out
        values = list(values)
        while values and values[-1] is None:
            values.pop()
    text = codec.stored_bytes(values)
    if text is None:
        return None
    packed = bytearray(_SHAPE_MARKS[code])
    packed += text
    return packed


def lifecycle_json(code: int, values_text: bytes) -> str:
    """A format 3 or 4 pack (shape ``code``, its data's values) as the JSON text its event
    has in format 1."""
    item = _lifecycle_item(code, values_text)
    return "[" + codec.dumps_stored(item, what=f"event {item['n']} data") + "]"


def lifecycle_item(code: int, values_text: bytes) -> dict[str, Any]:
    """The pack item ``codec.loads(lifecycle_json(code, values_text))[0]`` decodes to (its
    data's keys in sorted order, as that canonical text has them), without encoding the
    text and decoding it again: a reader of a job's trace (a dry-run's recording) meets
    two such packs a job."""
    item = _lifecycle_item(code, values_text)
    item["d"] = dict(sorted(item["d"].items()))
    return item


def _lifecycle_item(code: int, values_text: bytes) -> dict[str, Any]:
    """The item of a format 3 or 4 pack, its data in its shape's key order."""
    if code >= len(LIFECYCLE_SHAPES):
        raise ValueError(f"trace pack of unknown lifecycle shape {code}")
    name, status, fields = LIFECYCLE_SHAPES[code]
    values = codec.loads(values_text)
    if type(values) is not list or len(values) > len(fields):
        raise ValueError(f"trace pack of shape {code} holds {values!r}")
    if len(values) < len(fields):
        values += [None] * (len(fields) - len(values))  # the trailing nulls left out
    data = dict(zip(fields, values, strict=True))
    item: dict[str, Any] = {"n": name, "k": "lifecycle", "d": data}
    if status is not None:
        item["st"] = status
    return item
