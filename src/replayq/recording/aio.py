"""One recording flow, two ways to make the outside call: plain or awaited.

``ctx.call`` and ``ctx.effect`` are written once, as a *flow*: a generator that
does the recording (the world's answer, the idempotency claim, the events) and
yields exactly where the outside call happens, receiving its result (or its
exception, thrown in). ``run_flow`` drives it:

* a plain function is called in place and the verb returns its result, as
  before;
* a coroutine function (``async def``, or a ``functools.partial`` of one) or a
  coroutine object makes the verb return a coroutine: ``await ctx.call(...)``
  runs the same flow and awaits the call on the handler's event loop.

So recording, replay (a recorded answer: the flow returns without yielding, and
the coroutine is closed, never started) and the seal (a context variable, which
an awaited call inherits from its task) behave the same either way. Whether the
verb is awaitable is decided from ``fn`` before anything runs, so a replay that
never calls ``fn`` still returns an awaitable to a handler that awaits.
"""

from __future__ import annotations

import inspect
import types
from _thread import get_ident
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from replayq.errors import ConfigurationError

T = TypeVar("T")

Flow = Generator[Callable[[], Any], Any, T]
"""Yields the outside call once (or never, when the answer is recorded); returns the result."""


# Types that are never awaitable: checked by type first, since ``inspect.isawaitable``
# falls back to an ``Awaitable`` ABC check that costs more than the rest of a replayed call.
_PLAIN = frozenset(
    {types.FunctionType, types.MethodType, types.BuiltinFunctionType, dict, list, tuple}
    | {str, bytes, int, float, bool, type(None)}
)


_CO_COROUTINE = inspect.CO_COROUTINE


def _awaitable(value: Any) -> bool:
    return type(value) not in _PLAIN and inspect.isawaitable(value)


def is_async(fn: Any) -> bool:
    """Whether ``fn`` is a coroutine function or already a coroutine (or other awaitable).

    A plain function (a ``def`` or a lambda: most of what ``ctx.call`` and ``ctx.effect``
    get) is answered from its code's flags, as ``inspect.iscoroutinefunction`` answers it
    after its own five calls; one marked by ``inspect.markcoroutinefunction`` (3.12+,
    an attribute in its ``__dict__``) is left to ``inspect``."""
    if (
        type(fn) is types.FunctionType
        and not fn.__code__.co_flags & _CO_COROUTINE
        and "_is_coroutine_marker" not in fn.__dict__
    ):
        return False
    return inspect.iscoroutinefunction(fn) or _awaitable(fn)


def outside_call(fn: Any, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """The thunk a flow yields: calls ``fn`` (or hands over an awaitable ``fn`` as it is)."""
    if _awaitable(fn):
        if args or kwargs:
            raise ConfigurationError("pass arguments to the coroutine function, not with it")
        return lambda: fn
    return lambda: fn(*args, **kwargs)


def run_flow(flow: Flow[T], fn: Any) -> T | Coroutine[Any, Any, T]:
    """Drive ``flow``: in place for a plain ``fn``, as a coroutine for an async one."""
    if is_async(fn):
        return _drive_async(flow, fn)
    return _drive(flow)


def _drive(flow: Flow[T]) -> T:
    try:
        thunk = next(flow)
        while True:
            try:
                value = thunk()
                if _awaitable(value):
                    close_unstarted(value)
                    raise ConfigurationError(
                        "the function returned an awaitable: pass the coroutine function "
                        "itself (or the coroutine) and await the verb, "
                        "e.g. await ctx.effect(kind, send_async)"
                    )
            except Exception as exc:
                thunk = flow.throw(exc)
            else:
                thunk = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def _drive_async(flow: Flow[T], fn: Any) -> T:
    started = False
    try:
        thunk = next(flow)
        while True:
            try:
                started = True
                awaitable = thunk()
                value = await awaitable if inspect.isawaitable(awaitable) else awaitable
            except Exception as exc:
                thunk = flow.throw(exc)
            else:
                thunk = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        if not started:
            # Replayed or refused: the coroutine the handler passed is never run.
            close_unstarted(fn)


def close_unstarted(value: Any) -> None:
    """Close ``value`` if it is a coroutine that will never run (its verb was refused or
    replayed), so it is not reported as never awaited."""
    close = getattr(value, "close", None)
    if inspect.iscoroutine(value) and close is not None:
        close()


# ``asyncio.current_task``, bound at the first ``task_or_thread`` (``asyncio`` is imported
# late, as worker/event_loop.py says why; by then it is).
_current_task: Callable[[], object] | None = None


def task_or_thread() -> object:
    """Which flow of an ``async def`` handler's attempt runs now (``Recorder._running``):
    its ``asyncio`` task, or outside any task (a thread it started, ``asyncio.to_thread``)
    the thread's id. Asked for each event recorded while a step runs (the step it names):
    one C call in a task (an ``import`` statement and two calls cost ~1 K instructions
    more each)."""
    current_task = _current_task
    if current_task is None:
        current_task = _bind_current_task()
    try:
        task = current_task()
    except RuntimeError:  # no loop runs in this thread
        return get_ident()
    return task if task is not None else get_ident()


def _bind_current_task() -> Callable[[], object]:
    global _current_task
    import asyncio

    _current_task = asyncio.current_task
    return _current_task
