"""The storage seam stays typed: verbs take dataclasses or scalars and return records.

A verb that takes or returns a plain mapping hides its columns from the type
checker (a renamed column surfaces as a ``KeyError`` at run time); a verb the
storage package's map does not name is one a reader cannot find.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping

from msgspec import Struct

import replayq.storage
from replayq.storage import (
    context_params,
    params,
    records,
    reports,
    retention_params,
)
from replayq.storage.protocol import Transaction

# Every verb's parameters are typed (``step_complete`` was the last to take a mapping).
UNTYPED_PARAMETERS: set[str] = set()


def verbs() -> dict[str, typing.Callable[..., typing.Any]]:
    """The verbs of ``Transaction``: those of each verb family it is composed of."""
    found = {
        name: member
        for family in Transaction.__mro__
        if family.__module__.startswith("replayq.storage.")
        for name, member in vars(family).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    assert found, "no verb found: every test here would pass on nothing"
    return found


def is_mapping(annotation: typing.Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        return True
    return any(is_mapping(arg) for arg in typing.get_args(annotation))


def signatures(verb: typing.Callable[..., typing.Any]) -> list[typing.Callable[..., typing.Any]]:
    """The verb's overloads (one per kind of question it answers), and the verb itself."""
    return [*typing.get_overloads(verb), verb]


def test_no_verb_takes_or_returns_a_plain_mapping() -> None:
    found = []
    for name, verb in verbs().items():
        for signature in signatures(verb):
            hints = typing.get_type_hints(signature)
            returned = hints.pop("return")
            if is_mapping(returned):
                found.append(f"{name} returns {returned}")
            if name not in UNTYPED_PARAMETERS:
                found.extend(f"{name}({p}: {t})" for p, t in hints.items() if is_mapping(t))
    assert found == []


def members(kind: typing.Any) -> tuple[typing.Any, ...]:
    """A union's members; any other type (``Sequence[JobInsert]`` too) is one kind."""
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    return typing.get_args(kind) if union else (kind,)


def test_an_overloaded_verb_answers_every_kind_of_its_parameter() -> None:
    """A verb taking a union of questions (``report``, ``trace_query``…) declares an
    overload for each, so the type checker knows every answer's record."""
    missing = []
    for name, verb in verbs().items():
        overloads = typing.get_overloads(verb)
        if not overloads:
            continue
        [kinds] = [t for p, t in typing.get_type_hints(verb).items() if p != "return"]
        covered: set[typing.Any] = set()
        for overload in overloads:
            [kind] = [t for p, t in typing.get_type_hints(overload).items() if p != "return"]
            covered.update(members(kind))
        missing.extend(f"{name}({kind})" for kind in members(kinds) if kind not in covered)
    assert missing == []


# The aim (45). Today 37: the ten retention verbs became three (keep_transition,
# gc_scan, gc_apply).
MAX_VERBS = 45


def test_the_protocol_has_at_most_45_verbs() -> None:
    """Near-duplicates are one verb taking a union (``storage/__init__.py`` draws them)."""
    assert len(verbs()) <= MAX_VERBS, sorted(verbs())


def test_every_parameter_and_record_is_a_frozen_struct() -> None:
    """The storage's vocabulary: immutable, slotted (every ``Struct`` is), built in C at
    import (a frozen dataclass costs ~1 ms to define: every command and worker pays it)."""
    modules = (params, context_params, retention_params, reports, records)
    classes = [
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__
    ]
    assert len(classes) > 80  # the modules were read
    loose = [
        c.__name__
        for c in classes
        if not (issubclass(c, Struct) and c.__struct_config__.frozen and "__dict__" not in dir(c))
    ]
    assert loose == []


def test_the_storage_package_map_names_every_verb() -> None:
    words = set((replayq.storage.__doc__ or "").replace("(", " ").replace(")", " ").split())
    assert sorted(set(verbs()) - words) == []
