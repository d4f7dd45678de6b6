"""JSON in and out. replayq stores JSON only — never pickle — in one canonical form."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import chain
from json import encoder as json_encoder
from typing import Any

import msgspec

from replayq.errors import PayloadError

try:  # the [fast] extra: the same text, encoded ~6x faster (``_fast_text``)
    import orjson
except ImportError:  # pragma: no cover - exercised by tests that hide it
    orjson = None  # type: ignore[assignment]

# Deeper than any real payload; well inside Python's recursion limit for the walk below.
MAX_DEPTH = 200


def _check_text(text: str, path: str) -> None:
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"{path}: {text[exc.start : exc.end]!r} at {exc.start} is a lone surrogate, "
                "not a character; it cannot be stored as UTF-8"
            ) from None


def _check(value: Any, path: str, depth: int = 0) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        _check_text(value, path)
        return
    if depth > MAX_DEPTH:
        shown = path if len(path) <= 80 else path[:80] + "…"
        raise PayloadError(f"{shown}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path}: {value!r} is not valid JSON (NaN and infinity are not)")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path}: object key {key!r} is not a string")
            _check_text(key, f"{path} key")
            _check(item, f"{path}.{key}", depth + 1)
        return
    raise PayloadError(f"{path}: {type(value).__name__} is not JSON-serialisable")


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (no lone surrogates); ASCII needs no encode."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# One encoder, built once: json.dumps with non-default options builds a new one per call.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _c_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode`` as the C encoder it builds on every call, built once.

    ``JSONEncoder.encode`` makes a new C encoder (and a dict of the containers seen, for
    cycles) per call, about a microsecond: a cost paid per payload and per trace pack.
    This one keeps no such dict: a cycle is a ``RecursionError`` instead, which
    ``dumps`` never meets (its shape walk refuses values that deep) and ``dumps_own``
    hands to ``dumps``. The same options, so the same text.
    """
    # Not in the typeshed stubs: the C accelerators json.encoder imports from _json.
    make = getattr(json_encoder, "c_make_encoder", None)
    quote = getattr(json_encoder, "c_encode_basestring", None)
    if make is None or quote is None:  # pragma: no cover - Python without _json
        return _ENCODER.encode
    iterencode = make(None, _ENCODER.default, quote, None, ":", ",", True, False, False)

    def encode(value: Any) -> str:
        return "".join(iterencode(value, 0))

    return encode


_encode = _c_encoder()


# Types the shape walk (``_shape_valid``) passes without a look: the encoder checks them.
_LEAVES = frozenset((str, int, float, bool, type(None)))


_KEYS = frozenset((str,))


def _shape_valid(value: Any, depth: int = 0) -> bool:
    """What the encoder does not check of a JSON value: every object key a string (it
    would turn ``1`` into ``"1"``), at most ``MAX_DEPTH`` deep. Only containers are
    visited; leaves (finite floats, UTF-8 text, JSON types) are the encoder's and the
    text's to check (``dumps``). A container holding only leaves under plain ``str`` keys
    (most objects: a call's response lines, a state's fields) is judged by two C-level
    passes over its types, with no Python call per item."""
    if depth > MAX_DEPTH:
        return False
    if type(value) is dict or isinstance(value, dict):
        if not _KEYS.issuperset(map(type, value)):
            for key in value:
                if type(key) is not str and not isinstance(key, str):
                    return False
        items: Any = value.values()
    else:
        items = value
    if _LEAVES.issuperset(map(type, items)):
        return True
    for item in items:
        kind = type(item)
        if kind in _LEAVES:
            continue
        if (
            kind is dict
            and depth < MAX_DEPTH
            and _KEYS.issuperset(map(type, item))
            and _LEAVES.issuperset(map(type, item.values()))
        ):
            continue  # a flat object one level down: no call of its own
        container = kind is dict or kind is list or kind is tuple
        if (container or isinstance(item, dict | list | tuple)) and not _shape_valid(
            item, depth + 1
        ):
            return False
    return True


