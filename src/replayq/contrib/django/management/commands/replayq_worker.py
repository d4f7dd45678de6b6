"""``manage.py replayq_worker``: run a replayq worker for the project's app."""

from __future__ import annotations

import importlib
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import replayq


def load_app(spec: str) -> replayq.App:
    """Import ``module:attribute`` and return the ``replayq.App`` it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{spec!r}: use module:attribute, e.g. shop.jobs:app")
    app = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(app, replayq.App):
        raise CommandError(f"{spec!r} is not a replayq.App")
    return app


class Command(BaseCommand):
    help = "Run a replayq worker for settings.REPLAYQ_APP (or --app)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--app",
            default=None,
            help="module:attribute of your replayq.App (default: settings.REPLAYQ_APP).",
        )
        parser.add_argument("--concurrency", type=int, default=1, help="Jobs run at once.")
        parser.add_argument("--burst", action="store_true", help="Exit when no job is due.")
        parser.add_argument(
            "--burst-wait",
            type=float,
            default=0.0,
            help="With --burst: wait for jobs due within this many seconds.",
        )
        parser.add_argument("--queues", default=None, help="Comma-separated queues (default: all).")

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: the lazy settings object, held at module level, configures
        # itself on any attribute access (even isinstance), which fails without settings.
        from django.conf import settings

        spec = options["app"] or getattr(settings, "REPLAYQ_APP", None)
        if not spec:
            raise CommandError("set settings.REPLAYQ_APP = 'module:attribute' or pass --app")
        worker = replayq.Worker(
            load_app(spec),
            concurrency=options["concurrency"],
            burst=options["burst"],
            burst_wait=options["burst_wait"],
            queues=options["queues"].split(",") if options["queues"] else None,
        )
        stats = worker.run()
        self.stdout.write(
            f"worker {worker.worker_id}: leased={stats.leased} succeeded={stats.succeeded} "
            f"retried={stats.retried} dead={stats.dead}"
        )
