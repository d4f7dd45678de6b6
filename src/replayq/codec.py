"""JSON in and out. replayq stores JSON only — never pickle — in one canonical form."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from json import encoder as json_encoder
from typing import Any

from replayq.errors import PayloadError

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


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode canonically (sorted keys, no spaces); ``PayloadError`` names the bad path.

    The checks of ``_check`` without a Python call per leaf: the containers are walked
    for their keys and depth (``_shape_valid``), the C encoder refuses NaN, infinity and
    non-JSON types, and the text (not each string in the value) is checked for lone
    surrogates. ``_check`` walks the value only to name the problem it has.
    """
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
    key (json would coerce it), so the caller vouches for the keys.
    """
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError):
        return dumps(value, what=what)


_DECODER = json.JSONDecoder()


def loads(text: str | bytes | None) -> Any:
    """Decode JSON text; ``None`` stays ``None``.

    Text this module wrote has no surrounding whitespace, so it is decoded directly
    (``raw_decode``: no two whitespace scans per call, as ``json.loads`` makes); any
    other text, and every error, goes through ``json.loads``.
    """
    if text is None:
        return None
    if type(text) is str:
        try:
            value, end = _DECODER.raw_decode(text)
        except ValueError:
            return json.loads(text)
        if end == len(text):
            return value
    return json.loads(text)


def fingerprint(value: Any) -> str:
    """A short, stable hash of a JSON value, for comparing arguments across runs."""
    return fingerprint_text(dumps(value))


def fingerprint_text(text: str) -> str:
    """``fingerprint`` of a value already encoded by ``dumps`` (the text is not encoded again)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
