"""The replay engine: trace replay, dry-run, fork, rerun, rollback, diff."""
