"""Learned pack dictionaries: SQLite trace packs deflated against the application's own names.

A format 2 pack (``packs.py``) deflates against ``DICTIONARY_2``: replayq's keys, event
names and lifecycle data, frozen with the format. What it cannot hold is what each
application names itself: its steps, calls, effect kinds, resource namespaces and the keys
of its requests and answers. Each traced job pays for those again in every pack.

A dictionary is learned per job type from two succeeded jobs of that type (at the first
attempt a worker starts after their acks, once per job type and process; never in an
ack's transaction) and kept in ``rq_pack_dictionaries``; later
packs of that type's attempts are format 5: ``b"\\x05"``, the dictionary's id (one byte
below 128, ``_id_bytes``), and the pack's JSON deflated as format 2 is, against
``DICTIONARY_2`` followed by the learned text. Every process reads the same row for a
job type: the first learned wins (``UNIQUE (job_type)``), and a process that did not learn
it reads it there.

What a learned text holds (``shape``): the attempt's pack items with their names kept and
every value the application gave replaced by a placeholder — event, step, call and effect
kind names, states and error classes, object keys that are identifiers, a resource's or
reference's namespace (``order:`` of ``order:42``, ``blob:sha256:`` of a reference);
never a payload's, argument's, answer's or key's value, an owner token or a digest — and
of those names only the ones both jobs' traces hold (a step named ``f"line {sku}"`` is
one job's value, not a name). So a dictionary holds what the code names, nothing a job was
given: gc deleting a job's trace leaves no value of it behind. It is made from the stored
trace, after redaction (docs/secrets.md): it never holds what the trace did not.

A dictionary is never deleted or changed (packs name it by id): one row of at most
``_TEXT_MAX`` bytes per job type. A handler whose names change keeps the dictionary first
learned; its packs then compress as format 2 would, a little better or worse, and decode
the same.

Decoding needs the dictionary: ``PackDictionaries.zdict`` keeps those it has seen and
reads one it has not from the database file on a connection of its own (a pack written by
another process after this one loaded its dictionaries; the SQL function ``rq_pack_json``
cannot read the connection it runs on).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from replayq import codec

FORMAT_LEARNED = 5
LEARNED_MARK = bytes([FORMAT_LEARNED])

# The learned text's size at most: with ``DICTIONARY_2`` (~3.4 KB) the whole preset stays
# within the 8 KB window the packs deflate with, the learned part (last: shortest
# distances) in reach of a pack's first ~4 KB of JSON.
_TEXT_MAX = 3072
# Item keys (``packs._KEYS``) whose values are names the code gives, kept as they are.
_NAMES = frozenset({"n", "s", "k", "q", "h", "dt", "x", "v"})
# An event's status (``st``) kept when it is a word as replayq writes one (``started``,
# ``success``, ``fail``): an application's event may give any string as its status.
_STATUS = re.compile(r"[a-z_]{1,24}")
# Keys of replayq's own event data whose string values are names the code gives: a step's
# name, a call's, an effect's kind, a branch, a child job's type, an outbox topic, an
# error class, a handler version. Every other string is the application's value.
# Only in replayq's own events, by the prefix of their names: an application's event
# (``ctx.record("customer.noted", kind=email)``) is given its keys by the application,
# whose values are its own.
_DATA_NAMES: dict[str, tuple[str, ...]] = {
    "step_name": ("step.",),
    "call": ("call",),
    "kind": ("effect.",),
    "branch": ("state.",),
    "child_type": ("child.enqueued",),
    "topic": ("outbox.",),
    "error_class": ("call", "effect.", "step."),
}
_BLOB_PREFIX = "blob:sha256:"
# Item keys whose values keep only their namespace (``order:`` of ``order:42``).
_NAMESPACED = frozenset({"r", "i", "o"})
# An object key kept in a learned text: a name as code writes one. A key outside it
# (an e-mail address keying a map) is dropped with its value, and so is one with four
# digits or more, which is a value in the shape of a name more often than a name: an
# IBAN, an account or order number, a date keying a map (``acct_20261206``). A key of
# the application's that is neither (a random token of letters) is kept: the limit.
_IDENTIFIER = re.compile(r"(?!(?:[^0-9]*[0-9]){4})[A-Za-z_][A-Za-z0-9_.-]{0,40}")
_DEPTH_MAX = 6
# Tries a process makes at learning a job type's dictionary (``PackDictionaries.failed``).
_TRIES = 3


def _namespace(value: Any) -> Any:
    """``value``'s namespace: up to its first ``:`` (``order:`` of ``order:42``; a blob
    reference's ``blob:sha256:``), else ``""``. Only the first: a key may hold ``:`` itself
    (``session:mia@example.com:inbox``), and what follows the namespace is the key's."""
    if not isinstance(value, str):
        return 0 if isinstance(value, int | float) and not isinstance(value, bool) else None
    if value.startswith(_BLOB_PREFIX):
        return _BLOB_PREFIX
    cut = value.find(":")
    return value[: cut + 1] if cut > 0 else ""


