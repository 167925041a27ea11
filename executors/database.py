"""database_executor: one SQL statement against a configured SQLite or PostgreSQL database.

Connections are named by the operator (SERVICE_DB_CONNECTIONS); a task names one. A URL inside
task inputs would let any task author reach any database the service can reach (or read any SQLite
file on the host), so it is refused unless SERVICE_DB_ALLOW_INPUT_URL=true, and such connections
are always read-only.

Read-only is enforced twice. A keyword check refuses statements that do not start with a reading
keyword, with a message that says how to allow writes. Because a keyword check alone is easy to
fool (`WITH x AS (DELETE ...) SELECT ...`), the database enforces it too: PostgreSQL runs the
statement in a `READ ONLY` transaction that is always rolled back, SQLite runs it with
`PRAGMA query_only=ON`. For real isolation also give read-only connections a read-only database
role: extensions such as dblink can open their own, writable, sessions.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import math
import re
import sqlite3
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.storage import jsonvalues

READ_KEYWORDS = ("SELECT", "WITH", "EXPLAIN", "SHOW", "VALUES", "TABLE", "PRAGMA")
# PRAGMAs that take an argument yet only read (schema introspection and checks).
_PRAGMA_READ_WITH_ARG = {
    "table_info", "table_xinfo", "table_list", "index_info", "index_xinfo", "index_list",
    "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check",
}
# PRAGMAs that do something even without an argument.
_PRAGMA_ACTIONS = {"optimize", "shrink_memory", "incremental_vacuum", "wal_checkpoint"}
_PRAGMA = re.compile(
    r"^PRAGMA\s+(?:\w+\.)?(?P<name>\w+)\s*(?P<arg>\(\s*[\w\"'.]+\s*\))?\s*;?\s*$", re.I | re.S
)
# String literals, quoted identifiers and comments: stripped before looking for keywords or ';'.
_NOISE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)
_LEADING_NOISE = re.compile(r"^(?:\s+|--[^\n]*|/\*.*?\*/|\()*", re.S)
_DRIVER_PREFIX = re.compile(r"^<class '[\w.]+'>:\s*")

PG_QUERY_CANCELED = "57014"
# Extra time given to PostgreSQL's own statement_timeout before the client gives up waiting.
PG_TIMEOUT_GRACE = 1.0
# How long a cancelled or timed-out statement may take to release its connection.
STOP_WAIT = 5.0

# The one cache this module keeps: an engine (with its pool) per URL. Pooled connections belong
# to the event loop that opened them, so an engine is replaced when used from another loop.
_ENGINES: dict[str, tuple[asyncio.AbstractEventLoop, AsyncEngine]] = {}


def async_database_url(url: str) -> str:
    """Map the plain spellings to the async drivers; refuse databases we cannot keep read-only."""
    url = url.strip()
    for prefix, replacement in (
        ("sqlite+aiosqlite://", "sqlite+aiosqlite://"),
        ("sqlite://", "sqlite+aiosqlite://"),
        ("postgresql+asyncpg://", "postgresql+asyncpg://"),
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
    ):
        if url.startswith(prefix):
            return replacement + url[len(prefix):]
    scheme = url.split("://", 1)[0] if "://" in url else url[:20]
    raise ExecutorError(
        f"unsupported database URL scheme {scheme!r}: use sqlite:/// or postgresql://"
    )


def _engine(url: str) -> AsyncEngine:
    loop = asyncio.get_running_loop()
    cached = _ENGINES.get(url)
    if cached is not None and cached[0] is loop:
        return cached[1]
    engine = create_async_engine(url, pool_pre_ping=True)
    _ENGINES[url] = (loop, engine)
    return engine


def first_keyword(sql: str) -> str:
    """The statement's first word, upper-cased, after comments and opening parentheses."""
    rest = _LEADING_NOISE.sub("", sql, count=1)
    match = re.match(r"[A-Za-z]+", rest)
    return match.group(0).upper() if match else ""


def is_single_statement(sql: str) -> bool:
    cleaned = _NOISE.sub(" ", sql).strip().rstrip(";").strip()
    return ";" not in cleaned


def read_only_refusal(sql: str) -> str | None:
    """Why `sql` is not allowed on a read-only connection, or None when it may run."""
    if not is_single_statement(sql):
        return "only one statement per task is allowed"
    keyword = first_keyword(sql)
    if keyword not in READ_KEYWORDS:
        return f"{keyword or 'this'} statements change data"
    if keyword == "PRAGMA":
        match = _PRAGMA.match(_LEADING_NOISE.sub("", sql, count=1))
        if match is None:
            return "PRAGMA assignments change settings"
        name = match.group("name").lower()
        if name in _PRAGMA_ACTIONS or (match.group("arg") and name not in _PRAGMA_READ_WITH_ARG):
            return f"PRAGMA {name} with an argument changes settings"
    return None


