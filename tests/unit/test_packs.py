"""Trace pack formats (storage/packs.py): a deflated pack holds exactly the JSON pack.

Format 2 (SQLite) is format 1's JSON text deflated with a frozen preset dictionary; what
``unpack`` returns must not depend on the format a pack was written in, and the
dictionary may never change under packs already written with it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import weakref
import zlib
from collections.abc import Mapping
from typing import Any

import pytest

from replayq import codec
from replayq.model import TraceEvent
from replayq.storage import lifecycle_packs, packs


def attempt_events() -> list[TraceEvent]:
    """One commit's events as a traced step writes them, lifecycle and domain."""
    common = {"trace_id": "0123456789abcdef0123456789abcdef", "job_id": 41, "attempt": 2}
    common["worker_id"] = "host-1:worker"
    return [
        TraceEvent(
            name="step.started",
            seq=1,
            status="started",
            ts=1_796_000_000.5,
            hlc=9_000_000,
            data={"step_name": "reserve"},
            **common,
        ),
        TraceEvent(
            name="state.write",
            seq=2,
            step="reserve",
            resource="order:41",
            resource_version=3,
            ts=1_796_000_000.500214,
            hlc=9_000_001,
            data={
                "branch": "main",
                "delta": {"replace": {"status": "reserved", "ü": [1, 2.5]}},
                "expected_version": 2,
                "fencing": None,
                "parent_version": 2,
            },
            **common,
        ),
        TraceEvent(
            name="effect.succeeded",
            seq=3,
            step="reserve",
            resource="charge:41",
            status="success",
            side_effect=True,
            output_ref="blob:sha256:" + "ab" * 32,
            ts=1_796_000_000.6,
            hlc=9_065_536,
            data={"duration": 0.0003, "result": None},
            **common,
        ),
        TraceEvent(
            name="job.succeeded",
            kind="lifecycle",
            status="succeeded",
            ts=1_796_000_000.7,
            hlc=9_065_537,
            data={"duration": 0.2, "owner_token": "f" * 32, "version": "v1"},
            **common,
        ),
    ]


def stored(events: list[TraceEvent], pack_format: int, pack_id: int = 5) -> dict[str, object]:
    return {**packs.pack_row(events, pack_format), "id": pack_id}


def test_a_deflated_pack_reads_back_as_the_same_events_as_its_json_pack() -> None:
    events = attempt_events()
    as_json, deflated = stored(events, packs.FORMAT_JSON), stored(events, packs.FORMAT_DEFLATE)
    assert isinstance(as_json["events"], str)
    assert isinstance(deflated["events"], bytearray) and deflated["events"][:1] == b"\x02"
    assert packs.pack_json(deflated["events"]) == as_json["events"]  # type: ignore[arg-type]
    assert packs.unpack(deflated) == packs.unpack(as_json)
    assert [(e.name, e.hlc, e.ts, e.data) for e in packs.unpack(deflated)] == [
        (e.name, e.hlc, round(e.ts, 6), e.data) for e in events
    ]
    # Everything but the events column is the same row.
    assert {k: v for k, v in as_json.items() if k != "events"} == {
        k: v for k, v in deflated.items() if k != "events"
    }


def test_a_deflated_pack_is_a_fraction_of_its_json() -> None:
    events = attempt_events()
    text = packs.pack_row(events, packs.FORMAT_JSON)["events"]
    data = packs.pack_row(events, packs.FORMAT_DEFLATE)["events"]
    assert len(data) * 2 < len(text), (len(data), len(text))


def test_the_dictionary_of_format_2_never_changes() -> None:
    # Packs already stored are decoded with this dictionary: another one is another format.
    digest = hashlib.sha256(packs.DICTIONARY_2).hexdigest()
    assert digest == packs.DICTIONARY_2_SHA256
    assert digest == "c20fe38913382d297a259d400c024c630b28850bc0cb910ff05a9d178aabe0bc"


def test_a_pack_of_an_unknown_format_is_refused_not_misread() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        packs.pack_json(b"\x07" + zlib.compress(b"[]"))
    assert packs.pack_json("[]") == "[]"
    assert packs.pack_json(None) is None