def _named(event_name: Any, key: str) -> bool:
    """Whether ``key`` of the data of the event named ``event_name`` is a name the code
    gives (``_DATA_NAMES``): only in replayq's own events (a prefix ending in ``.`` is
    a family of names, another one name and its ``.``-suffixed kin: ``call.failed``)."""
    if not isinstance(event_name, str):
        return False
    for prefix in _DATA_NAMES.get(key, ()):
        if prefix.endswith("."):
            if event_name.startswith(prefix):
                return True
        elif event_name == prefix or event_name.startswith(prefix + "."):
            return True
    return False


def _placeholder(value: Any, depth: int, event_name: Any = None) -> Any:
    """``value`` with the application's values replaced: strings ``""`` (a name of
    replayq's own event kept, ``_named``), numbers ``0``, booleans ``false``, ``null``
    kept, an object's identifier keys kept with their values replaced, a list as its first
    item's placeholder."""
    if isinstance(value, str):
        return ""
    if isinstance(value, bool):
        return False  # a yes or no about the job is its value too
    if value is None:
        return None
    if isinstance(value, int | float):
        return 0
    if depth >= _DEPTH_MAX:
        return None
    if isinstance(value, dict):
        return {
            key: item
            if depth == 0 and isinstance(item, str) and _named(event_name, key)
            else _placeholder(item, depth + 1)
            for key, item in value.items()
            if isinstance(key, str) and _IDENTIFIER.fullmatch(key)
        }
    if isinstance(value, list | tuple):
        return [_placeholder(value[0], depth + 1)] if value else []
    return None


def _shaped(item: dict[str, Any]) -> dict[str, Any]:
    """One pack item with its names kept and the application's values replaced."""
    shaped: dict[str, Any] = {}
    for key, value in item.items():
        if key in _NAMES:
            shaped[key] = value
        elif key == "st":
            shaped[key] = value if isinstance(value, str) and _STATUS.fullmatch(value) else ""
        elif key in _NAMESPACED:
            shaped[key] = _namespace(value)
        elif key == "d":
            shaped[key] = _placeholder(value, 0, item.get("n"))
    return shaped


def _strings(value: Any, into: set[str]) -> None:
    """Every string ``value`` holds, object keys included, added to ``into``."""
    if isinstance(value, str):
        into.add(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            into.add(key)
            _strings(item, into)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)


def _agreed(value: Any, names: set[str]) -> Any:
    """``value`` with each string ``names`` lacks replaced by ``""`` and each object key it
    lacks dropped with its value."""
    if isinstance(value, str):
        return value if value in names else ""
    if isinstance(value, dict):
        return {key: _agreed(item, names) for key, item in value.items() if key in names}
    if isinstance(value, list):
        return [_agreed(item, names) for item in value]
    return value


def shape(
    items: Iterable[dict[str, Any]], agreeing: Iterable[dict[str, Any]] | None = None
) -> bytes:
    """A learned text from pack items (``packs._packed_items``' dictionaries): each item's
    names kept and every value of the application's replaced (see the module's
    docstring), and of those names only the ones another job's items (``agreeing``) hold
    too: a name made of one job's values (a step ``f"line {sku}"``, a resource namespace
    ``customer:<e-mail>:``) differs between two jobs and is not kept. Comma-joined as a
    pack joins items; the last items dropped past ``_TEXT_MAX`` bytes."""
    names: set[str] | None = None
    if agreeing is not None:
        names = {""}
        for other in agreeing:
            _strings(_shaped(other), names)
    pieces: list[bytes] = []
    size = 0
    for item in items:
        shaped = _shaped(item) if names is None else _agreed(_shaped(item), names)
        text = codec.dumps_stored(shaped, what="learned pack dictionary").encode()
        if size + len(text) + 1 > _TEXT_MAX:
            break
        pieces.append(text)
        size += len(text) + 1
    return b",".join(pieces)