def json_safe(value: Any) -> Any:
    """Convert a driver value into JSON: dates as ISO text, bytes as base64, Decimal as number.

    A Decimal becomes a float when that loses nothing (at most 15 significant digits, finite),
    otherwise its exact text, so money columns come out as numbers and huge values stay exact.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        # The JSON gate's walker (storage.jsonvalues.rebuild): no recursion, and
        # jsonvalues.TooDeep past its STORED_MAX_DEPTH (a JSON column's document can nest deep).
        return jsonvalues.rebuild(value, _scalar_safe, where="a row's value")
    return _scalar_safe(value, None)


def _scalar_safe(value: Any, _key: str | None) -> Any:
    """json_safe of a value that holds no other."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        if value.is_finite() and len(value.as_tuple().digits) <= 15:
            return float(value)
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (uuid.UUID, ipaddress._BaseAddress, ipaddress._BaseNetwork)):
        return str(value)
    return str(value)


def _driver_message(exc: BaseException) -> str:
    """The driver's own first line, without SQLAlchemy's statement dump or asyncpg's class tag."""
    orig = getattr(exc, "orig", None) or exc
    message = _DRIVER_PREFIX.sub("", str(orig)).strip()
    return message.splitlines()[0] if message else type(orig).__name__


def _driver_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "the database said no". asyncpg's own errors escape SQLAlchemy's
    wrapping when raised while reading a server-side cursor, so they are listed too."""
    errors: list[type[BaseException]] = [sa_exc.SQLAlchemyError, sqlite3.Error, OSError]
    with contextlib.suppress(ImportError):
        import asyncpg

        errors += [asyncpg.PostgresError, asyncpg.InterfaceError]
    return tuple(errors)


def _is_timeout_error(exc: BaseException, timed_out: bool) -> bool:
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == PG_QUERY_CANCELED:
        return True
    return timed_out and "interrupted" in str(orig).lower()


class DatabaseExecutor(Executor):
    """Runs one SQL statement with bound parameters and returns the rows (capped)."""

    id = "database_executor"
    name = "Database query"
    extension = "database"
    description = (
        "One SQL statement on a named connection (SERVICE_DB_CONNECTIONS): inputs.connection, sql, "
        "params, max_rows, timeout. Read-only unless the connection allows writes."
    )
    input_schema = {
        "type": "object",
        "required": ["sql"],
        "properties": {
            "connection": {"type": "string", "minLength": 1},
            "url": {"type": "string", "minLength": 1},
            "sql": {"type": "string", "minLength": 1},
            "params": {"type": "object"},
            "max_rows": {"type": "integer", "minimum": 0, "maximum": 1_000_000, "default": 1000},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "default": 30},
        },
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        sql = inputs.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise ExecutorError("sql is required")
        params = inputs.get("params") or {}
        if not isinstance(params, dict):
            raise ExecutorError("params must be an object of named parameters (:name in sql)")
        max_rows = int(inputs.get("max_rows", 1000))
        timeout = float(inputs.get("timeout", 30))
        if max_rows < 0 or timeout <= 0:
            raise ExecutorError("max_rows must not be negative and timeout must be positive")

        label, url, allow_write = self._connection(inputs, context)
        read_only = not allow_write
        if read_only and (reason := read_only_refusal(sql)) is not None:
            raise ExecutorError(
                f"statement refused on read-only connection {label}: {reason}. Only SELECT, WITH, "
                "EXPLAIN, SHOW, VALUES, TABLE and reading PRAGMA statements run there; set "
                f'"allow_write": true for it in SERVICE_DB_CONNECTIONS to allow writes'
            )
        engine = _engine(url)
        state: dict[str, Any] = {"timed_out": False, "driver": None}
        # SQLite stops at `timeout` by interrupting the query; PostgreSQL's statement_timeout gets
        # a moment to answer first, the client-side limit is the safety net for a silent server.
        limit = timeout if engine.dialect.name == "sqlite" else timeout + PG_TIMEOUT_GRACE
        run = asyncio.ensure_future(
            self._run(engine, sql, params, read_only, max_rows, timeout, state)
        )
        try:
            async with asyncio.timeout(limit):
                # Shielded: cancelling the query must go through _stop (see there), not straight
                # into SQLAlchemy, whose cleanup would wait for a running SQLite query to finish.
                return await asyncio.shield(run)
        except asyncio.CancelledError:
            await self._stop(run, state)
            raise
        except TimeoutError:
            await self._stop(run, state)
            raise ExecutorError(f"query timed out after {timeout:g}s") from None
        except _driver_errors() as exc:
            if _is_timeout_error(exc, state["timed_out"]):
                raise ExecutorError(f"query timed out after {timeout:g}s") from None
            raise ExecutorError(f"database error on {label}: {_driver_message(exc)}") from None

    @staticmethod
    async def _stop(run: asyncio.Future[Any], state: dict[str, Any]) -> None:
        """Abort the running statement and wait (bounded) for its connection to be released.

        aiosqlite runs the query in a thread that task cancellation does not reach, so SQLite
        gets `interrupt()`; asyncpg turns the task cancellation into a server-side cancel.
        """
        state["timed_out"] = True
        run.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_WAIT
        while not run.done() and loop.time() < deadline:
            # Interrupt repeatedly: an interrupt sent between two statements is a no-op, and
            # the query may only just be starting.
            driver = state["driver"]
            if driver is not None and hasattr(driver, "interrupt"):
                with contextlib.suppress(Exception):
                    await driver.interrupt()
            await asyncio.wait({run}, timeout=0.05)
        if run.done() and not run.cancelled():
            run.exception()  # retrieved, so asyncio does not log "exception never retrieved"

    @staticmethod
    def _connection(inputs: dict[str, Any], context: ExecutionContext) -> tuple[str, str, bool]:
        """(label for messages, async URL, allow_write) for the task's connection choice."""
        settings = context.settings
        name, url = inputs.get("connection"), inputs.get("url")
        if name and url:
            raise ExecutorError("give either connection or url, not both")
        if url:
            if not getattr(settings, "database_allow_input_url", False):
                raise ExecutorError(
                    "a database url in task inputs is refused; name a connection from "
                    "SERVICE_DB_CONNECTIONS, or set SERVICE_DB_ALLOW_INPUT_URL=true to allow urls"
                )
            return "(input url)", async_database_url(str(url)), False
        connections: Mapping[str, Mapping[str, Any]] = getattr(settings, "database_connections", {})
        known = ", ".join(sorted(connections)) or "none configured"
        if not name:
            raise ExecutorError(f"connection is required (configured: {known})")
        spec = connections.get(name)
        if spec is None:
            raise ExecutorError(
                f"unknown database connection {name!r} (configured: {known}; see SERVICE_DB_CONNECTIONS)"
            )
        return repr(name), async_database_url(str(spec["url"])), bool(spec.get("allow_write", False))

    @staticmethod
    async def _run(
        engine: AsyncEngine,
        sql: str,
        params: dict[str, Any],
        read_only: bool,
        max_rows: int,
        timeout: float,
        state: dict[str, Any],
    ) -> dict[str, Any]:
        is_sqlite = engine.dialect.name == "sqlite"
        async with engine.connect() as conn:
            if is_sqlite:
                state["driver"] = (await conn.get_raw_connection()).driver_connection
                # Set every time: pooled connections keep the value of their previous task.
                await conn.exec_driver_sql(f"PRAGMA query_only = {'ON' if read_only else 'OFF'}")
            else:
                if read_only:  # must be the first statement of the transaction
                    await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                await conn.exec_driver_sql(
                    f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}"
                )
            result = await _fetch(conn, sql, params, max_rows)
            if read_only:
                await conn.rollback()
            else:
                await conn.commit()
            return result


