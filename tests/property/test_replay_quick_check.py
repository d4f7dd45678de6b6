"""The quick check of a bulk verification never says "same" where the dry-run would not.

Generated handlers (steps of ``decide``, ``call``, ``effect``, ``now``, ``state.get`` and
``state.put`` with generated values, secrets among them) are recorded, then a mutated
version (a value changed, an operation dropped, repeated or moved, a name changed — or
nothing) is dry-run over the recording twice: in bulk with ``keep=False`` (through
``replay.quick``) and on its own (the full dry-run). The two reports must be the same.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import replayq
from replayq.replay.engine import ReplayReport, dry_run, dry_run_many
from replayq.testing import run_inline

Op = tuple[Any, ...]
Program = list[tuple[str, list[Op]]]

names = st.sampled_from(["a", "b", "c"])
keys = st.sampled_from(["k1", "k2"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([1.0, 0.5, "x", "4111 1111 1111 1111", "sk_live_0123456789abcdef"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.sampled_from(["x", "y", "password"]), inner, max_size=2)
    ),
    max_leaves=6,
)
ops = st.one_of(
    st.tuples(st.just("decide"), names, values),
    st.tuples(st.just("call"), names, values),
    st.tuples(st.just("effect"), names, keys),
    st.tuples(st.just("now")),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("put"), keys, st.dictionaries(st.sampled_from(["x", "y"]), values)),
)
programs = st.lists(
    st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.lists(ops, max_size=4)),
    min_size=1,
    max_size=3,
)
COUNTER = itertools.count()


def run_program(ctx: replayq.Context, program: Program, n: int) -> list[Any]:
    seen: list[Any] = []
    for step_name, step_ops in program:
        with ctx.step(step_name):
            for op in step_ops:
                kind = op[0]
                if kind == "decide":
                    seen.append(ctx.decide(op[1], op[2]))
                elif kind == "call":
                    seen.append(ctx.call(op[1], lambda value: {"echo": value}, op[2]))
                elif kind == "effect":
                    seen.append(ctx.effect(op[1], lambda: {"done": 1}, key=f"{n}-{op[2]}"))
                elif kind == "now":
                    ctx.now()
                elif kind == "get":
                    seen.append(ctx.state.get("prop", f"{n}-{op[1]}").data)
                else:
                    ctx.state.put("prop", f"{n}-{op[1]}", op[2])
    return seen


@st.composite
def mutated(draw: st.DrawFn, program: Program) -> Program:
    """``program`` with at most one change."""
    steps = [(name, list(step_ops)) for name, step_ops in program]
    change = draw(st.sampled_from(["none", "value", "drop", "repeat", "move", "rename", "add"]))
    index = draw(st.integers(0, len(steps) - 1))
    name, step_ops = steps[index]
    if change == "rename":
        steps[index] = (name + "x", step_ops)
    elif change == "add":
        step_ops.insert(draw(st.integers(0, len(step_ops))), draw(ops))
    elif step_ops and change != "none":
        at = draw(st.integers(0, len(step_ops) - 1))
        op = step_ops[at]
        if change == "value" and len(op) == 3:
            step_ops[at] = (op[0], op[1], draw(values if op[0] != "effect" else keys))
        elif change == "drop":
            del step_ops[at]
        elif change == "repeat":
            step_ops.insert(at, op)
        elif change == "move" and at + 1 < len(step_ops):
            step_ops[at], step_ops[at + 1] = step_ops[at + 1], op
    return steps


def comparable(report: ReplayReport) -> str:
    """The report as JSON without what differs between any two runs: the derived trace's
    names, a step's measured duration."""
    text = json.dumps(report.to_dict(), sort_keys=True, default=str)
    text = text.replace(report.branch, "BRANCH").replace(report.trace_id, "TRACE")
    return re.sub(r'"duration": [0-9.e-]+', '"duration": 0', text)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(st.data(), programs)
def test_the_quick_check_reports_what_the_dry_run_reports(
    app_factory: Callable[..., replayq.App], data: st.DataObject, program: Program
) -> None:
    # One app (and database) per backend, shared by the examples; each example its own
    # versions and entities.
    app: replayq.App = app_factory.__dict__.setdefault("app", None) or app_factory()
    app_factory.__dict__["app"] = app
    changed = data.draw(mutated(program))
    n = next(COUNTER)

    @app.job("prog", version=f"a{n}")
    def recorded(ctx: replayq.Context, n: int) -> list[Any]:
        return run_program(ctx, program, n)

    @app.job("prog", version=f"b{n}", candidate=True)
    def candidate(ctx: replayq.Context, n: int) -> list[Any]:
        return run_program(ctx, changed, n)

    job = run_inline(app, "prog", {"n": n})

    for version in (f"a{n}", f"b{n}"):
        [bulk] = dry_run_many(app, [job.id], version=version, keep=False)
        full = dry_run(app, job.id, version=version, keep=False)
        assert comparable(bulk) == comparable(full), (program, changed)
        if bulk.matched_in_memory:
            assert not full.diverged
        event("quick" if bulk.matched_in_memory else f"full, diverged={full.diverged}")
