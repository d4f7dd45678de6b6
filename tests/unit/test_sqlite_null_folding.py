"""The SQLite insert's ``None`` parameters written ``NULL`` in its text (``null_folded``),
the others bound by position (``positional``); every statement bound by position where its
text allows (``positional``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from replayq.storage.sqlite import SqliteTransaction, null_folded, positional


def test_only_the_named_parameters_become_null_whole_names_only() -> None:
    sql = "INSERT INTO t (a, ab, b) VALUES (:a, :ab, :b) ON CONFLICT (a, ab) DO NOTHING"
    assert null_folded(sql, ("a",)) == (
        "INSERT INTO t (a, ab, b) VALUES (NULL, :ab, :b) ON CONFLICT (a, ab) DO NOTHING"
    )
    assert null_folded(sql, ("ab", "b")) == (
        "INSERT INTO t (a, ab, b) VALUES (:a, NULL, NULL) ON CONFLICT (a, ab) DO NOTHING"
    )
    assert null_folded(sql, ()) == sql


def test_a_folded_statement_stores_what_the_bound_one_does() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a TEXT, ab TEXT, b INTEGER)")
    sql = "INSERT INTO t (a, ab, b) VALUES (:a, :ab, :b)"
    rows = [{"a": "x", "ab": None, "b": None}, {"a": None, "ab": "y", "b": 0}]
    for row in rows:
        nulls = tuple(name for name, value in row.items() if value is None)
        conn.execute(null_folded(sql, nulls), row)
        conn.execute(sql, row)
    stored = conn.execute("SELECT a, ab, b, typeof(b) FROM t ORDER BY rowid").fetchall()
    assert stored == [
        ("x", None, None, "null"),
        ("x", None, None, "null"),
        (None, "y", 0, "integer"),
        (None, "y", 0, "integer"),
    ]
    conn.close()


def test_the_other_parameters_are_bound_by_position_in_the_order_of_the_text() -> None:
    sql = "INSERT INTO t (a, ab, b) VALUES (:b, :ab, :a) ON CONFLICT (a) DO UPDATE SET b = :b"
    params = {"a": "x", "ab": None, "b": 3, "unused": 9}
    text, values_of = positional(sql, ("ab",))
    assert (
        text == "INSERT INTO t (a, ab, b) VALUES (?, NULL, ?) ON CONFLICT (a) DO UPDATE SET b = ?"
    )
    assert values_of(params) == (3, "x", 3)
    one, value_of = positional("INSERT INTO t (a) VALUES (:a)", ())
    assert (one, value_of(params)) == ("INSERT INTO t (a) VALUES (?)", ("x",))
    none, no_values = positional("INSERT INTO t (a) VALUES (:a)", ("a",))
    assert (none, no_values(params)) == ("INSERT INTO t (a) VALUES (NULL)", ())


def test_a_positional_statement_stores_what_the_named_one_does() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a TEXT, ab BLOB, b REAL)")
    sql = "INSERT INTO t (a, ab, b) VALUES (:a, :ab, :b)"
    rows = [
        {"a": "x", "ab": None, "b": 1.5},
        {"a": None, "ab": bytearray(b"\x03["), "b": 0},
        {"a": "ü", "ab": b"\x02", "b": None},
    ]
    for row in rows:
        nulls = tuple(name for name, value in row.items() if value is None)
        text, values_of = positional(sql, nulls)
        conn.execute(text, values_of(row))
        conn.execute(sql, row)
    stored = conn.execute("SELECT a, ab, b, typeof(ab), typeof(b) FROM t ORDER BY rowid").fetchall()
    assert stored[0::2] == stored[1::2]
    assert [row[3:] for row in stored[0::2]] == [
        ("null", "real"),
        ("blob", "real"),
        ("blob", "null"),
    ]
    conn.close()


def test_a_statement_whose_text_may_hold_a_colon_that_is_no_parameter_binds_by_name() -> None:
    # A literal's ':v' or a comment's ':name' is no parameter: written ``?`` it would be a
    # placeholder more than the values bound, or a literal changed.
    assert positional("SELECT 1 FROM t WHERE r >= :r || ':v'") is None
    assert positional("-- the :r prefix\nSELECT 1 FROM t WHERE r = :r") is None
    assert positional("SELECT 1 /* :r */ FROM t WHERE r = :r") is None
    found = positional("SELECT 'x' || a FROM t WHERE a = :a AND b = 'b'")
    assert found is not None
    text, values_of = found
    assert (text, values_of({"a": 1, "other": 2})) == (
        "SELECT 'x' || a FROM t WHERE a = ? AND b = 'b'",
        (1,),
    )


def test_statements_run_by_position_read_and_write_what_binding_by_name_does(
    tmp_path: Path,
) -> None:
    """The worker's and the CLI's statements run through ``SqliteTransaction.execute``:
    bound by position where the text allows, by name where it does not, a missing
    parameter reported by the driver as before."""
    conn = sqlite3.connect(tmp_path / "q.db")
    conn.execute("CREATE TABLE t (r TEXT, n INTEGER)")
    queries = {
        "put": "INSERT INTO t (r, n) VALUES (:r, :n)",
        "prefixed": "SELECT r, n FROM t WHERE r >= :r || ':v' AND r < :r || ':w' ORDER BY n",
    }
    tx = SqliteTransaction(conn, queries)
    for n, r in enumerate(["a:v1", "a:v2", "b:v1", "a"]):
        tx.execute("put", {"r": r, "n": n})
    assert tx.execute("prefixed", {"r": "a"}).fetchall() == [("a:v1", 0), ("a:v2", 1)]
    with pytest.raises(sqlite3.ProgrammingError, match="binding parameter :n"):
        tx.execute("put", {"r": "c"})
    conn.close()


def test_an_insert_whose_text_may_hold_a_colon_that_is_no_parameter_binds_by_name(
    tmp_path: Path,
) -> None:
    """``inserted_id`` folds ``None`` into the text and binds the rest by position, except
    where a literal or a comment holds a colon: there the folded text is bound by name,
    and the row holds the literal unchanged."""
    conn = sqlite3.connect(tmp_path / "q.db")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, n INTEGER, k TEXT)")
    queries = {
        "put": "INSERT INTO t (r, n, k) VALUES (:r || ':v', :n, :k)",
        "noted": "-- inserts :r\nINSERT INTO t (r, n, k) VALUES (:r, :n, :k)",
    }
    tx = SqliteTransaction(conn, queries)
    first = tx.inserted_id("put", {"r": "a", "n": None, "k": "x"})
    second = tx.inserted_id("noted", {"r": "b", "n": 2, "k": None})
    assert (first, second) == (1, 2)
    assert conn.execute("SELECT id, r, n, k FROM t ORDER BY id").fetchall() == [
        (1, "a:v", None, "x"),
        (2, "b", 2, None),
    ]
    conn.close()
