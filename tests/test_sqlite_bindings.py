"""What the SQLite engines bind: storage.db.bind_cheaply registers adapters for None and bools
(a speed measure, see its docstring); the values stored must be exactly what sqlite3 stores without them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from taskgrove.storage.db import bind_cheaply, create_batch_engine


def test_none_and_bools_are_stored_as_null_and_integers(tmp_path: Path) -> None:
    bind_cheaply()
    engine = create_batch_engine(f"sqlite:///{tmp_path}/t.db")  # the engines register them as well
    assert engine is not None
    conn = sqlite3.connect(tmp_path / "plain.db")
    conn.execute("CREATE TABLE t (a, b, c)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(None, True, False), (1, None, 2.5)])
    assert conn.execute("SELECT a, typeof(a), b, typeof(b), c, typeof(c) FROM t ORDER BY rowid").fetchall() == [
        (None, "null", 1, "integer", 0, "integer"),
        (1, "integer", None, "null", 2.5, "real")]
    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)](None) is None
    assert sqlite3.adapters[(bool, sqlite3.PrepareProtocol)](True) == 1
