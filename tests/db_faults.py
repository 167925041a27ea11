"""Cutting the database under a service in this process, at the connection layer (issue 46).

`DatabaseCut` raises the driver's own "unable to open database file" (sqlite3, SQLITE_CANTOPEN)
where a statement would reach the database: every statement SQLAlchemy sends (its
`before_cursor_execute` event, on every engine: the service's async engine, the SQLite database
thread and the loop's connection), its commits (the `commit` event) and the commit
storage/connections.py sends itself. The plain
sqlite3 reads (storage/sqlite_reader.py) answer "take the usual path" meanwhile, so they meet the
cut too. What the service sees is what a vanished database gives: a driver error, from any
statement, in any transaction.

Two ways to cut: `down()` (every statement fails until `up()`), and `at(n)`, only the n-th
statement from now (counting statements and commits), to cut a write at each of its points.
`after_commit` makes the n-th commit succeed and then fail, as a connection lost while the
answer to COMMIT travels back: the write is stored, its caller sees an error.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from taskgrove.storage import connections


def vanished() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("unable to open database file")
    error.sqlite_errorcode = sqlite3.SQLITE_CANTOPEN  # type: ignore[attr-defined]
    error.sqlite_errorname = "SQLITE_CANTOPEN"  # type: ignore[attr-defined]
    return error


class DatabaseCut:
    def __init__(self) -> None:
        self.is_down = False
        self.count = 0  # statements and commits seen since the last at()
        self.fail_at: int | None = None
        self.after_commit = False
        self.failed = 0  # statements refused

    def down(self) -> None:
        self.is_down = True

    def up(self) -> None:
        self.is_down = False
        self.fail_at = None

    def at(self, n: int, *, after_commit: bool = False) -> None:
        """Fail only the n-th statement or commit from now (1 = the next one)."""
        self.count, self.fail_at, self.after_commit, self.failed = 0, n, after_commit, 0

    def _cut_here(self, is_commit: bool) -> bool:
        self.count += 1
        if self.is_down:
            return True
        if self.fail_at is not None and self.count == self.fail_at and (is_commit or not self.after_commit):
            self.fail_at = None
            return True
        return False

    def statement(self, *_: Any) -> None:
        if self._cut_here(False):
            self.failed += 1
            raise vanished()

    def engine_commit(self, conn: Any) -> None:
        """SQLAlchemy's commit event, which comes before the driver's commit."""
        if not self._cut_here(True):
            return
        if self.after_commit:
            conn.connection.dbapi_connection.commit()  # stored; the answer is lost on the way back
        self.failed += 1
        raise vanished()

    def commit(self, original: Any, sync_conn: Any) -> None:
        cut = self._cut_here(True)
        if cut and not self.after_commit:
            self.failed += 1
            raise vanished()
        original(sync_conn)
        if cut:  # stored; the answer is lost on the way back
            self.failed += 1
            raise vanished()


@contextmanager
def database_cut(monkeypatch: pytest.MonkeyPatch) -> Iterator[DatabaseCut]:
    cut = DatabaseCut()
    original_commit = connections._commit
    monkeypatch.setattr(connections, "_commit", lambda sync_conn: cut.commit(original_commit, sync_conn))
    for name in ("rows", "scalar"):
        original = getattr(connections.SqliteReader, name)

        def read(self: Any, sql: str, args: Any, _original: Any = original) -> Any:
            return None if cut.is_down else _original(self, sql, args)  # None: the usual path, which is cut

        monkeypatch.setattr(connections.SqliteReader, name, read)
    event.listen(Engine, "before_cursor_execute", cut.statement)
    event.listen(Engine, "commit", cut.engine_commit)
    try:
        yield cut
    finally:
        event.remove(Engine, "before_cursor_execute", cut.statement)
        event.remove(Engine, "commit", cut.engine_commit)
