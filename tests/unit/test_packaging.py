"""Packaging hygiene: an SPDX licence, and every extra pinned in the lock and importable.

The dev/test environment installs exactly ``requirements.lock``; an extra whose
requirement is missing there (or pinned outside its range) would go untested.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# What each extra makes importable; a new extra must say what to import here.
EXTRA_MODULES = {
    "postgres": ["psycopg", "psycopg_pool", "greenlet", "replayq.storage.postgres"],
    "redis": ["redis"],
    "metrics": ["prometheus_client"],
    "otel": ["opentelemetry.sdk.trace"],
    "web": ["starlette", "jinja2", "uvicorn", "python_multipart"],
    "django": ["django", "replayq.contrib.django", "replayq.contrib.django.apps"],
    "sqlalchemy": ["sqlalchemy", "replayq.contrib.sqlalchemy"],
    "pydantic": ["pydantic"],
    "msgspec": ["msgspec"],
    "fast": ["orjson"],
}


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_the_license_is_an_spdx_string_not_a_table() -> None:
    assert PROJECT["license"] == "Apache-2.0"


def test_every_extra_says_what_it_makes_importable() -> None:
    assert set(PROJECT["optional-dependencies"]) == set(EXTRA_MODULES)


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_each_extra_is_pinned_in_the_lock_within_its_range_and_imports(extra: str) -> None:
    pins = locked()
    for text in PROJECT["optional-dependencies"][extra]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"[{extra}] needs {name} pinned in requirements.lock"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} vs {text}"
    for module in EXTRA_MODULES[extra]:
        importlib.import_module(module)
