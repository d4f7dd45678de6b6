"""Typed payload fields: what a handler's annotations promise, checked at enqueue and
decoded for the handler.

A payload is stored as JSON, so every annotation maps to one JSON form and back:

=====================================  =====================================  ==================
annotation                             stored as                              the handler gets
=====================================  =====================================  ==================
``int`` ``float`` ``str`` ``bool``     itself (``float`` also takes an int)   the same value
``dict`` ``list`` (bare)               itself, contents unchecked             the same value
``Decimal``                            a string, ``"12.30"`` (an int too;     ``Decimal("12.30")``
                                       a float is refused: it is not exact)
``datetime``                           ISO 8601 with its UTC offset           an aware datetime
                                       (a naive datetime is refused)          (fixed offset)
``date`` ``UUID``                      ISO string / canonical string          ``date`` / ``UUID``
an ``Enum``                            its value                              the member
``list[T]`` ``dict[str, T]``           list / object, each item as ``T``      list / dict of T
``T | None``, ``Optional[T]``          ``null`` or ``T``                      ``None`` or T
a dataclass                            an object of its fields, each typed    an instance
a pydantic model (extra ``pydantic``)  ``model_dump(mode="json")``            ``model_validate``
a ``msgspec.Struct``                   ``msgspec.to_builtins``                ``msgspec.convert``
anything else, or no annotation        not checked                            the stored JSON
=====================================  =====================================  ==================

Every check names the path of the bad value (``'order.lines[2].qty'``). The JSON
form is canonical, so fingerprints, idempotency keys and dry-run comparisons see
one value whatever object the producer passed; a payload with no typed field is
stored exactly as it was before types existed. A datetime comes back with a fixed
offset (``+01:00``), not the ``ZoneInfo`` it was made with: the same instant and
offset, compared equal.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from functools import cached_property
from typing import Any

from msgspec import Struct, field

from replayq.errors import PayloadError
from replayq.redaction import Redactor, has_marker, is_marker


def join(path: str, name: str) -> str:
    """The path of field ``name`` under ``path`` (``order`` + ``qty`` = ``order.qty``)."""
    return f"{path}.{name}" if path else name


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:80] + "…"


def _wrong(path: str, expected: str, value: Any, hint: str = "") -> PayloadError:
    error = PayloadError(
        f"field {path!r} expects {expected}, got {type(value).__name__} {_shown(value)}{hint}"
    )
    error.quoted = (path, value)
    return error


def without_secrets(error: PayloadError, redactor: Redactor, payload: Any = None) -> PayloadError:
    """``error`` with its whole message screened by ``redactor``'s rules. A payload refused
    at enqueue was never redacted, and its error becomes a caller's message, a handler's
    failure (``ctx.enqueue``: the trace, ``last_error``) or a CLI's output; one refused at
    lease, the job's burial.

    The value it quotes (``PayloadError.quoted``) is redacted whole where a name on its
    field's path is a secret field's, else as any value is; every value a secret field of
    ``payload`` holds is replaced by its marker wherever the message quotes it (a
    validator's own text: ``unknown key …``, msgspec's ``Invalid enum value …``); then
    the patterns search the whole message."""
    original = message = str(error)
    if error.quoted is not None:
        path, value = error.quoted
        names = [name for name in re.split(r"[.\[\]<>]+", path) if name]
        secret = any(redactor.secret_field(name) for name in names)
        redacted = redactor.whole(value) if secret else redactor.value(value)
        if redacted is not value and redacted != value:
            message = message.replace(_shown(value), _shown(redacted))
    held = _secrets_held(payload, redactor, False, {})
    if held:
        message = _replace_verbatim(message, held)
    message = redactor.text(message)
    return error if message == original else PayloadError(message)


def _secrets_held(
    value: Any, redactor: Redactor, secret: bool, out: dict[str, str]
) -> dict[str, str]:
    """Each text (or number, as written) a secret field holds anywhere in ``value`` (a
    payload as given: JSON, or a dataclass, pydantic model or Struct in it), mapped to
    what replaces it (its redaction as a secret field's value)."""
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = ((None, item) for item in value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value))
    elif isinstance(value, Struct):
        items = ((name, getattr(value, name, None)) for name in type(value).__struct_fields__)
    elif hasattr(type(value), "model_fields") and hasattr(value, "model_dump"):
        items = ((name, getattr(value, name, None)) for name in type(value).model_fields)
    else:
        if not secret or value is None or isinstance(value, bool) or is_marker(value):
            return out
        if isinstance(value, str) and value:
            out[value] = redactor.whole(value)
            shown = repr(value)[1:-1]  # as a repr quotes it (escapes)
            if shown != value:
                out[shown] = out[value]
        elif isinstance(value, int | float | Decimal | uuid.UUID):
            out[str(value)] = redactor.whole(str(value))
        return out
    for key, item in items:
        inner = secret or (isinstance(key, str) and redactor.secret_field(key))
        _secrets_held(item, redactor, inner, out)
    return out


