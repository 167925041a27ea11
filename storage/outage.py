"""The database as a neighbour that can fail: recognising an outage, and remembering one.

Why one module: the drivers say "the database is gone" in a dozen ways (asyncpg's connection
errors, SQLAlchemy's `OperationalError` and invalidated connections, sqlite3's result codes,
PostgreSQL's SQLSTATEs, plain socket errors). Every surface must answer all of them with one
retryable error, and readiness and the engine must agree on whether the database is up, so the
drivers' words are read here and nowhere else (`recognise`), and one `DatabaseHealth` per
repository remembers what the last operations saw.

Three reasons, each retryable, each with its own wait:

- `unavailable`: no connection, a connection lost, the server shutting down or starting up;
- `full`: no room to write (SQLite `SQLITE_FULL`, PostgreSQL `disk_full` 53100); reads still work;
- `read_only`: the database refuses writes (SQLite `SQLITE_READONLY`, PostgreSQL 25006, e.g. a
  standby after a failover).

storage/ imports nothing above it: the surfaces turn a `DatabaseOutage` into their own answer
(agent/foundations/errors.py `DatabaseUnavailable`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

UNAVAILABLE = "unavailable"
FULL = "full"
READ_ONLY = "read_only"
REASONS = (UNAVAILABLE, FULL, READ_ONLY)
# Whole seconds a client is told to wait (Retry-After): a restart or failover takes seconds; room on
# a disk or a writable primary takes an operator, so asking again sooner would only add load.
RETRY_AFTER = {UNAVAILABLE: 2, FULL: 10, READ_ONLY: 10}
MESSAGES = {
    UNAVAILABLE: "The database is unavailable",
    FULL: "The database is full: nothing more can be stored",
    READ_ONLY: "The database is read-only: nothing can be stored",
}

# What the write probe stores (and rolls back) on SQLite: room for a tree of a few tasks.
PROBE_BYTES = 64 * 1024
# PostgreSQL SQLSTATEs: class 08 (connection exception), 57P01-57P03 (admin or crash shutdown,
# cannot connect now), 53100 disk_full, 25006 read_only_sql_transaction.
_PG_UNAVAILABLE = ("57P01", "57P02", "57P03")
_PG_FULL = "53100"
_PG_READ_ONLY = "25006"
_SOCKET_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH,
                            errno.ENETUNREACH, errno.ETIMEDOUT, errno.EPIPE, errno.ENOTCONN})
# asyncpg says a lost connection with these InterfaceError / ConnectionDoesNotExistError words.
_LOST_WORDS = ("connection is closed", "connection was closed", "underlying connection is closed",
               "connection has been released", "unexpected connection_lost")


# The outages met by the operations of one request (see `watching`); None outside one.
_MET: ContextVar[list["DatabaseOutage"] | None] = ContextVar("taskgrove_outages_met", default=None)


@contextmanager
def watching() -> Iterator[list["DatabaseOutage"]]:
    """The outages every operation meets inside (this task and the tasks it starts), as a list
    that fills as they happen. Why: a library that answers any exception as its own internal
    error (the a2a-sdk) hides the driver's error from the surface; the surface asks this list
    instead whether its request met the database going away."""
    met: list[DatabaseOutage] = []
    token = _MET.set(met)
    try:
        yield met
    finally:
        _MET.reset(token)


def met_so_far() -> list["DatabaseOutage"]:
    """The outages met so far inside the innermost `watching()`; empty outside one."""
    return list(_MET.get() or ())


class DatabaseOutage(Exception):
    """The database could not do what was asked, for a reason a retry later may cure."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{MESSAGES[reason]}{': ' + detail if detail else ''}")
        self.reason = reason
        self.detail = detail
        self.retry_after = RETRY_AFTER[reason]


def _one(exc: BaseException) -> str | None:
    """The reason `exc` itself says (not its causes), or None."""
    if isinstance(exc, DatabaseOutage):
        return exc.reason
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            primary = code & 0xFF
            if primary == sqlite3.SQLITE_FULL:
                return FULL
            if primary == sqlite3.SQLITE_READONLY:
                return READ_ONLY
            if primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOTADB):
                return UNAVAILABLE
        text = str(exc).lower()
        if "database or disk is full" in text:
            return FULL
        if "readonly database" in text or "read-only" in text:
            return READ_ONLY
        if "unable to open database" in text or "disk i/o error" in text:
            return UNAVAILABLE
        return None
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(state, str):
        if state == _PG_FULL:
            return FULL
        if state == _PG_READ_ONLY:
            return READ_ONLY
        if state.startswith("08") or state in _PG_UNAVAILABLE:
            return UNAVAILABLE
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return UNAVAILABLE
    if isinstance(exc, ConnectionError):
        return UNAVAILABLE
    if isinstance(exc, OSError) and exc.errno in _SOCKET_ERRNOS:
        return UNAVAILABLE
    name = type(exc).__name__
    if name in ("ConnectionDoesNotExistError", "CannotConnectNowError", "AdminShutdownError",
                "CrashShutdownError", "ConnectionFailureError", "ClientCannotConnectError"):
        return UNAVAILABLE
    if name.endswith("InterfaceError") and any(word in str(exc).lower() for word in _LOST_WORDS):
        return UNAVAILABLE
    return None