def test_sql_reads_both_formats_through_the_registered_function() -> None:
    events = attempt_events()
    conn = sqlite3.connect(":memory:")
    packs.register_sqlite(conn)
    conn.execute("CREATE TABLE p (id INTEGER PRIMARY KEY, events TEXT NOT NULL)")
    for pack_format in (packs.FORMAT_JSON, packs.FORMAT_DEFLATE):
        conn.execute("INSERT INTO p (events) VALUES (?)", (stored(events, pack_format)["events"],))
    rows = conn.execute(
        "SELECT p.id, typeof(p.events), json_extract(e.value, '$.n') "
        "FROM p, json_each(rq_pack_json(p.events)) AS e ORDER BY p.id, e.key"
    ).fetchall()
    names = [e.name for e in events]
    assert rows == [(1, "text", n) for n in names] + [(2, "blob", n) for n in names]
    conn.close()


def test_a_pack_appended_to_piece_by_piece_reads_back_whole_at_every_commit() -> None:
    events = attempt_events()
    row, writer = packs.opened_row(events[:1], packs.FORMAT_DEFLATE)
    assert writer is not None
    data = row["events"]
    assert isinstance(data, bytearray)  # bound by sqlite3 without an adapter lookup
    for n in range(1, len(events)):
        # Each commit appends its own items: the bytes already stored stay as they were.
        before = bytes(data)
        data = data + writer.more(packs.pack_items(events[n : n + 1], row["hlc"], row["ts"]))
        assert data.startswith(before) and writer.stored == data
        as_json = packs.pack_row(events[: n + 1], packs.FORMAT_JSON)["events"]
        assert packs.pack_json(data) == as_json
        assert packs.unpack({**row, "events": data, "id": 5}) == packs.unpack(
            stored(events[: n + 1], packs.FORMAT_JSON)
        )


def test_a_pack_a_lifecycle_event_starts_reads_back_whole_with_what_later_commits_append() -> None:
    # A pack that a lifecycle event starts (job.enqueued, job.leased, job.succeeded) is
    # deflated by a smaller compressor (packs._PRIMED_LIFECYCLE: 4 KB window) with the same
    # dictionary: no more bytes for it than the pack's usual compressor gives, and its stream
    # goes on for later events of the attempt, past its window (a lease's pack joined by
    # the steps' events on the same connection).
    leased = TraceEvent(
        trace_id="0123456789abcdef0123456789abcdef",
        job_id=41,
        attempt=1,
        name="job.leased",
        kind="lifecycle",
        status="running",
        ts=1_796_000_000.5,
        hlc=9_000_000,
        worker_id="w-1",
        data={"lease_deadline": 1_796_000_060.5, "owner_token": "ab" * 16, "version": "v1"},
    )
    row, writer = packs.opened_row([leased], packs.FORMAT_DEFLATE)
    assert writer is not None
    data = row["events"]
    assert isinstance(data, bytearray)
    items = packs.pack_items([leased], row["hlc"], row["ts"])
    assert len(data) <= len(packs.PackWriter().first(items))
    later = [
        TraceEvent(
            trace_id=leased.trace_id,
            job_id=41,
            attempt=1,
            name="state.write",
            step=f"step-{n}",
            seq=n + 1,
            ts=1_796_000_001.0 + n,
            hlc=9_000_001 + n,
            worker_id="w-1",
            resource=f"order:{n}",
            resource_version=n + 1,
            data={"delta": {"replace": {"note": f"{n:04d}" * 40}}, "branch": "main"},
        )
        for n in range(40)  # ~10 KB of JSON: well past the 4 KB window
    ]
    for n in range(len(later)):
        data += writer.more(packs.pack_items(later[n : n + 1], row["hlc"], row["ts"]))
        expected = [leased, *later[: n + 1]]
        assert packs.pack_json(data) == packs.pack_row(expected, packs.FORMAT_JSON)["events"]
    assert packs.unpack({**row, "events": data, "id": 5}) == packs.unpack(
        stored([leased, *later], packs.FORMAT_JSON)
    )