def _replace_verbatim(message: str, held: Mapping[str, str]) -> str:
    """``message`` with every text of ``held`` replaced by its redaction, in one pass
    (longest first) that leaves markers already in it alone."""
    found = re.compile("|".join(map(re.escape, sorted(held, key=len, reverse=True))))
    parts = re.split(r"(\[redacted(?::[0-9a-f]{16})?\](?:#\d+)?)", message)
    return "".join(
        part if index % 2 else found.sub(lambda hit: held[hit.group(0)], part)
        for index, part in enumerate(parts)
    )


class FieldType(Struct, frozen=True):
    """One annotation's check and conversion, both ways.

    ``to_json`` takes what a producer passed (a rich value or its JSON form) and
    returns the JSON form; ``from_json`` takes the stored form and returns what the
    handler receives. Both raise ``PayloadError`` naming ``path``. ``rich`` is False
    when both are the identity on valid input (plain JSON types).
    """

    name: str
    to_json: Callable[[Any, str], Any]
    from_json: Callable[[Any, str], Any]
    schema: Any
    rich: bool = True
    # A record's (dataclass, pydantic model, msgspec Struct) own fields: a whole payload can be one.
    fields: Fields | None = None


def _plain(name: str, allowed: tuple[type, ...]) -> FieldType:
    def check(value: Any, path: str) -> Any:
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            raise _wrong(path, name, value)
        return value

    return FieldType(name, check, check, name, rich=False)


_PLAIN: dict[Any, FieldType] = {
    int: _plain("int", (int,)),
    float: _plain("float", (int, float)),
    str: _plain("str", (str,)),
    bool: _plain("bool", (bool,)),
    dict: _plain("dict", (dict,)),
    list: _plain("list", (list,)),
}


def _decimal_in(value: Any, path: str) -> Decimal:
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        number = Decimal(value)
    elif isinstance(value, str):
        try:
            number = Decimal(value)
        except InvalidOperation:
            raise _wrong(path, "Decimal", value) from None
    else:
        hint = " (a float is not exact: pass a Decimal or a string)" if type(value) is float else ""
        raise _wrong(path, "Decimal", value, hint)
    if not number.is_finite():
        raise _wrong(path, "a finite Decimal", value)
    return number


DECIMAL = FieldType("Decimal", lambda v, p: str(_decimal_in(v, p)), _decimal_in, "decimal")


def _datetime_in(value: Any, path: str) -> _dt.datetime:
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value)
        except ValueError:
            raise _wrong(path, "an ISO 8601 datetime", value) from None
    if not isinstance(value, _dt.datetime):
        raise _wrong(path, "datetime", value)
    if value.utcoffset() is None:
        raise _wrong(path, "a timezone-aware datetime", value, " (naive: give it a tzinfo)")
    return value


DATETIME = FieldType(
    "datetime", lambda v, p: _datetime_in(v, p).isoformat(), _datetime_in, "datetime"
)


def _date_in(value: Any, path: str) -> _dt.date:
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value)
        except ValueError:
            raise _wrong(path, "an ISO 8601 date", value) from None
    if isinstance(value, _dt.datetime) or not isinstance(value, _dt.date):
        raise _wrong(path, "date", value)
    return value