# orjson's options for the canonical form: sorted keys (orjson's output is compact and
# UTF-8 already); dataclasses, datetimes and subclasses of str, int, dict and list are
# handed to the (absent) default, i.e. refused, so that the standard encoder, which
# writes or refuses them its own way, decides.
_FAST_OPTIONS = (
    0
    if orjson is None
    else orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
# Where orjson's text differs from the standard encoder's: a float of magnitude below 1e-4
# (orjson ``0.00001`` and ``2.5e-7``, Python ``1e-05`` and ``2.5e-07``; every other finite
# float has the same shortest digits in the same notation), and NaN or infinity (orjson
# writes ``null``, the standard encoder refuses them). A text that may hold the first
# (the pattern, even inside a string) takes the standard path: it costs time, never a
# different byte.
_TINY_FLOAT = re.compile(rb"[0-9]e-|0\.0000")
# The exact types ``_plain`` lets through to orjson (``bool`` included: an exact type).
_PLAIN_LEAVES = frozenset((str, int, float, bool, type(None)))
_DICT = frozenset((dict,))


def _plain(value: Any) -> bool:
    """Whether ``value`` is made of exact JSON types only (``dict``, ``list``, ``tuple``,
    ``str``, ``int``, ``float``, ``bool``, ``None``), at most ``MAX_DEPTH`` deep: a value
    whose text orjson writes as the standard encoder does (floats aside: ``_fast_text``).
    Anything else (a subclass, a UUID, an enum member) goes to the standard path, which
    writes or refuses it as it always did. Containers are judged by C-level passes over
    their types, as in ``_shape_valid``.

    Object keys are not looked at: orjson refuses every key that is not exactly a ``str``
    (a subclass, a number: ``Dict key must be str``, tests/unit/test_codec_orjson.py), and
    ``_fast_text`` then hands the value to the standard path, as a ``False`` here did."""
    return _plain_keys(value, set())


def _plain_keys(value: Any, keys: set[Any], depth: int = 0) -> bool:
    """``_plain``'s walk, adding the keys of every object in ``value`` to ``keys`` on the way:
    when it answers ``True`` (every container exactly a ``dict``, ``list`` or ``tuple``),
    ``keys`` holds what ``redaction.keys_of`` finds, without a second walk of the value
    (``dumps_keyed``). On ``False`` ``keys`` is partial and means nothing."""
    if depth > MAX_DEPTH:
        return False
    kind = type(value)
    if kind is dict:
        keys.update(value)
        items: Any = value.values()
    elif kind is list or kind is tuple:
        items = value
    else:
        return kind in _PLAIN_LEAVES
    if _PLAIN_LEAVES.issuperset(map(type, items)):
        return True
    if depth < MAX_DEPTH and _DICT.issuperset(map(type, items)):
        keys.update(*items)  # flat objects (a response's lines): their keys in one pass
        if _PLAIN_LEAVES.issuperset(map(type, chain.from_iterable(map(dict.values, items)))):
            return True
    for item in items:
        kind = type(item)
        if kind in _PLAIN_LEAVES:
            continue
        if (
            kind is dict
            and depth < MAX_DEPTH
            and _PLAIN_LEAVES.issuperset(map(type, item.values()))
        ):
            keys.update(item)
            continue  # a flat object one level down: no call of its own
        if not _plain_keys(item, keys, depth + 1):
            return False
    return True


def _fast_text(value: Any) -> str | None:
    """``value``'s canonical text by orjson, byte for byte the standard encoder's, or
    ``None`` for the standard path: without the [fast] extra, for a value that is not a
    container (the standard encoder is as quick for a scalar), where orjson refuses the
    value (a lone surrogate, an integer beyond 64 bits, a type it hands to ``default``)
    and where the text may hold a float below 1e-4 (``_TINY_FLOAT``).

    NaN and infinity are written ``null``: ``dumps`` checks for them, ``dumps_own``'s
    caller vouches that there are none."""
    kind = type(value)
    if orjson is None or not (kind is dict or kind is list or kind is tuple):
        return None
    try:
        raw = orjson.dumps(value, option=_FAST_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError
        return None
    # Asked of the text, not the bytes: ``str in str`` is a slot call, where
    # ``bytes.find`` parses its arguments (~1,000 instructions a search: two a value, ~7
    # values a traced job) and ``bytes in bytes`` first tries its operand as an integer
    # (a byte value), formatting and clearing a TypeError (~2,500). The two are ASCII: in
    # UTF-8 text they are where they are in its bytes.
    text = raw.decode()
    if ("e-" in text or "0.0000" in text) and _TINY_FLOAT.search(raw):
        return None
    return text


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode canonically (sorted keys, no spaces); ``PayloadError`` names the bad path.

    The checks of ``_check`` without a Python call per leaf: the containers are walked
    for their keys and depth (``_shape_valid``), the C encoder refuses NaN, infinity and
    non-JSON types, and the text (not each string in the value) is checked for lone
    surrogates. ``_check`` walks the value only to name the problem it has.

    With the [fast] extra, a value of exact JSON types (``_plain``) is encoded by orjson
    (``_fast_text``): the same bytes, so fingerprints and stored texts do not change. Its
    ``null`` may be a NaN or an infinity, which orjson does not refuse: a text with a
    ``null`` takes the standard path, which does.
    """
    if orjson is not None and _plain(value):
        text = _fast_text(value)
        if text is not None and "null" not in text:
            return text
    return _dumps_standard(value, what)


def dumps_keyed(value: Any, *, what: str = "value") -> tuple[str, set[Any] | None]:
    """``dumps`` and the keys of every object in ``value`` (``redaction.keys_of``'s set),
    found by the walk that judges the value for orjson (``_plain_keys``) instead of a walk
    of their own; ``None`` for the keys where that walk cannot tell them (a container
    that is not exactly a ``dict``, ``list`` or ``tuple``, no [fast] extra): the caller
    then finds them its own way. The text is ``dumps``'s, byte for byte."""
    if orjson is None:
        return dumps(value, what=what), None
    keys: set[Any] = set()
    if not _plain_keys(value, keys):
        return _dumps_standard(value, what), None
    text = _fast_text(value)
    if text is not None and "null" not in text:
        return text, keys
    return _dumps_standard(value, what), keys


def _dumps_standard(value: Any, what: str) -> str:
    """``dumps`` by the standard encoder, with the checks orjson's path does not need."""
    kind = type(value)
    if (
        kind is dict or kind is list or kind is tuple or isinstance(value, dict | list | tuple)
    ) and (not _shape_valid(value)):
        _check(value, what)
    try:
        text = _encode(value)
    except (TypeError, ValueError, RecursionError):
        _check(value, what)
        raise
    if not text.isascii() and not _utf8(text):
        _check(value, what)
    return text


def dumps_own(value: Any, *, what: str = "value") -> str:
    """``dumps`` without the validation walk, for values replayq built itself.

    For lifecycle event data and for domain event data whose user values the
    recording context already checked once (``Context.encoded``): a value is
    walked once, not again each time it is written. The encoder still
    refuses NaN, infinity and non-JSON types; those fall back to ``dumps`` for
    its ``PayloadError`` naming the path. What it cannot catch is a non-string
    key (json would coerce it), so the caller vouches for the keys. With the [fast]
    extra orjson encodes it (``_fast_text``: the same text) unless it holds what orjson
    hands back (subclasses, datetimes, dataclasses, a lone surrogate, big integers) or
    writes differently (tiny floats). What orjson does not refuse where the standard
    encoder does: NaN and infinity (written ``null``), a UUID and an enum member that is
    not an ``int`` or ``str``. The caller vouches that there are none, as for the keys:
    user values here were checked by ``dumps`` when recorded, and replayq's own floats
    are times and durations.
    """
    text = _fast_text(value)
    if text is not None:
        return text
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError):
        return dumps(value, what=what)


def dumps_stored(value: Any, *, what: str = "value") -> str:
    """``dumps_own`` for a text that is only ever decoded, never compared or hashed as
    text: a trace pack's item (``storage/packs.py``).

    With the [fast] extra, orjson's text as it writes it, tiny floats included: it writes
    a float below 1e-4 in its own notation (``7.2e-5``, ``0.00001``), which decodes to the
    same float as the standard encoder's ``7.2e-05``. ``dumps_own`` encodes such a value
    a second time to get the standard text, which every ``step.finished`` of a step
    faster than 100 µs (``duration``) paid: about half of the encoding of a dry-run's
    derived trace. The caller vouches for the value as for ``dumps_own``.
    """
    text = stored_text(value) if type(value) is dict else None
    return text if text is not None else dumps_own(value, what=what)


def stored_text(value: Any) -> str | None:
    """``dumps_stored``'s text of a container by orjson, or ``None`` where orjson refuses
    it or is absent (the caller then takes ``dumps_stored``'s path for a name to blame)."""
    data = stored_bytes(value)
    return None if data is None else data.decode()


def stored_bytes(value: Any) -> bytes | None:
    """``stored_text`` as UTF-8 bytes, as orjson gives them (no ``str`` made and encoded
    again): a SQLite trace pack of one lifecycle event (``storage/lifecycle_packs.py``,
    format 4)."""
    if orjson is None:
        return None
    try:
        return orjson.dumps(value, option=_FAST_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError
        return None


# msgspec's JSON decoder (``loads``): a core dependency, in C.
_FAST_DECODE = msgspec.json.Decoder().decode


def loads(text: str | bytes | None) -> Any:
    """Decode JSON text; ``None`` stays ``None``; the value ``json.loads`` gives.

    msgspec's decoder first: it gives the same values as ``json.loads`` (integers of any
    size since msgspec 0.19, floats correctly rounded, the last of duplicate keys) in
    about a third of the time (a kept dry-run reads its recording's packs, states and
    responses: ~5 % of its instructions). What it refuses and ``json.loads`` reads
    (``NaN``, ``Infinity``, ``1e400``, a lone surrogate, bytes not in UTF-8) and every
    error go to ``json.loads`` (tests/unit/test_codec_loads.py compares the two).
    """
    if text is None:
        return None
    try:
        return _FAST_DECODE(text)
    except (msgspec.DecodeError, UnicodeError):  # the latter: a lone surrogate, as text or bytes
        return json.loads(text)


def fingerprint(value: Any) -> str:
    """A short, stable hash of a JSON value, for comparing arguments across runs."""
    return fingerprint_text(dumps(value))


def fingerprint_text(text: str) -> str:
    """``fingerprint`` of a value already encoded by ``dumps`` (the text is not encoded again)."""
    import hashlib  # here: a worker whose jobs record no calls or steps never needs it

    return hashlib.sha256(text.encode()).hexdigest()[:16]
