"""The storage seam stays typed: verbs take dataclasses or scalars and return records.

A verb that takes or returns a plain mapping hides its columns from the type
checker (a renamed column surfaces as a ``KeyError`` at run time); a verb the
storage package's map does not name is one a reader cannot find.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Mapping

import replayq.storage
from replayq.storage import protocol
from replayq.storage.protocol import Transaction

# Every verb's parameters are typed (``step_complete`` was the last to take a mapping).
UNTYPED_PARAMETERS: set[str] = set()


def verbs() -> dict[str, typing.Callable[..., typing.Any]]:
    return {
        name: member
        for name, member in vars(Transaction).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def is_mapping(annotation: typing.Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        return True
    return any(is_mapping(arg) for arg in typing.get_args(annotation))


def test_no_verb_takes_or_returns_a_plain_mapping() -> None:
    found = []
    for name, verb in verbs().items():
        hints = typing.get_type_hints(verb, vars(protocol))
        returned = hints.pop("return")
        if is_mapping(returned):
            found.append(f"{name} returns {returned}")
        if name not in UNTYPED_PARAMETERS:
            found.extend(f"{name}({p}: {t})" for p, t in hints.items() if is_mapping(t))
    assert found == []


def test_every_parameter_and_record_dataclass_is_frozen_and_slotted() -> None:
    classes = [
        value
        for value in vars(protocol).values()
        if dataclasses.is_dataclass(value)
        and value.__module__ in {"replayq.storage.params", "replayq.storage.records"}
    ]
    assert len(classes) > 20  # the module was read
    loose = [
        c.__name__
        for c in classes
        if not (c.__dataclass_params__.frozen and "__slots__" in vars(c))  # type: ignore[attr-defined]
    ]
    assert loose == []


def test_the_storage_package_map_names_every_verb() -> None:
    words = set((replayq.storage.__doc__ or "").replace("(", " ").replace(")", " ").split())
    assert sorted(set(verbs()) - words) == []
