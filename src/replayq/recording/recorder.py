"""What an attempt records before it commits: its pending events, writes and blobs.

``Recorder`` is the part of ``Context`` that builds the attempt's domain events,
holds them with the step's deferred writes until the step (or the ack) commits,
and commits them fenced by the job's lease (``commit_now``). Every value enters
the recording through ``redacted`` / ``encoded`` here. The views' own pending
writes (state, cache) join through three hooks the context fills in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

from replayq import codec
from replayq.errors import LeaseLostError, PayloadError
from replayq.model import Job, TraceEvent, set_event_dict
from replayq.recording.blobs import Encoded, put_bytes, ref_of
from replayq.redaction import Redactor
from replayq.runtime import Runtime
from replayq.storage.commits import CommitRefused, commit_at_once
from replayq.storage.protocol import TraceFence, Transaction

# The keys of a ``state.read`` event's data (``record_read``).
_READ_KEYS = ("exists", "branch")

_new_event = object.__new__


class PendingRecord:
    """What an attempt recorded since its last commit. A class with slots, not a dataclass:
    two are made per attempt (the context's, and its commit's fresh one), and the
    dataclass's ``__init__`` called ``list`` through a default factory four times each.

    ``events`` and ``blobs`` are one list each for the whole attempt, handed from each
    record to the next (``Recorder.committed``) with what a commit wrote cut from their
    front in place. A thread of the handler appends to them without a lock (one
    ``list.append``: every event takes this path), so the list it appends to must never be
    one a commit forgets, even while that commit runs in another thread. The other lists
    change under ``Recorder._pending_lock``."""

    __slots__ = (
        "blobs",
        "events",
        "flushed",
        "flushed_blobs",
        "marks",
        "releases",
        "unpipelined",
        "what",
        "writes",
    )

    def __init__(
        self,
        events: list[TraceEvent] | None = None,
        blobs: list[Callable[[Transaction], None]] | None = None,
    ) -> None:
        self.events: list[TraceEvent] = [] if events is None else events
        self.writes: list[Callable[[Transaction], None]] = []
        # Large recorded values (blob store rows) go with the events that name them: they
        # do not make a step commit on its own, and a failed step's events keep theirs.
        self.blobs: list[Callable[[Transaction], None]] = [] if blobs is None else blobs
        # How many of ``events`` and of ``blobs`` (from the front) the last ``flush`` wrote:
        # what ``committed`` cuts (one appended since stays for the next commit).
        self.flushed = self.flushed_blobs = 0
        # What each write is, for ``write.fenced`` ("state order:1", "outbox orders.paid").
        self.what: list[str] = []
        # The releases of locks let go of while writes under them waited (``defer_release``):
        # run after the writes, whether or not they are written.
        self.releases: list[Callable[[Transaction], None]] = []
        # Whether a write may not run in a pipelined commit (``Recorder.defer``).
        self.unpipelined = False
        # For each write made here while a step ran (in another flow: a thread or task
        # outside steps), by its place in ``writes``: how many writes each running step
        # held then (``Recorder._adopt_step_writes`` puts that step's writes around it).
        # ``None`` until one is (the usual case).
        self.marks: dict[int, dict[StepFlow, int]] | None = None


class StepFlow:
    """The outermost step running in one flow of an attempt (a thread; for an ``async
    def`` handler, an ``asyncio`` task), which holds the writes that flow's steps deferred
    so far: a ``StepBoundary`` (``recording.steps``), in ``Recorder._running`` while it
    runs. They commit with the commit of the step of that flow that ends next
    (``Recorder._adopt_step_writes``: the innermost, as a nested step's commit always took
    its flow's writes), or never (it failed, or still ran when its attempt ended)."""

    __slots__ = ("after", "step_keys", "step_names", "unpipelined", "what", "writes")

    # The writes (``None`` until the first: most steps write nothing), what each is, and
    # whether one may not run in a pipelined commit: as ``PendingRecord``'s.
    writes: list[Callable[[Transaction], None]] | None
    what: list[str]
    unpipelined: bool
    # What the flow's steps left for after their commit (cache writes: ``CacheView``), and
    # what each is; ``None`` until the first.
    after: list[tuple[Callable[[], None], str]] | None
    # The names and positions of the flow's running steps, innermost last: what its events
    # name as their step (``Recorder._event``), ``current_step`` and ``current_step_key``
    # (an outbox event's id). Per flow, as the writes: another thread's or task's step is
    # not this flow's. Empty while the outermost step records its end.
    step_names: list[str]
    step_keys: list[str]


class Recorder:
    """The pending record of one attempt, and its fenced commit (a base of ``Context``)."""

    runtime: Runtime
    job: Job
    worker_id: str
    owner_token: str | None
    redactor: Redactor
    blob_limit: int
    _pending: PendingRecord
    # The outermost step running in each flow of this attempt, by the flow's key
    # (``_flow_key()``: the thread's id; for an ``async def`` handler, the ``asyncio`` task,
    # or the thread's id outside one): a write made in a step waits there, not in
    # ``_pending``, which the next commit of any flow (another thread's step, the ack)
    # takes. So a step still running when the attempt ends (its body in a thread the
    # handler left), or one that fails, commits none of its writes. Empty while no step
    # runs: a write outside steps asks no key.
    _running: dict[object, StepFlow]
    _flow_key: Callable[[], object]
    # Held while the pending record's writes and releases change (a write made
    # outside steps, a step's writes merged in, a failed step's dropped) and by a commit
    # from its ``flush`` to its ``committed`` (``commit_now``), which puts a new record in
    # its place: what another thread of the handler defers meanwhile, outside any step,
    # lands either in what the commit wrote or in the next record, never in the one the
    # commit forgets. Events and blobs take no lock (``PendingRecord``). Reentrant: a
    # commit's ``committed`` defers the lock releases it kept (``defer_release``).
    _pending_lock: Any  # a ``threading.RLock``
    _seq: int
    # The fields every domain event of this attempt starts from (``_event``).
    _event_template: dict[str, Any] | None = None
    _trace_id: str

    @property
    def current_step(self) -> str | None:
        """The name of the innermost step running in this flow (thread, task), if any."""
        running = self._running
        flow = running.get(self._flow_key()) if running else None
        return flow.step_names[-1] if flow is not None and flow.step_names else None

    @property
    def owns_job_trace(self) -> bool:
        """Whether this run records into the job's own trace (not a replay, fork or rerun)."""
        return self._trace_id == self.job.trace_id

    def _views_pending(self) -> list[str]:
        """What the views (state, cache) would write at the next commit."""
        return []

    def _views_committed(self) -> None:
        """The views' pending writes committed."""

    def _views_discard(self) -> None:
        """A step failed: the views drop their pending writes."""

    # -- recording --------------------------------------------------------------------------

    def event(
        self,
        name: str,
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        hlc: int | None = None,
        **data: Any,
    ) -> TraceEvent:
        """Build the next domain event of this attempt (sequence numbered)."""
        return self._event(
            name,
            self.redactor.value(data),
            status,
            resource,
            resource_version,
            side_effect,
            output_ref,
            hlc,
        )

    def _event(
        self,
        name: str,
        data: dict[str, Any],
        status: str | None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        hlc: int | None = None,
        steps: Sequence[str] | None = None,
    ) -> TraceEvent:
        """``event`` with ``data`` as it is (already redacted). ``steps``: the names of the
        steps running in this flow, where the caller knows them (a step's own event: no
        look-up of the flow, ~1 K instructions each); else looked up."""
        self._seq = seq = self._seq + 1
        if steps is None:
            # The steps running in this flow (``StepFlow.step_names``); not asked while no
            # step runs in any flow.
            running = self._running
            if running:
                flow = running.get(self._flow_key())
                if flow is not None:
                    steps = flow.step_names
        # The HLC of the runtime is over the runtime's clock: its reading is ``ts``.
        if hlc is None:
            now, hlc = self.runtime.hlc.stamp()
        else:
            now = self.runtime.clock.now()
        # ``TraceEvent.built`` inlined (one call fewer an event): every field named. The
        # fields are a copy of the attempt's template (``_event_template``: what is the same
        # for each of its events, in the dataclass's order) with the rest set on it: a
        # copy of an 18-key dict is one ``memcpy``, where a dict display inserted each key
        # (~3 k instructions more an event, 17 events a traced 5-step job). The defaults
        # (``None``, ``False``) are the template's: set only when given.
        template = self._event_template
        fields = (template or self._new_event_template()).copy()
        fields["name"] = name
        fields["seq"] = seq
        if steps:
            # Already redacted: ``Context.step`` redacts a name where the step enters.
            fields["step"] = steps[-1]
        fields["ts"] = now
        fields["hlc"] = hlc
        if status is not None:
            fields["status"] = status
        if resource is not None:
            # Redacted as the step's name is (``Redactor.resource``: a name found clean
            # costs a set look-up): an entity keyed by a card number is ``card:[redacted:…]``
            # in the trace and its resource index; the state, lock and ledger keep the key.
            if resource not in self.redactor._clean_resources:
                resource = self.redactor.resource(resource)
            fields["resource"] = resource
        if resource_version is not None:
            fields["resource_version"] = resource_version
        if side_effect:
            fields["side_effect"] = side_effect
        if output_ref is not None:
            fields["output_ref"] = output_ref
        fields["data"] = data
        event = _new_event(TraceEvent)
        set_event_dict(event, fields)
        return event

    def unmake(self, event: TraceEvent) -> None:
        """``event``, built by ``event`` and never recorded, is dropped: when it is the last
        event built, its sequence number goes to the next one again. A block that
        ``commit_at_once`` runs again after a refusal built an event in the refused try
        that the careful one records later, after others, or not at all (an effect's
        existing record): unmade, its place in the attempt's sequence is as it was."""
        if event.seq == self._seq:
            self._seq -= 1

    def _new_event_template(self) -> dict[str, Any]:
        """This attempt's event template (``_event_template``, built at its first event):
        its domain events' fields, those that differ from event to event at their
        defaults (``job``, ``worker_id`` and the trace are the attempt's, set once)."""
        job, trace_id = self.job, self._trace_id
        template = self._event_template = {
            "trace_id": trace_id,
            # A derived trace (replay, fork) is not part of the job's own timeline.
            "job_id": job.id if trace_id == job.trace_id else None,
            "attempt": job.attempt,
            "kind": "domain",
            "name": "",
            "seq": 0,
            "step": None,
            "ts": 0.0,
            "hlc": 0,
            "worker_id": self.worker_id,
            "status": None,
            "resource": None,
            "resource_version": None,
            "side_effect": False,
            "input_ref": None,
            "output_ref": None,
            "data": None,
            "id": None,
        }
        return template

    def record(
        self,
        name: str,
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        hlc: int | None = None,
        **data: Any,
    ) -> TraceEvent:
        """Record a domain event; it commits with the step (or the ack)."""
        # ``event``'s body: its keyword arguments are not packed and unpacked again.
        event = self._event(
            name,
            self.redactor.value(data),
            status,
            resource,
            resource_version,
            side_effect,
            output_ref,
            hlc,
        )
        self._pending.events.append(event)
        return event

    def record_screened(
        self,
        name: str,
        screened: tuple[str, ...],
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        output_ref: str | None = None,
        **data: Any,
    ) -> TraceEvent:
        """``record`` where the fields named in ``screened`` hold values that came out of
        ``encoded`` or ``redacted`` in this same call (a call's request and response, a
        decision's value and reasons): they are redacted already and are not encoded and
        screened a second time. The other fields are redacted as any event's; a field of
        ``screened`` whose name is a secret field's (a user's rule) sends the whole data
        through ``redacted``, as ``record`` would."""
        # ``event_screened``'s body: its keyword arguments are not packed and unpacked again.
        event = self._event(
            name,
            self._screened_data(screened, data),
            status,
            resource,
            resource_version,
            False,
            output_ref,
        )
        self._pending.events.append(event)
        return event

    def event_screened(
        self,
        name: str,
        screened: tuple[str, ...],
        *,
        status: str | None = None,
        resource: str | None = None,
        resource_version: int | None = None,
        side_effect: bool = False,
        output_ref: str | None = None,
        **data: Any,
    ) -> TraceEvent:
        """``event`` (built, not recorded) with the fields of ``screened`` taken as they are,
        as ``record_screened`` takes them (an effect's result, out of ``encoded``)."""
        return self._event(
            name,
            self._screened_data(screened, data),
            status,
            resource,
            resource_version,
            side_effect,
            output_ref,
        )

    def _screened_data(self, screened: tuple[str, ...], data: dict[str, Any]) -> dict[str, Any]:
        """``data`` redacted, its fields named in ``screened`` left as they are (see
        ``record_screened``)."""
        redactor = self.redactor
        if not redactor._plain_keys.issuperset(screened) and redactor.any_secret_field(screened):
            return redactor.value(data)  # type: ignore[no-any-return]
        rest = {key: value for key, value in data.items() if key not in screened}
        clean = redactor.value(rest)
        if clean is rest:
            return data
        return {key: value if key in screened else clean[key] for key, value in data.items()}

    def record_step(
        self,
        name: str,
        status: str,
        data: dict[str, Any],
        output_ref: str | None = None,
        steps: Sequence[str] | None = None,
    ) -> TraceEvent:
        """Record a step's own event (``step.started``, ``step.finished``...); ``steps``, the
        names of the steps running in its flow (it belongs to the innermost), as ``_event``.

        Its data is replayq's: the step's name, its duration, and values the step
        already recorded redacted (its result through ``encoded``, its error through
        ``redactor.error``). So the name is screened as a text and the keys as field
        names, and the value is not walked again; a key that names a secret field
        (a user's rule) sends it through ``redacted`` as any event's data.
        """
        redactor = self.redactor
        # ``any_secret_field`` and ``short_text`` asked only for keys and a name not known
        # clean yet (their own first look, inlined: every step passes here twice).
        if not redactor._plain_keys.issuperset(data) and redactor.any_secret_field(data):
            return self.record(name, status=status, output_ref=output_ref, **data)
        step_name = data["step_name"]
        if step_name not in redactor._clean_texts:
            data["step_name"] = redactor.short_text(step_name)
        event = self._event(name, data, status, output_ref=output_ref, steps=steps)
        self._pending.events.append(event)
        return event

    def record_read(self, resource: str, version: int, exists: bool, branch: str) -> TraceEvent:
        """Record ``state.read`` (it commits with the step, or the ack).

        Its data is replayq's: whether the entity exists and the branch's name. So the
        name is screened as a short text (``short_text``, as a step's name) and the keys
        as field names, without ``record``'s keyword packing and value walk; a user's
        rule naming one of the keys sends it through ``record``, as any event's data.
        """
        redactor = self.redactor
        if not redactor._plain_keys.issuperset(_READ_KEYS) and redactor.any_secret_field(
            _READ_KEYS
        ):
            return self.record(
                "state.read",
                resource=resource,
                resource_version=version,
                exists=exists,
                branch=branch,
            )
        if branch not in redactor._clean_texts:
            branch = redactor.short_text(branch)
        data = {"exists": exists, "branch": branch}
        event = self._event("state.read", data, None, resource, version)
        self._pending.events.append(event)
        return event

    def defer(
        self, write: Callable[[Transaction], None], what: str = "write", *, pipelines: bool = False
    ) -> None:
        """Run ``write(tx)`` in the transaction that commits the current step.

        ``what`` names the write in ``write.fenced`` should the lease be gone by then.
        ``pipelines=True``: ``write`` runs replayq's own verbs alone, so the commit that
        runs it may be pipelined (``commit_now``); any other write (the application's
        code, ``ctx.db_write``; a child job's enqueue) keeps that commit out of pipeline
        mode.
        """
        running = self._running
        if running:
            flow = running.get(self._flow_key())
            if flow is not None:  # in a step of this flow: the write waits for its end
                writes = flow.writes
                if writes is None:
                    writes = flow.writes = []
                    flow.what, flow.unpipelined = [], False
                writes.append(write)
                flow.what.append(what)
                if not pipelines:
                    flow.unpipelined = True
                return
        # Into the attempt's pending record, with what it is and its mark, at once: not
        # across another flow's commit (``_pending_lock``).
        with self._pending_lock:
            pending = self._pending
            if running:
                # Outside steps in this flow while steps run in others (a thread or task one
                # of them started, maybe): where it goes among their writes
                # (``_adopt_step_writes``).
                if pending.marks is None:
                    pending.marks = {}
                pending.marks[len(pending.writes)] = {
                    held: len(held.writes or ()) for held in list(running.values())
                }
            pending.writes.append(write)
            pending.what.append(what)
            if not pipelines:
                pending.unpipelined = True

    def _adopt_step_writes(
        self, flow: StepFlow, writes: list[Callable[[Transaction], None]]
    ) -> None:
        """A step of ``flow`` ended: ``writes``, the flow's (taken from it), join the
        attempt's pending record for the commit that follows at once (the step's), in the
        order all were made: a thread or task the step started may have written outside
        any step of its own meanwhile (a write on top of the step's own comes after it).
        Under ``_pending_lock``: such a write is not made while the lists are rebuilt."""
        # ``acquire``/``release``, not ``with``: half the instructions, on every step that
        # writes.
        lock = self._pending_lock
        lock.acquire()
        try:
            pending = self._pending
            marks = pending.marks
            if marks is None:
                pending.writes += writes
                pending.what += flow.what
            else:
                # Each pending write after the flow's writes made before it (its mark); one made
                # while no step ran, or before this one began, before all of them. The commit
                # that follows resets ``pending``: the marks are not needed again.
                merged: list[tuple[Callable[[Transaction], None], str]] = []
                ours = list(zip(writes, flow.what, strict=True))
                taken = 0
                for at, theirs in enumerate(zip(pending.writes, pending.what, strict=True)):
                    before = marks.get(at, {}).get(flow, 0)
                    merged += ours[taken:before]
                    taken = max(taken, before)
                    merged.append(theirs)
                merged += ours[taken:]
                pending.writes = [entry[0] for entry in merged]
                pending.what = [entry[1] for entry in merged]
                pending.marks = None
            if flow.unpipelined:
                pending.unpipelined = True
        finally:
            lock.release()

    def _defer_after_commit(self, action: Callable[[], None], what: str) -> bool:
        """Hold ``action`` (a cache write, after the commit: ``CacheView``) for the end of
        the step running in this flow, as ``defer`` holds a write; ``False`` when no step
        runs in it (the caller keeps it for the attempt's next commit)."""
        running = self._running
        if not running:
            return False
        flow = running.get(self._flow_key())
        if flow is None:
            return False
        if flow.after is None:
            flow.after = []
        flow.after.append((action, what))
        return True

    def _in_step(self) -> bool:
        """Whether a step runs in this flow (what it holds waits in the flow, not in the
        pending record another flow's commit flushes)."""
        running = self._running
        return bool(running) and self._flow_key() in running

    def _steps_hold(self) -> bool:
        """Whether a step running in any flow holds a write or a cache action."""
        return any(flow.writes or flow.after for flow in list(self._running.values()))

    def _step_writes(self) -> list[Callable[[Transaction], None]]:
        """The writes waiting in running steps, in every flow."""
        writes: list[Callable[[Transaction], None]] = []
        for flow in list(self._running.values()):
            writes += flow.writes or ()
        return writes

    def defer_release(self, release: Callable[[Transaction], None]) -> None:
        """Run ``release(tx)`` (a lock's release, replayq's own verbs) in the next commit of
        this attempt, after its writes, and whether or not they are written: a failed
        step's commit or the attempt's failure releases it as well as a step's commit."""
        with self._pending_lock:
            self._pending.releases.append(release)

    def fenced_by(self, resource: str, fencing_token: int) -> bool:
        """Whether a pending write carries ``fencing_token`` of the lock on ``resource``: a
        state write's ``fences`` (no other write is fenced by a lock)."""
        return self._fenced([*self._pending.writes, *self._step_writes()], resource, fencing_token)

    def _fenced_in_step(self, resource: str, fencing_token: int) -> bool:
        """Whether a write carrying ``fencing_token`` of the lock on ``resource`` waits in a
        step still running (in any flow): not in the next commit unless it is that step's,
        so the lock's release waits for a later one (``LockReleases._release_waiting``)."""
        return bool(self._running) and self._fenced(self._step_writes(), resource, fencing_token)

    @staticmethod
    def _fenced(
        writes: list[Callable[[Transaction], None]], resource: str, fencing_token: int
    ) -> bool:
        """Whether one of ``writes`` carries ``fencing_token`` of the lock on ``resource``."""
        return any(getattr(write, "fences", {}).get(resource) == fencing_token for write in writes)

    def amend(self, event: TraceEvent, amended: TraceEvent) -> None:
        """The pending ``event`` replaced by ``amended`` (its place in the sequence kept): a
        pending release's event once its commit knows how the release went."""
        events = self._pending.events
        for at, pending in enumerate(events):
            if pending is event:
                events[at] = amended
                return

    # -- fencing ----------------------------------------------------------------------------

    def lease_held(self, tx: Transaction) -> bool:
        """Whether this context's owner token still holds the job's lease, inside ``tx``.

        Contexts without an owner token (replays, reruns) hold no lease and are not
        fenced by one. On PostgreSQL the job row stays locked until ``tx`` ends.
        """
        if self.owner_token is None:
            return True
        return tx.lease_check(self.job.id, self.owner_token)

    def trace_fence(self) -> TraceFence | None:
        """The lease this context's writes are fenced by (``None`` without an owner token)."""
        if self.owner_token is None:
            return None
        return TraceFence(self.job.id, self.owner_token)

    def fence(self, tx: Transaction, refused: list[str], **details: Any) -> None:
        """Raise ``LeaseLostError`` in ``tx`` unless the lease is held; the refusal is traced.

        The ``write.fenced`` event waits with the attempt's other events (``tx`` is
        about to roll back) and commits with the attempt's failure or rejection.
        """
        if not self.lease_held(tx):
            self.refuse(refused, **details)

    def append_fenced(
        self, tx: Transaction, events: list[TraceEvent], refused: list[str], **details: Any
    ) -> None:
        """``tx.trace_append(events)`` as the fence of ``tx``'s writes: the lease check is
        the statement that writes the events (no statement of its own). Without the lease
        nothing is appended and ``LeaseLostError`` is raised, as ``fence`` raises it."""
        if not tx.trace_append(events, self.trace_fence()):
            self.refuse(refused, **details)

    def refuse(self, refused: list[str], **details: Any) -> NoReturn:
        """Trace ``write.fenced`` and raise ``LeaseLostError``: the lease is gone."""
        self.record_fenced(refused, **details)
        raise LeaseLostError(
            f"job {self.job.id} attempt {self.job.attempt}: the lease was taken by another "
            f"worker; refused: {', '.join(refused)}"
        )

    def record_fenced(self, refused: list[str], **details: Any) -> TraceEvent:
        """Record ``write.fenced``: what the database refused because the lease is gone."""
        return self.record(
            "write.fenced",
            status="rejected",
            refused=refused,
            reason="owner token no longer holds the job's lease",
            owner_token=self.owner_token,
            **details,
        )

    def ride_along(self) -> list[TraceEvent]:
        """Pending events that may commit in a transaction the attempt opens now (an
        effect's claim or result), so that they need no commit of their own. None while
        a write is pending (the attempt's, or a running step's in any thread, a cache
        write too): a step's events commit with that step's writes."""
        pending = self._pending
        if pending.blobs or pending.releases or self.pending_writes():
            return []
        if self._running and self._steps_hold():
            return []
        return pending.events.copy()

    def rode(self, events: list[TraceEvent]) -> None:
        """``events`` (from ``ride_along``) committed: they are no longer pending. Taken
        out of the list in place: an event another thread appends meanwhile stays."""
        if events:
            pending = self._pending.events
            rode = len(events)
            if len(pending) >= rode and pending[rode - 1] is events[-1]:
                # What ``ride_along`` returned, all that was pending then (the usual case:
                # nothing but appends since, each commit of the attempt being under
                # ``_live``, as this effect's).
                del pending[:rode]
                return
            gone = {id(e) for e in events}
            held = len(pending)
            pending[:held] = [e for e in pending[:held] if id(e) not in gone]

    def pending_writes(self) -> list[str]:
        """What the next commit would write (for ``write.fenced``)."""
        return [*self._pending.what, *self._views_pending()]

    def redacted(self, value: Any) -> Any:
        """``value`` with its secrets replaced by markers (``replayq.redaction``).

        The one boundary where values enter the recording: every event's data and
        every encoded value (blobs, effect results, step results) pass through here.
        """
        return self.redactor.value(value)

    def encode(self, value: Any, *, what: str) -> tuple[Any, str | None, bytes | None]:
        """Check a recorded value: JSON only, under the blob limit; large ones go to blobs."""
        inline, ref, raw, _ = self.encoded(value, what=what)
        return inline, ref, raw

    def encoded(self, value: Any, *, what: str) -> Encoded:
        """``encode``, keeping the canonical text: the value is walked and serialised once
        here; the size check, the version row, the blob and its hash reuse the text."""
        return self._sized(*self._redacted_text(value, what), what)

    def encoded_as_written(self, value: Any, *, what: str) -> tuple[Encoded, Encoded]:
        """``encoded`` (redacted: for the trace) and the value as written, for a store the
        application reads back (``ctx.state``: docs/secrets.md leaves its values alone).
        The same ``Encoded`` twice when redaction changed nothing (the usual case: one
        walk, one serialisation); else the value is serialised again as it is."""
        redacted, text = self._redacted_text(value, what)
        traced = self._sized(redacted, text, what)
        if redacted is value:
            return traced, traced
        return traced, self._sized(value, codec.dumps(value, what=what), what)

    def _redacted_text(self, value: Any, what: str) -> tuple[Any, str]:
        try:
            # A partial, not a lambda: called in C, no Python frame of its own.
            return self.redactor.encoded_keyed(value, partial(codec.dumps_keyed, what=what))
        except PayloadError as exc:
            raise PayloadError(f"{what} cannot be recorded: {exc}") from exc

    def _sized(self, value: Any, text: str, what: str) -> Encoded:
        """``text`` (``value``'s) inline or for the blob store, by its size."""
        raw = text.encode()
        size = len(raw)
        if size > self.blob_limit:
            raise PayloadError(
                f"{what}: {size} bytes is above the blob limit of {self.blob_limit} bytes"
            )
        if size <= self.runtime.limits.inline_limit_bytes:
            return Encoded(value, None, None, text)
        return Encoded(None, ref_of(raw), raw, text)

    def store_blob(self, raw: bytes | None, what: str, ref: str | None = None) -> None:
        """Schedule a large value for the blob store: it commits with the events (the next
        commit of the attempt, whether or not the step's writes commit)."""
        if raw is None:
            return
        now = self.runtime.clock.now()
        limit = self.blob_limit

        def write(tx: Transaction) -> None:
            put_bytes(tx, raw, now=now, limit=limit, what=what, ref=ref)

        # Before the event that names it is recorded: a flush, which counts the events
        # before the blobs, writes it with that event (``flush``).
        self._pending.blobs.append(write)

    def flush(
        self,
        tx: Transaction,
        *,
        failed: bool = False,
        fence: TraceFence | None = None,
        events_to: list[TraceEvent] | None = None,
    ) -> bool:
        """Write what is pending into ``tx``: events, their blobs and lock releases always;
        writes unless the attempt failed. With ``fence``, ``False`` (the events not
        appended) when the lease is gone: the caller must then roll ``tx`` back. With
        ``events_to`` the events are added to that list instead: the caller appends them
        with others (a group commit's, in one ``trace_append``).

        The events and blobs written are those pending as it starts (counted: ``committed``
        cuts them), not one another thread records meanwhile.
        No write may join the record from here to ``committed``, or it would be forgotten
        with it: a caller while the handler may still record holds ``_pending_lock`` from
        here to ``committed`` (``commit_now``).
        """
        pending = self._pending
        events = pending.events
        # The events counted before the blobs: an event's blob was stored before it
        # (``store_blob``), so a blob an event written names is written.
        count = pending.flushed = len(events)
        blobs = pending.blobs
        if blobs:
            stored = blobs.copy()
            pending.flushed_blobs = len(stored)
            for blob in stored:
                blob(tx)
        if not failed:
            for write in pending.writes:
                write(tx)
        # After the writes they guarded, so that no one takes the lock before they land;
        # a release may amend its pending event (``amend``): before the events are read.
        for release in pending.releases:
            release(tx)
        written = events.copy()
        if len(written) != count:
            del written[count:]  # recorded by another thread since: for the next commit
        if events_to is not None:
            events_to.extend(written)
            return True
        return tx.trace_append(written, fence)

    def pending_write_calls(self) -> list[Callable[[Transaction], None]]:
        """The writes the next commit would run, in order."""
        return [*self._pending.blobs, *self._pending.writes]

    def take_pending(self, *, failed: bool = False) -> tuple[list[Any], list[TraceEvent]]:
        """Hand over what is pending — writes (none if ``failed``) and events — instead of
        committing it now; for a caller that commits them later (a dry-run, which holds no
        real lock: no release waits in it)."""
        with self._pending_lock:
            pending = self._pending
            events, blobs = pending.events.copy(), pending.blobs.copy()
            pending.flushed, pending.flushed_blobs = len(events), len(blobs)
            self.committed()
            if failed and pending.writes:
                self._keep_writes(pending)
        return [*blobs, *([] if failed else pending.writes)], events

    def committed(self) -> None:
        """The transaction that ``flush`` wrote into has committed: forget what it held; of
        the events and blobs, those it wrote (cut from the front of their lists, in place:
        another thread may be appending to them)."""
        pending = self._pending
        events, blobs = pending.events, pending.blobs
        del events[: pending.flushed]
        if blobs:
            del blobs[: pending.flushed_blobs]
        self._pending = PendingRecord(events, blobs)
        self._views_committed()

    def _keep_writes(self, pending: PendingRecord) -> None:
        """``pending`` was committed as failed (``committed`` since, under ``_pending_lock``):
        its writes, not written, stay pending. The failed step's were dropped before it
        (``_discard_step_writes``): these are another flow's, made outside steps since (a
        thread of the handler's), for the next commit."""
        kept = self._pending
        kept.writes, kept.what, kept.marks = pending.writes, pending.what, pending.marks
        kept.unpipelined = pending.unpipelined

    def discard_writes(self) -> None:
        """A step failed: its writes never happen; its events are kept for the record, and
        the releases of locks that guarded them still run at the next commit."""
        with self._pending_lock:
            pending = self._pending
            pending.writes.clear()
            pending.what.clear()
            pending.marks = None
            self._views_discard()

    def _discard_step_writes(self, dropped: list[Callable[[Transaction], None]] | None) -> None:
        """A step failed (or its commit was refused): ``discard_writes``, and ``dropped``, its
        flow's writes, are gone too. While another thread's or task's step still holds
        writes, the views forget only what these writes put (``ctx.state.get`` in that
        step still reads that step's own puts), not everything."""
        running = self._running
        if not running or not self._steps_hold():
            self.discard_writes()
            return
        with self._pending_lock:
            pending = self._pending
            gone = [*(dropped or ()), *pending.writes]
            resources = {getattr(write, "resource", None) for write in gone}
            pending.writes.clear()
            pending.what.clear()
            pending.marks = None
            self._views_discard_only(resources)

    def _views_discard_only(self, resources: set[str | None]) -> None:
        """A step failed while others run: the views drop what ``resources`` they put."""
        self._views_discard()

    def commit_now(self, *, failed: bool = False, refused: list[str] | None = None) -> None:
        """Commit what is pending in a transaction of its own (a step boundary).

        ``refused``: ``pending_writes()`` as the caller just asked it (a step's end),
        not asked again.

        The writes commit only if this context's owner token still holds the job's
        lease, checked in the database in the same transaction: the statement that
        appends the step's events checks it (``trace_append`` with a ``TraceFence``,
        no statement of its own; on PostgreSQL it keeps the job row as read until the
        commit). Once another worker took the job the writes are refused
        (``LeaseLostError``, traced as ``write.fenced``); the attempt's events are
        still kept. The events are appended after the writes, so a write's own check
        (a version conflict, a stale lock token: ``state.write_rejected``) refuses it
        first; the lease is then asked in the same transaction, and without it the
        error is always ``LeaseLostError``. Everything rolls back.

        On PostgreSQL the commit is one round trip (``commit_at_once``: ``BEGIN``, the
        writes, the fenced events and ``COMMIT`` behind one ``Sync``; six before
        pipelining, three after), each compare-and-set, each lock a write is under and
        the lease's fence refusing in the server; a refusal committed nothing, and the
        commit is made again the careful way (every result read before ``COMMIT``), which
        says what refused it as above. Not so when a pending write runs the
        application's code (``ctx.db_write``) or enqueues a child job (any ``defer``
        without ``pipelines=True``): those run on a connection out of pipeline mode, as
        they would anywhere.
        """
        if failed:
            refused = []
        elif refused is None:
            refused = self.pending_writes()
        fence = self.trace_fence() if refused else None
        lost = refused

        def commit(tx: Transaction) -> None:
            try:
                held = self.flush(tx, failed=failed, fence=fence)
            except CommitRefused:
                raise  # not an answer yet: commit_at_once asks again, every result read
            except Exception as exc:
                # A write's own check refused it (its event is recorded): without the
                # lease, the lease is the reason.
                if fence is None or self._held_after_failure(tx):
                    raise
                raise self._lost(lost) from exc
            if not held:
                raise self._lost(lost)

        # From the flush to ``committed``: nothing joins the record being committed after
        # the flush read it, to be forgotten with it (``_pending_lock``; ``acquire`` and
        # ``release``, not ``with``: half the instructions, at every commit).
        lock = self._pending_lock
        lock.acquire()
        try:
            pending = self._pending
            if pending.unpipelined:
                with self.runtime.storage.transaction() as tx:
                    commit(tx)
            else:
                commit_at_once(self.runtime.storage, commit)
            self.committed()
            if failed and pending.writes:
                self._keep_writes(pending)
        finally:
            lock.release()

    def _lost(self, refused: list[str]) -> LeaseLostError:
        """The error of a commit refused because the lease is gone (built only then)."""
        return LeaseLostError(
            f"job {self.job.id} attempt {self.job.attempt}: the lease was taken by "
            f"another worker; not committed: {', '.join(refused)}"
        )

    def _held_after_failure(self, tx: Transaction) -> bool:
        """Whether the lease is held, asked in ``tx`` after one of its writes failed; a
        transaction the database already aborted cannot answer, and the write's own
        error stands (``True``)."""
        try:
            return self.lease_held(tx)
        except Exception:
            return True