DATE = FieldType("date", lambda v, p: _date_in(v, p).isoformat(), _date_in, "date")


def _uuid_in(value: Any, path: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except (TypeError, ValueError, AttributeError):
        raise _wrong(path, "UUID", value) from None


UUID = FieldType("UUID", lambda v, p: str(_uuid_in(v, p)), _uuid_in, "uuid")


def _enum(cls: type[enum.Enum]) -> FieldType:
    def from_json(value: Any, path: str) -> enum.Enum:
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise _wrong(path, f"{cls.__name__} (one of {allowed})", value) from None

    values = [m.value for m in cls]
    return FieldType(cls.__name__, lambda v, p: from_json(v, p).value, from_json, {"enum": values})


def _optional(inner: FieldType) -> FieldType:
    return FieldType(
        f"{inner.name} | None",
        lambda v, p: None if v is None else inner.to_json(v, p),
        lambda v, p: None if v is None else inner.from_json(v, p),
        {"optional": inner.schema},
        inner.rich,
    )


def _list_of(inner: FieldType) -> FieldType:
    def each(convert: Callable[[Any, str], Any]) -> Callable[[Any, str], list[Any]]:
        def walk(value: Any, path: str) -> list[Any]:
            if not isinstance(value, list | tuple):
                raise _wrong(path, f"list[{inner.name}]", value)
            return [convert(item, f"{path}[{i}]") for i, item in enumerate(value)]

        return walk

    name = f"list[{inner.name}]"
    return FieldType(name, each(inner.to_json), each(inner.from_json), {"list": inner.schema})


def _dict_of(inner: FieldType) -> FieldType:
    def each(convert: Callable[[Any, str], Any]) -> Callable[[Any, str], dict[str, Any]]:
        def walk(value: Any, path: str) -> dict[str, Any]:
            if not isinstance(value, Mapping):
                raise _wrong(path, f"dict[str, {inner.name}]", value)
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _wrong(join(path, "<key>"), "str", key)
                out[key] = convert(item, join(path, key))
            return out

        return walk

    name = f"dict[str, {inner.name}]"
    return FieldType(name, each(inner.to_json), each(inner.from_json), {"dict": inner.schema})


# A frozen Struct, not a frozen dataclass: built in C, where the dataclass compiled six
# methods at every process's start. ``dict=True`` keeps room for ``name_set``'s cache.
class Fields(Struct, frozen=True, dict=True):
    """A record's typed fields: which are required, and each one's type (if checked)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    types: Mapping[str, FieldType]
    # The JSON form of each optional field's fixed default (``fixed_default``): what a key
    # template renders for the field when a payload leaves it out.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return self.required + self.optional

    @cached_property
    def name_set(self) -> frozenset[str]:
        """``names`` as a set, built once (``check_names`` runs at each enqueue)."""
        return frozenset(self.names)

    def schema(self) -> dict[str, Any]:
        """Per field: its type's schema (``"any"`` if unchecked), ``?`` marking optional."""
        return {
            name if name in self.required else f"{name}?": (
                self.types[name].schema if name in self.types else "any"
            )
            for name in self.names
        }


class _NoDefault:
    """The marker of a field with no fixed default (``fixed_default``)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


def fixed_default(value: Any, kind: FieldType | None, name: str) -> Any:
    """The JSON form of a field's default, as a key template renders it when a payload
    leaves the field out: the stored form of the value the handler receives.
    ``NO_DEFAULT`` when the default does not fit its own annotation."""
    if value is None or kind is None:
        return value
    try:
        return kind.to_json(value, name)
    except (PayloadError, KeyError):  # KeyError: a recursive record still being built
        return NO_DEFAULT


# Each dataclass's check, built once; a recursive one (a tree of nodes) refers to its own
# check by name, looked up when a value is converted (it is built by then).
_DATACLASSES: dict[type, FieldType] = {}
_BUILDING: set[type] = set()


def _dataclass(cls: type[Any]) -> FieldType:
    if cls in _DATACLASSES:
        return _DATACLASSES[cls]
    if cls in _BUILDING:
        return FieldType(
            cls.__name__,
            lambda v, p: _DATACLASSES[cls].to_json(v, p),
            lambda v, p: _DATACLASSES[cls].from_json(v, p),
            {"ref": cls.__name__},
        )
    _BUILDING.add(cls)
    try:
        built = _DATACLASSES[cls] = _dataclass_fields(cls)
    finally:
        _BUILDING.discard(cls)
    return built


def _dataclass_fields(cls: type[Any]) -> FieldType:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: check field names, not types
        hints = {}
    required: list[str] = []
    optional: list[str] = []
    field_types: dict[str, FieldType] = {}
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        (optional if has_default else required).append(f.name)
        checked = field_type(hints.get(f.name))
        if checked is not None:
            field_types[f.name] = checked
        # A default_factory's value is made anew at each decode: no fixed default.
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = fixed_default(f.default, checked, f.name)
    record = Fields(
        tuple(required),
        tuple(optional),
        field_types,
        {name: value for name, value in defaults.items() if value is not NO_DEFAULT},
    )

    def items(value: Any, path: str) -> Mapping[str, Any]:
        if isinstance(value, cls):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}
        if not isinstance(value, Mapping):
            raise _wrong(path or "payload", cls.__name__, value)
        check_names(record, value, path)
        return value

    def to_json(value: Any, path: str) -> dict[str, Any]:
        return {
            name: record.types[name].to_json(item, join(path, name))
            if name in record.types
            else item
            for name, item in items(value, path).items()
        }

    def from_json(value: Any, path: str) -> Any:
        if isinstance(value, cls):
            return value
        fields = items(value, path)
        converted = {
            # A redacted secret reaches the handler as its marker (checked at enqueue).
            name: record.types[name].from_json(item, join(path, name))
            if name in record.types and not is_marker(item)
            else item
            for name, item in fields.items()
        }
        try:
            return cls(**converted)
        except Exception as exc:  # its own check (``__post_init__``) refused the values
            if any(has_marker(item) for item in converted.values()):
                # A stored payload, checked whole at enqueue with its secrets in clear: a
                # check of the marker that replaced one is not a check of the payload.
                return _unchecked(cls, converted)
            raise PayloadError(
                f"field {path or cls.__name__!r}: {cls.__name__} refused it:"
                f" {type(exc).__name__}: {exc}"
            ) from None

    return FieldType(
        cls.__name__, to_json, from_json, {cls.__name__: record.schema()}, fields=record
    )


def _unchecked(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of dataclass ``cls`` holding ``values``, each other field its default,
    made without ``__init__`` (its ``__post_init__``): a redacted secret reaches the
    handler as its marker, as a field of any other type does."""
    instance = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            value = values[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        object.__setattr__(instance, f.name, value)  # a frozen dataclass's too
    return instance


def _pydantic(cls: type[Any]) -> FieldType:
    pydantic = sys.modules["pydantic"]

    def refused(exc: Any, value: Any, path: str, stored: bool) -> Any:
        errors = exc.errors()
        # A stored payload, checked whole at enqueue with its secrets in clear: a check (a
        # validator, a pattern, a ``Literal``) of the marker that replaced one is not a
        # check of the payload. Every refusal must be a marker's.
        if stored and all(has_marker(e["input"]) for e in errors):
            built = _pydantic_unchecked(cls, value)
            if built is not None:
                return built
        # The first refusal not of a marker is the one to name (a stored payload's).
        first = next((e for e in errors if not has_marker(e["input"])), errors[0])
        where = path
        for part in first["loc"]:
            where = f"{where}[{part}]" if isinstance(part, int) else join(where, str(part))
        error = PayloadError(
            f"field {where or cls.__name__!r}: {first['msg']}, got {_shown(first['input'])}"
        )
        error.quoted = (where, first["input"])
        raise error from None

    def validated(value: Any, path: str) -> Any:  # at enqueue
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)
        except pydantic.ValidationError as exc:
            return refused(exc, value, path, False)

    def decoded(value: Any, path: str) -> Any:  # a stored payload (the fallback: refused)
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)
        except pydantic.ValidationError as exc:
            return refused(exc, value, path, True)

    model_fields = cls.model_fields.items()
    undefined = sys.modules["pydantic_core"].PydanticUndefined
    to_jsonable = sys.modules["pydantic_core"].to_jsonable_python
    return FieldType(
        cls.__name__,
        lambda v, p: validated(v, p).model_dump(mode="json"),
        decoded,
        {cls.__name__: cls.model_json_schema()},
        fields=Fields(
            tuple(name for name, info in model_fields if info.is_required()),
            tuple(name for name, info in model_fields if not info.is_required()),
            {},
            {
                name: to_jsonable(info.default)
                for name, info in model_fields
                if info.default is not undefined and info.default_factory is None
            },
        ),
    )


