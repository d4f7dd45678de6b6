"""Secrets redaction: what is replaced before a value is stored, and by what.

A ``Redaction`` names what is secret: field names (exact, any case, ``-``/``_``
ignored, or ``fnmatch`` globs such as ``*_secret``) and value patterns (regular
expressions; with a group, only the first group is secret). The defaults cover
``Authorization``/``Cookie`` headers, passwords, API keys, access tokens, client
secrets, private keys, card numbers and CVVs, ``Bearer``/``Basic`` credentials,
passwords in URLs and card numbers (Luhn-checked) anywhere in a text.

A ``Redactor`` applies it. A secret becomes a marker: ``[redacted:<16 hex>]``,
the first 16 hex digits of an HMAC-SHA256 of the secret under a key that lives
outside the database (``REPLAYQ_REDACTION_KEY``, or the file named by
``REPLAYQ_REDACTION_KEY_FILE``, or ``Redaction(key=...)``). Equal secrets get
equal markers, so a diff still says "same card" and a replay whose arguments
carry the marker (from the redacted payload) or the secret itself has the same
call fingerprint. Without a key the marker is ``[redacted]``: the secret is
still never stored, but two secrets can no longer be told apart.

Redacting is idempotent: a marker is never redacted again, so values read back
from the database (a replay, an imported case) redact to themselves.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import chain, compress
from pathlib import Path
from typing import Any

from replayq.errors import ConfigurationError

KEY_ENV = "REPLAYQ_REDACTION_KEY"
KEY_FILE_ENV = "REPLAYQ_REDACTION_KEY_FILE"

DEFAULT_FIELDS: tuple[str, ...] = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "client_secret",
    "api_key",
    "x_api_key",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "bearer_token",
    "session_token",
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "private_key",
    "card_number",
    "cvv",
    "cvc",
)

DEFAULT_PATTERNS: tuple[str, ...] = (
    # Authorization header values, wherever they appear in a text.
    r"(?i)\b(?:bearer|basic)\s+([A-Za-z0-9\-._~+/]{8,}=*)",
    # user:password@ in a URL (the user may be empty: redis://:password@host).
    r"://[^/\s:@\[\]]*:([^/\s@\[\]]+)@",
)

# 13 to 19 digits, single spaces or dashes between groups; kept only if Luhn-valid.
_CARD = re.compile(r"(?<![\w.])(?:\d[ -]?){12,18}\d(?![\w.])")
_CARD_SCREEN = (
    r"\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d[ -]?\d"
)
MARKER = re.compile(r"\[redacted(?::[0-9a-f]{16})?\]")


_URL_PASSWORD = re.compile(DEFAULT_PATTERNS[1])
# A libpq URL's password given as a query parameter (``postgresql://u@h/db?password=…``).
_QUERY_PASSWORD = re.compile(r"(?i)[?&]password=([^&#\s]+)")


def mask_url_passwords(text: str) -> str:
    """``postgresql://user:secret@host`` → ``postgresql://user:***@host``, wherever it occurs:
    the same pattern the redactor marks in traces, shown as ``***`` where no diff needs it
    (error messages, a printed ``--db``); so is a ``?password=secret`` of the URL's query."""

    def mask(found: re.Match[str]) -> str:
        whole, start = found.group(0), found.start(0)
        return whole[: found.start(1) - start] + "***" + whole[found.end(1) - start :]

    return _QUERY_PASSWORD.sub(mask, _URL_PASSWORD.sub(mask, text))


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


@dataclass(frozen=True)
class Redaction:
    """What is secret: extra field names/globs and value regexes, on top of the defaults.

    ``defaults=False`` drops the built-in names and patterns (card numbers included).
    ``key`` (text or bytes) overrides ``REPLAYQ_REDACTION_KEY``/``_FILE``; it is only
    read from the app's ``Redaction``: a job type's adds names and patterns.
    """

    fields: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    defaults: bool = True
    key: str | bytes | None = None

    def __init__(
        self,
        fields: Iterable[str] = (),
        patterns: Iterable[str] = (),
        *,
        defaults: bool = True,
        key: str | bytes | None = None,
    ) -> None:
        object.__setattr__(self, "fields", tuple(fields))
        object.__setattr__(self, "patterns", tuple(patterns))
        object.__setattr__(self, "defaults", defaults)
        object.__setattr__(self, "key", key)


