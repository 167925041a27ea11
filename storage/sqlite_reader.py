"""Reads of a SQLite file through plain sqlite3 connections (storage/connections.py says when).

A row is exactly what the SQLAlchemy path returns: the same columns in the same order
(statements.TASK_COLUMNS), decoded by SQLAlchemy's own result processors.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import JSON
from sqlalchemy.engine import Engine
from sqlalchemy.engine.processors import int_to_boolean

from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.statements import TASK_COLUMNS

Row = dict[str, Any]


def _row_builder(processors: Sequence[tuple[str, Callable[[Any], Any]]],
                 extra: Sequence[str] = ()) -> Callable[[Sequence[Any]], Row]:
    """A function from a DB-API tuple to the row dict, every processor applied: written out as
    one dict display (a third of the cost of a zip and a loop over the processors). `extra`:
    the names of columns a statement selects after TASK_COLUMNS (a value it computes, such as
    TASK_WITH_TREE_USAGES' `tree_usages`), kept as the driver gives them."""
    index = {name: i for i, name in enumerate(TASK_COLUMNS)}
    calls = dict(processors)
    scope: dict[str, Any] = {"read_stored": read_stored}
    items = []
    for name in TASK_COLUMNS:
        value = f"v[{index[name]}]"
        processor = calls.get(name)
        if processor is _stored_json:  # inlined: the call is most of its cost; JSON null (most
            # stored `result`, `checkpoint`, `concurrency`, `rate_limit`...) needs no parser either,
            # nor an empty object or array (most `inputs`, `params`, `dependencies`...): a new one
            # each, as the parser would give
            item = (f"None if {value} is None or {value} == 'null' else {{}} if {value} == '{{}}' "
                    f"else [] if {value} == '[]' else read_stored({value})")
        elif processor is _stored_boolean:
            item = f"None if {value} is None else bool({value})"
        elif processor is not None:
            scope[f"p_{name}"] = processor
            item = f"p_{name}({value})"
        else:
            item = value
        items.append(f"{name!r}: {item}")
    items.extend(f"{name!r}: v[{i}]" for i, name in enumerate(extra, len(TASK_COLUMNS)))
    exec(f"def row(v):\n    return {{{', '.join(items)}}}", scope)  # noqa: S102 - our own column names
    return scope["row"]


def _stored_json(value: Any) -> Any:
    return None if value is None else read_stored(value)


def _stored_boolean(value: Any) -> bool | None:
    return None if value is None else bool(value)


class SqliteReader:
    """Reads of a SQLite file on the calling thread, through a sqlite3 connection of its own.

    Why: a read through the database thread costs a thread hop and a wait for the GIL behind
    the event loop, and SQLAlchemy's execution layer around one indexed lookup costs about
    five times the lookup; under load that made `tasks.get` run at a sixth of the framework's
    ceiling. In WAL mode a reader never waits for the writer and sees every committed
    transaction as soon as its statement starts, so a read here sees at least what any answer
    already sent showed.

    Guarantees kept: every statement runs to its end (`fetchmany` past the last row, or the
    cursor is closed), so no read transaction stays open; values are decoded by SQLAlchemy's own
    result processors for each column (JSON through jsonvalues.read_stored, booleans), so a row
    is exactly what the SQLAlchemy path returns, bad stored values reported the same way.
    A statement may select columns after TASK_COLUMNS: they come last in the row, undecoded.
    `rows` returns None, having changed nothing, when the read should take the usual path
    instead: the database is busy (no waiting on the event loop: busy_timeout 0), any error
    (the usual path raises it as it always did), or more than INLINE_ROWS rows (large reads
    go through SQLAlchemy on the database thread, where the event loop can still interleave).
    """

    INLINE_ROWS = 2000

    def __init__(self, path: str, processors: list[tuple[str, Callable[[Any], Any]]]) -> None:
        self.path = path
        self._processors = processors
        self._row = _row_builder(processors)
        # Row functions of the statements that select columns after TASK_COLUMNS, by their text.
        self._wider: dict[str, Callable[[Sequence[Any]], Row]] = {}
        # One connection per thread (the app's event loop; tests may run loops in other threads).
        self._connections: dict[int, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine: Engine) -> "SqliteReader | None":
        url = engine.url
        path = url.database
        if not path or path == ":memory:" or path.startswith("file:") or url.query:
            return None  # in-memory or URI databases: another connection would not see the same data
        dialect = engine.dialect
        processors: list[tuple[str, Callable[[Any], Any]]] = []
        for column in T.c:
            processor = column.type._cached_result_processor(dialect, None)
            if processor is None:
                continue
            # SQLAlchemy's processors, called directly where they are known: what JSON does with
            # a dialect whose deserializer is read_stored (None stays None), what Boolean does
            # on SQLite (sqlalchemy.engine.processors.int_to_boolean). Any other: as it is.
            if isinstance(column.type, JSON) and getattr(dialect, "_json_deserializer", None) is read_stored:
                processor = _stored_json
            elif processor is int_to_boolean:
                processor = _stored_boolean
            processors.append((column.name, processor))
        return cls(path, processors)

    def _connection(self) -> sqlite3.Connection:
        ident = threading.get_ident()
        conn = self._connections.get(ident)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
            with self._lock:
                self._connections[ident] = conn
        return conn

    def rows(self, sql: str, args: Sequence[Any]) -> list[Row] | None:
        row = self._row
        try:
            cursor = self._connection().execute(sql, args)
            try:
                raw = cursor.fetchmany(self.INLINE_ROWS + 1)
                if raw and len(raw[0]) > len(TASK_COLUMNS):
                    row = self._wider.get(sql) or self._wider_row(sql, cursor.description)
            finally:
                cursor.close()
        except Exception:  # busy, or anything else: the usual path, which raises what it always did
            return None
        if len(raw) > self.INLINE_ROWS:
            return None
        try:
            return list(map(row, raw))
        except Exception:  # a value no processor expected: the usual path decides what happens
            return None

    def _wider_row(self, sql: str, description: Sequence[Sequence[Any]]) -> Callable[[Sequence[Any]], Row]:
        """The row function of a statement that selects more than TASK_COLUMNS, made on its
        first read (the names of its further columns from the cursor's description)."""
        extra = tuple(column[0] for column in description[len(TASK_COLUMNS):])
        row = self._wider[sql] = _row_builder(self._processors, extra)
        return row

    def scalar(self, sql: str, args: Sequence[Any]) -> Any:
        """The first value of the first row of a read; None when it should take the usual path."""
        try:
            cursor = self._connection().execute(sql, args)
            try:
                row = cursor.fetchone()
                cursor.fetchall()  # to the end: no read transaction stays open
            finally:
                cursor.close()
        except Exception:  # busy, or anything else: the usual path, which raises what it always did
            return None
        return row[0] if row else None

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