def recognise(exc: BaseException) -> DatabaseOutage | None:
    """A `DatabaseOutage` when `exc`, or what it wraps (SQLAlchemy's `orig`, `__cause__`,
    `__context__`), says the database is unreachable, full or read-only; None for anything else
    (a constraint, a bug, a lock a retry inside the operation handles)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        one = todo.pop()
        if one is None or id(one) in seen or len(seen) > 16:
            continue
        seen.add(id(one))
        reason = _one(one)
        if reason is not None:
            return one if isinstance(one, DatabaseOutage) else DatabaseOutage(reason, _short(one))
        orig = getattr(one, "orig", None)
        todo.extend((orig if isinstance(orig, BaseException) else None, one.__cause__, one.__context__))
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def write_probe(sync_conn: Connection) -> None:
    """A write that stores nothing: a table created inside a savepoint and rolled back. Creating a
    table needs catalog rows and WAL (PostgreSQL), so it fails on a full or read-only database as a
    real write would; on SQLite the table also gets a row of PROBE_BYTES, because a database just
    short of room may still have the one page a table needs. Rolled back, it leaves no trace."""
    sync_conn.exec_driver_sql("SAVEPOINT taskgrove_probe")
    try:
        sync_conn.exec_driver_sql("CREATE TABLE taskgrove_write_probe (x INTEGER)")
        if sync_conn.dialect.name == "sqlite":
            sync_conn.exec_driver_sql(f"INSERT INTO taskgrove_write_probe VALUES (zeroblob({PROBE_BYTES}))")
    finally:
        try:
            sync_conn.exec_driver_sql("ROLLBACK TO SAVEPOINT taskgrove_probe")
            sync_conn.exec_driver_sql("RELEASE SAVEPOINT taskgrove_probe")
        finally:
            # SQLite may have ended the transaction itself on SQLITE_FULL, or left it open behind
            # the savepoint: either way no write lock may outlive the probe.
            driver = sync_conn.connection.driver_connection
            if isinstance(driver, sqlite3.Connection) and driver.in_transaction:
                driver.rollback()


class DatabaseHealth:
    """What the database did lately, as readiness, /metrics and the engine's loops see it.

    Every operation that fails with an outage reports it (`failed`); every one that commits or
    reads reports an answer (`answered`). The state changes on the first of each and is logged
    once each way: one WARNING when the database goes away, one INFO when it is back, however
    many operations fail meanwhile. A read proves an `unavailable` database back; a `full` or
    `read_only` one is back only when a write succeeds (`check`'s write probe).
    """

    # A probe's answer is reused this long, and a probe waits at most PROBE_TIMEOUT: readiness
    # asked a hundred times a second opens no connection per call, and never hangs on a dead host.
    PROBE_EVERY = 0.5
    PROBE_TIMEOUT = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.outage: DatabaseOutage | None = None  # None: up, as far as we know
        self.down_since = 0.0
        self.failed_at = float("-inf")
        self.answered_at = float("-inf")
        self.outages = {reason: 0 for reason in REASONS}  # counted once per outage (/metrics)
        self._probed_at = float("-inf")
        self._probing: asyncio.Future[None] | None = None

    @property
    def up(self) -> bool:
        return self.outage is None

    def answered(self, at: float | None = None) -> None:
        """An operation got an answer: an unreachable database is reachable again."""
        self.answered_at = self._clock() if at is None else at
        if self.outage is not None and self.outage.reason == UNAVAILABLE and self.answered_at > self.failed_at:
            self._back()

    def wrote(self) -> None:
        """A write was stored: whatever the outage was, it is over."""
        self.answered()
        if self.outage is not None:
            self._back()

    def failed(self, exc: BaseException) -> DatabaseOutage | None:
        """Remember `exc` when it is an outage (and return it as one); None for any other error."""
        outage = recognise(exc)
        if outage is None:
            return None
        met = _MET.get()
        if met is not None and len(met) < 16:
            met.append(outage)
        self.failed_at = self._clock()
        if self.outage is None or self.outage.reason != outage.reason:
            if self.outage is None:
                self.down_since = self.failed_at
                self.outages[outage.reason] += 1
                log.warning("database %s (%s); operations will be refused until it is back", outage.reason,
                            outage.detail or outage)
            self.outage = outage
        return outage

    def _back(self) -> None:
        assert self.outage is not None
        log.info("database is back after %.1f s (%s)", self._clock() - self.down_since, self.outage.reason)
        self.outage = None

    async def check(self, fresh_within: float, read: Callable[[], Awaitable[Any]],
                    write: Callable[[], Awaitable[Any]]) -> DatabaseOutage | None:
        """The current outage, or None when the database is up: an answer within `fresh_within`
        seconds with no failure since counts as up; otherwise one bounded probe shared by all
        callers (`read` while up or unreachable, `write` while full or read-only)."""
        now = self._clock()
        if self.outage is None and now - self.answered_at < fresh_within and self.answered_at >= self.failed_at:
            return None
        if now - self._probed_at < self.PROBE_EVERY and self._probing is None:
            return self.outage
        if self._probing is None:
            self._probing = asyncio.ensure_future(self._probe(write if self.outage is not None and
                                                              self.outage.reason != UNAVAILABLE else read))
        probing = self._probing
        await asyncio.shield(probing)
        return self.outage

    async def _probe(self, operation: Callable[[], Awaitable[Any]]) -> None:
        try:
            await asyncio.wait_for(operation(), self.PROBE_TIMEOUT)
            if self.outage is not None and self.outage.reason != UNAVAILABLE:
                self.wrote()
            else:
                self.answered()
        except asyncio.TimeoutError:
            self.failed(DatabaseOutage(UNAVAILABLE, f"no answer within {self.PROBE_TIMEOUT:g} s"))
        except Exception as exc:  # an outage is remembered; anything else is not readiness's to judge
            if self.failed(exc) is None:
                log.warning("database probe failed: %s", _short(exc))
                self.failed(DatabaseOutage(UNAVAILABLE, _short(exc)))
        finally:
            self._probed_at = self._clock()
            self._probing = None
