"""Learned pack dictionaries (storage/pack_dictionaries.py): what a learned text keeps of an
attempt (its names, never its values), and format 5 packs read back as the events they hold,
in Python and in SQL, or are refused with a clear error when their dictionary is unknown."""

from __future__ import annotations

import sqlite3

import pytest

from replayq.model import TraceEvent
from replayq.storage import packs
from replayq.storage.pack_dictionaries import PackDictionaries, id_bytes, read_id

COMMON = {
    "trace_id": "0123456789abcdef0123456789abcdef",
    "attempt": 1,
    "worker_id": "host-1:worker",
    "kind": "domain",
}
SECRETS = (b"mia@example.com", b"Mia Example", b"4711", b"DE89370400440532013000", b"9.75")


def attempt(job_id: int, order_id: int = 4711) -> list[TraceEvent]:
    """A traced attempt's domain events under an application's own names, holding values
    a job was given (an e-mail, a name, an IBAN, an amount) that no dictionary may keep."""
    common = {**COMMON, "job_id": job_id}
    return [
        TraceEvent(
            name="step.started", seq=1, status="started", ts=1_796_000_000.0,
            hlc=9_000_000, data={"step_name": "pull"}, **common,
        ),
        TraceEvent(
            name="state.read", seq=2, step="pull", resource=f"entry:{order_id}",
            resource_version=1, ts=1_796_000_000.0002, hlc=9_000_001,
            data={"branch": "main", "exists": True}, **common,
        ),
        TraceEvent(
            name="call", seq=3, step="quote", status="success",
            output_ref="blob:sha256:" + "ab" * 32, ts=1_796_000_000.001, hlc=9_000_002,
            data={
                "call": "tariff.lookup",
                "duration": 0.0004,
                "fingerprint": "0123456789abcdef",
                "request": {"args": [order_id], "kwargs": {"email": "mia@example.com"}},
                "response": {"holder": "Mia Example", "iban": "DE89370400440532013000",
                             "amount": 9.75, "mia@example.com": 1},
            },
            **common,
        ),
        TraceEvent(
            name="effect.claimed", seq=4, step="settle", resource=f"outlay:{order_id}",
            ts=1_796_000_000.002, hlc=9_000_003,
            data={"claim": "f" * 32, "key": f"outlay:{order_id}", "kind": "ledger.debited"},
            **common,
        ),
        TraceEvent(
            name="step.finished", seq=5, status="success", ts=1_796_000_000.003,
            hlc=9_000_004, data={"duration": 0.0001, "step_name": "journal"}, **common,
        ),
    ]  # fmt: skip


def learned(text: bytes, dictionary_id: int = 1, job_id: int = 2) -> PackDictionaries:
    """Dictionaries holding ``text`` as ``dictionary_id``, in use for job ``job_id``."""
    dictionaries = PackDictionaries(packs.DICTIONARY_2)
    dictionaries.learned("ledger.settle", dictionary_id, text)
    dictionaries.attempt(job_id, "ledger.settle")
    return dictionaries


def test_a_learned_text_keeps_the_applications_names_and_none_of_its_values() -> None:
    text = packs.learned_text(attempt(1))
    for name in (b"pull", b"quote", b"settle", b"journal", b"tariff.lookup", b"ledger.debited"):
        assert name in text
    # A resource's and a key's namespace, an answer's keys that are identifiers.
    assert b'"entry:"' in text and b'"outlay:"' in text and b'"blob:sha256:"' in text
    assert b'"holder"' in text and b'"iban"' in text
    for value in SECRETS:
        assert value not in text, value
    assert b"f" * 32 not in text and b"0123456789abcdef" not in text  # a token, a digest


def test_a_pack_deflated_against_a_learned_dictionary_reads_back_as_its_events() -> None:
    events = attempt(2)
    dictionaries = learned(packs.learned_text(attempt(1, order_id=13)), dictionary_id=300)
    row = {**packs.opened_row(events, packs.FORMAT_DEFLATE, dictionaries)[0], "id": 9}
    stored = row["events"]
    assert stored[:1] == b"\x05" and read_id(stored) == (300, 3)  # two bytes of id
    as_json = {**packs.pack_row(events, packs.FORMAT_JSON), "id": 9}
    assert packs.pack_json(stored, dictionaries) == as_json["events"]
    assert packs.unpack(row, dictionaries) == packs.unpack(as_json)
    # Smaller than the same pack against DICTIONARY_2 alone: the names are not paid again.
    plain = packs.pack_row(events, packs.FORMAT_DEFLATE)["events"]
    assert len(stored) < len(plain) - 40, (len(stored), len(plain))


def test_a_learned_packs_later_commits_append_to_its_stream() -> None:
    events = attempt(2)
    dictionaries = learned(packs.learned_text(attempt(1)))
    row, writer = packs.opened_row(events[:2], packs.FORMAT_DEFLATE, dictionaries)
    assert isinstance(writer, packs.PackWriter)
    writer.more(packs.pack_items(events[2:], writer.base_hlc, events[0].ts, keep=False))
    whole = {**row, "events": writer.stored, "id": 1}
    assert [e.name for e in packs.unpack(whole, dictionaries)] == [e.name for e in events]


