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

How ``events`` is stored (its first byte says which, so packs of every format stay readable):

* format 1, JSON text (PostgreSQL always; SQLite packs written before 0016);
* format 2, bytes (SQLite since 0016): ``b"\\x02"`` and the same JSON text as raw deflate
  (``zlib``, 8 KB window) with ``DICTIONARY_2`` as preset dictionary: replayq's own keys,
  event names and lifecycle data, so a pack of a few events does not pay for them again.
  SQL reads it through ``rq_pack_json(events)``, a function replayq registers on every
  SQLite connection it opens (``register_sqlite``); the ``rq_events`` view and every query
  that unpacks packs in SQL call it. A plain ``sqlite3`` shell does not have it: read the trace
  through replayq, or from Python after ``register_sqlite(connection)``;
* formats 3 and 4, bytes (SQLite since 0019 and 0021): a pack of one lifecycle event of a
  known shape (a new job's ``job.enqueued``, kept in its row since 0023; a lease's
  ``job.leased``, an ack's ``job.succeeded``) as its data's values, no deflate
  (``lifecycle_packs``). ``rq_pack_json`` returns the same JSON text as format 1.

A format 3 or 4 pack has no deflate stream to append to: a later event of its attempt
that joins it (a traced job's steps after its lease, on the same connection) rewrites it
whole as format 2 (``CompactPack``), whose stream later joins append to.

An event's id is ``pack id * PACK_SIZE + its place``: ids still grow in commit order, so
``ORDER BY hlc, id`` sorts as it did when each event was a row. The view ``rq_events``
unpacks the rows in SQL for the queries that count or filter events by name.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from replayq import codec
from replayq.model import TraceEvent, set_event_dict
from replayq.storage.lifecycle_packs import (
    ENQUEUED_MARK,
    LIFECYCLE_MARK,
    lifecycle_item,
    lifecycle_json,
    lifecycle_pack,
)
from replayq.storage.pack_dictionaries import (
    LEARNED_MARK,
    PackDictionaries,
    id_bytes,
    read_id,
    shape,
)

# Events per pack at most: an event id is pack id * PACK_SIZE + the event's place.
PACK_SIZE = 1024

# The formats of ``events`` (the first byte of a pack of formats 2 to 4; format 1 is text).
FORMAT_JSON = 1
FORMAT_DEFLATE = 2
_DEFLATE_MARK = bytes([FORMAT_DEFLATE])
# Raw deflate (no zlib header or checksum: the row is the unit), an 8 KB window (the
# dictionary and a pack of ~25 events in reach), level 6, memLevel 5: creating a
# compressor with a preset dictionary at zlib's defaults (32 KB, memLevel 8/9) costs
# ~100 µs of allocation and hashing per pack; these ~15 µs, for the same bytes.
_WBITS = -13
_LEVEL = 6
_MEM_LEVEL = 5

# The preset dictionary of format 2: pack items as replayq writes them (lifecycle events,
# steps, state, calls, effects, locks, cache, outbox), common ones last (deflate reaches
# the end of the dictionary with the shortest distances). Frozen: packs written with it
# are decoded with it, so a change is a new format byte (tests/unit/test_packs.py
# checks its digest). Its values are placeholders in the shapes replayq writes (a step
# "load", a resource "order:1"): what a pack repeats is replayq's keys and names.
DICTIONARY_2 = (
    b'{"d":{"attempt":1,"duration":0.0012,"error":"","error_class":"transient","owner_toke'
    b'n":"","retry_in":1.0,"version":"v1"},"k":"lifecycle","n":"job.failed","st":"failed"}'
    b',{"d":{"error":"","error_class":"validation","owner_token":"","reason":""},"k":"life'
    b'cycle","n":"job.dead","st":"dead"},{"d":{"redelivery_count":1,"stale":true},"k":"lif'
    b'ecycle","n":"lease.expired","st":"expired"},{"d":{"fencing_token":1,"owner_token":""'
    b',"ttl":60.0,"wait":0.0001},"dt":10,"h":1,"n":"lock.acquired","q":1,"r":"lock:","s":"'
    b'step","st":"acquired"},{"d":{"fencing_token":1,"owner_token":""},"dt":10,"h":1,"n":"'
    b'lock.released","q":2,"r":"lock:","s":"step"},{"d":{"hit":true,"key":"cache:","versio'
    b'n":1},"dt":10,"h":1,"n":"cache.read","q":3,"r":"cache:","s":"step","st":"hit","v":1}'
    b',{"d":{"key":"cache:","ttl":60.0,"version":2},"dt":10,"h":1,"n":"cache.write","q":4,'
    b'"r":"cache:","s":"step","v":2},{"d":{"event_id":1,"payload":{},"topic":""},"dt":10,"'
    b'h":1,"n":"outbox.written","q":5,"r":"outbox:","s":"step"},{"d":{"child_job_id":1,"ch'
    b'ild_type":"","payload":{}},"dt":10,"h":1,"n":"child.enqueued","q":6,"s":"step"},{"d"'
    b':{"value":""},"dt":10,"h":1,"n":"random.uuid","q":7,"s":"step"},{"d":{"value":0.5},"'
    b'dt":10,"h":1,"n":"random.random","q":8,"s":"step"},{"d":{"error":"","error_class":"d'
    b'ependency","key":"","kind":""},"dt":10,"h":1,"n":"effect.failed","q":9,"r":"","s":"s'
    b'tep","st":"error"},{"d":{"key":"","kind":"","result":{}},"dt":10,"h":1,"n":"effect.d'
    b'eduplicated","q":10,"r":"","s":"step","st":"success"},{"d":{"duration":0.0001,"error'
    b'":"","error_class":"unknown","step_name":"step"},"dt":10,"h":1,"n":"step.finished","'
    b'q":11,"st":"error"},{"d":{"causation_id":null,"message_id":null,"ordering_key":null,'
    b'"priority":0,"run_at":1796102764.558651},"k":"lifecycle","n":"job.enqueued","st":"qu'
    b'eued"},{"d":{"lease_deadline":1796102824.654009,"owner_token":"","redelivery_count":'
    b'0,"version":"v1"},"k":"lifecycle","n":"job.leased","st":"running"},{"d":{"step_name"'
    b':"load"},"n":"step.started","q":1,"st":"started"},{"d":{"branch":"main","exists":tru'
    b'e},"dt":214,"h":1,"n":"state.read","q":2,"r":"order:1","s":"load","v":1},{"d":{"call'
    b'":"service.call","duration":0.0001,"fingerprint":"0123456789abcdef","request":{"args'
    b'":[],"kwargs":{}},"response":null},"dt":856,"h":65536,"n":"call","o":"blob:sha256:",'
    b'"q":6,"s":"price","st":"success"},{"d":{"branch":"main","delta":{"replace":{}},"expe'
    b'cted_version":0,"fencing":null,"parent_version":0},"dt":974,"h":65539,"n":"state.wri'
    b'te","q":9,"r":"order:1","s":"reserve","v":1},{"d":{"claim":"","key":"charge:1","kind'
    b'":"payment.charge"},"dt":323,"h":1,"n":"effect.claimed","q":12,"r":"charge:1","s":"c'
    b'harge"},{"d":{"duration":0.0003,"key":"charge:1","kind":"payment.charge","result":{}'
    b'},"n":"effect.succeeded","q":13,"r":"charge:1","s":"charge","st":"success","x":1},{"'
    b'd":{"duration":0.0001,"step_name":"load"},"dt":298,"h":3,"n":"step.finished","q":4,"'
    b'st":"success"},{"d":{"duration":0.0037782649999940077,"owner_token":"","version":"v1'
    b'"},"k":"lifecycle","n":"job.succeeded","st":"succeeded"},{"d":{"step_name":"price"},'
    b'"dt":314,"h":4,"n":"step.started","q":5,"st":"started"},{"d":{"duration":0.0005,"ste'
    b'p_name":"price"},"dt":887,"h":65537,"n":"step.finished","q":7,"st":"success"}'
)
DICTIONARY_2_SHA256 = "c20fe38913382d297a259d400c024c630b28850bc0cb910ff05a9d178aabe0bc"

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


_group_key = operator.attrgetter(*_GROUP)


def same_pack(earlier: Sequence[TraceEvent], group: Sequence[TraceEvent]) -> bool:
    """Whether ``group`` may join the pack holding ``earlier`` (same group, room left)."""
    return _group_key(earlier[0]) == _group_key(group[0]) and len(earlier) + len(group) <= PACK_SIZE


def groups(events: Sequence[TraceEvent]) -> Iterator[list[TraceEvent]]:
    """``events`` cut into packs: runs of the same trace, job, attempt and worker, in order."""
    for _, same in itertools.groupby(events, _group_key):  # keys read in C, not per event
        run = list(same)
        if len(run) <= PACK_SIZE:
            yield run
        else:
            for start in range(0, len(run), PACK_SIZE):
                yield run[start : start + PACK_SIZE]


def cut(events: Sequence[TraceEvent]) -> list[list[TraceEvent]]:
    """``groups(events)`` as a list; a commit's few events of one attempt (the usual case:
    a step's), or events of as many attempts, without ``groupby``'s iteration."""
    keys = len(set(map(_group_key, events)))
    if keys == 1 and len(events) <= PACK_SIZE:
        return [list(events)]
    if keys == len(events):
        # Every event its own attempt's (a lease batch's ``job.leased``, a group's
        # ``job.succeeded``): each one a group, without ``groupby``'s iteration.
        return [[event] for event in events]
    return list(groups(events))


def _packed(event: TraceEvent, base_hlc: int, base_ts: float) -> dict[str, Any]:
    """One event as a pack item: the fields of ``_KEYS`` that are set, under short keys."""
    return _packed_items((event,), base_hlc, base_ts)[0]


def _packed_items(
    events: Sequence[TraceEvent], base_hlc: int, base_ts: float
) -> list[dict[str, Any]]:
    """``_packed`` of each of ``events``: its body is this loop's (a commit's events are
    packed without a Python call each: ~400 instructions an event)."""
    items: list[dict[str, Any]] = []
    append = items.append
    for event in events:
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
        append(item)
    return items


# A compressor with ``DICTIONARY_2`` already set: each pack's is a copy (``PackWriter``),
# which skips hashing the dictionary again (~10 µs a pack).
_PRIMED = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zdict=DICTIONARY_2)
# A derived trace's (replay, fork, rerun: no job row) at level 1, the same stream format:
# a kept dry-run writes its whole trace in one pack at its end, where level 6 was the
# largest part of that write (~90 µs for ~35 events); level 1 takes about half the time
# for ~25 % more bytes (~1.1 KB instead of ~0.85 KB), still within one page.
_PRIMED_DERIVED = zlib.compressobj(1, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zdict=DICTIONARY_2)
# A pack that a lifecycle event starts (~160 bytes of JSON, rarely joined later: one whose
# event has no shape of formats 3 and 4, ``LIFECYCLE_SHAPES``, or a format 3 or 4 pack
# rewritten when joined, ``CompactPack``): a 4 KB window (the whole dictionary is within
# it) and memLevel 3, the same stream format and, for such a pack, the same bytes. Each
# such pack copies its compressor: ~17 KB of state instead of ~48 KB, ~2 µs of the
# ~5.5 µs the pack's deflate took. Inflating with the format's 8 KB window reads any
# smaller window's stream.
_LIFECYCLE_WBITS = -12
_LIFECYCLE_MEM_LEVEL = 3
_PRIMED_LIFECYCLE = zlib.compressobj(
    _LEVEL, zlib.DEFLATED, _LIFECYCLE_WBITS, _LIFECYCLE_MEM_LEVEL, zdict=DICTIONARY_2
)


def _primed_with(preset: bytes) -> Any:
    """A format 5 pack's compressor: format 2's settings on a worker (``_PRIMED``) with a
    learned dictionary's ``preset`` (``PackDictionaries.primed`` keeps it per dictionary)."""
    return zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zdict=preset)


