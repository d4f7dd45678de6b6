"""The replay engine: the four modes of seed 000, and what surrounds them.

::

    replay/
    ├── recorded.py   Recording (one attempt read back, or a batch of them), RecordedWorld
    ├── engine.py     trace_replay, dry_run, fork (the public verbs)
    ├── compare.py    signatures, the first divergence (as the run goes), ReplayReport
    ├── run.py        a handler run against a recording on its branch, sealed; BufferedContext
    ├── bulk.py       dry_run_many: batches, one handler, worker processes (worker_process.py)
    ├── quick.py      a verification's quick check: the handler against its recording, no events
    ├── rerun.py      guarded real re-execution: GatedWorld, rerun, rerun_many
    ├── rollback.py   plan_rollback, rollback, compensate
    ├── diff.py       diff_traces, render
    ├── export.py     export_case, import_case, replay_case_file (regression cases)
    ├── signals.py    the seed-003 signals counted from the trace
    └── window.py     questions across jobs by time: events in an HLC window, signals per bucket

Imports: recording and everything below it. Nothing below imports this package.
"""
