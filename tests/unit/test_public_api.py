"""The public surface: ``replayq.__all__`` is exactly what the package exports, all resolving."""

from __future__ import annotations

import types

import replayq


def test_all_names_every_public_name_and_nothing_else() -> None:
    # dir(), not vars(): the replay and rollout names are there before their first use.
    exported = {
        name
        for name in dir(replayq)
        if not name.startswith("_") and not isinstance(getattr(replayq, name), types.ModuleType)
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


def test_the_replay_verbs_are_public() -> None:
    for verb in ("trace_replay", "dry_run", "fork", "rerun", "rollback", "diff_traces"):
        assert verb in replayq.__all__
    for verb in ("plan_rollback", "compensate", "export_case", "import_case", "signal_counts"):
        assert verb in replayq.__all__


def test_every_exception_class_in_the_package_is_in_the_one_tree() -> None:
    import importlib
    import pkgutil

    strays = []
    for info in pkgutil.walk_packages(replayq.__path__, "replayq."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
                and not issubclass(value, replayq.ReplayqError)
            ):
                strays.append(f"{info.name}.{value.__name__}")
    assert strays == []


def test_no_module_of_the_package_takes_part_in_an_import_cycle() -> None:
    import grimp

    graph = grimp.build_graph("replayq", include_external_packages=False)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            path = graph.find_shortest_chain(importer=imported, imported=module)
            if path is not None and module != imported:
                cycles.append(" -> ".join((module, *path)))
    assert cycles == []
