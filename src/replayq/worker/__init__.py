"""The worker: lease, heartbeat, run, classify, retry or bury, ack after commit, reap.

::

    worker/
    ├── process.py    Worker: run() starts the threads, the dispatcher loop (lease, reap,
    │                 periodic jobs, burst end), signals, stop, shutdown; jobs leased
    │                 ahead and not started are released at once (Observer.released);
    │                 a dispatcher that dies of a non-storage error stops the same way
    ├── core.py       WorkerCore: options, the in-flight table (InFlight), WorkerStats,
    │                 the thread events every part shares
    ├── lease.py      Leasing: lease for the free slots with job.leased, route the version,
    │                 hold a committed lease (heartbeat it, queue it)
    ├── heartbeat.py  Heartbeat: the thread that extends leases and sees cancel requests;
    │                 the renew of a held job whose lease may have run out before it starts
    ├── execute.py    Executing: the executor threads; a held job started only while its
    │                 lease is surely held (else renewed first, or dropped unrun if lost:
    │                 Observer.released); one whose start raised given back unstarted;
    │                 execute(): the inline path, the job forgotten once settled;
    │                 one attempt through its handler under a Context over a LiveWorld;
    │                 shadow comparisons
    ├── event_loop.py EventLoopThread: the one asyncio loop every async def handler runs on
    ├── outcome.py    Outcomes: cancelled, failed (retry or dead), buried
    ├── acks.py       Acking: succeeded; acks buffered in memory, committed in groups (each
    │                 a compare-and-set on its owner token) with the lease of the freed slots
    ├── settle.py     Settling: one compare-and-set transaction per outcome, retried while
    │                 the database is away; write.rejected when the lease is gone
    └── reap.py       Reaping: expired leases re-delivered, buried or cancelled

    Worker ─┬▶ Reaping ──────────────┐
            └▶ Executing ─┬▶ Acking ─┴▶ Outcomes ─┬▶ Settling ─┬▶ WorkerCore
                          │                       └▶ Leasing ──┤
                          └▶ Heartbeat ────────────────────────┘

Each part is a class the next one builds on (the arrows); ``Worker`` is all of
them, so the threads and the job's state machine read apart while sharing one
in-flight table. Imports: ``rollout``, ``observe``, ``recording``, the runtime,
the queue, storage and the foundations; the worker sits beside ``app.py``, and
nothing below imports it.
"""

from replayq.worker.core import InFlight, WorkerStats
from replayq.worker.process import Worker

__all__ = ["InFlight", "Worker", "WorkerStats"]
