"""The flow driver behind ``ctx.call``/``ctx.effect`` (``replayq.recording.aio``): one
recording, driven in place for a plain function or awaited for a coroutine."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

import replayq
from replayq.recording.aio import Flow, is_async, outside_call, run_flow


def recording(log: list[str], fn: Any, *args: Any, answer: Any = None) -> Flow[Any]:
    """A flow like ``ctx.call``'s: records before and after; a recorded answer skips ``fn``."""
    log.append("before")
    if answer is not None:
        log.append("replayed")
        return answer
    try:
        value = yield outside_call(fn, *args)
    except Exception as exc:
        log.append(f"failed {exc}")
        raise
    log.append(f"after {value}")
    return value


async def double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


async def broken() -> int:
    raise ValueError("down")


def test_a_plain_function_is_called_in_place() -> None:
    log: list[str] = []
    assert run_flow(recording(log, lambda x: x + 1, 1), lambda x: x + 1) == 2
    assert log == ["before", "after 2"]


@pytest.mark.parametrize("fn", [double, partial(double), double(21)], ids=["fn", "partial", "coro"])
def test_a_coroutine_function_or_coroutine_makes_the_verb_awaitable(fn: Any) -> None:
    log: list[str] = []
    args = () if asyncio.iscoroutine(fn) else (21,)
    pending = run_flow(recording(log, fn, *args), fn)

    assert log == [], "nothing runs before the verb is awaited"
    assert asyncio.run(pending) == 42  # type: ignore[arg-type]
    assert log == ["before", "after 42"]


def test_an_awaited_failure_reaches_the_flow_and_the_caller() -> None:
    log: list[str] = []
    with pytest.raises(ValueError, match="down"):
        asyncio.run(run_flow(recording(log, broken), broken))  # type: ignore[arg-type]
    assert log == ["before", "failed down"]


def test_a_replayed_coroutine_is_closed_never_started() -> None:
    log: list[str] = []
    coro = double(1)
    result = asyncio.run(run_flow(recording(log, coro, answer=7), coro))  # type: ignore[arg-type]

    assert result == 7
    assert log == ["before", "replayed"]
    assert coro.cr_frame is None, "the coroutine was not closed (a never-awaited warning)"


def test_a_plain_function_returning_a_coroutine_is_refused_with_the_fix() -> None:
    log: list[str] = []

    def sneaky() -> Any:
        return double(1)

    assert not is_async(sneaky)
    with pytest.raises(replayq.ConfigurationError, match="await the verb"):
        run_flow(recording(log, sneaky), sneaky)
    assert log[-1].startswith("failed the function returned an awaitable")
