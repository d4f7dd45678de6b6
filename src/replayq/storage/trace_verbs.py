"""``trace_append`` and ``trace_query``: the trace's packs written and read, implemented once.

A mixin over ``SqlTransaction``'s plumbing, like ``report_verbs.ReportVerbs``; the SQL
is in the backends' ``jobs.sql`` (``trace_window``: ``window.sql``).

A pack (``packs.py``) is one ``rq_trace`` row holding the events of one commit of one
job attempt (or derived trace): ``packs.groups`` cuts ``events`` into runs of the same
trace, job, attempt and worker, and each run is placed in a pack:

* it joins the pack this transaction wrote last if it continues it (same trace, job,
  attempt and worker: a context's pending events, then the ack's), or the pack the
  connection's last committed transaction wrote (``last_pack``: SQLite). A format 2
  pack (SQLite) takes only the run's items, compressed by its deflate stream
  (``packs.PackWriter``) and appended to the stored bytes (``trace_join``); a format 3 or
  4 pack (one lifecycle event, no stream to append to) is rewritten whole as format 2
  (``trace_rewrite``, whose writer later joins append to); a JSON pack (PostgreSQL,
  within one transaction) is rewritten (``trace_extend``);
* otherwise it starts a new pack; the new packs after it go in together, in as few
  statements as the driver's limit on parameters allows (``trace_append_rows``).

With a ``TraceFence`` the first new pack's insert or SQLite pack's append or rewrite is
also the lease check (``trace_append_fenced``, ``trace_join_fenced``,
``trace_rewrite_fenced``): nothing is written once the lease is gone.

Each pack is indexed by one ``rq_trace_resources`` entry per resource its events name,
at its first HLC (``packs.pack_resources``, the index of ``trace resource``); a
transaction's entries go in in one ``executemany``. ``trace_query`` reads the packs of
a job, a trace, a resource or many jobs back as events in trace order
(``packs.unpack_sorted``), or a window of events with their jobs' types and versions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from replayq import codec
from replayq.errors import ConfigurationError
from replayq.model import TraceEvent
from replayq.storage import packs
from replayq.storage.context_params import TraceFence
from replayq.storage.context_verbs import query_params
from replayq.storage.lifecycle_packs import lifecycle_pack
from replayq.storage.pack_dictionaries import PackDictionaries
from replayq.storage.params import JobTrace, TraceJobs, TraceRead, TraceWindow
from replayq.storage.sql_statements import SqlStatements

# A pack later events of its attempt may join: its id, its events, on SQLite what joins it
# (``packs.Writer``: the writer of a format 2 pack's deflate stream, or a format 3 or 4
# pack's bytes, rewritten by a join), and the resources its events name (those already
# indexed in ``rq_trace_resources``: a join indexes only the new ones). Carried from
# commit to commit, so that a join never walks the events already stored.
OpenPack = tuple[int, list[TraceEvent], "packs.Writer | None", "set[str | None]"]

# A pack joined (``TraceVerbs._pack_extended``): its id, all its events, the events naming a
# resource it did not name yet, every resource it names now, what later events join it by.
_Extended = tuple[int, list[TraceEvent], list[TraceEvent], "set[str | None]", "packs.Writer | None"]

# The columns of an ``rq_trace`` row (``packs.pack_row``) as ``trace_append_rows`` takes them.
PACK_COLUMNS = packs.PACK_COLUMNS

_EVENT_COLUMNS = (
    "id",
    "trace_id",
    "job_id",
    "attempt",
    "kind",
    "name",
    "seq",
    "step",
    "ts",
    "hlc",
    "worker_id",
    "status",
    "resource",
    "resource_version",
    "input_ref",
    "output_ref",
)


def row_to_event(row: Mapping[str, Any]) -> TraceEvent:
    fields = {name: row[name] for name in _EVENT_COLUMNS}
    fields["side_effect"] = bool(row["side_effect"])
    fields["data"] = codec.loads(row["data"])
    return TraceEvent.of(fields)


class TraceVerbs(SqlStatements):
    """The ``trace_append`` and ``trace_query`` verbs, shared by every SQL backend."""

    # Set by ``SqlTransaction.__init__``: the pack later events may join (``last_pack``)
    # and the writer of the format 2 row ``pack_row`` built last.
    _last_pack: OpenPack | None
    _writer: packs.Writer | None
    # How this backend stores a pack's events (``SqlTransaction.pack_format``), and the
    # learned dictionaries of its format 5 packs (SQLite: storage/pack_dictionaries.py).
    pack_format: int
    pack_dictionaries: PackDictionaries | None

    def lease_check(self, job_id: int, owner_token: str) -> bool:
        raise NotImplementedError

    # -- writing ----------------------------------------------------------------------------

    def trace_append(self, events: Sequence[TraceEvent], fence: TraceFence | None = None) -> bool:
        """One ``rq_trace`` row per job attempt (or derived trace) among ``events``, with
        an ``rq_trace_resources`` entry per resource its events name (storage/packs.py);
        all of those entries in one ``executemany``.

        Events that continue the pack this transaction wrote last (same trace, job,
        attempt and worker: a context's pending events, then the ack's) join that pack,
        as do those continuing the pack the connection's last committed transaction
        wrote (``last_pack``: SQLite). With ``fence`` the first new pack's insert or
        deflated pack's append is also the lease check (``trace_append_fenced``,
        ``trace_join_fenced``); the check is asked on its own before a JSON pack is
        rewritten, and after an append that changed nothing (the lease, or the pack?);
        ``False``, nothing written, once the lease is gone.

        The packs after the first new one go in together (``_packs_inserted``: one
        statement on SQLite for a lease batch's or a group commit's packs).
        """
        entries = []
        cut = packs.cut(events)
        for at, group in enumerate(cut):
            last = self._last_pack
            joins = last is not None and packs.same_pack(last[1], group)
            if fence is not None and joins and (last is None or last[2] is None):
                # Joining a JSON pack rewrites it (trace_extend, no fenced form): the lease
                # is asked first, so that nothing is written once it is gone.
                if not self.lease_check(fence.job_id, fence.owner_token):
                    return False
                fence = None
            extended = self._pack_extended(group, fence) if joins else None
            if fence is not None and joins:
                # The append was the lease check (trace_join_fenced); nothing appended is
                # either a lost lease or a pack rewritten since: only then is it asked.
                if extended is None and not self.lease_check(fence.job_id, fence.owner_token):
                    return False
                fence = None
            if extended is not None:
                pack_id, joined, new, named, writer = extended
                self._last_pack = (pack_id, joined, writer, named)
            elif fence is not None:
                placed = self._pack_inserted_fenced(group, fence)
                if placed is None:
                    return False
                fence = None
                pack_id, joined, new, writer = placed
                self._last_pack = (pack_id, joined, writer, {e.resource for e in group})
            else:
                # A new pack: no later group joins it or another (each differs from the
                # one before it, or that one is full), so they all go in with it.
                entries.extend(self._packs_inserted(cut[at:]))
                break
            entries.extend(packs.pack_resources(new, pack_id))
        if fence is not None and not self.lease_check(fence.job_id, fence.owner_token):
            return False  # nothing was inserted to check it with (no events, or all joined)
        self._index(entries)
        return True

    def _pack_extended(
        self, group: list[TraceEvent], fence: TraceFence | None = None
    ) -> _Extended | None:
        """``group`` added to the pack this transaction wrote last, which it continues
        (``packs.same_pack``, asked by the caller): ``(pack id, all its events, the events
        naming a resource it did not name yet, every resource it names now, what later
        events join it by)``.

        In format 2 only ``group``'s items are compressed, appended to the stored bytes
        (``trace_join``; with ``fence``, ``trace_join_fenced``: only while the lease is
        held); a format 3 or 4 pack is rewritten whole as format 2, its event's item and
        ``group``'s in one deflate stream (``trace_rewrite``, ``trace_rewrite_fenced``);
        a JSON pack (PostgreSQL, within one transaction) is rewritten.
        """
        last = self._last_pack
        assert last is not None
        pack_id, earlier, writer, named = last
        joined = [*earlier, *group]
        if writer is not None:
            hlcs = [e.hlc for e in group]
            base = writer.base_hlc
            if min(hlcs) < base:
                return None  # the row's hlc is its items' base: a new pack instead
            first = earlier[0]
            row = {
                "id": pack_id,
                "trace_id": first.trace_id,
                "job_id": first.job_id,
                "attempt": first.attempt,
                "stored": writer.stored,
                "hlc_last": max(hlcs),
            }
            if type(writer) is packs.PackWriter:
                # Appended through the deflate stream, never rewritten: no item texts kept.
                row["piece"] = writer.more(packs.pack_items(group, base, first.ts, keep=False))
                query = "trace_join"
            else:
                assert isinstance(writer, packs.CompactPack)
                # One lifecycle event's pack (format 3 or 4): rewritten whole as format 2,
                # whose stream later joins append to.
                writer = writer.rewritten(joined, self.pack_dictionaries)
                row["events"] = writer.stored
                query = "trace_rewrite"
            if fence is not None:
                query += "_fenced"
                row["fence_job_id"] = fence.job_id
                row["fence_owner_token"] = fence.owner_token
            # Not found if the pack was rolled back (to a savepoint) or rewritten since
            # (or, fenced, the lease is gone).
            if not self.changed(query, row):
                return None
        # Not found only if the pack was rolled back (to a savepoint): a new one then.
        elif not self.changed("trace_extend", {**self.pack_row(joined), "id": pack_id}):
            return None
        new = [e for e in group if e.resource not in named]
        return (
            pack_id,
            joined,
            new,
            named.union([e.resource for e in new]) if new else named,
            writer,
        )

    def _pack_inserted_fenced(
        self, group: list[TraceEvent], fence: TraceFence
    ) -> tuple[int, list[TraceEvent], list[TraceEvent], packs.Writer | None] | None:
        row = self.pack_row(group)
        row["fence_job_id"] = fence.job_id
        row["fence_owner_token"] = fence.owner_token
        found = self.fetchone("trace_append_fenced", row)
        return None if found is None else (found["id"], group, group, self._writer)

    def _packs_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[dict[str, Any]]:
        """A new pack for each group (``packs.groups``), in as few statements as the
        driver's limit on parameters allows (one for any batch of up to ~4,000) where the
        backend has a many-row insert; their ``rq_trace_resources`` entries. The last
        pack is the one later events of its group may join (``_last_pack``)."""
        if len(groups) > 1:
            return self._packs_placed(groups, self._pack_rows_inserted(groups))
        # One pack (``enqueue``, a step's commit): the fixed one-row statement.
        pack_id = self.inserted_id("trace_append", self.pack_row(groups[0]))
        assert pack_id is not None
        return self._packs_placed(groups, [pack_id])

    def _pack_rows_inserted(self, groups: Sequence[Sequence[TraceEvent]]) -> list[int]:
        """``trace_append_rows`` for ``groups``: their pack ids, in order (SQLite: a
        multi-row ``VALUES`` per chunk of the driver's parameter limit)."""
        columns = PACK_COLUMNS
        per_statement = self.rows_per_statement(len(columns))
        row_sql = "(" + ", ".join("?" * len(columns)) + ")"
        pack_ids: list[int] = []
        opened, pack_format = packs.opened_values, self.pack_format
        row_values = packs.row_values
        compact_of = lifecycle_pack if pack_format == packs.FORMAT_DEFLATE else None
        for start in range(0, len(groups), per_statement):
            chunk = groups[start : start + per_statement]
            values: list[Any] = []
            compact = None
            for group in chunk:
                if compact_of is not None and len(group) == 1:
                    # A lease batch's ``job.leased``, a group's ``job.succeeded``: one
                    # lifecycle event a pack (format 4), its row's values straight from
                    # the event (``opened_values``', without its writer).
                    event = group[0]
                    compact = compact_of(event)
                    if compact is not None:
                        values += row_values(event, event.hlc, event.hlc, compact)
                        continue
                # ``pack_row`` without its call per pack, nor its dictionary: the last
                # writer is kept below.
                found, self._writer = opened(group, pack_format, self.pack_dictionaries)
                compact = None
                values += found
            if compact is not None:  # the last pack is format 4: what later events join
                self._writer = packs.CompactPack(compact, chunk[-1][0].hlc)
            cursor = self.execute_rows("trace_append_rows", row_sql, len(chunk), values)
            pack_ids.extend(self.rows_inserted_ids(cursor, len(chunk)))
        return pack_ids

    def rows_inserted_ids(self, cursor: Any, rows: int) -> list[int]:
        """The ids of the ``rows`` rows a multi-row insert made (``trace_append_rows``), in
        the order of its ``VALUES``: its ``RETURNING id`` rows, sorted (``RETURNING`` has
        no order; the ids rise in the order the rows went in). SQLite's
        ``SqliteTransaction`` reads them off ``lastrowid`` instead."""
        return sorted(int(row[0]) for row in cursor.fetchall())

    def _packs_placed(
        self, groups: Sequence[Sequence[TraceEvent]], pack_ids: Sequence[int]
    ) -> list[dict[str, Any]]:
        """After new packs of ``groups`` (``pack_ids[i]`` for ``groups[i]``, each made by
        ``pack_row`` in turn): their ``rq_trace_resources`` entries; the last is
        remembered as the pack later events of its group may join (``_last_pack``)."""
        entries = []
        for group, pack_id in zip(groups, pack_ids, strict=True):
            if len(group) == 1 and group[0].resource is None:
                continue  # a lifecycle event's pack (two a drained job) names no resource
            entries.extend(packs.pack_resources(group, pack_id))
        # pack_row keeps the writer of the row it made last: the last group's.
        last = list(groups[-1])
        self._last_pack = (pack_ids[-1], last, self._writer, {e.resource for e in last})
        return entries

    def _placed(self, events: Sequence[TraceEvent], pack_ids: Mapping[int, int]) -> None:
        """After new packs of ``events`` (one each, by job id, the last made last): their
        resources indexed (``_packs_placed``)."""
        ids = []
        for event in events:
            assert event.job_id is not None
            ids.append(pack_ids[event.job_id])
        self._index(self._packs_placed([[e] for e in events], ids))

    def _index(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """``rq_trace_resources`` entries, in one ``executemany``."""
        if entries:
            self.send_many("trace_resources_append", entries)

    # -- reading ----------------------------------------------------------------------------

    def trace_query(self, query: TraceRead) -> Any:
        if isinstance(query, TraceJobs):
            return self._trace_jobs(query)
        if isinstance(query, TraceWindow):
            rows = self.fetchall("trace_window", query_params(query))
            return [(row_to_event(r), r["job_type"], r["version"]) for r in rows]
        if query.job_id is not None:
            return packs.unpack_sorted(
                self.fetchall("trace_for_job", {"job_id": query.job_id}), self.pack_dictionaries
            )
        if query.trace_id is not None:
            rows = self.fetchall("trace_for_trace", {"trace_id": query.trace_id})
            return packs.unpack_sorted(rows, self.pack_dictionaries)
        if query.resource is None:
            raise ConfigurationError("TraceQuery needs a job_id, a trace_id or a resource")
        resource = query.resource
        rows = self.fetchall("trace_for_resource", {"resource": resource})
        versioned = resource + ":v"
        return [
            e
            for e in packs.unpack_sorted(rows, self.pack_dictionaries)
            if e.resource is not None
            and (e.resource == resource or e.resource.startswith(versioned))
        ]

    def _trace_jobs(self, params: TraceJobs) -> list[JobTrace]:
        query = "trace_for_jobs" if params.enqueued else "trace_for_jobs_attempts"
        rows = self.fetchall(query, {"job_ids": self.list_param(params.job_ids)})
        by_job: dict[int, list[Any]] = {}
        for row in rows:
            by_job.setdefault(int(row["job_id"]), []).append(row)
        return [
            JobTrace(job_id, packs.unpack_sorted(found, self.pack_dictionaries))
            for job_id, found in by_job.items()
        ]
