"""The queue: job types, their contracts, and each job's lifecycle.

::

    queue/
    ├── contracts.py   JobContract, Retry: declared, validated, frozen per version;
    │                  diff_contracts, lint_contract
    ├── handlers.py    Handler (contract + function + payload shape), HandlerRegistry
    ├── lifecycle.py   the lifecycle event names and their builder (job.enqueued, job.leased, ...)
    ├── enqueue.py     EnqueueRequest, insert_job (row + job.enqueued in one transaction), get_job
    ├── catalog.py     register_contracts, stored_contracts
    ├── actions.py     one job: cancel_job, requeue_job (App.cancel, App.requeue)
    ├── bulk.py        the same over a JobMatch filter, previewed, in batches (App.bulk)
    ├── resources.py   resource_trace: a resource's events across jobs (App.resource_trace)
    ├── inspection.py  JobsFacade: the App's methods that read jobs and act on them
    ├── schedule.py    Schedule (@app.periodic), MissedSlots, decide_slots: which slots are due
    ├── periodic.py    periodic_decorator: the body of @app.periodic
    └── scheduler.py   Scheduler: each due slot enqueued once (anchor compare-and-set)

Imports: storage and the foundations; ``replayq.runtime`` shares this layer
(it is the queue's composition: registry, storage, clocks).
"""