def deflated(text: str) -> bytes:
    """``text`` (a pack's JSON) as format 2, its deflate stream finished."""
    compressor = _PRIMED.copy()
    return _DEFLATE_MARK + compressor.compress(text.encode()) + compressor.flush()


def learned_text(
    events: Sequence[TraceEvent], agreeing: Sequence[TraceEvent] | None = None
) -> bytes:
    """A learned dictionary's text (``pack_dictionaries.shape``) from a succeeded job's
    events: its domain events as their pack items, names kept and values replaced, and of
    those names only the ones another job's events (``agreeing``) hold too; lifecycle
    events left out (``DICTIONARY_2`` holds theirs)."""
    domain = _domain(events)
    if not domain:
        return b""
    items = _packed_items(domain, domain[0].hlc, domain[0].ts)
    if agreeing is None:
        return shape(items)
    others = _domain(agreeing)
    return shape(items, _packed_items(others, others[0].hlc, others[0].ts) if others else [])


def _domain(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    return [e for e in events if e.kind != "lifecycle"]


def _learned(
    events: Sequence[TraceEvent], dictionaries: PackDictionaries | None
) -> tuple[PackDictionaries, int] | None:
    """The learned dictionary a new format 2 pack of ``events`` deflates against instead
    (format 5): its job's type's, while the attempt runs in this process
    (``PackDictionaries.for_job``); ``None`` for a derived trace's pack or none learned."""
    if dictionaries is None:
        return None
    dictionary_id = dictionaries.for_job(events[0].job_id)
    return None if dictionary_id is None else (dictionaries, dictionary_id)


class PackWriter:
    """The deflate stream of one format 2 pack that later commits of its attempt append to.

    The first commit stores ``b"\\x02"``, ``[`` and its items; each later one appends its
    own items (``,`` first) compressed by the same stream, which keeps the earlier ones in
    its window: a commit compresses only its new events, never those already stored. Each
    piece ends with a sync flush (byte-aligned, everything so far decodable), so the
    stored bytes are always a whole prefix of one deflate stream; ``pack_json`` closes the
    array the stream leaves open. ``stored`` is what the row holds once the last piece is
    written, which the append checks: a pack rewritten or rolled back since is not
    appended to (its stream would no longer be this one).
    """

    __slots__ = ("_compressor", "_mark", "base_hlc", "stored")

    def __init__(
        self,
        derived: bool = False,
        lifecycle: bool = False,
        base_hlc: int = 0,
        learned: tuple[PackDictionaries, int] | None = None,
    ) -> None:
        if learned is not None:
            # Format 5: deflated against a dictionary learned for the job's type.
            dictionaries, dictionary_id = learned
            self._compressor = dictionaries.primed(dictionary_id, _primed_with).copy()
            self._mark = LEARNED_MARK + id_bytes(dictionary_id)
        else:
            primed = _PRIMED_DERIVED if derived else _PRIMED_LIFECYCLE if lifecycle else _PRIMED
            self._compressor = primed.copy()
            self._mark = _DEFLATE_MARK
        # The row's ``hlc``, its items' base: a later piece is encoded against it.
        self.base_hlc = base_hlc
        self.stored = bytearray()

    # ``stored`` and the pieces are ``bytearray``s: they are the parameters of each join
    # (``trace_join``), and the ``sqlite3`` driver binds a ``bytearray`` as a blob at once,
    # where for ``bytes`` it first looks for an adapter and fails (an ``AttributeError``
    # raised and cleared, ~3.7 K instructions; two a join, ten a traced job). ``stored``
    # is replaced, never grown in place: a join's row still holds the bytes it had.

    def first(self, items: str) -> bytearray:
        """The pack's ``events`` as first stored: the mark, ``[`` and ``items``; the very
        ``stored`` it keeps (bound as a ``bytearray``: no failed adapter lookup; ``more``
        replaces ``stored``, never grows it in place)."""
        compressor = self._compressor  # ``_piece`` inlined: a step's commit, a rewrite
        stored = bytearray(self._mark)
        stored += compressor.compress(("[" + items).encode())
        stored += compressor.flush(zlib.Z_SYNC_FLUSH)
        self.stored = stored
        return stored

    def more(self, items: str) -> bytearray:
        """The bytes that append ``items`` to the pack (``stored`` grows by them)."""
        data = self._piece("," + items)
        self.stored = self.stored + data
        return data

    def _piece(self, text: str) -> bytearray:
        compressor = self._compressor
        piece = bytearray(compressor.compress(text.encode()))
        piece += compressor.flush(zlib.Z_SYNC_FLUSH)
        return piece


class CompactPack:
    """A format 3 or 4 pack (one lifecycle event) that later events of its attempt may join.

    It has no deflate stream to append to: a join rewrites it whole as format 2
    (``rewritten``), its event's item and the new ones in one stream, whose
    ``PackWriter`` later joins append to. ``stored`` is what the row holds, which the
    rewrite checks (``trace_rewrite``), as an append does.
    """

    __slots__ = ("base_hlc", "stored")

    def __init__(self, stored: bytearray, base_hlc: int) -> None:
        self.stored = stored
        self.base_hlc = base_hlc

    def rewritten(
        self, events: Sequence[TraceEvent], dictionaries: PackDictionaries | None = None
    ) -> PackWriter:
        """The writer of this pack rewritten as format 2 holding ``events`` (its own event
        first, then those joining it); ``writer.stored`` is the row's new ``events``.

        Its event's item is encoded again from the event (``pack_json`` gives the same
        text for the stored bytes), in one encoding with the new ones: decoding the stored
        values and encoding them again cost a traced job ~40,000 instructions more."""
        writer = PackWriter(
            lifecycle=True, base_hlc=self.base_hlc, learned=_learned(events, dictionaries)
        )
        writer.first(pack_items(events, self.base_hlc, events[0].ts, keep=False))
        return writer


# What later events of a pack's attempt join it by: the writer of its deflate stream
# (format 2), or its compact bytes (formats 3 and 4, rewritten by a join).
Writer = PackWriter | CompactPack


def pack_json(
    stored: str | bytes | None, dictionaries: PackDictionaries | None = None
) -> str | None:
    """A pack's ``events`` as JSON text, whichever format it was written in (a format 5
    pack's dictionary from ``dictionaries``).

    SQLite's ``rq_pack_json``: the SQL that unpacks packs reads them through it. A format 2
    pack still open to appends (``PackWriter``) is a deflate stream without its end and its
    JSON array without its ``]``: both are closed here.
    """
    if stored is None or isinstance(stored, str):
        return stored
    text = _inflated(stored, dictionaries)
    if text is None:
        if stored[:1] == LIFECYCLE_MARK and len(stored) > 1:
            return lifecycle_json(stored[1], stored[2:])
        if stored[:1] == ENQUEUED_MARK:
            return lifecycle_json(0, stored[1:])
        raise ValueError(f"trace pack of unknown format {stored[:1]!r}")
    return text.decode()


def _inflated(stored: bytes, dictionaries: PackDictionaries | None) -> bytes | None:
    """A format 2 or 5 pack's JSON array, closed (``]`` added to a stream still open to
    appends); ``None`` for a pack of another format."""
    mark = stored[:1]
    if mark == _DEFLATE_MARK:
        decompressor = zlib.decompressobj(_WBITS, zdict=DICTIONARY_2)
        start = 1
    elif mark == LEARNED_MARK:
        if dictionaries is None:
            raise ValueError(
                "trace pack of format 5 (a learned dictionary) read without its database's "
                "dictionaries: read it through replayq, or after register_sqlite(connection)"
            )
        dictionary_id, start = read_id(stored)
        decompressor = zlib.decompressobj(_WBITS, zdict=dictionaries.zdict(dictionary_id))
    else:
        return None
    raw = decompressor.decompress(memoryview(stored)[start:])
    return raw if decompressor.eof else raw + b"]"


def _loader_on(connection: Any) -> Callable[[int], bytes | None]:
    """What reads a dictionary learned after ``register_sqlite`` on ``connection`` itself:
    a script's connection lives on while workers learn (SQLite runs this query inside
    ``rq_pack_json``'s statement, on the same connection)."""

    def text_of(dictionary_id: int) -> bytes | None:
        try:
            row = connection.execute(
                "SELECT text FROM rq_pack_dictionaries WHERE id = ?", (dictionary_id,)
            ).fetchone()
        except Exception:  # a database before migration 0029, a closed connection
            return None
        return None if row is None else bytes(row[0])

    return text_of


def register_sqlite(connection: Any, dictionaries: PackDictionaries | None = None) -> None:
    """Give a ``sqlite3`` connection ``rq_pack_json``, which the ``rq_events`` view needs.

    replayq does it on every connection it opens (with its storage's ``dictionaries``); a
    script that reads the trace in SQL on its own connection calls this first, which
    reads the database's learned dictionaries (``rq_pack_dictionaries``) as they are now.
    """
    if dictionaries is None:
        dictionaries = PackDictionaries(DICTIONARY_2, _loader_on(connection))
        with contextlib.suppress(Exception):  # a database before migration 0029 has none
            for dictionary_id, text in connection.execute(
                "SELECT id, text FROM rq_pack_dictionaries"
            ):
                dictionaries.known(dictionary_id, text)

    def rq_pack_json(stored: str | bytes | None) -> str | None:
        return pack_json(stored, dictionaries)

    connection.create_function("rq_pack_json", 1, rq_pack_json, deterministic=True)


# Each event's item text, by event: a JSON pack joined by later events of its transaction
# (PostgreSQL, trace_verbs.py) is written again whole, and its earlier events are not
# encoded again. Bounded; an
# entry holds its event, so an id is never another event's while it is here.
_ITEM_TEXTS: dict[int, tuple[TraceEvent, int, float, str]] = {}
_ITEM_TEXTS_MAX = 4096


def _item_text(event: TraceEvent, base_hlc: int, base_ts: float, keep: bool = True) -> str:
    """``event`` as its pack's JSON item (``_packed``), encoded once per pack base (kept
    for a later rewrite of its pack only with ``keep``)."""
    known = _ITEM_TEXTS.get(id(event))
    if known is not None and known[0] is event and known[1] == base_hlc and known[2] == base_ts:
        return known[3]
    # Names the event whose data cannot be stored (PayloadError with its path). Decoded,
    # never compared as text: a tiny float may keep orjson's notation (``dumps_stored``).
    text = codec.dumps_stored(_packed(event, base_hlc, base_ts), what=f"event {event.name} data")
    if not keep:
        return text
    if len(_ITEM_TEXTS) >= _ITEM_TEXTS_MAX:
        _ITEM_TEXTS.clear()
    _ITEM_TEXTS[id(event)] = (event, base_hlc, base_ts, text)
    return text


def forget(event: TraceEvent) -> None:
    """Drop the item text kept for ``event`` (``_item_text``): its data changed since it
    was encoded. A write deferred to a commit notes in its event what it found (a child
    job's id, a key already claimed); when that transaction rolls back and the commit is
    made again (a group commit tried again without an ack it refused, or in halves), the
    write runs again and may find otherwise, and the text of the try rolled back must
    not be the one stored."""
    _ITEM_TEXTS.pop(id(event), None)


def pack_items(
    events: Sequence[TraceEvent], base_hlc: int, base_ts: float, keep: bool = True
) -> str:
    """``events`` as the comma-separated items of a pack whose row has ``base_hlc`` and
    ``base_ts`` (its ``hlc`` and ``ts``); ``keep``: remember each item's text for a
    rewrite of the pack (``_ITEM_TEXTS``)."""
    if not keep:
        # No text kept per item: all of them in one encoding (a dry-run's derived trace is
        # ~35 events at once), unless one holds what orjson refuses (then one by one, so
        # that the error names its event).
        if len(events) == 1:  # a lifecycle event's pack: the object, no array to cut
            one = codec.stored_text(_packed(events[0], base_hlc, base_ts))
            if one is not None:
                return one
        whole = codec.stored_text(_packed_items(events, base_hlc, base_ts))
        if whole is not None:
            return whole[1:-1]
    return ",".join(_item_text(e, base_hlc, base_ts, keep) for e in events)


# A pack row's shape: its values (``row_values``) or a dictionary (``row_dict``).
Row = TypeVar("Row")


def pack_row(
    events: Sequence[TraceEvent],
    pack_format: int = FORMAT_JSON,
    dictionaries: PackDictionaries | None = None,
) -> dict[str, Any]:
    """The ``rq_trace`` row of one group (from ``groups``), ``events`` as compact JSON
    (``FORMAT_JSON``) or that JSON deflated (``FORMAT_DEFLATE``, SQLite).

    Lifecycle data is built by replayq (string keys, scalars) and the user values in
    domain data were checked once when recorded (``Context.encoded``): no walk here.
    """
    return opened_row(events, pack_format, dictionaries)[0]


def opened_row(
    events: Sequence[TraceEvent],
    pack_format: int = FORMAT_JSON,
    dictionaries: PackDictionaries | None = None,
) -> tuple[dict[str, Any], Writer | None]:
    """``pack_row`` and, on SQLite, what later events may join it by: the ``PackWriter``
    of a format 2 pack (a pack a lifecycle event starts is deflated by
    ``_PRIMED_LIFECYCLE``), the ``CompactPack`` of a format 3 or 4 one."""
    return _opened(events, pack_format, row_dict, dictionaries)


def opened_values(
    events: Sequence[TraceEvent],
    pack_format: int = FORMAT_JSON,
    dictionaries: PackDictionaries | None = None,
) -> tuple[tuple[Any, ...], Writer | None]:
    """``opened_row`` with the row as its values in ``PACK_COLUMNS`` order (``row_values``):
    a many-row insert binds them by position (``trace_append_rows``), no dictionary."""
    return _opened(events, pack_format, row_values, dictionaries)


def _opened(
    events: Sequence[TraceEvent],
    pack_format: int,
    shaped: Callable[[TraceEvent, int, int, str | bytes | bytearray], Row],
    dictionaries: PackDictionaries | None = None,
) -> tuple[Row, Writer | None]:
    """A new pack's row made by ``shaped`` (``row_values`` or ``row_dict``), and its writer.
    The row is shaped straight from its parts: PostgreSQL's many-row insert sends each
    row as a JSON object, and a dictionary made from the values (``dict(zip(...))``) cost
    a drained job ~13 k instructions more there."""
    first = events[0]
    if len(events) == 1:  # an enqueue's pack, a lease's, an ack's: no list of one HLC
        base = last = first.hlc
        if pack_format == FORMAT_DEFLATE and first.kind == "lifecycle":
            compact = lifecycle_pack(first)
            if compact is not None:
                # A later event of its group (a traced job's steps after its lease, on the
                # same connection) rewrites the pack whole as format 2
                # (``CompactPack.rewritten``).
                return shaped(first, base, last, compact), CompactPack(compact, base)
    else:
        hlcs = [e.hlc for e in events]
        base, last = min(hlcs), max(hlcs)
    # A format 2 pack is joined by appending to its deflate stream, never rewritten from
    # its items: keeping their texts would only hold each event alive until the bounded
    # cache is cleared, work for the garbage collector (~3-5 µs of a SQLite enqueue's ~40).
    items = pack_items(events, base, first.ts, keep=pack_format != FORMAT_DEFLATE)
    writer = None
    if pack_format == FORMAT_DEFLATE:
        writer = PackWriter(
            first.job_id is None, first.kind == "lifecycle", base, _learned(events, dictionaries)
        )
        stored: str | bytes | bytearray = writer.first(items)
    else:
        stored = "[" + items + "]"
    return shaped(first, base, last, stored), writer


# The columns of an ``rq_trace`` row, in the order of ``row_values``.
PACK_COLUMNS = ("trace_id", "job_id", "attempt", "worker_id", "hlc", "hlc_last", "ts", "events")


def row_values(
    first: TraceEvent, base: int, last: int, stored: str | bytes | bytearray
) -> tuple[Any, ...]:
    """The ``rq_trace`` row of a pack whose first event is ``first``, HLCs ``base`` to
    ``last`` and ``events`` ``stored``: its values in ``PACK_COLUMNS`` order. The one place
    a pack row's values are taken from its events (``opened_row``, ``opened_values``, and a
    lifecycle event's format 4 pack in a lease's or ack's many-row insert)."""
    return (
        first.trace_id,
        first.job_id,
        first.attempt,
        first.worker_id,
        base,
        last,
        first.ts,
        stored,
    )


def row_dict(
    first: TraceEvent, base: int, last: int, stored: str | bytes | bytearray
) -> dict[str, Any]:
    """``row_values`` as a dictionary keyed by ``PACK_COLUMNS``."""
    return {
        "trace_id": first.trace_id,
        "job_id": first.job_id,
        "attempt": first.attempt,
        "worker_id": first.worker_id,
        "hlc": base,
        "hlc_last": last,
        "ts": first.ts,
        "events": stored,
    }


def pack_resources(events: Sequence[TraceEvent], pack_id: int) -> list[dict[str, Any]]:
    """The ``rq_trace_resources`` entries of a pack: each resource once, at its first HLC."""
    if len(events) == 1:  # a lifecycle event's pack (two a job): it names no resource
        only = events[0]
        if only.resource is None:
            return []
        return [{"resource": only.resource, "hlc": only.hlc, "pack_id": pack_id}]
    first: dict[str, int] = {}
    for event in events:
        if event.resource is not None and (
            event.resource not in first or event.hlc < first[event.resource]
        ):
            first[event.resource] = event.hlc
    return [
        {"resource": resource, "hlc": hlc, "pack_id": pack_id} for resource, hlc in first.items()
    ]


class Item(msgspec.Struct, gc=False, kw_only=True):
    """One pack item as ``unpack`` reads it: the keys ``_packed_items`` writes, each at what
    its absence means (``h`` and ``dt`` ``UNSET``: no offset, ``x`` false, the others
    ``None``).

    Decoded straight from the pack's JSON (``_ITEMS``): msgspec fills the fields in C, no
    dictionary per item that ``unpack`` then looks each key up in (with the deflated bytes
    decoded as they are, ~135 K instructions fewer of a bulk dry-run's ~2.3 M). Its values
    are typed ``Any``: they are what ``codec.loads`` decodes (the same decoder), whatever
    the pack holds; keys no field names are ignored, as ``unpack`` ignored them in a
    dictionary; the last of duplicate keys wins, as it did.
    Not tracked by the garbage collector (``gc=False``): decoded JSON holds no cycles.

    Its fields are in the order of the keys in a stored item (sorted: ``codec``'s
    canonical text), so that msgspec finds each key at the field it expects next instead
    of searching the fields for it (~30 K instructions a dry-run); ``kw_only`` lets the
    one required field, ``n``, stand in that order."""

    d: Any = None
    dt: Any = msgspec.UNSET
    h: Any = msgspec.UNSET
    i: Any = None
    k: Any = None
    n: Any
    o: Any = None
    q: Any = None
    r: Any = None
    s: Any = None
    st: Any = None
    v: Any = None
    x: Any = False


_ITEMS = msgspec.json.Decoder(list[Item]).decode


def _lifecycle(code: int, values_text: bytes) -> list[Item]:
    """The one item of a format 3 or 4 pack (``lifecycle_item``: no JSON text made for it
    and decoded again)."""
    found = lifecycle_item(code, values_text)
    return [Item(n=found["n"], st=found.get("st"), k=found["k"], d=found["d"])]


def items(stored: str | bytes | None, dictionaries: PackDictionaries | None = None) -> list[Item]:
    """A pack's items, whichever format it was written in: the values
    ``codec.loads(pack_json(stored))`` decodes, each as an ``Item``.

    A deflated pack's bytes are decoded as they come out of ``zlib`` (no ``str`` made of
    them first). What msgspec refuses (``NaN``, ``1e400``, a lone surrogate: see
    ``codec.loads``) or an item it cannot read as an ``Item`` is decoded the way it was
    before, through ``pack_json`` and ``codec.loads``, and then made ``Item`` s: the same
    values, or an error (``ValueError``) where they are not a list of objects that name
    their event (tests/unit/test_packs.py compares this with the dictionary decode)."""
    raw: str | bytes | None = stored
    if stored is not None and not isinstance(stored, str):
        mark = stored[:1]
        if mark == LIFECYCLE_MARK and len(stored) > 1:
            return _lifecycle(stored[1], stored[2:])
        if mark == ENQUEUED_MARK:
            return _lifecycle(0, stored[1:])
        raw = _inflated(stored, dictionaries)
    if raw is not None:
        try:
            return _ITEMS(raw)
        except msgspec.DecodeError:  # ``ValidationError`` included
            pass
    return msgspec.convert(codec.loads(pack_json(stored, dictionaries)), list[Item])


def unpack(
    row: Mapping[str, Any], dictionaries: PackDictionaries | None = None
) -> list[TraceEvent]:
    """The events of one ``rq_trace`` row, in the order they were appended.

    Each event's fields are a copy of the pack's template (its group's fields, the
    row's ``hlc`` and ``ts``, the other fields at their defaults, in the order a dict
    display named them) with only the fields its ``Item`` holds set on it: a copy of an
    18-key dict is one ``memcpy``, where a display inserts every key (~2.8 k instructions
    an event more, ~37 events a dry-run reads).
    """
    base, base_ts = row["hlc"], row["ts"]
    copy = {
        "trace_id": row["trace_id"],
        "job_id": row["job_id"],
        "attempt": row["attempt"],
        "worker_id": row["worker_id"],
        "name": None,
        "ts": base_ts + 0.0,  # a float, as ``base_ts + dt / 1e6`` is
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
        "data": None,
        "id": None,
    }.copy
    event_id = row["id"] * PACK_SIZE
    new, cls, unset = object.__new__, TraceEvent, msgspec.UNSET
    out: list[TraceEvent] = []
    append = out.append
    for item in items(row["events"], dictionaries):
        fields = copy()
        fields["name"] = item.n
        fields["id"] = event_id
        event_id += 1
        fields["data"] = item.d or {}
        # Only what the item holds (``_packed_items`` leaves out what is at its default;
        # a ``null`` is the default of the fields that default to ``None``).
        if item.h is not unset:
            fields["hlc"] = base + item.h
        if item.dt is not unset:
            fields["ts"] = base_ts + item.dt / 1e6
        if item.q is not None:
            fields["seq"] = item.q
        if item.s is not None:
            fields["step"] = item.s
        if item.st is not None:
            fields["status"] = item.st
        if item.r is not None:
            fields["resource"] = item.r
        if item.v is not None:
            fields["resource_version"] = item.v
        if item.i is not None:
            fields["input_ref"] = item.i
        if item.o is not None:
            fields["output_ref"] = item.o
        if item.k:  # absent, ``null`` or empty: "domain"
            fields["kind"] = item.k
        if item.x:
            fields["side_effect"] = True
        event = new(cls)  # ``TraceEvent.built`` inlined: every field named
        set_event_dict(event, fields)
        append(event)
    return out


def unpack_sorted(
    rows: Sequence[Mapping[str, Any]], dictionaries: PackDictionaries | None = None
) -> list[TraceEvent]:
    """The events of ``rows`` in trace order: by HLC, then by id (commit order)."""
    events = [event for row in rows for event in unpack(row, dictionaries)]
    events.sort(key=lambda e: (e.hlc, e.id))
    return events
