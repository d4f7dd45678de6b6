"""The public surface: ``replayq.__all__`` is exactly what the package exports, all resolving."""

from __future__ import annotations

import types

import replayq


def test_all_names_every_public_name_and_nothing_else() -> None:
    exported = {
        name
        for name, value in vars(replayq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(replayq.__all__) == exported


def test_every_name_in_all_resolves() -> None:
    for name in replayq.__all__:
        assert getattr(replayq, name) is not None, name


def test_all_is_sorted_without_duplicates() -> None:
    assert list(replayq.__all__) == sorted(set(replayq.__all__))


def test_every_exception_descends_from_the_one_root() -> None:
    errors = [
        value
        for name in replayq.__all__
        if isinstance(value := getattr(replayq, name), type) and issubclass(value, BaseException)
    ]
    assert errors
    assert all(issubclass(error, replayq.ReplayqError) for error in errors)