def test_a_format_2_pack_whose_stream_was_finished_still_reads() -> None:
    # Packs written before appends existed end their deflate stream (and their array).
    events = attempt_events()
    text = packs.pack_row(events, packs.FORMAT_JSON)["events"]
    assert isinstance(text, str)
    assert packs.pack_json(packs.deflated(text)) == text


def test_a_deflated_pack_keeps_no_reference_to_its_events() -> None:
    """A format 2 pack is joined through its deflate stream, never rewritten from its items,
    so writing one must not keep its events alive (an enqueue's event each, until a cache
    filled): the JSON format keeps its items' texts for its rewrites."""
    events = attempt_events()
    alive = [weakref.ref(event) for event in events]
    packs.pack_row(events, packs.FORMAT_DEFLATE)
    del events
    assert [ref() for ref in alive] == [None] * len(alive)

    kept = attempt_events()
    packs.pack_row(kept, packs.FORMAT_JSON)
    assert all(id(event) in packs._ITEM_TEXTS for event in kept)


def test_a_joins_pieces_and_stored_bytes_are_bytearrays_and_its_row_keeps_its_bytes() -> None:
    # A join's parameters (``trace_join``): the ``sqlite3`` driver binds a ``bytearray``
    # as it is, where ``bytes`` first costs it a failed adapter lookup.
    events = attempt_events()
    row, writer = packs.opened_row(events[:1], packs.FORMAT_DEFLATE)
    assert writer is not None
    before = writer.stored
    piece = writer.more(packs.pack_items(events[1:2], row["hlc"], row["ts"]))
    assert type(piece) is bytearray and type(writer.stored) is bytearray
    # ``stored`` is replaced, not grown in place: a row built before still holds its bytes.
    assert before == row["events"] and writer.stored == row["events"] + piece


def enqueued(run_at: float, **data: object) -> TraceEvent:
    """A new job's ``job.enqueued`` as ``queue/enqueue.py`` builds it."""
    return TraceEvent(
        trace_id="0123456789abcdef0123456789abcdef",
        job_id=41,
        attempt=0,
        name="job.enqueued",
        kind="lifecycle",
        status="queued",
        ts=1_796_000_000.5,
        hlc=9_000_000,
        data={
            "message_id": None,
            "priority": 0,
            "run_at": run_at,
            "ordering_key": None,
            "causation_id": None,
            **data,
        },
    )


@pytest.mark.parametrize(
    "event",
    [
        enqueued(1_796_000_000.5),
        enqueued(1_796_000_060.123456, priority=-3),
        enqueued(1_796_000_000, message_id='order-7 ü "q"', ordering_key="customer:1"),
        enqueued(1_796_000_000.5, causation_id="01234567", message_id=None),
    ],
    ids=["defaults", "delayed", "message-and-key", "causation-only"],
)
def test_a_new_jobs_enqueued_pack_is_its_data_values_and_reads_back_as_its_json(
    event: TraceEvent,
) -> None:
    # Format 3 (SQLite): the one event of a new job's first pack, stored as the values of its
    # data, not deflated; read back (Python and the SQL function alike) as format 1's JSON.
    row, writer = packs.opened_row([event], packs.FORMAT_DEFLATE)
    data = row["events"]
    # A bytearray, which the sqlite3 driver binds without a failed adapter lookup.
    assert type(data) is bytearray and data[:1] == b"\x03"
    # No deflate stream to append to: a later event of its group rewrites the pack whole
    # as format 2 (``CompactPack.rewritten``, ``trace_rewrite``).
    assert isinstance(writer, packs.CompactPack) and writer.stored == data
    as_json = packs.pack_row([event], packs.FORMAT_JSON)["events"]
    assert packs.pack_json(data) == as_json
    assert packs.unpack({**row, "id": 5}) == packs.unpack(stored([event], packs.FORMAT_JSON))
    connection = sqlite3.connect(":memory:")
    packs.register_sqlite(connection)
    assert connection.execute("SELECT rq_pack_json(?)", (bytes(data),)).fetchone()[0] == as_json
    connection.close()


