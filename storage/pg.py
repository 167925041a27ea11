"""PostgreSQL through plain asyncpg: the engine's passes and the hot reads.

SQLAlchemy's execution layer costs about 0.4 ms around each statement on asyncpg, more than
PostgreSQL takes to run an engine pass or an indexed read. These statements go to asyncpg
directly instead, as plain prepared statements; their SQL text is the one SQLAlchemy runs
elsewhere (`:name` parameters, numbered here), so there is one text per statement.

- Reads use a connection of SQLAlchemy's pool (`get_raw_connection`), outside any transaction
  (autocommit, as the SQLAlchemy reads). Its JSON codec is SQLAlchemy's, which decodes with the
  engine's deserializer, so a row is the same dict the SQLAlchemy path returns.
- The engine's passes use one connection of their own: one pass runs at a time per instance,
  and that connection plans every statement once, generically (`plan_cache_mode`), which the
  pass statement is written for (storage/executions.py). Errors come out as SQLAlchemy's, a lost
  connection as an OperationalError, so the engine retries what it always retried.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskgrove.storage.jsonvalues import read_stored

_CONNECTION_ERRORS = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)


@functools.lru_cache(maxsize=64)
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with its `:name` parameters as `$1, $2, ...`, and the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return re.sub(r"(?<![:\w]):(\w+)", number, sql), tuple(names)


@functools.lru_cache(maxsize=64)
def from_qmark(sql: str) -> str:
    """A qmark-style statement (the SQLite reader's) with `$1, $2, ...` placeholders."""
    count = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)


async def rows(engine: AsyncEngine, sql: str, args: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The rows of a read through a pooled connection; None when it failed: the caller then takes
    the SQLAlchemy path, which raises what it always did."""
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        try:
            found = await driver.fetch(sql, *args)
        except Exception:
            if driver.is_closed():
                await conn.invalidate()
            return None
    return [dict(record) for record in found]


class PassConnection:
    """The connection the engine's passes run on, opened when first needed."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)
            settings = {**cparams.pop("server_settings", {}), "plan_cache_mode": "force_generic_plan"}
            conn = await asyncpg.connect(*cargs, **cparams, server_settings=settings)
            await conn.set_type_codec("json", encoder=str, decoder=read_stored, schema="pg_catalog")
            self._conn = conn
        return self._conn

    async def fetchmany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """`sql` once for each of `rows` (parameters by name), in one round trip and one transaction."""
        text, names = numbered(sql)
        args = [tuple(row[name] for name in names) for row in rows]
        async with self._lock:
            try:
                return await (await self._connection()).fetchmany(text, args)
            except _CONNECTION_ERRORS as exc:
                self._drop()
                raise OperationalError(text, None, exc, connection_invalidated=True) from exc
            except asyncpg.PostgresError as exc:
                raise DBAPIError(text, None, exc) from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()