def test_only_the_attempts_of_a_job_type_with_a_dictionary_use_it() -> None:
    dictionaries = learned(packs.learned_text(attempt(1)), job_id=2)
    other = packs.pack_row(attempt(3), packs.FORMAT_DEFLATE)["events"]
    assert packs.pack_row(attempt(3), packs.FORMAT_DEFLATE, dictionaries)["events"] == other
    assert other[:1] == b"\x02"
    assert packs.pack_row(attempt(2), packs.FORMAT_DEFLATE, dictionaries)["events"][:1] == b"\x05"


def test_a_pack_whose_dictionary_is_unknown_is_refused_with_its_id() -> None:
    events = attempt(2)
    stored = packs.pack_row(events, packs.FORMAT_DEFLATE, learned(b'{"n":"x"}', 7))["events"]
    with pytest.raises(ValueError, match="learned dictionary 7"):
        packs.pack_json(stored, PackDictionaries(packs.DICTIONARY_2))
    with pytest.raises(ValueError, match="register_sqlite"):
        packs.pack_json(stored)
    # A loader is asked for what is not known yet (another process learned it since).
    asked: list[int] = []
    late = PackDictionaries(packs.DICTIONARY_2, lambda i: asked.append(i) or b'{"n":"x"}')
    assert packs.pack_json(stored, late) == packs.pack_row(events)["events"]
    assert packs.pack_json(stored, late) is not None and asked == [7]  # read once


def test_a_name_made_of_one_jobs_values_is_not_kept_when_learned_from_two_jobs() -> None:
    def audited(job_id: int, email: str) -> list[TraceEvent]:
        events = attempt(job_id, order_id=job_id)
        common = {**COMMON, "job_id": job_id}
        return [
            *events,
            TraceEvent(
                name="step.finished", seq=6, status="success", ts=1_796_000_000.004,
                hlc=9_000_005, data={"duration": 0.0001, "step_name": f"audit {email}"},
                **common,
            ),
            TraceEvent(
                name="state.read", seq=7, step=f"audit {email}",
                resource=f"customer:{email}:cart", ts=1_796_000_000.005, hlc=9_000_006,
                data={"branch": "main", "exists": True, email.split("@")[0]: 1}, **common,
            ),
        ]  # fmt: skip

    alone = packs.learned_text(audited(1, "mia@example.com"))
    assert b"audit mia@example.com" in alone  # one job's trace cannot tell a value from a name
    text = packs.learned_text(audited(1, "mia@example.com"), audited(2, "noor@example.org"))
    for value in (b"mia", b"noor", b"example", b"customer:mia"):
        assert value not in text, value
    for name in (b"pull", b"tariff.lookup", b"ledger.debited", b'"entry:"', b'"holder"'):
        assert name in text, name


@pytest.mark.parametrize("dictionary_id", [0, 1, 127, 128, 300, 2**21 + 5])
def test_a_dictionary_id_reads_back_as_written(dictionary_id: int) -> None:
    header = b"\x05" + id_bytes(dictionary_id)
    assert read_id(header + b"rest") == (dictionary_id, len(header))
    assert len(id_bytes(dictionary_id)) == (1 if dictionary_id < 128 else len(header) - 1)


def test_sql_on_a_connection_of_ones_own_reads_learned_packs_after_register_sqlite() -> None:
    events = attempt(2)
    text = packs.learned_text(attempt(1))
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE rq_pack_dictionaries (id INTEGER PRIMARY KEY, job_type TEXT, text BLOB)"
    )
    conn.execute("INSERT INTO rq_pack_dictionaries VALUES (4, 'ledger.settle', ?)", (text,))
    conn.execute("CREATE TABLE p (id INTEGER PRIMARY KEY, events BLOB NOT NULL)")
    stored = packs.pack_row(events, packs.FORMAT_DEFLATE, learned(text, 4))["events"]
    conn.execute("INSERT INTO p (events) VALUES (?)", (stored,))
    packs.register_sqlite(conn)  # reads the database's dictionaries
    rows = conn.execute(
        "SELECT json_extract(e.value, '$.n') FROM p, json_each(rq_pack_json(p.events)) AS e"
    ).fetchall()
    assert [name for (name,) in rows] == [e.name for e in events]
    conn.close()


def test_learning_is_due_after_a_types_second_success_and_again_after_a_failure_three_times() -> (
    None
):
    dictionaries = PackDictionaries(packs.DICTIONARY_2)
    dictionaries.succeeded("ledger.settle", 1)
    assert dictionaries.due("ledger.settle") is None  # one success: nothing to learn from
    dictionaries.succeeded("ledger.settle", 1)  # the same job again
    assert dictionaries.due("ledger.settle") is None
    dictionaries.succeeded("ledger.settle", 2)
    assert dictionaries.due("other.type") is None
    assert dictionaries.due("ledger.settle") == (2, 1)  # learn from 2 and 1, once
    assert dictionaries.due("ledger.settle") is None
    dictionaries.succeeded("ledger.settle", 3)  # asked once: later successes change nothing
    assert dictionaries.due("ledger.settle") is None
    for _ in range(2):
        dictionaries.failed("ledger.settle", (2, 1))  # the database was busy: due again
        assert dictionaries.due("ledger.settle") == (2, 1)
    dictionaries.failed("ledger.settle", (2, 1))  # the third failure: no more tries
    assert dictionaries.due("ledger.settle") is None
    dictionaries.learned("known.type", 4, b'{"n":"x"}')
    dictionaries.succeeded("known.type", 1)
    dictionaries.succeeded("known.type", 2)
    assert dictionaries.due("known.type") is None
