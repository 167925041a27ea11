"""Shared fixtures: an app per test on a fresh database, driven over HTTP through httpx.

Storage-backed tests run on SQLite, and again on PostgreSQL when TASKGROVE_TEST_POSTGRES_URL is
set (`.ci/run` sets it). The PostgreSQL tests share one scratch database per session, emptied
before each test (creating a database per test tripled the suite's time); tests that need a
database of their own (several instances) use `postgres_database()`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import EVENT_WAIT
from tests.processes import IN_PROCESS_SLEEPS

pytest_plugins = ["tests.fakellm"]  # the fake OpenAI-compatible server fixtures

POSTGRES_URL = os.environ.get("TASKGROVE_TEST_POSTGRES_URL")
BACKENDS = ["sqlite"] + (["postgres"] if POSTGRES_URL else [])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def postgres_session_url() -> Iterator[str]:
    # Its own event loop, in a thread: the first user is an async fixture whose loop is running.
    url = _in_thread(create_postgres_database)
    try:
        yield url
    finally:
        _in_thread(lambda: drop_postgres_database(url))


def _in_thread(make: Callable[[], Any]) -> Any:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


@pytest.fixture
async def db_url(backend: str, tmp_path: Any, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    url = request.getfixturevalue("postgres_session_url")
    await empty_database(url)
    yield url


async def empty_database(url: str) -> None:
    """Remove every row the previous test left (the schema and its migrations stay).

    TRUNCATE, not DELETE: a DELETE is some 10 times cheaper here, but leaves every row dead until
    a vacuum, and CI's PostgreSQL runs without autovacuum, so some 860 tests' dead rows would
    pile up under the later tests' reads.

    Only the tables that hold a row are truncated: TRUNCATE gives each table (and each of its
    indexes) new files, some 70 ms for all 13 tables, while most tests fill only a few; which
    ones do is one query (an EXISTS per table, well under a millisecond)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        tables = [r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'")]
        if tables:
            filled = [r["name"] for r in await conn.fetch(" UNION ALL ".join(
                f"SELECT '{t}' AS name WHERE EXISTS (SELECT 1 FROM \"{t}\")" for t in tables))]
            if filled:
                await conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in filled) + " CASCADE")
    finally:
        await conn.close()


async def create_postgres_database() -> str:
    import asyncpg

    assert POSTGRES_URL is not None
    admin_url = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    name = f"tg_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{admin_url.rpartition('/')[0]}/{name}"


async def drop_postgres_database(url: str) -> None:
    import asyncpg

    assert POSTGRES_URL is not None
    conn = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')
    finally:
        await conn.close()


async def terminate_backend(pid: int, wait_ms: int = 0) -> None:
    """End a PostgreSQL server process as an admin, a failover or a restart would (wait_ms: wait
    that long for it to be gone; 0: return once the signal is sent)."""
    import asyncpg

    assert POSTGRES_URL is not None
    admin = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1, $2)", pid, wait_ms)
    finally:
        await admin.close()


@asynccontextmanager
async def postgres_database() -> AsyncIterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    url = await create_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(url)


@pytest.fixture
def make_settings(db_url: str) -> Callable[..., Settings]:
    def make(env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        # The per-user request rate is off: tests send requests as fast as a loop can, and the
        # rate (a policy, default 200/s) is tested on its own in tests/test_admission.py.
        # Long sleep_executor tasks are the tests' stand-in for slow work running in a slot: they do
        # not park as durable timers here (tests/test_waits.py sets SERVICE_PARK_SLEEP_SECONDS itself).
        base = {"SERVICE_DATABASE_URL": db_url, "SERVICE_ALLOW_PRIVATE_URLS": "true",
                "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_PARK_SLEEP_SECONDS": IN_PROCESS_SLEEPS}
        return Settings.from_env({**base, **(env or {})}, **overrides)

    return make


class Client:
    """httpx client against an app, with JSON-RPC helpers."""

    def __init__(self, http: httpx.AsyncClient, app: Any) -> None:
        self.http = http
        self.app = app
        self.services = app.state.services
        self._ids = 0

    async def call(self, method: str, params: Any = None, *, path: str = "/tasks",
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The whole JSON-RPC response object."""
        self._ids += 1
        call_id = self._ids  # its own: calls may run concurrently (tests/test_races.py)
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": call_id}
        if params is not None:
            body["params"] = params
        response = await self.http.post(path, json=body, headers=headers or {})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["id"] == call_id
        return answer

    async def result(self, method: str, params: Any = None, **kw: Any) -> Any:
        answer = await self.call(method, params, **kw)
        assert "error" not in answer, answer
        return answer["result"]

    async def error(self, method: str, params: Any = None, **kw: Any) -> dict[str, Any]:
        answer = await self.call(method, params, **kw)
        assert "error" in answer, answer
        return answer["error"]

    async def wait_status(self, task_id: str, statuses: tuple[str, ...], timeout: float = EVENT_WAIT) -> dict[str, Any]:
        """Poll tasks.get until the task reaches one of `statuses` (for asynchronous executions)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            task = await self.result("tasks.get", {"task_id": task_id})
            if task and task["status"] in statuses:
                return task
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"task {task_id} stuck in {task and task['status']}")
            await asyncio.sleep(0.02)


    async def runs_ended(self, timeout: float = EVENT_WAIT) -> bool:
        """True once this instance drives no execution (ending one is a last database write)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.services.engine.runs and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return not self.services.engine.runs


@asynccontextmanager
async def running_app(settings: Settings, **kw: Any) -> AsyncIterator[Client]:
    if "SERVICE_SHUTDOWN_GRACE_SECONDS" not in settings.environ:
        settings = settings.with_(shutdown_grace_seconds=0.0)  # tests stop at once unless they say otherwise
    app = build_app(settings, **kw)
    # A test still in here this long before pytest-timeout ends it: print where every asyncio task
    # waits (the timeout's own report shows only the event loop idling).
    watchdog = asyncio.get_running_loop().call_later(HANG_REPORT_SECONDS, _print_tasks)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
                yield Client(http, app)
    finally:
        watchdog.cancel()


HANG_REPORT_SECONDS = 240.0  # pyproject's pytest timeout is 300


def _print_tasks() -> None:
    import sys

    print(f"--- still running after {HANG_REPORT_SECONDS:.0f} s; the asyncio tasks:", file=sys.stderr)
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


@pytest.fixture
async def client(make_settings: Callable[..., Settings]) -> AsyncIterator[Client]:
    async with running_app(make_settings()) as c:
        yield c


@pytest.fixture
def app_factory(make_settings: Callable[..., Settings]) -> Callable[..., Any]:
    """`async with app_factory(env={...}) as client:` for tests that need other settings."""

    def factory(env: dict[str, str] | None = None, **overrides: Any) -> Any:
        return running_app(make_settings(env, **overrides))

    return factory
