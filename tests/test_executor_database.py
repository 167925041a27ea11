"""database_executor against a temporary SQLite file and the local PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from taskgrove.agent.foundations.settings import Settings, SettingsError
from taskgrove.executors.base import ExecutionContext, ExecutorError
from taskgrove.executors.database import (
    DatabaseExecutor,
    async_database_url,
    dispose_engines,
    json_safe,
    read_only_refusal,
)
from tests.deadlines import EVENT_WAIT

PG_URL = os.environ.get("TASKGROVE_TEST_POSTGRES_URL")
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(autouse=True)
async def _dispose() -> AsyncIterator[None]:
    yield
    await dispose_engines()  # pools belong to this test's event loop


def context(connections: dict[str, Any], **env: str) -> ExecutionContext:
    settings = Settings.from_env({"SERVICE_DB_CONNECTIONS": json.dumps(connections), **env})
    return ExecutionContext(task_id="t", task={}, settings=settings)


async def run(ctx: ExecutionContext, **inputs: Any) -> dict[str, Any]:
    return await DatabaseExecutor().execute(inputs, ctx)


# ---- pure helpers and settings ---------------------------------------------------------------

def test_settings_parse_connections() -> None:
    settings = Settings.from_env({"SERVICE_DB_CONNECTIONS": '{"a": {"url": "sqlite:///x.db", "allow_write": true}}'})
    assert settings.database_connections == {"a": {"url": "sqlite:///x.db", "allow_write": True}}
    assert settings.database_allow_input_url is False
    assert "x.db" not in repr(settings)  # URLs carry passwords
    assert Settings.from_env({}).database_connections == {}
    assert Settings.from_env({"SERVICE_DB_ALLOW_INPUT_URL": "true"}).database_allow_input_url


@pytest.mark.parametrize("raw", ["{not json", "[1]", '{"a": "sqlite:///x"}', '{"a": {"url": 1}}',
                                 '{"a": {"url": "sqlite:///x", "allow_write": "yes"}}'])
def test_settings_bad_connections(raw: str) -> None:
    with pytest.raises(SettingsError, match="SERVICE_DB_CONNECTIONS"):
        Settings.from_env({"SERVICE_DB_CONNECTIONS": raw})


def test_url_spellings() -> None:
    assert async_database_url("sqlite:///a.db") == "sqlite+aiosqlite:///a.db"
    assert async_database_url("postgresql://u@h/d") == "postgresql+asyncpg://u@h/d"
    assert async_database_url("postgres://u@h/d") == "postgresql+asyncpg://u@h/d"
    assert async_database_url("postgresql+asyncpg://u@h/d") == "postgresql+asyncpg://u@h/d"
    with pytest.raises(ExecutorError, match="unsupported database URL scheme 'mysql'"):
        async_database_url("mysql://u@h/d")


@pytest.mark.parametrize("sql", [
    "SELECT 1", "  -- c\n select 1", "(SELECT 1) UNION (SELECT 2)", "with x as (select 1) select * from x",
    "EXPLAIN SELECT 1", "SHOW search_path", "VALUES (1)", "PRAGMA table_info(items)",
    "PRAGMA main.user_version", "SELECT ';' AS semi;",
])
def test_reading_statements_pass_keyword_check(sql: str) -> None:
    assert read_only_refusal(sql) is None


@pytest.mark.parametrize("sql", [
    "DELETE FROM t", "/* hi */ UPDATE t SET a = 1", "insert into t values (1)", "DROP TABLE t",
    "SELECT 1; DELETE FROM t", "PRAGMA query_only = OFF", "PRAGMA query_only(0)",
    "PRAGMA journal_mode=WAL", "ATTACH DATABASE 'x' AS y", "COMMIT", "SET x = 1", "PRAGMA optimize",
])
def test_writing_statements_fail_keyword_check(sql: str) -> None:
    assert read_only_refusal(sql) is not None


def test_json_safe() -> None:
    row = json_safe([
        dt.datetime(2024, 1, 2, 3, 4, 5), dt.date(2024, 1, 2), Decimal("1.10"),
        Decimal("123456789012345678901.5"), b"\x00\x01", uuid.UUID(int=1), {"a": [Decimal("2")]},
        dt.timedelta(seconds=90), float("nan"),
    ])
    assert row == [
        "2024-01-02T03:04:05", "2024-01-02", 1.1, "123456789012345678901.5", "AAE=",
        "00000000-0000-0000-0000-000000000001", {"a": [2.0]}, 90.0, "nan",
    ]
    json.dumps(row)


# ---- SQLite ------------------------------------------------------------------------------------

@pytest.fixture
def sqlite_ctx(tmp_path: Path) -> ExecutionContext:
    path = tmp_path / "data.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price NUMERIC, blob BLOB)")
        db.executemany(
            "INSERT INTO items VALUES (?, ?, ?, ?)",
            [(i, f"item{i}", i * 1.5, bytes([i])) for i in range(1, 6)],
        )
    url = f"sqlite:///{path}"
    return context({"ro": {"url": url}, "rw": {"url": url, "allow_write": True}})


async def test_sqlite_read(sqlite_ctx: ExecutionContext) -> None:
    result = await run(sqlite_ctx, connection="ro", sql="SELECT id, name, price, blob FROM items ORDER BY id")
    assert result["columns"] == ["id", "name", "price", "blob"]
    assert result["rows"][0] == [1, "item1", 1.5, "AQ=="]
    assert result["row_count"] == 5 and result["truncated"] is False


async def test_sqlite_bound_params(sqlite_ctx: ExecutionContext) -> None:
    result = await run(sqlite_ctx, connection="ro", sql="SELECT name FROM items WHERE id = :id OR name = :name",
                       params={"id": 2, "name": "item4' OR '1'='1"})
    assert result["rows"] == [["item2"]]


async def test_sqlite_row_limit(sqlite_ctx: ExecutionContext) -> None:
    result = await run(sqlite_ctx, connection="ro", sql="SELECT id FROM items ORDER BY id", max_rows=3)
    assert result["rows"] == [[1], [2], [3]]
    assert result["row_count"] == 3 and result["truncated"] is True
    exact = await run(sqlite_ctx, connection="ro", sql="SELECT id FROM items", max_rows=5)
    assert exact["truncated"] is False


async def count_items(ctx: ExecutionContext) -> int:
    return (await run(ctx, connection="ro", sql="SELECT count(*) FROM items"))["rows"][0][0]


async def test_sqlite_write_refused_by_keyword(sqlite_ctx: ExecutionContext) -> None:
    with pytest.raises(ExecutorError, match=r"read-only connection 'ro'.*\"allow_write\": true"):
        await run(sqlite_ctx, connection="ro", sql="DELETE FROM items")
    assert await count_items(sqlite_ctx) == 5


async def test_sqlite_write_trick_stopped_by_database(sqlite_ctx: ExecutionContext) -> None:
    with pytest.raises(ExecutorError, match="readonly"):
        await run(sqlite_ctx, connection="ro", sql="WITH x AS (SELECT 1) DELETE FROM items")
    assert await count_items(sqlite_ctx) == 5


async def test_sqlite_write_allowed_when_configured(sqlite_ctx: ExecutionContext) -> None:
    result = await run(sqlite_ctx, connection="rw", sql="INSERT INTO items (id, name) VALUES (:id, :n)",
                       params={"id": 9, "n": "new"})
    assert result["affected_rows"] == 1 and result["rows"] == []
    assert await count_items(sqlite_ctx) == 6
    # The pooled connection the write used must not stay writable for read-only tasks.
    with pytest.raises(ExecutorError, match="readonly"):
        await run(sqlite_ctx, connection="ro", sql="WITH x AS (SELECT 1) DELETE FROM items")
    assert await count_items(sqlite_ctx) == 6


async def test_sqlite_pragma(sqlite_ctx: ExecutionContext) -> None:
    result = await run(sqlite_ctx, connection="ro", sql="PRAGMA table_info(items)")
    assert [row[1] for row in result["rows"]] == ["id", "name", "price", "blob"]
    with pytest.raises(ExecutorError, match="PRAGMA"):
        await run(sqlite_ctx, connection="ro", sql="PRAGMA query_only = OFF")


async def test_sqlite_timeout_interrupts_query(sqlite_ctx: ExecutionContext) -> None:
    started = time.monotonic()
    with pytest.raises(ExecutorError, match="timed out after 0.5s"):
        await asyncio.wait_for(run(sqlite_ctx, connection="ro", sql=ENDLESS, timeout=0.5), EVENT_WAIT)
    assert time.monotonic() - started < 10  # the query never ends; 10 s is a busy machine's margin
    assert await count_items(sqlite_ctx) == 5  # the connection is usable again


async def test_sqlite_cancel_interrupts_query(sqlite_ctx: ExecutionContext) -> None:
    task = asyncio.create_task(run(sqlite_ctx, connection="ro", sql=ENDLESS, timeout=60))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, EVENT_WAIT)


async def test_sql_error_is_reported(sqlite_ctx: ExecutionContext) -> None:
    with pytest.raises(ExecutorError, match="no such table: nope"):
        await run(sqlite_ctx, connection="ro", sql="SELECT * FROM nope")
    with pytest.raises(ExecutorError, match="database error"):
        await run(sqlite_ctx, connection="ro", sql="SELECT :missing")


async def test_unknown_connection(sqlite_ctx: ExecutionContext) -> None:
    with pytest.raises(ExecutorError, match=r"unknown database connection 'other' \(configured: ro, rw"):
        await run(sqlite_ctx, connection="other", sql="SELECT 1")
    with pytest.raises(ExecutorError, match="connection is required"):
        await run(sqlite_ctx, sql="SELECT 1")


async def test_input_url_refused_by_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ExecutorError, match="SERVICE_DB_ALLOW_INPUT_URL=true"):
        await run(context({}), url=url, sql="SELECT 1")
    allowed = context({}, SERVICE_DB_ALLOW_INPUT_URL="true")
    assert (await run(allowed, url=url, sql="SELECT 1 AS one"))["rows"] == [[1]]
    with pytest.raises(ExecutorError, match="read-only"):  # input URLs never write
        await run(allowed, url=url, sql="CREATE TABLE t (a)")


# ---- PostgreSQL ----------------------------------------------------------------------------

@pytest.fixture
async def pg_ctx() -> AsyncIterator[tuple[ExecutionContext, str]]:
    import asyncpg

    if not PG_URL:
        pytest.skip("needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")
    admin = await asyncpg.connect(PG_URL, timeout=10)  # set but unreachable is a failure
    schema = f"tg_exec_{uuid.uuid4().hex[:10]}"
    try:
        await admin.execute(f"""
            CREATE SCHEMA {schema};
            CREATE TABLE {schema}.items (
                id int PRIMARY KEY, name text, price numeric(10, 2), at timestamptz,
                raw bytea, doc jsonb, tags text[]);
            INSERT INTO {schema}.items
                SELECT i, 'item' || i, i * 1.25, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 day',
                       decode('0102', 'hex'), jsonb_build_object('n', i), ARRAY['a', 'b']
                FROM generate_series(1, 5) AS i;
        """)
        yield context({"ro": {"url": PG_URL}, "rw": {"url": PG_URL, "allow_write": True}}), schema
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


async def test_pg_read_types(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, schema = pg_ctx
    result = await run(ctx, connection="ro", sql=f"SELECT * FROM {schema}.items ORDER BY id")
    assert result["columns"] == ["id", "name", "price", "at", "raw", "doc", "tags"]
    assert result["rows"][0] == [1, "item1", 1.25, "2024-01-02T00:00:00+00:00", "AQI=", {"n": 1}, ["a", "b"]]
    json.dumps(result)


async def test_pg_bound_params_and_limit(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, schema = pg_ctx
    result = await run(ctx, connection="ro", sql=f"SELECT id FROM {schema}.items WHERE id >= :low ORDER BY id",
                       params={"low": 2}, max_rows=2)
    assert result["rows"] == [[2], [3]] and result["truncated"] is True


async def test_pg_write_refused(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, schema = pg_ctx
    with pytest.raises(ExecutorError, match="allow_write"):
        await run(ctx, connection="ro", sql=f"DELETE FROM {schema}.items")
    with pytest.raises(ExecutorError, match="read-only transaction"):
        await run(ctx, connection="ro",
                  sql=f"WITH d AS (DELETE FROM {schema}.items RETURNING *) SELECT count(*) FROM d")
    with pytest.raises(ExecutorError, match="read-only transaction"):
        await run(ctx, connection="ro", sql=f"EXPLAIN ANALYZE DELETE FROM {schema}.items")
    result = await run(ctx, connection="ro", sql=f"SELECT count(*) FROM {schema}.items")
    assert result["rows"] == [[5]]


async def test_pg_write_allowed_when_configured(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, schema = pg_ctx
    result = await run(ctx, connection="rw", sql=f"UPDATE {schema}.items SET name = :n WHERE id <= 2",
                       params={"n": "renamed"})
    assert result["affected_rows"] == 2
    result = await run(ctx, connection="rw", sql=f"DELETE FROM {schema}.items WHERE id = 5 RETURNING id")
    assert result["rows"] == [[5]]
    result = await run(ctx, connection="ro", sql=f"SELECT count(*) FROM {schema}.items WHERE name = 'renamed'")
    assert result["rows"] == [[2]]


async def test_pg_timeout(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, _ = pg_ctx
    started = time.monotonic()
    with pytest.raises(ExecutorError, match="timed out after 0.5s"):
        await run(ctx, connection="ro", sql="SELECT pg_sleep(60)", timeout=0.5)
    assert time.monotonic() - started < 10  # long before the query's end; a busy machine's margin
    assert (await run(ctx, connection="ro", sql="SELECT 1"))["rows"] == [[1]]


async def test_pg_cancel(pg_ctx: tuple[ExecutionContext, str]) -> None:
    ctx, _ = pg_ctx
    task = asyncio.create_task(run(ctx, connection="ro", sql="SELECT pg_sleep(60)", timeout=120))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, EVENT_WAIT)
    assert time.monotonic() - started < 10  # long before the query's end; a busy machine's margin
