"""Connecting to the database and bringing its schema up to date.

SQLite gets the pragmas a server needs (WAL so readers never block the writer, a busy timeout
instead of instant "database is locked" errors, foreign keys on). Alembic migrations run at
start-up on the same async engine, inside `run_sync`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS = Path(__file__).parent / "migrations"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine for `url` (already in its async spelling, see Settings)."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)


def create_batch_engine(url: str) -> Engine | None:
    """SQLite: a synchronous engine on the same file for the engine's batched writes."""
    if not is_sqlite(url):
        return None
    engine = sa_create_engine(url.replace("sqlite+aiosqlite://", "sqlite://", 1),
                              connect_args={"timeout": 30, "check_same_thread": False})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_conn.cursor()
    for pragma in (
        "PRAGMA journal_mode=WAL",
        "PRAGMA busy_timeout=30000",
        "PRAGMA foreign_keys=ON",
        "PRAGMA synchronous=NORMAL",
    ):
        cursor.execute(pragma)
    cursor.close()


def _alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


async def migrate(engine: AsyncEngine) -> None:
    """Apply every pending migration (idempotent; safe with several instances on PostgreSQL)."""
    async with engine.begin() as conn:
        await conn.run_sync(lambda sync_conn: command.upgrade(_alembic_config(sync_conn), "head"))
