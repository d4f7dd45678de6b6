"""``replayq.contracts.lock``: the app's operational contracts, frozen in its repository.

``freeze`` writes every declared version's contract as reviewable text, one
``[type version]`` block of ``field = JSON value`` lines, so that a pull request
that changes a lease, a retry policy, a lock TTL or a cache TTL shows it as a
diff a reviewer reads. ``check`` compares the code's contracts with the lock,
field by field (made for the app's CI: ``replayq contract check`` exits 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayq.errors import ConfigurationError
from replayq.queue.contracts import JobContract, diff_contracts
from replayq.queue.handlers import HandlerRegistry
from replayq.runtime import RuntimeSource

LOCK_FILE = "replayq.contracts.lock"
_HEADER = """\
# replayq.contracts.lock: the operational contracts this app declares, one block per
# job type and version. Review changes here like an API change.
# Written by: replayq contract freeze --app MODULE:APP   Checked by: replayq contract check
"""

Frozen = dict[tuple[str, str], dict[str, Any]]
_WHICH_APP = " (is --app the module:attribute of the App your workers run?)"


@dataclass(frozen=True)
class LockDifference:
    """One field (or a whole version) where the code differs from the lock."""

    job_type: str
    version: str
    field: str
    locked: Any
    code: Any
    concern: str

    def describe(self) -> str:
        return (
            f"{self.job_type} {self.version}: {self.field} ({self.concern}): "
            f"lock {json.dumps(self.locked)} -> code {json.dumps(self.code)}"
        )


def _flat(body: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("name", "version"):
            continue
        if key == "retry" and isinstance(value, Mapping):
            flat.update({f"retry.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _unflat(job_type: str, version: str, flat: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": job_type, "version": version, "retry": {}}
    for key, value in flat.items():
        if key.startswith("retry."):
            body["retry"][key[len("retry.") :]] = value
        else:
            body[key] = value
    return body


def render(frozen: Frozen) -> str:
    lines = [_HEADER]
    for (job_type, version), flat in sorted(frozen.items()):
        lines.append(f"\n[{job_type} {version}]\n")
        lines.extend(f"{k} = {json.dumps(flat[k], sort_keys=True)}\n" for k in sorted(flat))
    return "".join(lines)


def parse(text: str) -> Frozen:
    frozen: Frozen = {}
    current: dict[str, Any] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            job_type, _, version = line[1:-1].partition(" ")
            current = frozen.setdefault((job_type, version.strip()), {})
            continue
        key, sep, value = line.partition(" = ")
        if current is None or not sep:
            raise ConfigurationError(
                f"{LOCK_FILE}:{number}: expected '[type version]' or 'field = value'"
            )
        current[key] = json.loads(value)
    return frozen


def declared(registry: HandlerRegistry, job_types: Iterable[str] | None = None) -> Frozen:
    wanted = set(job_types) if job_types else None
    return {
        (h.contract.name, h.contract.version): _flat(h.contract.to_dict())
        for h in registry.handlers()
        if wanted is None or h.contract.name in wanted
    }


def freeze(source: RuntimeSource, path: str | Path, job_types: Sequence[str] = ()) -> Frozen:
    """Write the lock; with ``job_types`` only those are re-frozen, the others kept."""
    registry, path = source.runtime.registry, Path(path)
    unknown = [t for t in job_types if not registry.declares(t)]
    if unknown:
        raise ConfigurationError(f"not declared by this app: {', '.join(unknown)}")
    if not declared(registry):
        # A lock of nothing would make every later ``check`` of this app vacuous.
        raise ConfigurationError(f"this app declares no job type: nothing to freeze{_WHICH_APP}")
    frozen = parse(path.read_text()) if path.exists() and job_types else {}
    if job_types:
        frozen = {k: v for k, v in frozen.items() if k[0] not in set(job_types)}
    frozen.update(declared(registry, job_types or None))
    path.write_text(render(frozen))
    return frozen


def check(source: RuntimeSource, path: str | Path) -> list[LockDifference]:
    """Every difference between the code's contracts and the lock (empty: they agree)."""
    registry, path = source.runtime.registry, Path(path)
    if not path.exists():
        raise ConfigurationError(f"{path}: no lock file; write one with replayq contract freeze")
    locked, code = parse(path.read_text()), declared(registry)
    if not locked and not code:
        # Both empty "match", and that would pass an app CI never loaded as meant.
        raise ConfigurationError(
            f"{path}: nothing to check: the lock has no contract and this app declares no "
            f"job type{_WHICH_APP}"
        )
    differences = []
    for key in sorted(set(locked) | set(code)):
        job_type, version = key
        if key not in code:
            differences.append(
                LockDifference(job_type, version, "*", "declared", None, "version removed")
            )
            continue
        if key not in locked:
            differences.append(
                LockDifference(job_type, version, "*", None, "declared", "version not frozen")
            )
            continue
        old = JobContract.from_dict(_unflat(job_type, version, locked[key]))
        new = JobContract.from_dict(_unflat(job_type, version, code[key]))
        differences.extend(
            LockDifference(job_type, version, c.field, c.old, c.new, c.concern)
            for c in diff_contracts(old, new)
        )
    return differences
