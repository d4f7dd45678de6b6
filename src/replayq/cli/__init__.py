"""The ``replayq`` command line."""

from replayq.cli.main import main

__all__ = ["main"]
