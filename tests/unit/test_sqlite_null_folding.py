"""The SQLite insert's ``None`` parameters written ``NULL`` in its text (``null_folded``),
the others bound by position (``positional``)."""

from __future__ import annotations

import sqlite3

from replayq.storage.sqlite import null_folded, positional


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
