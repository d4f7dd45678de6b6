"""Example applications built on replayq (importable from a source checkout)."""
