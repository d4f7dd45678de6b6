"""The SQLite insert's ``None`` parameters written ``NULL`` in its text (``null_folded``)."""

from __future__ import annotations

import sqlite3

from replayq.storage.sqlite import null_folded


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