def _pydantic_unchecked(cls: type[Any], values: Any) -> Any:
    """An instance of pydantic model ``cls`` holding ``values`` (a stored payload whose
    only refusals are of markers): each field holding a marker as it is (a nested record
    decoded as replayq decodes it), each other one validated alone (a datetime is a
    datetime), made with ``model_construct``. ``None`` when that fails too."""
    if not isinstance(values, Mapping):
        return None
    fields = cls.model_fields
    given = {
        name: _marked(fields[name].annotation, item, name)
        if name in fields and has_marker(item)
        else item
        for name, item in values.items()
    }
    try:
        instance = cls.model_construct(**given)
        for name, item in given.items():
            if name in fields and not has_marker(values[name]):
                cls.__pydantic_validator__.validate_assignment(instance, name, item)
    except Exception:  # a field refused alone, or the model's own code refused the marker
        return None
    return instance


def _marked(annotation: Any, item: Any, path: str) -> Any:
    """A field's stored value holding a marker, as the handler gets it: a whole marker as
    it is, a record (or a list or dict of them) decoded by replayq's own check (which
    keeps each marker), else the stored JSON."""
    kind = field_type(annotation) if not is_marker(item) else None
    return kind.from_json(item, path) if kind is not None else item


def _msgspec_error(message: str, path: str, cls: type[Any]) -> PayloadError:
    """``msgspec``'s message (``Expected `int`, got `str` - at `$.lines[0].qty```) as
    replayq's, the field named by its path under ``path``."""
    what, _, at = message.partition(" - at `$")
    where = (path + at.rstrip("`")).lstrip(".")
    missing = re.fullmatch(r"Object missing required field `(.+)`", what)
    if missing:
        return PayloadError(f"payload is missing required field {join(where, missing[1])!r}")
    return PayloadError(f"field {where or cls.__name__!r}: {what}")


