"""The seal's bookkeeping without I/O: which context is sealed, the message, the error tree."""

from __future__ import annotations

import ast
import asyncio
import contextvars
import sys
import threading
from pathlib import Path

import replayq.seal
from replayq.errors import ReplayqError, UnrecordedIOError
from replayq.seal import Violation, is_sealed, seal, unsealed


def test_message_names_the_call_its_target_and_the_step() -> None:
    error = UnrecordedIOError("socket.connect", "127.0.0.1:8123", "charge")
    assert str(error) == "unrecorded I/O at step 'charge': socket.connect 127.0.0.1:8123"
    assert (error.call, error.target, error.step) == ("socket.connect", "127.0.0.1:8123", "charge")
    assert isinstance(error, ReplayqError)


def test_message_outside_any_step() -> None:
    violation = Violation("subprocess.Popen", "true", None)
    assert str(violation) == "unrecorded I/O outside any step: subprocess.Popen true"


def test_unrecorded_io_error_is_drawn_in_the_error_tree() -> None:
    import replayq.errors

    assert replayq.errors.__doc__ is not None
    assert "UnrecordedIOError" in replayq.errors.__doc__


def test_sealed_only_inside_the_block_and_lifted_by_unsealed() -> None:
    assert not is_sealed()
    with seal():
        assert is_sealed()
        with unsealed():
            assert not is_sealed()
            with seal():  # a replay started from replayq's own code is sealed again
                assert is_sealed()
            assert not is_sealed()
        assert is_sealed()
    assert not is_sealed()


def test_the_seal_is_lifted_when_the_block_raises() -> None:
    try:
        with seal():
            raise KeyError("handler bug")
    except KeyError:
        pass
    assert not is_sealed()


def test_a_plain_thread_started_inside_the_seal_is_not_sealed() -> None:
    """The documented gap: threading.Thread starts with an empty context."""
    seen: dict[str, bool] = {}

    def probe(name: str) -> None:
        seen[name] = is_sealed()

    with seal():
        plain = threading.Thread(target=probe, args=("plain",))
        copied = threading.Thread(target=contextvars.copy_context().run, args=(probe, "copied"))
        for thread in (plain, copied):
            thread.start()
            thread.join()
    assert seen == {"plain": False, "copied": True}


def test_asyncio_tasks_inherit_the_seal() -> None:
    async def main() -> list[bool]:
        async def probe() -> bool:
            return is_sealed()

        with seal():
            inside = await asyncio.create_task(probe())
            in_thread = await asyncio.to_thread(is_sealed)
        outside = await asyncio.create_task(probe())
        return [inside, in_thread, outside]

    assert asyncio.run(main()) == [True, True, False]


def test_seal_module_imports_only_the_standard_library_and_errors() -> None:
    source = Path(replayq.seal.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    third_party = {
        name
        for name in imported
        if name.split(".")[0] not in sys.stdlib_module_names and name != "replayq.errors"
    }
    assert third_party == set()