def key_from_environment() -> bytes | None:
    """The HMAC key: ``$REPLAYQ_REDACTION_KEY``, else the file ``$REPLAYQ_REDACTION_KEY_FILE``."""
    text = os.environ.get(KEY_ENV)
    if text:
        return text.encode()
    path = os.environ.get(KEY_FILE_ENV)
    if not path:
        return None
    try:
        raw = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"{KEY_FILE_ENV}={path}: cannot read the redaction key ({exc.strerror})"
        ) from None
    if not raw:
        raise ConfigurationError(f"{KEY_FILE_ENV}={path}: the redaction key file is empty")
    return raw


@dataclass(frozen=True)
class Redactor:
    """Replaces secrets in JSON values and texts by keyed-hash markers (see the module)."""

    names: frozenset[str] = frozenset()
    globs: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    cards: bool = False
    key: bytes | None = None
    _seen: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    # Field names ``secret_field`` found not secret (``clean_text``'s fast path).
    _plain_keys: set[str] = field(default_factory=set, compare=False, repr=False)
    # Short texts ``short_text`` found clean (step names).
    _clean_texts: set[str] = field(default_factory=set, compare=False, repr=False)
    # Resources ``resource`` found clean (what trace events name: ``order:1``).
    _clean_resources: set[str] = field(default_factory=set, compare=False, repr=False)
    # One search that every text with a secret matches (most texts have none).
    _screen: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    # The substrings that a value's JSON text must contain to hold a secret under the
    # built-in patterns (``clean_text``); ``None`` where that cannot be promised.
    _needles: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, redaction: Redaction | None = None, *, key: bytes | None = None) -> Redactor:
        """The app's redactor: ``redaction`` (defaults when ``None``) and its key."""
        redaction = redaction or Redaction()
        if redaction.key is not None:
            key = redaction.key.encode() if isinstance(redaction.key, str) else redaction.key
        elif key is None:
            key = key_from_environment()
        return cls().extended(redaction, key=key)

    def extended(self, redaction: Redaction | None, *, key: bytes | None = None) -> Redactor:
        """This redactor plus ``redaction``'s names and patterns (a job type's own)."""
        if redaction is None:
            return self
        names = set(self.names)
        globs = list(self.globs)
        patterns = list(self.patterns)
        sources = (*DEFAULT_FIELDS, *redaction.fields) if redaction.defaults else redaction.fields
        for name in sources:
            if any(c in name for c in "*?["):
                globs.append(name.lower())
            else:
                names.add(_norm(name))
        for pattern in (
            (*DEFAULT_PATTERNS, *redaction.patterns) if redaction.defaults else (redaction.patterns)
        ):
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ConfigurationError(f"redaction pattern {pattern!r}: {exc}") from None
            if compiled not in patterns:
                patterns.append(compiled)
        cards = self.cards or redaction.defaults
        return Redactor(
            names=frozenset(names),
            globs=tuple(dict.fromkeys(globs)),
            patterns=tuple(patterns),
            cards=cards,
            key=self.key if key is None else key,
            _screen=_screen_of(patterns, cards),
            _needles=_needles_of(patterns),
        )

    @property
    def active(self) -> bool:
        return bool(self.names or self.globs or self.patterns or self.cards)

    # -- markers ----------------------------------------------------------------------------

    def marker(self, secret: str) -> str:
        """The marker that replaces ``secret`` (keyed hash, or plain without a key)."""
        if self.key is None:
            return "[redacted]"
        # Imported here: most processes never find a secret, and every start paid for them.
        import hashlib
        import hmac

        digest = hmac.new(self.key, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return f"[redacted:{digest.hexdigest()[:16]}]"

    def secret_field(self, name: str) -> bool:
        """Whether a field called ``name`` holds a secret."""
        known = self._seen.get(name)
        if known is None:
            lowered = name.lower()
            known = _norm(name) in self.names or any(
                fnmatch.fnmatchcase(lowered, glob) for glob in self.globs
            )
            if len(self._seen) < 4096:
                self._seen[name] = known
        return known

    def any_secret_field(self, names: Iterable[str]) -> bool:
        """Whether any of ``names`` is a secret field's name (``secret_field``); names
        already judged not secret cost a set comparison, not a call each."""
        plain = self._plain_keys
        if plain.issuperset(names):
            return False
        for name in names:
            if self.secret_field(name):
                return True
            self._plain_key(name)
        return False

    def _plain_key(self, name: str) -> None:
        """Remember ``name`` as a key that needs no look: not a secret field's name (the
        caller found) and, under the built-in patterns, a text ``_cannot_match`` (a key
        can hold a card number or a credential as a value can: ``_flat_clean`` skips
        the keys it finds here). At most 4,096."""
        plain = self._plain_keys
        if len(plain) < 4096 and (self._needles is None or self._cannot_match(name)):
            plain.add(name)

    # -- texts ------------------------------------------------------------------------------

    def short_text(self, text: str) -> str:
        """``text`` for a short text that recurs (a step's name): a text found clean
        before is not searched again. Only clean texts are remembered, at most 4,096."""
        if text in self._clean_texts:
            return text
        redacted = self.text(text)
        if redacted == text and len(text) <= 200 and len(self._clean_texts) < 4096:
            self._clean_texts.add(text)
        return redacted

    def resource(self, resource: str) -> str:
        """``resource``, the name a trace event gives what it touches (an entity's
        ``card:4111…``, a lock's name, an effect's or a cache's key), as the trace stores it
        and a look-up by resource asks for it: ``text``'s patterns applied, field rules not
        (a name is no field). A name found clean is not searched again; at most 4,096 are
        remembered, and the set starts anew when full: a worker names ever new ids
        (``order:1``, ``order:2``...), and the ones it names now are those worth keeping."""
        clean = self._clean_resources
        if resource in clean:
            return resource
        if len(resource) < _SHORTEST and self._needles is not None and "://" not in resource:
            # Shorter than anything the built-in patterns match but a URL's password: a
            # new id (``order:57``) costs no search.
            redacted = resource
        else:
            redacted = self.text(resource)
        if redacted == resource:
            if len(clean) >= 4096:
                clean.clear()
            clean.add(resource)
        return redacted

    def text(self, text: str) -> str:
        """``text`` with every secret the patterns find replaced (markers are left alone)."""
        if not text or not (self.patterns or self.cards):
            return text
        if self._cannot_match(text):
            return text
        screen = self._screen
        if screen is not None and not screen.search(text):
            return text
        if "[redacted" in text:
            parts = MARKER.split(text)
            found = MARKER.findall(text)
            out = [self._plain(parts[0])]
            for marker, part in zip(found, parts[1:], strict=True):
                out += [marker, self._plain(part)]
            return "".join(out)
        return self._plain(text)

    def _cannot_match(self, text: str) -> bool:
        """Whether no rule can match ``text``, known without the joined regex (``_screen``
        costs ~25 ns a character: a worker's log line of a group commit, ~300 characters,
        took half of its logging's CPU): with only the built-in patterns, an ASCII text
        holding none of the substrings they need (``_needles``, in lower case) and no 13
        digits in a run once spaces and dashes are dropped (what a card number needs).
        ``False`` means "search it", as before."""
        needles = self._needles
        if needles is None or not text.isascii():
            return False  # a pattern of the user's, or case folding beyond ASCII
        return _screened_clean(text, needles, self.cards)

    def _plain(self, text: str) -> str:
        for pattern in self.patterns:
            if pattern.search(text):
                text = pattern.sub(self._replace, text)
        if self.cards:
            text = _CARD.sub(self._card, text)
        return text

    def _replace(self, match: re.Match[str]) -> str:
        if match.re.groups == 0:
            return self.marker(match.group(0))
        start, end = match.span(1)
        if start < 0:
            return match.group(0)
        whole = match.group(0)
        offset = match.start(0)
        secret = match.group(1)
        return whole[: start - offset] + self.marker(secret) + whole[end - offset :]

    def _card(self, match: re.Match[str]) -> str:
        digits = "".join(c for c in match.group(0) if c.isdigit())
        return self.marker(digits) if _luhn(digits) else match.group(0)

    def error(self, exc: BaseException) -> str:
        """``"Type: message"`` of an exception, as it is recorded: with secrets replaced."""
        return self.text(f"{type(exc).__name__}: {exc}")

    # -- values -----------------------------------------------------------------------------

    def value(self, value: Any) -> Any:
        """A JSON value with secret fields and secret texts replaced; the same object when
        nothing in it is secret. A flat object's keys are judged at once and its texts
        searched as one (``_flat_clean``); a nested value is encoded and its text screened
        (``clean_text``); either is walked only if that finds something or the rules
        cannot be screened that way (another flat value is walked: cheaper than that)."""
        # ``active`` and ``_flat`` inlined: every recorded event's data passes here.
        if not (self.names or self.globs or self.patterns or self.cards):
            return value
        if (
            self._needles is not None
            and type(value) is dict
            and len(value) <= 16
            and _FLAT.issuperset(map(type, value.values()))
        ):
            # A flat object (an event's data as replayq passes it: names, keys, tokens,
            # numbers): its keys judged at once, its texts searched as one
            # (``_flat_clean``); walked only if that finds something to look at.
            return value if self._flat_clean(value) else self._walk(value, 0)
        if self._needles is not None and _nested(value):
            try:
                text = _SCREEN_ENCODER.encode(value)
            except (TypeError, ValueError, RecursionError):
                pass  # not JSON: the walk leaves what it cannot read as it is
            else:
                if self.clean_text(text):
                    return value
        return self._walk(value, 0)

    def _flat_clean(self, value: dict[Any, Any]) -> bool:
        """Whether a flat object (``_flat``: up to 16 items, each ``None``, a text, a whole
        number, a float or a bool) certainly holds no secret: no key is a secret field's
        name or a text that may hold a secret (``_plain_key``), and its texts (picked in
        C: ``_walk`` returns its other values as they are), joined by a NUL that no
        rule's substring or digit run holds, are a text ``_cannot_match``. Then
        ``_walk`` would return it as it is: each of its texts is part of the joined one,
        so none of them holds a needle or a run of 13 digits either. ``False`` means
        "walk it". Only with the built-in patterns (``_needles``)."""
        if not self._plain_keys.issuperset(value) and (
            not _STR.issuperset(map(type, value))
            or self.any_secret_field(value)
            or not self._cannot_match("\0".join(value))
        ):
            return False
        values = value.values()
        return self._cannot_match("\0".join(compress(values, map(_IS_STR, map(type, values)))))

    def clean_text(self, text: str, keys: set[str] | None = None) -> bool:
        """Whether the JSON text of a value certainly holds no secret: no key that is a
        secret field's name (``secret_field``), none of the substrings that
        the built-in patterns need, no run of 13 digits. ``False`` means "walk it": so
        does a text that is not ASCII or has a backslash (a JSON escape), since a pattern
        matches a string as it is, not as JSON writes it. ``keys``: the value's object
        keys when the caller has them (``keys_of``), else they are searched in the text."""
        needles = self._needles
        if needles is None:
            return not self.active
        if "\\" in text or not text.isascii():
            return False
        screened = _screened(text) if needles or self.cards else ""
        if needles:
            for needle in needles:  # a loop, not ``any`` over a generator resumed per needle
                if needle in screened:
                    return False
        if self.names or self.globs:
            if keys is None:
                keys = keys_in(text)
            plain = self._plain_keys
            # Keys already judged not secret cost a set difference, not a call each.
            if not keys <= plain:
                for key in keys - plain:
                    if self.secret_field(key):
                        return False
                    self._plain_key(key)
        return not (self.cards and _card_run(text, screened))

    def encoded(self, value: Any, dumps: Callable[[Any], str]) -> tuple[Any, str]:
        """``value`` redacted and its text ``dumps(value)``, encoding it once when nothing
        in it is secret (the usual case) and twice otherwise."""
        return self.encoded_keyed(value, lambda v: (dumps(v), None))

    def encoded_keyed(
        self, value: Any, dumps_keyed: Callable[[Any], tuple[str, set[Any] | None]]
    ) -> tuple[Any, str]:
        """``encoded`` with ``codec.dumps_keyed``: the value's keys come from the walk that
        encodes it (``keys_of`` only where that walk cannot tell them), so a value is
        walked once for its types and keys, not twice."""
        text, keys = dumps_keyed(value)
        if keys is None and (self.names or self.globs):
            keys = keys_of(value)
        if self.clean_text(text, keys):
            return value, text
        redacted = self._walk(value, 0)
        return redacted, (text if redacted is value else dumps_keyed(redacted)[0])

    def _walk(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return self.text(value)
        if kind is int or kind is float or kind is bool or value is None:
            return value
        if depth > 256:  # deeper than the codec allows: the codec names the problem
            return value
        if kind is dict or isinstance(value, dict):
            out: dict[Any, Any] | None = None
            seen = self._seen
            for index, (key, item) in enumerate(value.items()):
                secret = seen.get(key) if type(key) is str else None
                if secret is None:
                    secret = isinstance(key, str) and self.secret_field(key)
                if secret:
                    new = self.whole(item)
                elif item is None or type(item) in _SCALARS:
                    new = item  # most leaves: no call
                elif type(item) is str:
                    new = self.text(item)  # what ``_walk`` does with it, one call less
                else:
                    new = self._walk(item, depth + 1)
                new_key = key
                if type(key) is str and key not in self._clean_texts:
                    # A key is a text: a card number or a credential in it is as secret.
                    new_key = self.short_text(key)
                    if new_key != key:
                        new_key = _distinct_key(new_key, value, out)
                if (new is not item or new_key is not key) and out is None:
                    out = dict(list(value.items())[:index])
                if out is not None:
                    out[new_key] = new
            return value if out is None else out
        if kind is list or kind is tuple or isinstance(value, (list, tuple)):
            items = [self._walk(item, depth + 1) for item in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items
        return value

    def whole(self, value: Any) -> Any:
        """The redaction of a value held by a secret field: all of it is secret.

        A text keeps its shape where a pattern finds the secret in it (``Bearer
        [redacted:…]``); a text that already carries a marker is left as it is.
        """
        if value is None or value == "":
            return value
        if isinstance(value, str):
            redacted = self.text(value)
            if "[redacted" in redacted and MARKER.search(redacted):
                return redacted
            return self.marker(value)
        if isinstance(value, dict | list | tuple) and has_marker(value):
            # Redacted before (read back from the database), or a marker passed on (a
            # redacted payload field) beside secrets in clear: each leaf is redacted whole,
            # a marker kept, so the first is itself again and the second keeps no secret.
            return self._whole_leaves(value)
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
        return self.marker(text)

    def _whole_leaves(self, value: Any) -> Any:
        """``whole`` of each leaf of a secret field's container (see ``whole``)."""
        if isinstance(value, dict):
            return {key: self._whole_leaves(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._whole_leaves(item) for item in value]
        return self.whole(value)


def _distinct_key(key: str, value: dict[Any, Any], out: dict[Any, Any] | None) -> str:
    """``key``, a redacted object key, made distinct from the object's other keys: two keys
    can redact to one marker (two card numbers without a key give ``[redacted]``; one card
    number written with and without dashes, one keyed marker), and the second value would
    silently replace the first in what is recorded, and in what a resumed step or a
    replayed call returns. The second becomes ``MARKER#2`` (as a step's position does),
    which redacts to itself."""
    if key not in value and (out is None or key not in out):
        return key
    count = 2
    while (found := f"{key}#{count}") in value or (out is not None and found in out):
        count += 1
    return found


_SCALARS = frozenset((int, float, bool))
# The fewest characters a built-in pattern other than the URL's matches: a card number's
# 13 digits; ``Basic `` or ``Bearer `` and 8 more (``Redactor.resource``).
_SHORTEST = 13
_GLOBAL_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _screen_of(patterns: list[re.Pattern[str]], cards: bool) -> re.Pattern[str] | None:
    """One regex matching wherever any pattern (or a card-like digit run) matches, so a
    text without secrets costs one search; ``None`` if the patterns cannot be joined."""
    parts = [
        _GLOBAL_FLAGS.sub(r"(?\1:", p.pattern) + (")" if _GLOBAL_FLAGS.match(p.pattern) else "")
        for p in patterns
    ]
    parts = [f"(?:{part})" for part in parts] + ([_CARD_SCREEN] if cards else [])
    try:
        return re.compile("|".join(parts)) if parts else None
    except re.error:
        return None


# Any JSON, keys in their order; ``clean_text`` only searches the text.
_SCREEN_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

# What a text must contain for each built-in pattern to match it (in lower case).
_NEEDLES: dict[str, tuple[str, ...]] = {
    DEFAULT_PATTERNS[0]: ("bearer", "basic"),
    DEFAULT_PATTERNS[1]: ("://",),
}
# (ASCII) digits to "0", spaces and dashes deleted: a card number (13 to 19 digits with
# single spaces or dashes between) becomes a run of at least 13 zeros.
_DIGIT_RUNS = bytes.maketrans(b"123456789", b"000000000")
_CARD_RUN = b"0" * 13
# One pass for every screen of an ASCII text (``_screened``): letters in lower case (the
# needles are looked for in it, as in ``text.lower()``), digits, spaces and dashes all
# "0". No needle holds a digit, a space, a dash or a "0", so a needle is found in it
# exactly where it is found in ``text.lower()``; and a card number's digits with the
# spaces and dashes between them are a run of at least 13 "0"s in it, as they are in
# ``_DIGIT_RUNS``'s text with the spaces and dashes deleted. The converse does not hold
# (``2024-01-01 12:00``, a run of spaces): such a run is then asked of that text
# (``_card_run``). ``bytes.translate`` without deletions is one table lookup a byte; with
# them, and ``str.lower`` besides, a text was passed over twice (the 2.6 KB of a call's
# response: ~33 k and ~17 k instructions).
_SCREEN = bytes.maketrans(
    b"0123456789 -ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"000000000000abcdefghijklmnopqrstuvwxyz"
)
_CARD_TEXT = "0" * 13


def _screened(text: str) -> str:
    """``text`` (ASCII) as ``_SCREEN`` maps it: the text the needles and card runs are
    looked for in (a ``str`` again: ``str in str`` is a slot call, where ``bytes.find``
    parses its arguments, ~1,000 instructions a search)."""
    return text.encode().translate(_SCREEN).decode()


def _card_run(text: str, screened: str) -> bool:
    """Whether ``text`` (ASCII; ``screened`` is ``_screened(text)``) holds 13 digits in a
    run once spaces and dashes are dropped (what a card number needs). ``find``, not
    ``in``: ``bytes in bytes`` formats and clears a TypeError first."""
    return (
        _CARD_TEXT in screened and text.encode().translate(_DIGIT_RUNS, b" -").find(_CARD_RUN) != -1
    )


def _screened_clean(text: str, needles: tuple[str, ...], cards: bool) -> bool:
    """``_cannot_match`` of an ASCII text under the built-in patterns (``needles``)."""
    if not needles and not cards:
        return True
    screened = _screened(text)
    for needle in needles:
        if needle in screened:
            return False
    return not (cards and _card_run(text, screened))


# The strings of a JSON text without escapes, each whole and in order (no string holds a
# '"', and none is outside one), with the ":" that follows a key. A search for '"...":'
# alone could start at a string's closing quote: in '{"":"",":":1}' it read the value's
# end and the key's first character as a key "," and missed the key ":".
_STRINGS = re.compile(r'"([^"]*)"(:?)')


def keys_in(text: str) -> set[str]:
    """The object keys of a canonical JSON text without escapes (``keys_of``'s answer)."""
    return {string for string, colon in _STRINGS.findall(text) if colon}


_LEAF_TYPES = frozenset((str, int, float, bool, type(None)))
_DICTS = frozenset((dict,))


def keys_of(value: Any) -> set[str] | None:
    """The object keys anywhere in a JSON value, as ``keys_in`` would find them in its
    canonical text, without searching the text (the 2.6 KB of a 32-line response: ~35 µs
    of regex). Objects only one level down, and lists of them, cost C-level passes, not a
    Python call per key. ``None`` (search the text) for a container that is not exactly a
    ``dict``, ``list`` or ``tuple``, whose keys the text may show otherwise."""
    kind = type(value)
    if kind is not dict and kind is not list and kind is not tuple:
        return None if isinstance(value, dict | list | tuple) else set()
    keys: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            keys.update(item)
            children: Any = item.values()
        else:
            children = item
        if _LEAF_TYPES.issuperset(map(type, children)):
            continue
        if _DICTS.issuperset(map(type, children)):
            # A list of objects (a response's lines): their keys in one pass, their
            # values in another; visited one by one only if one holds a container.
            keys.update(*children)
            if _LEAF_TYPES.issuperset(map(type, chain.from_iterable(map(dict.values, children)))):
                continue
        for child in children:
            kind = type(child)
            if kind is dict or kind is list or kind is tuple:
                stack.append(child)
            elif isinstance(child, dict | list | tuple):
                return None
    return keys


def _flat(value: dict[Any, Any]) -> bool:
    """Whether ``value`` (an object) has at most 16 items, each ``None``, a text, a whole
    number, a float or a bool (exactly those types: no subclass), read in one C pass."""
    return len(value) <= 16 and _FLAT.issuperset(map(type, value.values()))


_FLAT = frozenset((str, int, float, bool, type(None)))
_STR = frozenset((str,))
_IS_STR = _STR.__contains__


def _nested(value: Any) -> bool:
    """Whether ``value`` holds containers or many items: worth a screen, not a walk."""
    items: Collection[Any]
    if type(value) is dict:
        items = value.values()
    elif type(value) is list or type(value) is tuple:
        items = value
    else:
        return False
    # The item types in one C-level pass (no generator resumed per item): ~7 values a job.
    return len(items) > 16 or not _CONTAINERS.isdisjoint(map(type, items))


_CONTAINERS = frozenset((dict, list, tuple))


def _needles_of(patterns: list[re.Pattern[str]]) -> tuple[str, ...] | None:
    """The substrings behind ``clean_text`` for the built-in patterns; ``None`` when
    another pattern is in the rules (it may anchor or look around in ways a value's
    JSON text does not keep: then every value is walked)."""
    needles: list[str] = []
    for pattern in patterns:
        found = _NEEDLES.get(pattern.pattern)
        if found is None:
            return None
        needles += found
    return tuple(needles)


def has_marker(value: Any) -> bool:
    """Whether ``value`` (a text, or a JSON list or object at any depth) holds a marker."""
    if isinstance(value, str):
        return MARKER.search(value) is not None
    if isinstance(value, dict):
        return any(has_marker(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_marker(v) for v in value)
    return False


def is_marker(value: Any) -> bool:
    """Whether ``value`` is a whole redaction marker (a redacted payload field)."""
    return isinstance(value, str) and MARKER.fullmatch(value) is not None


NONE = Redactor()