def _msgspec(cls: type[Any]) -> FieldType:
    msgspec = sys.modules["msgspec"]

    def validated(value: Any, path: str) -> Any:  # at enqueue
        # A Struct's constructor checks nothing: an instance is checked through its JSON form.
        given = msgspec.to_builtins(value) if isinstance(value, cls) else value
        try:
            return msgspec.convert(given, cls)
        except msgspec.ValidationError as exc:
            raise _msgspec_error(str(exc), path, cls) from None

    def decoded(value: Any, path: str) -> Any:  # a stored payload (the fallback: refused)
        given = msgspec.to_builtins(value) if isinstance(value, cls) else value
        try:
            return msgspec.convert(given, cls)
        except msgspec.ValidationError as exc:
            # Checked whole at enqueue with its secrets in clear: a constraint
            # (``Meta(pattern=...)``) on the marker that replaced one is not a check of it.
            built = _msgspec_unchecked(cls, given, path) if has_marker(given) else None
            if built is None:
                raise _msgspec_error(str(exc), path, cls) from None
            return built

    struct_fields = msgspec.structs.fields(cls)
    return FieldType(
        cls.__name__,
        lambda v, p: msgspec.to_builtins(validated(v, p)),
        decoded,
        {cls.__name__: msgspec.json.schema(cls)},
        fields=Fields(
            tuple(f.encode_name for f in struct_fields if f.required),
            tuple(f.encode_name for f in struct_fields if not f.required),
            {},
            {
                f.encode_name: msgspec.to_builtins(f.default)
                for f in struct_fields
                if f.default is not msgspec.NODEFAULT
            },
        ),
    )