def test_enqueued_packs_take_no_more_bytes_than_deflated() -> None:
    # Over run_at values as ``time.time()`` gives them (one shares digits with the
    # dictionary's sample time, which deflate then matches): each within a few bytes.
    compact = deflated = 0
    for run_at in (1_796_000_000.123456, 1_796_316_307.0042136, 1_796_316_307.1042137, 1e9):
        event = enqueued(run_at)
        stored_bytes = packs.opened_row([event], packs.FORMAT_DEFLATE)[0]["events"]
        assert isinstance(stored_bytes, bytearray)
        items = packs.pack_items([event], event.hlc, event.ts)
        stream = packs.PackWriter(lifecycle=True).first(items)
        assert len(stored_bytes) <= len(stream) + 3
        compact, deflated = compact + len(stored_bytes), deflated + len(stream)
    assert compact <= deflated


@pytest.mark.parametrize(
    "event",
    [
        enqueued(1_796_000_000.5, extra=1),  # data the format does not hold
        TraceEvent(**{**enqueued(1.0).__dict__, "status": "scheduled"}),
        TraceEvent(**{**enqueued(1.0).__dict__, "job_id": None}),  # a derived trace's
    ],
    ids=["extra-data", "other-status", "no-job"],
)
def test_an_enqueued_event_of_another_shape_is_deflated(event: TraceEvent) -> None:
    row, writer = packs.opened_row([event], packs.FORMAT_DEFLATE)
    data = row["events"]
    assert isinstance(data, bytearray) and data[:1] == b"\x02" and writer is not None
    assert packs.pack_json(data) == packs.pack_row([event], packs.FORMAT_JSON)["events"]


def lifecycle_event(name: str, status: str | None, **data: object) -> TraceEvent:
    """A lifecycle event as ``queue/lifecycle.lifecycle`` builds it (a lease's, an ack's)."""
    return TraceEvent(
        trace_id="0123456789abcdef0123456789abcdef",
        job_id=41,
        attempt=2,
        worker_id="host-1:worker",
        name=name,
        kind="lifecycle",
        status=status,
        ts=1_796_000_000.25,
        hlc=9_000_000,
        data=data,
    )


LEASED = {
    "owner_token": "ab" * 16,
    "lease_deadline": 1_796_000_060.123456,
    "version": "v1",
    "redelivery_count": 0,
}


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (lifecycle_event("job.leased", "running", **LEASED), 1),
        (lifecycle_event("job.leased", "running", **{**LEASED, "redelivery_count": 3}), 1),
        (lifecycle_event("job.leased", "running", **{**LEASED, "version": None}), 1),
        (lifecycle_event("job.leased", "running", **LEASED, version_moved_from="v0"), 2),
        (
            lifecycle_event(
                "job.succeeded", "succeeded", duration=0.0037, owner_token="f" * 32, version="v1"
            ),
            3,
        ),
        # orjson writes a float below 1e-4 its own way: it still reads back as format 1's.
        (
            lifecycle_event(
                "job.succeeded", "succeeded", duration=7.2e-05, owner_token="", version="v2 ü"
            ),
            3,
        ),
        (
            lifecycle_event(
                "job.succeeded", "succeeded", duration=1.5, owner_token="t", version=None
            ),
            3,
        ),
    ],
    ids=[
        "leased",
        "leased-redelivered",
        "leased-no-version",
        "leased-moved",
        "succeeded",
        "succeeded-tiny-duration",
        "succeeded-no-version",
    ],
)
def test_a_lone_lifecycle_event_of_a_known_shape_is_its_data_values_and_reads_back_as_its_json(
    event: TraceEvent, code: int
) -> None:
    # Format 4 (SQLite): a lease's or an ack's pack of one event, stored as a shape code and
    # the values of its data, not deflated; read back (Python and the SQL function alike)
    # as format 1's JSON, so every reader sees the event as before.
    row, writer = packs.opened_row([event], packs.FORMAT_DEFLATE)
    data = row["events"]
    assert type(data) is bytearray and bytes(data[:2]) == bytes([4, code])
    assert not data.endswith(b",null]")  # trailing nulls are left out
    assert isinstance(writer, packs.CompactPack) and writer.stored == data
    as_json = packs.pack_row([event], packs.FORMAT_JSON)["events"]
    assert packs.pack_json(data) == as_json
    assert packs.pack_json(bytes(data)) == as_json
    assert packs.unpack({**row, "id": 5}) == packs.unpack(stored([event], packs.FORMAT_JSON))
    # Everything but the events column is the same row.
    assert {k: v for k, v in row.items() if k != "events"} == {
        k: v for k, v in stored([event], packs.FORMAT_JSON).items() if k not in ("events", "id")
    }
    connection = sqlite3.connect(":memory:")
    packs.register_sqlite(connection)
    assert connection.execute("SELECT rq_pack_json(?)", (bytes(data),)).fetchone()[0] == as_json
    connection.close()