async def _fetch(conn: AsyncConnection, sql: str, params: dict[str, Any], max_rows: int) -> dict[str, Any]:
    """Run the statement and take at most max_rows rows (reading one more to detect the cap).

    Reading statements use a server-side cursor, so a huge result is never loaded whole.
    """
    statement = text(sql)
    if first_keyword(sql) in READ_KEYWORDS:
        streamed = await conn.stream(statement, params)
        try:
            columns = list(streamed.keys())
            rows = await streamed.fetchmany(max_rows + 1)
        finally:
            await streamed.close()
        affected = None
    else:
        buffered = await conn.execute(statement, params)
        if buffered.returns_rows:
            columns = list(buffered.keys())
            rows = buffered.fetchmany(max_rows + 1)
            affected = None
        else:
            columns, rows, affected = [], [], buffered.rowcount
        buffered.close()
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    result: dict[str, Any] = {
        "columns": columns,
        "rows": [[json_safe(value) for value in row] for row in rows],
        "row_count": len(rows),
        "truncated": truncated,
    }
    if affected is not None:
        result["affected_rows"] = affected
    return result


async def dispose_engines() -> None:
    """Close every cached pool (for application shutdown and tests); safe to call any time."""
    cached = list(_ENGINES.values())
    _ENGINES.clear()
    for _loop, engine in cached:
        with contextlib.suppress(Exception):
            await engine.dispose()