def _msgspec_unchecked(cls: type[Any], values: Any, path: str) -> Any:
    """An instance of Struct ``cls`` holding ``values`` (a stored payload holding a
    marker): each field holding one as it is (a nested record decoded as replayq decodes
    it), each other one converted alone to its type, with its constraints (its refusal
    raised, naming it); made with the constructor, which checks no constraint. ``None``
    when the constructor refuses (a missing field, ``__post_init__``)."""
    if not isinstance(values, Mapping):
        return None
    msgspec = sys.modules["msgspec"]
    given = {}
    for f in msgspec.structs.fields(cls):
        if f.encode_name in values:
            item, where = values[f.encode_name], join(path, f.encode_name)
            if has_marker(item):
                given[f.name] = _marked(f.type, item, where)
                continue
            try:
                given[f.name] = msgspec.convert(item, f.type)
            except msgspec.ValidationError as exc:
                raise _msgspec_error(str(exc), where, cls) from None
    try:
        return cls(**given)
    except Exception:  # a required field missing, or ``__post_init__`` refused the marker
        return None


def _is_struct(annotation: type[Any]) -> bool:
    msgspec = sys.modules.get("msgspec")
    return msgspec is not None and issubclass(annotation, msgspec.Struct)


def is_record(annotation: Any) -> bool:
    """Whether ``annotation`` is a class whose instances are a whole payload: a dataclass,
    a pydantic model or a ``msgspec.Struct``."""
    if not isinstance(annotation, type):
        return False
    if dataclasses.is_dataclass(annotation) or _is_struct(annotation):
        return True
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(annotation, pydantic.BaseModel)


def field_type(annotation: Any) -> FieldType | None:
    """The check for one annotation; ``None`` for one replayq does not check (``Any``,
    a class it does not know, no annotation)."""
    if isinstance(annotation, type):
        if annotation in _PLAIN:
            return _PLAIN[annotation]
        if issubclass(annotation, enum.Enum):
            return _enum(annotation)
        if issubclass(annotation, Decimal):
            return DECIMAL
        if issubclass(annotation, _dt.datetime):
            return DATETIME
        if issubclass(annotation, _dt.date):
            return DATE
        if issubclass(annotation, uuid.UUID):
            return UUID
        if dataclasses.is_dataclass(annotation):
            return _dataclass(annotation)
        if _is_struct(annotation):
            return _msgspec(annotation)
        if is_record(annotation):
            return _pydantic(annotation)
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = field_type(rest[0]) if len(rest) == 1 else None
        if inner is None or len(rest) == len(args):
            return None  # a union of several types is not checked
        return _optional(inner)
    if origin is list and len(args) == 1:
        inner = field_type(args[0])
        return _list_of(inner) if inner is not None else _PLAIN[list]
    if origin is dict and len(args) == 2 and args[0] is str:
        inner = field_type(args[1])
        return _dict_of(inner) if inner is not None else _PLAIN[dict]
    return None


def check_names(record: Fields, value: Mapping[str, Any], path: str, extra: bool = False) -> None:
    """Raise ``PayloadError`` for the first missing required or unknown field of a record."""
    # Run at every enqueue and attempt: no list or set is built while nothing is wrong.
    for name in record.required:
        if name not in value:
            raise PayloadError(f"payload is missing required field {join(path, name)!r}")
    if not extra and not record.name_set.issuperset(value):
        unknown = sorted(value.keys() - record.name_set)
        if unknown:
            where = f" of {path!r}" if path else ""
            raise PayloadError(
                f"payload has unknown field {join(path, unknown[0])!r}"
                f" (fields{where}: {', '.join(record.names) or 'none'})"
            )
