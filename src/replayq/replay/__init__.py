"""The replay engine: the four modes of seed 000, and what surrounds them.

::

    replay/
    ├── recorded.py   Recording (one attempt read back), RecordedWorld (answers from it)
    ├── engine.py     trace_replay, dry_run, fork; first divergence; the seal around the handler
    ├── rerun.py      guarded real re-execution: GatedWorld, rerun, rerun_many
    ├── rollback.py   plan_rollback, rollback, compensate
    ├── diff.py       diff_traces, render
    ├── export.py     export_case, import_case, replay_case_file (regression cases)
    ├── signals.py    the seed-003 signals counted from the trace
    └── window.py     questions across jobs by time: events in an HLC window, signals per bucket

Imports: recording and everything below it. Nothing below imports this package.
"""