def test_lifecycle_packs_take_about_the_bytes_deflated_ones_did() -> None:
    # With owner tokens as replayq makes them (random hex, which deflate cannot shorten
    # much): the values of a lease's and an ack's events take within a few bytes of their
    # deflate streams (~60 bytes each); what format 4 saves is instructions, not bytes.
    tokens = ["f72a0ff8d144a7239477bc86ce080b5e", "0c9be6c1a35d4e2f8b71d0a4c6e95f13"]
    compact = deflated = 0
    for n, token in enumerate(tokens):
        for event in (
            lifecycle_event(
                "job.leased",
                "running",
                **{**LEASED, "owner_token": token, "lease_deadline": 1_796_316_367.0042 + n},
            ),
            lifecycle_event(
                "job.succeeded", "succeeded", duration=0.000143 + n, owner_token=token, version="v1"
            ),
        ):
            stored_bytes = packs.opened_row([event], packs.FORMAT_DEFLATE)[0]["events"]
            assert stored_bytes[:1] == b"\x04"
            items = packs.pack_items([event], event.hlc, event.ts)
            stream = packs.PackWriter(lifecycle=True).first(items)
            assert len(stored_bytes) <= len(stream) + 10
            compact, deflated = compact + len(stored_bytes), deflated + len(stream)
    assert compact <= deflated * 1.15


@pytest.mark.parametrize(
    "event",
    [
        lifecycle_event("job.leased", "running", **LEASED, extra=1),  # data not in its shape
        lifecycle_event("job.leased", "queued", **LEASED),  # another status
        lifecycle_event("job.succeeded", "succeeded", duration=0.1, owner_token="t"),  # a key less
        TraceEvent(**{**lifecycle_event("job.leased", "running", **LEASED).__dict__, "seq": 1}),
        TraceEvent(
            **{**lifecycle_event("job.leased", "running", **LEASED).__dict__, "job_id": None}
        ),
        TraceEvent(**{**lifecycle_event("job.succeeded", "succeeded").__dict__, "kind": "domain"}),
        lifecycle_event("job.failed", "fail", error="boom", duration=0.1),  # no shape of its name
        # A value orjson refuses (an integer beyond 64 bits): the standard encoder's path.
        lifecycle_event("job.leased", "running", **{**LEASED, "redelivery_count": 2**70}),
    ],
    ids=[
        "extra-data",
        "other-status",
        "missing-key",
        "with-seq",
        "no-job",
        "domain",
        "no-shape",
        "big-int",
    ],
)
def test_a_lone_event_of_no_known_shape_is_deflated(event: TraceEvent) -> None:
    row, writer = packs.opened_row([event], packs.FORMAT_DEFLATE)
    data = row["events"]
    assert isinstance(data, bytearray) and data[:1] == b"\x02"
    assert isinstance(writer, packs.PackWriter)
    assert packs.pack_json(data) == packs.pack_row([event], packs.FORMAT_JSON)["events"]


