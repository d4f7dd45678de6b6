"""Write docs/reference/api.md: the public Python API, from the docstrings.

    python scripts/api_reference.py          # rewrite the file
    python scripts/api_reference.py --check  # exit 1 if the file is out of date

Every name in ``replayq.__all__`` (and ``replayq.testing``) with its signature and
docstring; for a class, its public methods and properties too. Nothing but the
standard library (``inspect``): no documentation toolchain to install.
``tests/unit/test_api_reference.py`` runs ``--check``, so the page cannot rot.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "reference" / "api.md"
HEADER = """# Python API reference

Generated from the docstrings by `scripts/api_reference.py` (do not edit by hand;
run the script after changing a public docstring or signature: a test fails
while this page is out of date). The guides say how the pieces fit:
[tutorial](../tutorial.md), [recording context](../recording-context.md),
[contracts](../contracts.md), [replay](../replay.md).
"""


def _doc(obj: Any) -> str:
    text = inspect.getdoc(obj) or ""
    return text.strip()


class _Text(str):
    """An annotation kept as text (``from __future__ import annotations``), shown unquoted."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _unquoted(annotation: Any) -> Any:
    return _Text(annotation) if isinstance(annotation, str) else annotation


def _signature(name: str, obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    signature = signature.replace(
        parameters=[
            p.replace(annotation=_unquoted(p.annotation)) for p in signature.parameters.values()
        ],
        return_annotation=_unquoted(signature.return_annotation),
    )
    return f"{name}{signature}"


def _is_public_member(name: str, value: Any, owner: type) -> bool:
    if name.startswith("_"):
        return False
    if name in vars(object) or isinstance(value, enum.Enum):
        return False
    defined_here = any(
        name in vars(base) for base in owner.__mro__ if base.__module__.startswith("replayq")
    )
    return defined_here and (
        inspect.isfunction(value) or isinstance(value, property | classmethod | staticmethod)
    )


def _class(name: str, cls: type) -> list[str]:
    lines = [f"### class `{name}`", ""]
    if not issubclass(cls, BaseException | enum.Enum):
        lines += ["```python", _signature(name, cls), "```", ""]
    lines += [_doc(cls) or "*(no docstring)*", ""]
    if issubclass(cls, enum.Enum):
        lines += [", ".join(f"`{member.value}`" for member in cls), ""]
        return lines
    for member_name in sorted(dir(cls)):
        raw = inspect.getattr_static(cls, member_name)
        if not _is_public_member(member_name, raw, cls):
            continue
        if isinstance(raw, property):
            lines += [f"* **`{member_name}`** (property) — {_first_line(raw)}"]
        else:
            function = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
            doc = _doc(function)
            lines += [f"* **`{_signature(member_name, function)}`**"]
            if doc:
                lines += ["", *(f"  {line}" if line else "" for line in doc.splitlines()), ""]
    lines.append("")
    return lines


def _first_line(obj: Any) -> str:
    return _doc(obj).split("\n\n")[0].replace("\n", " ") or "*(no docstring)*"


def _function(name: str, fn: Any) -> list[str]:
    return [
        f"### `{name}`",
        "",
        "```python",
        _signature(name, fn),
        "```",
        "",
        _doc(fn) or "*(no docstring)*",
        "",
    ]


def _section(title: str, module: ModuleType, names: list[str]) -> list[str]:
    lines = [f"## {title}", ""]
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            lines += _class(name, obj)
        elif callable(obj):
            lines += _function(name, obj)
    return lines


def render() -> str:
    import replayq
    import replayq.testing

    public = sorted(replayq.__all__, key=lambda n: (not inspect.isclass(getattr(replayq, n)), n))
    errors = [
        n
        for n in public
        if inspect.isclass(getattr(replayq, n)) and issubclass(getattr(replayq, n), BaseException)
    ]
    classes = [n for n in public if inspect.isclass(getattr(replayq, n)) and n not in errors]
    functions = [
        n
        for n in public
        if not inspect.isclass(getattr(replayq, n)) and callable(getattr(replayq, n))
    ]
    testing = sorted(
        n
        for n in vars(replayq.testing)
        if not n.startswith("_")
        and getattr(getattr(replayq.testing, n), "__module__", "") == "replayq.testing"
    )
    lines = [HEADER, ""]
    lines += _section("Classes (`replayq`)", replayq, classes)
    lines += _section("Functions (`replayq`)", replayq, functions)
    lines += _section("Errors (`replayq`)", replayq, errors)
    lines += _section("Test helpers (`replayq.testing`)", replayq.testing, testing)
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python scripts/api_reference.py")
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
