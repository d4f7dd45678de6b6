"""Bulk dry-run: many recorded jobs, one loaded handler, recordings read in batches.

``dry_run_many`` is ``dry_run`` of each job, cheaper per job: the handler is chosen
once per (job type, recorded version), the recordings of ``BATCH`` jobs are read in
one read transaction, and with ``keep=True`` the derived traces of a batch are
written in one transaction. With ``keep=False`` each job is first run through the quick
check (``replay.quick``: no events built); only a job it cannot vouch for runs the full
dry-run. ``processes > 1`` runs the batches in that many worker
processes (``python -m replayq.replay.worker_process``): each is a fresh interpreter
(never a fork of this one, whatever threads it runs), imports the application named
by ``app`` (``module:attribute``, as ``--app`` takes it), opens its own connection to
the same database and dry-runs sealed, like this process would. Batches and reports
travel as JSON lines over the worker's stdin and stdout. The worker processes stay
alive for the next call on the same database and application (``_Pool``), so a caller
that dry-runs in many small calls pays their start-up once.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import selectors
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from replayq import errors
from replayq.errors import ReplayqError
from replayq.queue.handlers import Handler
from replayq.replay.compare import ReplayReport
from replayq.replay.quick import quick_check
from replayq.replay.recorded import load_recording, load_recordings
from replayq.replay.run import Deferred, choose_handler, derived_names, dry_run_recording
from replayq.runtime import Runtime, RuntimeSource

# Jobs whose recordings are read in one transaction (and, kept, written in one).
BATCH = 50
# Batches a worker process holds at once: the one it runs and the next.
IN_FLIGHT = 2

OnError = Callable[[int, ReplayqError], None]
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Options:
    """What every job of a bulk dry-run is run with."""

    version: str | None = None
    handler: str | None = None
    allow_io: bool = False
    keep: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def dry_run_many(
    source: RuntimeSource,
    job_ids: Sequence[int],
    *,
    version: str | None = None,
    handler: str | None = None,
    allow_io: bool = False,
    keep: bool = True,
    processes: int = 1,
    app: str | None = None,
    on_error: OnError | None = None,
    progress: Progress | None = None,
) -> list[ReplayReport]:
    """``dry_run`` of each job (its last recorded attempt), reports in the order given.

    One handler is chosen per (job type, recorded version) and reused; recordings are
    read ``BATCH`` jobs per read transaction; the runs share one connection. Each run
    is sealed as ``dry_run`` is. ``keep=False`` writes nothing (verification: the
    reports are the result); a job its quick check (``replay.quick``) finds the same as
    recorded gets its report without events (``matched_in_memory``), every other job the
    full dry-run's report. ``keep=True`` writes each job's derived trace, branch and
    lineage, a batch's in one transaction (one that a constraint of replayq's own tables
    refuses is written job by job: a job refused again reports it, as ``dry_run`` does).

    ``processes > 1`` splits the batches over that many worker processes, fresh
    interpreters that import ``app`` (``module:attribute`` naming the ``App`` whose
    handlers to run; default: the module attribute that is ``source`` itself, if
    there is one) and open their own connection to this database; they stay up for
    the next call on the same database and application (``close_workers`` ends
    them). Without an importable application the jobs run here, one batch after
    another; while they do, Python's cyclic garbage collector is paused (the youngest
    generation is collected after each batch instead) and given back when the call
    returns or raises.

    A job that cannot be replayed (missing, nothing recorded) raises its
    ``ReplayqError``; with ``on_error(job_id, error)`` it is passed there instead and
    left out of the reports. ``progress(n)`` is called as each batch of ``n`` jobs is
    done. Every argument after ``job_ids`` is keyword-only and optional, so callers
    written for the first form (``version``, ``handler``, ``allow_io``, ``keep``,
    ``processes``) keep working.
    """
    ids = list(job_ids)
    options = Options(version=version, handler=handler, allow_io=allow_io, keep=keep)
    spec = (app or _module_attribute(source)) if processes > 1 and len(ids) > 1 else None
    if spec is not None:
        return _in_processes(source.runtime, spec, ids, options, processes, on_error, progress)
    return run_batches(source.runtime, ids, options, on_error, progress)


def run_batches(
    runtime: Runtime,
    ids: list[int],
    options: Options,
    on_error: OnError | None,
    progress: Progress | None,
) -> list[ReplayReport]:
    """Dry-run ``ids`` here, ``BATCH`` at a time."""
    chosen: dict[tuple[str, str | None], Handler] = {}
    reports: list[ReplayReport] = []
    with _collected_per_batch() as batch_done:
        for start in range(0, len(ids), BATCH):
            batch = ids[start : start + BATCH]
            _run_batch(runtime, batch, options, chosen, reports, on_error)
            batch_done()
            if progress is not None:
                progress(len(batch))
    return reports


def _run_batch(
    runtime: Runtime,
    batch: list[int],
    options: Options,
    chosen: dict[tuple[str, str | None], Handler],
    reports: list[ReplayReport],
    on_error: OnError | None,
) -> None:
    """Dry-run one batch: its recordings read in one transaction, kept writes in one."""
    deferred = Deferred() if options.keep else None
    for job_id, loaded in zip(batch, load_recordings(runtime, batch), strict=True):
        if isinstance(loaded, ReplayqError):
            if on_error is None:
                raise loaded
            on_error(job_id, loaded)
            continue
        which = (loaded.job.job_type, loaded.job.handler_version)
        if which not in chosen:
            chosen[which] = choose_handler(runtime, loaded, options.version, options.handler)
        handler = chosen[which]
        if not options.keep and not options.allow_io:
            quick = quick_check(runtime, loaded, handler, derived_names("replay"))
            if quick is not None:
                reports.append(quick)
                continue
            # The full dry-run on a recording of its own: the quick run's handler may have
            # changed the values it was handed (recorded state, responses) in place.
            try:
                loaded = load_recording(runtime, job_id, loaded.attempt)
            except ReplayqError as exc:  # gone since the batch was read
                if on_error is None:
                    raise
                on_error(job_id, exc)
                continue
        reports.append(
            dry_run_recording(
                runtime,
                loaded,
                handler,
                allow_io=options.allow_io,
                keep=options.keep,
                deferred=deferred,
            )
        )
    if deferred is not None:
        deferred.commit(runtime)


@contextlib.contextmanager
def _collected_per_batch() -> Iterator[Callable[[], None]]:
    """Python's cyclic garbage collector paused for the run, a young-generation collection
    after each batch instead.

    A dry-run leaves no reference cycles of its own (``BufferedContext.release``), but the
    reports it keeps are containers, and the automatic collections kept scanning all of them
    (over 1,000 jobs about a quarter of the run's CPU). Cycles a handler makes are
    still collected, a batch at a time. Nothing changes when the collector was off already.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()

    def batch_done() -> None:
        if paused:
            gc.collect(0)

    try:
        yield batch_done
    finally:
        if paused:
            gc.enable()


def _module_attribute(source: RuntimeSource) -> str | None:
    """``module:attribute`` of a module-level name bound to ``source`` (or its runtime)."""
    runtime = source.runtime
    # A script's own module (``__main__``) is not importable by name in a fresh process.
    modules = {h.fn.__module__ for h in runtime.registry.handlers()} - {"__main__"}
    for name in sorted(modules):
        module = sys.modules.get(name)
        if module is None:
            continue
        for attribute, value in vars(module).items():
            if value is source or getattr(value, "runtime", None) is runtime:
                return f"{name}:{attribute}"
    return None


class _Worker:
    """One worker process and the batches it was sent, oldest (the one it runs) first."""

    def __init__(self, url: str, spec: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replayq.replay.worker_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        self.batches: deque[list[int]] = deque()
        self.send({"url": url, "app": spec})

    @property
    def stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError as exc:
            # It no longer reads its input (it exited, or closed it): its batches are
            # lost, as when its output ends (``_in_processes``).
            raise ReplayqError(
                f"a dry-run worker process stopped reading its work ({exc.strerror}) "
                f"with {sum(len(b) for b in self.batches)} job(s) unfinished; "
                "see its error output"
            ) from exc

    def close(self, *, kill: bool = False) -> None:
        """End the process (it exits at the end of its input) and close its pipes."""
        process = self.process
        if kill:
            process.kill()
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


class _Pool:
    """The worker processes of the last (database, application) a bulk dry-run used.

    They stay alive between ``dry_run_many`` calls (a worker's start-up — a fresh
    interpreter importing the application — costs more than a batch of dry-runs), are
    ended when another database or application is asked for, after an error, and at
    exit. A worker whose process has exited is replaced.
    """

    def __init__(self) -> None:
        self.key: tuple[str, str] | None = None
        self.workers: list[_Worker] = []

    def take(self, url: str, spec: str, count: int) -> list[_Worker]:
        if self.key != (url, spec):
            self.close()
            self.key = (url, spec)
        self.workers = [w for w in self.workers if w.process.poll() is None]
        while len(self.workers) < count:
            self.workers.append(_Worker(url, spec))
        return self.workers[:count]

    def close(self, *, kill: bool = False) -> None:
        workers, self.workers, self.key = self.workers, [], None
        for worker in workers:
            worker.close(kill=kill)


_POOL = _Pool()
atexit.register(_POOL.close)


def close_workers() -> None:
    """End the bulk dry-run's worker processes now (they are ended at exit otherwise)."""
    _POOL.close()


def _in_processes(
    runtime: Runtime,
    spec: str,
    ids: list[int],
    options: Options,
    processes: int,
    on_error: OnError | None,
    progress: Progress | None,
) -> list[ReplayReport]:
    """Hand out batches to worker processes; reports in ``ids`` order.

    Each worker holds up to ``IN_FLIGHT`` batches, the next one waiting in its input while
    it runs the first, so that it never waits for this process to read its answer and
    send more work (on a busy machine this process may not run for a while).
    """
    size = max(1, min(BATCH, -(-len(ids) // processes)))
    todo = deque(ids[n : n + size] for n in range(0, len(ids), size))
    done: dict[int, ReplayReport] = {}
    failed: list[tuple[int, ReplayqError]] = []
    selector = selectors.DefaultSelector()
    setup = options.to_dict()
    busy = 0

    def hand_out(worker: _Worker) -> None:
        batch = todo.popleft()
        worker.batches.append(batch)
        worker.send({"ids": batch, "options": setup})

    try:
        workers = _POOL.take(runtime.url, spec, min(processes, len(todo)))
        for worker in workers:
            worker.batches.clear()
            selector.register(worker.stdout, selectors.EVENT_READ, worker)
            busy += 1
        for _ in range(IN_FLIGHT):  # one batch each first: every worker gets work
            for worker in workers:
                if todo:
                    hand_out(worker)
        while busy:
            for key, _ in selector.select():
                worker = key.data
                line = worker.stdout.readline()
                if not line:
                    unfinished = sum(len(b) for b in worker.batches)
                    raise ReplayqError(
                        f"a dry-run worker process exited ({worker.process.wait()}) "
                        f"with {unfinished} job(s) unfinished; see its error output"
                    )
                batch = worker.batches.popleft()
                for job_id, entry in zip(batch, json.loads(line), strict=True):
                    if "report" in entry:
                        done[job_id] = ReplayReport.from_dict(entry["report"])
                    else:
                        failed.append((job_id, _error(entry)))
                if failed and on_error is None:
                    raise failed[0][1]
                if progress is not None:
                    progress(len(batch))
                if todo:
                    hand_out(worker)
                elif not worker.batches:
                    selector.unregister(worker.stdout)
                    busy -= 1
    finally:
        selector.close()
        if busy:
            _POOL.close(kill=True)  # an error above: the rest of the work is abandoned
    for job_id, error in failed:
        assert on_error is not None
        on_error(job_id, error)
    return [done[job_id] for job_id in ids if job_id in done]


def _error(entry: dict[str, Any]) -> ReplayqError:
    """The ``ReplayqError`` a worker process reported, as its own class where it is one."""
    kind = getattr(errors, str(entry.get("error_type")), None)
    message = str(entry.get("error"))
    if isinstance(kind, type) and issubclass(kind, ReplayqError):
        try:
            return kind(message)
        except TypeError:
            pass
    return ReplayqError(message)


def serve(lines: IO[str], out: IO[str]) -> None:
    """A worker process's loop: the set-up line, then a batch per line (``ids`` and the
    ``options`` to run them with), until its input ends.

    Answers one line per batch: for each job, ``{"report": ...}`` or
    ``{"error": ..., "error_type": ...}``, in the batch's order.
    """
    import importlib

    from msgspec import structs

    setup = json.loads(lines.readline())
    module_name, _, attribute = str(setup["app"]).partition(":")
    found = getattr(importlib.import_module(module_name), attribute)
    base: Runtime = found.runtime
    # The application's handlers, on the parent's database, with connections of its own.
    runtime = structs.replace(base, url=setup["url"], _opened=type(base._opened)())
    try:
        for line in lines:
            message = json.loads(line)
            options = Options(**message["options"])
            answers = _answers(runtime, message["ids"], options)
            out.write(json.dumps(answers, default=str) + "\n")
            out.flush()
    finally:
        runtime.close()


def _answers(runtime: Runtime, batch: list[int], options: Options) -> list[dict[str, Any]]:
    """One entry per job of ``batch``: its report, or why it could not be replayed."""
    entries: dict[int, dict[str, Any]] = {}

    def failed(job_id: int, error: ReplayqError) -> None:
        entries[job_id] = {"error": str(error), "error_type": type(error).__name__}

    for report in run_batches(runtime, batch, options, failed, None):
        entries[report.job_id] = {"report": report.to_dict()}
    return [entries[job_id] for job_id in batch]