def test_the_lifecycle_shapes_never_change() -> None:
    # Packs already stored name their shape by its place in the table: a shape is only ever
    # added at the end; changing, reordering or removing one misreads stored packs.
    text = json.dumps(lifecycle_packs.LIFECYCLE_SHAPES, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == lifecycle_packs.LIFECYCLE_SHAPES_SHA256
    assert digest == "6d51b8e0a50e2dbbeda1f0e49d5dd603d8a8bc905dee6dffd82a9b8e828383f7"
    # Shape 0 is format 3's: packs written in it before format 4 read as they did.
    assert lifecycle_packs.LIFECYCLE_SHAPES[0] == (
        "job.enqueued",
        "queued",
        ("run_at", "priority", "message_id", "ordering_key", "causation_id"),
    )


def test_a_format_3_pack_written_before_format_4_still_reads() -> None:
    # The bytes format 3 has always written for a new job's job.enqueued.
    stored_bytes = b'\x03[1796000000.5,0,null,"customer:1"]'
    event = enqueued(1_796_000_000.5, ordering_key="customer:1")
    assert packs.pack_json(stored_bytes) == packs.pack_row([event], packs.FORMAT_JSON)["events"]
    # Shape 0 in format 4 says the same.
    assert packs.pack_json(b"\x04\x00" + stored_bytes[1:]) == packs.pack_json(stored_bytes)


@pytest.mark.parametrize(
    "stored_bytes",
    [
        b"\x05[1,2]",  # a format this replayq does not know
        b"\x04",  # format 4 without its shape code
        b"\x04\x7f[1,2]",  # a shape code beyond the table
        b"\x04\x01[1,2,3,4,5,6]",  # more values than its shape has keys
        b"\x04\x01{}",  # not an array
    ],
    ids=["format-5", "no-shape", "unknown-shape", "too-many-values", "not-an-array"],
)
def test_a_lifecycle_pack_that_cannot_be_read_is_refused_not_misread(stored_bytes: bytes) -> None:
    with pytest.raises(ValueError):
        packs.pack_json(stored_bytes)


def test_a_lifecycle_pack_joined_by_later_events_is_rewritten_whole_as_format_2() -> None:
    # A traced job's steps commit after its lease on the same connection: their events
    # join the lease's pack, which has no deflate stream to append to; it is rewritten as
    # format 2 (its event and theirs in one stream), and later commits append to that.
    leased = lifecycle_event("job.leased", "running", **LEASED)
    later = [
        TraceEvent(**{**event.__dict__, "attempt": 2, "hlc": 9_000_001 + n})
        for n, event in enumerate(attempt_events())
    ]
    row, compact = packs.opened_row([leased], packs.FORMAT_DEFLATE)
    assert isinstance(compact, packs.CompactPack) and compact.base_hlc == row["hlc"]
    writer = compact.rewritten([leased, *later[:2]])
    data = one_stream = writer.stored
    assert type(data) is bytearray and data[:1] == b"\x02"
    assert writer.base_hlc == row["hlc"]
    assert (
        packs.pack_json(data) == packs.pack_row([leased, *later[:2]], packs.FORMAT_JSON)["events"]
    )
    # The row keeps its hlc and ts (the lease's event stays first): only ``events`` changes.
    assert packs.unpack({**row, "events": data, "id": 5}) == packs.unpack(
        stored([leased, *later[:2]], packs.FORMAT_JSON)
    )
    # Later commits append to the rewritten pack's stream, as to any format 2 pack.
    data = data + writer.more(packs.pack_items(later[2:], row["hlc"], row["ts"]))
    assert writer.stored == data
    assert packs.unpack({**row, "events": data, "id": 5}) == packs.unpack(
        stored([leased, *later], packs.FORMAT_JSON)
    )
    # One stream for the lease's event and the first step's: no larger than the two
    # sync-flushed pieces the lease's deflated pack and its first join made before.
    pieces = packs.PackWriter(lifecycle=True)
    two = pieces.first(packs.pack_items([leased], row["hlc"], row["ts"]))
    two += pieces.more(packs.pack_items(later[:2], row["hlc"], row["ts"]))
    assert len(one_stream) <= len(two)


# -- unpack against the decode it replaced ------------------------------------------------


def reference_unpack(row: Mapping[str, Any]) -> list[TraceEvent]:
    """``packs.unpack`` as it was before items were decoded as ``packs.Item``: every pack
    through ``codec.loads(pack_json(...))`` (a format 3 or 4 pack through
    ``lifecycle_item``) into dictionaries, each event's fields looked up in its item."""
    stored = row["events"]
    items: list[dict[str, Any]]
    if isinstance(stored, bytes | bytearray) and stored[:1] == b"\x04" and len(stored) > 1:
        items = [lifecycle_packs.lifecycle_item(stored[1], stored[2:])]
    elif isinstance(stored, bytes | bytearray) and stored[:1] == b"\x03":
        items = [lifecycle_packs.lifecycle_item(0, stored[1:])]
    else:
        items = codec.loads(packs.pack_json(stored))
    base, base_ts = row["hlc"], row["ts"]
    event_id = row["id"] * packs.PACK_SIZE
    out = []
    for item in items:
        fields = {
            "trace_id": row["trace_id"],
            "job_id": row["job_id"],
            "attempt": row["attempt"],
            "worker_id": row["worker_id"],
            "name": item["n"],
            "ts": base_ts + 0.0,
            "hlc": base,
            "kind": "domain",
            "seq": None,
            "step": None,
            "status": None,
            "resource": None,
            "resource_version": None,
            "side_effect": False,
            "input_ref": None,
            "output_ref": None,
            "data": item.get("d") or {},
            "id": event_id,
        }
        event_id += 1
        if "h" in item:
            fields["hlc"] = base + item["h"]
        if "dt" in item:
            fields["ts"] = base_ts + item["dt"] / 1e6
        for field, key in (
            ("seq", "q"),
            ("step", "s"),
            ("status", "st"),
            ("resource", "r"),
            ("resource_version", "v"),
            ("input_ref", "i"),
            ("output_ref", "o"),
        ):
            if key in item:
                fields[field] = item[key]
        if "k" in item:
            fields["kind"] = item["k"] or "domain"
        if "x" in item:
            fields["side_effect"] = bool(item["x"])
        out.append(TraceEvent.of(fields))
    return out


def exactly(events: list[TraceEvent]) -> list[str]:
    """Each event's fields in order, as ``repr`` writes them: the values and their types
    (``1`` is not ``1.0`` nor ``True``), NaN included (``==`` never equals it)."""
    return [repr(list(vars(event).items())) for event in events]


# Items as no replayq writes them but a pack may hold: keys at their defaults written out,
# ``null`` kinds, values msgspec refuses (``codec.loads`` then reads them the standard
# library's way), keys unpack does not know, a key given twice.
ODD_ITEMS = [
    '{"n":"a","h":0,"dt":0,"x":0,"k":null,"d":null,"q":null}',
    '{"n":"b","k":"","x":true,"d":{},"h":3,"dt":-12,"v":2}',
    '{"n":"c","k":"lifecycle","x":1,"st":"ok","r":"order:1","i":"blob:in","o":"blob:out"}',
    '{"n":"d","s":"step","q":4,"zz":{"unknown":[1]},"n":"d2"}',
    '{"n":"e","d":{"big":1180591620717411303424,"tiny":2.5e-7,"neg":-0.0,"u":"\\u00fc\\ud83d"}}',
    '{"n":"f","d":{"nan":NaN,"inf":Infinity,"huge":1e400}}',
    '{"n":"g","d":{"lone":"\\ud800"},"dt":1.5,"h":2.0}',
    '{"n":"h","d":[1,2],"x":false,"q":1.0}',
]


def odd_rows(text_items: list[str]) -> list[dict[str, Any]]:
    """``text_items`` as a pack of each format that holds JSON text: format 1, format 2
    finished and format 2 still open to appends (its array not closed), the latter also
    joined piece by piece; with a time as a float and as an integer."""
    joined = ",".join(text_items)
    writer = packs.PackWriter()
    pieces = writer.first(text_items[0])
    for text in text_items[1:]:
        pieces += writer.more(text)
    group = {"trace_id": "t" * 32, "job_id": 41, "attempt": 2, "worker_id": "w", "id": 7}
    return [
        {**group, "hlc": 9_000_000, "ts": ts, "events": events}
        for events in (
            "[" + joined + "]",
            packs.deflated("[" + joined + "]"),
            bytes(packs.PackWriter().first(joined)),
            pieces,
        )
        for ts in (1_796_000_000.25, 1_796_000_000)
    ]


@pytest.mark.parametrize("which", range(len(ODD_ITEMS)))
def test_unpack_reads_any_item_as_the_dictionary_decode_did(which: int) -> None:
    for row in odd_rows([ODD_ITEMS[which]]):
        assert exactly(packs.unpack(row)) == exactly(reference_unpack(row)), row


def test_unpack_reads_a_pack_of_odd_items_as_the_dictionary_decode_did() -> None:
    rows = odd_rows(ODD_ITEMS)
    for row in rows:
        events = packs.unpack(row)
        assert len(events) == len(ODD_ITEMS)
        assert exactly(events) == exactly(reference_unpack(row))
    # Not vacuous: the odd values are there, as the standard library reads them.
    data = packs.unpack(rows[0])[5].data
    assert math.isnan(data["nan"]) and data["inf"] == data["huge"] == math.inf


def test_unpack_reads_every_format_replayq_writes_as_the_dictionary_decode_did() -> None:
    events = attempt_events()
    lone = [
        enqueued(1_796_000_000.5),
        enqueued(1_796_000_000, message_id='order-7 ü "q"', ordering_key="customer:1"),
        lifecycle_event("job.leased", "running", **LEASED),
        lifecycle_event("job.leased", "running", **LEASED, version_moved_from="v0"),
        lifecycle_event(
            "job.succeeded", "succeeded", duration=7.2e-05, owner_token="", version="v"
        ),
        lifecycle_event("job.failed", "fail", error="boom", duration=0.1),  # no shape: format 2
    ]
    rows = [stored(events, packs.FORMAT_JSON), stored(events, packs.FORMAT_DEFLATE)]
    rows += [stored([event], form) for event in lone for form in (1, 2)]
    rows.append({**rows[0], "events": b'\x03[1796000000.5,0,null,"customer:1"]'})
    # A deflated pack joined by a later commit (its stream open) and one rewritten whole.
    row, writer = packs.opened_row(events[:2], packs.FORMAT_DEFLATE)
    assert isinstance(writer, packs.PackWriter)
    more = writer.more(packs.pack_items(events[2:], row["hlc"], row["ts"]))
    rows.append({**row, "events": row["events"] + more, "id": 3})
    row, compact = packs.opened_row(lone[2:3], packs.FORMAT_DEFLATE)
    assert isinstance(compact, packs.CompactPack)
    rows.append({**row, "events": compact.rewritten([lone[2], *events]).stored, "id": 4})
    marks = {bytes(r["events"][:1]) if not isinstance(r["events"], str) else "[" for r in rows}
    assert marks == {"[", b"\x02", b"\x03", b"\x04"}
    for row in rows:
        assert exactly(packs.unpack(row)) == exactly(reference_unpack(row)), row
    assert exactly(packs.unpack(rows[1])) == exactly(packs.unpack(rows[0]))


def test_unpack_refuses_what_the_dictionary_decode_refused() -> None:
    # Items without a name, that are not objects, text that is not JSON, unknown formats
    # and shapes (an object where the array belongs: the dictionary decode iterated its
    # keys, read one that holds none as no events; it is refused now).
    group = {"trace_id": "t", "job_id": 1, "attempt": 1, "worker_id": None, "id": 1}
    for events in ('[{"q":1}]', "[1]", '{"n":1}', "[{", b"\x05[]", b"\x04\x7f[1]", "null"):
        row = {**group, "hlc": 1, "ts": 1.0, "events": events}
        with pytest.raises((KeyError, TypeError, ValueError)):
            reference_unpack(row)
        with pytest.raises(ValueError):  # msgspec's ValidationError is one
            packs.unpack(row)


def test_the_item_fields_are_in_the_order_a_stored_item_has_its_keys() -> None:
    # msgspec matches each key of an object against the field it expects next: stored items
    # have their keys sorted (codec's canonical text), and so must ``packs.Item``'s fields
    # be, or each key is searched for (slower, the same events).
    text = packs.pack_items(attempt_events(), 9_000_000, 1_796_000_000.5, keep=False)
    for item in json.loads("[" + text + "]"):
        assert list(item) == sorted(item)
    assert list(packs.Item.__struct_fields__) == sorted(packs.Item.__struct_fields__)
    assert set(packs.Item.__struct_fields__) == {key for _, key in packs._KEYS} | {
        "d",
        "dt",
        "h",
        "k",
        "x",
    }
