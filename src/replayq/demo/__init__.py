"""``replayq demo``: the ShipOrder incident of seed 003, reproduced, investigated and fixed.

The demo runs the example shop (``replayq.demo.shop``, shipped in the package)
on real local processes: a warehouse, a payment and an email HTTP service
(``replayq.demo.shop.services``) and
two ``replayq worker`` subprocesses. The warehouse slows past ship_order v1's
lease and the incident happens for real: two workers ship one order. Then it
walks the runbook of ``docs/runbook.md``, printing each ``replayq`` command
before running it as a subprocess, and proves the fix (v2) on a fork, repairs
the state the duplicate wrote, deploys v2 under the same conditions and exports
that run as a regression case.

Every number it prints comes from a service's ``/_counts`` or from the
database; ``run_demo`` returns them as a ``DemoResult`` for the tests to assert.

It runs from an installed wheel as well as from a checkout. On PostgreSQL it
creates a fresh schema in the given database and drops it at the end (kept
with ``--keep``); a URL that already sets ``search_path`` is used as is and
nothing is dropped.

::

    demo/
    ├── harness.py      Demo: the services, the worker subprocesses, the CLI runner, the
    │                   database (a fresh PostgreSQL schema or a SQLite file); DemoResult
    ├── chapter.py      Chapter: the state the chapters below share, and their helpers
    ├── story.py        Story: setup, 1. the incident, the damage; the runbook's order
    ├── investigate.py  Investigation: 2-7, identify, quarantine, classify, dry-run, fork,
    │                   compare
    ├── repair.py       Repair: 8-10, repair, deploy v2, the regression case; the summary
    ├── rollout.py      ``replayq demo rollout``
    └── shop/           the example shop and its HTTP services

    Story ─▶ Investigation ─▶ Chapter
          └▶ Repair ────────▶ Chapter
"""

from __future__ import annotations

import sys
import time
from typing import IO

from replayq.demo.harness import Demo, DemoError, DemoResult
from replayq.demo.story import Story

__all__ = ["DemoError", "DemoResult", "run_demo"]


def run_demo(db_url: str | None, keep: bool, *, out: IO[str] | None = None) -> DemoResult:
    """Run the whole demo; returns its facts. Processes and temporary files are always cleaned up.

    ``db_url``: ``None`` for a temporary SQLite file; ``postgresql://...`` for a
    fresh schema in that database. ``keep``: keep the database, logs and
    ``case.json`` (their folder is printed and set in ``DemoResult.kept``).
    """
    demo = Demo(db_url, keep, out or sys.stdout)
    story: Story | None = None
    try:
        story = Story(demo)
        workers = story.setup()
        story.incident(workers)
        story.identify()
        story.quarantine()
        story.classify()
        story.safe_replay()
        fork_trace = story.fork()
        story.compare(fork_trace)
        story.repair()
        story.deploy_fix()
        story.regression_case()
        story.summary()
    except KeyboardInterrupt:
        demo.say("\ninterrupted: stopping the demo's processes and removing its files")
        raise
    except BaseException:
        demo.dump_logs()
        raise
    finally:
        if story is not None:
            story.close()
        demo.cleanup()
    demo.result.seconds = time.monotonic() - demo.started
    return demo.result
