"""Connecting to the database and bringing its schema up to date.

SQLite gets the pragmas a server needs (WAL so readers never block the writer, a busy timeout
instead of instant "database is locked" errors, foreign keys on). Alembic migrations run at
start-up on the same async engine, inside `run_sync`, when the database is not at the newest one;
a new, empty SQLite database gets the newest schema without Alembic (storage/sqlite_schema.py).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from taskgrove.storage import sqlite_schema, statements
from taskgrove.storage.jsonvalues import read_stored

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def bind_cheaply() -> None:
    """Give Python's sqlite3 module an adapter for None and for bools, so binding them is a
    dictionary hit and a C call.

    Why: sqlite3 binds only exact int, float and str without asking for an adapter. For any other
    value (None, a bool) it looks one up, and with none registered it asks the value's protocol
    for `__adapt__`, which raises and swallows an AttributeError, message formatted: about a
    microsecond a value, and a task row binds some twenty NULLs on its way through a create and
    a pass (3 % of a 1000-task chain's instructions). What is stored does not change: None is
    still NULL (`{}.get` answers None for any value, at C speed), a bool still the integer 0 or 1.
    Process-wide and idempotent; the adapters of other types are untouched.
    """
    sqlite3.register_adapter(type(None), {}.get)  # type: ignore[arg-type]  # None -> NULL
    sqlite3.register_adapter(bool, int)


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine for `url` (already in its async spelling, see Settings)."""
    # Stored JSON is read with read_stored, which never raises: one bad row (NaN, a lone
    # surrogate, text written by hand) is reported on that task instead of failing a whole read.
    if is_sqlite(url):
        bind_cheaply()
        engine = create_async_engine(url, connect_args={"timeout": 30}, json_deserializer=read_stored)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800,
                               json_deserializer=read_stored)


def create_batch_engine(url: str) -> Engine | None:
    """SQLite: a synchronous engine on the same file, for the engine's batched writes (run on
    the database thread: it waits for locks, and its commits checkpoint the WAL)."""
    return _sync_engine(url)


def create_loop_engine(url: str) -> Engine | None:
    """SQLite: a synchronous engine for small transactions run on the event loop's own thread
    (storage.connections.Connections.run_here). It must never make the loop wait: a lock held elsewhere fails
    it at once ("database is locked"), and its commits never copy the WAL into the database
    file (a checkpoint, milliseconds of writes and an fsync); the database thread does that."""
    return _sync_engine(url, *statements.LOOP_PRAGMAS)


def _sync_engine(url: str, *pragmas: str) -> Engine | None:
    if not is_sqlite(url):
        return None
    bind_cheaply()
    engine = sa_create_engine(url.replace("sqlite+aiosqlite://", "sqlite://", 1),
                              connect_args={"check_same_thread": False}, json_deserializer=read_stored)

    def connected(dbapi_conn: Any, record: Any) -> None:
        _sqlite_pragmas(dbapi_conn, record, pragmas)

    event.listen(engine, "connect", connected)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, extra: tuple[str, ...] = ()) -> None:
    cursor = dbapi_conn.cursor()
    for pragma in (*statements.SQLITE_PRAGMAS, *extra):
        cursor.execute(pragma)
    cursor.close()


def _alembic_config(connection: Connection) -> "Config":
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


_REVISION = re.compile(r'^(down_)?revision\s*=\s*(?:"([^"]*)"|None)', re.M)


def head_revision() -> str:
    """The newest migration's revision, read from the files in migrations/versions without
    loading Alembic (tests/test_migrations_head.py checks it against Alembic's own answer)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        for down, value in _REVISION.findall(path.read_text()):
            if value:
                (parents if down else revisions).add(value)
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads: {sorted(heads)}")
    return heads.pop()


def _is_current(connection: Connection) -> bool:
    """True when the database is at the newest migration: nothing for Alembic to do."""
    if not inspect(connection).has_table("alembic_version"):
        return False
    read = statements.MIGRATION_VERSION.form(connection.dialect.name)
    versions = [row[0] for row in connection.exec_driver_sql(read)]
    return versions == [head_revision()]


def _create_new_sqlite(connection: Connection) -> bool:
    """On an empty SQLite database, create the newest schema from storage/sqlite_schema.py, in one
    transaction that holds the write lock; False (nothing done) if the database is not empty or
    the snapshot is not at the newest migration: then Alembic migrates."""
    if sqlite_schema.REVISION != head_revision():
        return False
    # The driver leaves DDL outside transactions: BEGIN IMMEDIATE makes the whole schema and its
    # version row one transaction, committed or rolled back with `connection`'s.
    connection.exec_driver_sql(statements.WRITE_LOCK.form("sqlite"))
    if connection.exec_driver_sql(statements.SCHEMA_OBJECTS.form("sqlite")).scalar():
        return False  # another process got there first, or something else lives here
    for statement in sqlite_schema.STATEMENTS:
        connection.exec_driver_sql(statement)
    connection.exec_driver_sql(statements.SET_MIGRATION_VERSION.form("sqlite"), (sqlite_schema.REVISION,))
    return True


async def migrate(engine: AsyncEngine) -> None:
    """Apply every pending migration (idempotent; safe with several instances on PostgreSQL).

    A database already at the newest migration is left as it is without loading Alembic (about
    0.1 s and 11 MB of a start-up; Alembic would find nothing to do), and a new SQLite database
    gets the newest schema the same way (_create_new_sqlite). Otherwise Alembic upgrades it,
    under an advisory lock on PostgreSQL (migrations/env.py).
    """
    async with engine.begin() as conn:
        if await conn.run_sync(_is_current):
            return
    if engine.dialect.name == "sqlite":
        async with engine.begin() as conn:
            if await conn.run_sync(_create_new_sqlite):
                return

    def upgrade(sync_conn: Connection) -> None:
        from alembic import command

        command.upgrade(_alembic_config(sync_conn), "head")

    async with engine.begin() as conn:
        await conn.run_sync(upgrade)
