"""Facts about the machine a benchmark ran on, printed beside its numbers."""

from __future__ import annotations

import os
import platform
import sqlite3
from collections.abc import Sequence
from pathlib import Path


def machine(workdir: Path, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """CPU, OS, Python, SQLite, load average and the disk the databases are on."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    device = "unknown"
    mounts = Path("/proc/mounts")
    if mounts.exists():
        best = ""
        for line in mounts.read_text().splitlines():
            dev, mount, fstype, *_ = line.split()
            if str(workdir.resolve()).startswith(mount) and len(mount) >= len(best):
                best, device = mount, f"{dev} ({fstype}, mounted at {mount})"
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return [
        ("nproc", str(len(os.sched_getaffinity(0)))),
        ("cpu", cpu),
        ("os", platform.platform()),
        ("python", platform.python_version()),
        ("sqlite", sqlite3.sqlite_version),
        *extra,
        ("load average at the end (1/5/15 min)", load),
        ("databases in", f"{workdir} on {device}"),
    ]