def id_bytes(dictionary_id: int) -> bytes:
    """A format 5 pack's dictionary id after its mark: unsigned LEB128 (one byte below 128)."""
    out = bytearray()
    while True:
        low = dictionary_id & 0x7F
        dictionary_id >>= 7
        if dictionary_id:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def read_id(stored: bytes | bytearray | memoryview) -> tuple[int, int]:
    """A format 5 pack's dictionary id and where its deflate stream starts (after the mark)."""
    value = shift = 0
    at = 1
    while True:
        if at >= len(stored):
            raise ValueError("trace pack of format 5 ends inside its dictionary id")
        byte = stored[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


# What reads a dictionary this process has not seen: ``(id) -> learned text or None``.
Loader = Callable[[int], "bytes | None"]


class PackDictionaries:
    """The learned dictionaries of one database, as one process knows them.

    ``zdict(id)``: the preset of a format 5 pack (``DICTIONARY_2`` + the learned text), read
    through ``loader`` the first time. ``for_job(job_id)``: the id a new pack of that job's
    running attempt deflates against (``attempt``), ``None`` until its type's is learned
    or read (``learned``). ``primed(id, prime)``: the deflate stream ``packs`` primes with
    that preset, made once (each pack copies it, as format 2's copy ``packs._PRIMED``).
    """

    def __init__(self, base: bytes, loader: Loader | None = None) -> None:
        self._base = base
        self._loader = loader
        self._zdicts: dict[int, bytes] = {}
        self._primed: dict[int, Any] = {}
        self._by_type: dict[str, int] = {}
        # Job types whose row this process read (``unread``); per job type, the first
        # success (``succeeded``), the types whose second one was, the two jobs to learn
        # from at the next attempt's start (``due``), and the tries that failed.
        self._read: set[str] = set()
        self._first: dict[str, int] = {}
        self._done: set[str] = set()
        self._due: dict[str, tuple[int, int]] = {}
        self._failures: dict[str, int] = {}
        # Job id -> dictionary id of the attempts running in this process whose type has
        # one: what a new pack of theirs deflates against (``for_job``).
        self._jobs: dict[int, int] = {}
        self._lock = threading.Lock()

    def zdict(self, dictionary_id: int) -> bytes:
        found = self._zdicts.get(dictionary_id)
        if found is not None:
            return found
        text = self._loader(dictionary_id) if self._loader is not None else None
        if text is None:
            raise ValueError(
                f"trace pack deflated against learned dictionary {dictionary_id}, which "
                "this database does not hold (rq_pack_dictionaries)"
            )
        return self.known(dictionary_id, text)

    def known(self, dictionary_id: int, text: bytes) -> bytes:
        """Note dictionary ``dictionary_id``'s learned ``text``; its whole preset."""
        whole = self._base + bytes(text)
        with self._lock:
            return self._zdicts.setdefault(dictionary_id, whole)

    def primed(self, dictionary_id: int, prime: Callable[[bytes], Any]) -> Any:
        """``prime(preset)`` of dictionary ``dictionary_id`` (a deflate stream primed with
        it, in ``packs``' settings), made once: the caller copies it for each pack."""
        primed = self._primed.get(dictionary_id)
        if primed is None:
            primed = self._primed[dictionary_id] = prime(self.zdict(dictionary_id))
        return primed

    # -- which packs use one -----------------------------------------------------------------

    def unread(self, job_type: str) -> bool:
        """Whether ``job_type``'s row is to be read now: the first attempt of a type this
        process knows no dictionary of (then never again)."""
        if job_type in self._by_type or job_type in self._read:
            return False
        with self._lock:
            if job_type in self._read:
                return False
            self._read.add(job_type)
            return True

    def succeeded(self, job_type: str, job_id: int) -> None:
        """A success of ``job_type`` (job ``job_id``) acked in this process (memory only:
        the ack's transaction is the ack's alone). At the second, of another job, while no
        dictionary of the type is known here, the two are due (``due``)."""
        if job_type in self._by_type or job_type in self._done:
            return
        with self._lock:
            first = self._first.setdefault(job_type, job_id)
            if first != job_id and job_type not in self._done:
                self._done.add(job_type)
                self._due[job_type] = (job_id, first)

    def due(self, job_type: str) -> tuple[int, int] | None:
        """At an attempt's start: the two succeeded jobs of ``job_type`` to learn its
        dictionary from (``shape``'s ``agreeing``), once; ``None`` if there are none."""
        if not self._due:
            return None
        with self._lock:
            return self._due.pop(job_type, None)

    def failed(self, job_type: str, jobs: tuple[int, int]) -> None:
        """Learning ``job_type``'s dictionary from ``jobs`` failed (the database busy or
        away): due again at a later attempt's start, ``_TRIES`` tries in all."""
        with self._lock:
            self._failures[job_type] = tries = self._failures.get(job_type, 0) + 1
            if tries < _TRIES:
                self._due[job_type] = jobs

    def postponed(self, job_type: str, jobs: tuple[int, int]) -> None:
        """Learning ``job_type``'s dictionary from ``jobs`` did not start (the write lock
        was held): due again at a later attempt's start, not counted as a try."""
        with self._lock:
            self._due[job_type] = jobs

    def learned(self, job_type: str, dictionary_id: int, text: bytes) -> None:
        """``job_type``'s dictionary is ``dictionary_id`` (learned here or read)."""
        self.known(dictionary_id, text)
        self._by_type[job_type] = dictionary_id

    def attempt(self, job_id: int, job_type: str) -> None:
        """An attempt of job ``job_id`` starts here: its new packs use its type's dictionary."""
        dictionary_id = self._by_type.get(job_type)
        if dictionary_id is not None:
            if len(self._jobs) >= 4096:  # ended attempts are not told: bounded instead
                self._jobs.clear()
            self._jobs[job_id] = dictionary_id

    def for_job(self, job_id: int | None) -> int | None:
        """The dictionary a new pack of job ``job_id``'s attempt deflates against, if any."""
        return None if job_id is None else self._jobs.get(job_id)
