"""SQLite made full with its own `PRAGMA max_page_count` (issue 46): readiness says so, every
request that needs a write is a retryable 503 in its surface's form (never -32603), reads go on,
and writes work again as soon as there is room, without a restart.

How the disk is filled: the database gets a filler table first, then every connection the service
opens is held to the file's size plus a few pages (a `connect` listener on SQLAlchemy's pools), so
the service's own writes soon find no room. Room is made as an operator would: another connection
deletes the filler, whose pages go to SQLite's freelist, where the service's writes find them.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE, INTERNAL_ERROR
from taskgrove.agent.foundations.settings import Settings
from tests.conftest import Client, running_app
from tests.test_engine import task
from tests.test_operations import sample

SLACK_PAGES = 6
FILLER_ROWS = 60  # ~60 pages of 4 KB freed when room is made


@contextmanager
def held_to_size(limit: int) -> Iterator[None]:
    """Every SQLite connection SQLAlchemy opens meanwhile may grow the file to `limit` pages."""

    def connected(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA max_page_count = {limit}")
        cursor.close()

    event.listen(Pool, "connect", connected)
    try:
        yield
    finally:
        event.remove(Pool, "connect", connected)


def fill(path: Path) -> int:
    """Add the filler table and return the file's page count with it (WAL copied in)."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE filler (blob BLOB)")
        conn.executemany("INSERT INTO filler VALUES (?)", [(b"x" * 4000,) for _ in range(FILLER_ROWS)])
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(conn.execute("PRAGMA page_count").fetchone()[0])


def make_room(path: Path) -> None:
    with sqlite3.connect(path, timeout=60) as conn:
        conn.execute("DELETE FROM filler")


def big_tree(root: str) -> list[dict[str, Any]]:
    payload = {"text": "y" * 6000}
    return [task(root, inputs=payload), task(f"{root}-a", root, inputs=payload), task(f"{root}-b", root,
                                                                                     inputs=payload)]


async def create(client: Client, tree: list[dict[str, Any]]) -> Any:
    """The raw HTTP answer of one tasks.create."""
    return await client.http.post("/tasks", json={"jsonrpc": "2.0", "id": tree[0]["id"], "method": "tasks.create",
                                                  "params": tree})


def assert_refused_full(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == DATABASE_UNAVAILABLE and error["code"] != INTERNAL_ERROR
    assert error["data"]["reason"] == "full" and error["data"]["retry_after"] >= 1


async def test_a_full_sqlite_database_is_a_retryable_503_and_writes_resume_when_there_is_room(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "full.db"
    settings = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{path}", "SERVICE_RATE_LIMIT_PER_USER": "0",
                                  "SERVICE_ENABLE_METRICS": "true"}).with_(shutdown_grace_seconds=0.0)
    async with running_app(settings) as client:  # migrate, and one tree stored before
        await client.result("tasks.create", big_tree("before"))
    limit = fill(path) + SLACK_PAGES

    caplog.set_level(logging.INFO)
    with held_to_size(limit):
        async with running_app(settings) as client:
            refused: list[list[dict[str, Any]]] = []
            stored: list[str] = []
            for n in range(200):  # the slack runs out within a few trees
                tree = big_tree(f"t{n}")
                response = await create(client, tree)  # answered at once: no wait on a full disk
                if response.status_code == 200 and "result" in response.json():
                    stored.append(tree[0]["id"])
                    continue
                assert_refused_full(response)
                refused.append(tree)
                if len(refused) >= 3:
                    break
            assert refused, "the database never filled up"

            ready = await client.http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["database_error"] == "full"
            assert int(ready.headers["Retry-After"]) >= 1
            metrics = (await client.http.get("/metrics")).text
            assert sample(metrics, "taskgrove_database_up") == 0
            assert sample(metrics, "taskgrove_database_outages_total", reason="full") == 1
            # What was stored before stays readable.
            before = await client.result("tasks.get", {"task_id": "before"})
            assert before["status"] == "completed"

            make_room(path)
            deadline = asyncio.get_running_loop().time() + 120
            while (await client.http.get("/readyz")).status_code != 200:
                assert asyncio.get_running_loop().time() < deadline, "never ready again"
                await asyncio.sleep(0.2)
            for tree in refused:  # resent with the same ids: stored once, and run
                response = await create(client, tree)
                assert response.status_code == 200 and "result" in response.json(), response.text
            metrics = (await client.http.get("/metrics")).text
            assert sample(metrics, "taskgrove_database_up") == 1
            for tree in refused:  # the resent trees run to the end: the database has room again
                for tid in (tree[0]["id"], f"{tree[0]['id']}-a", f"{tree[0]['id']}-b"):
                    found = await client.wait_status(tid, ("completed", "failed", "cancelled"), timeout=120)
                    assert found["status"] == "completed", found
            # Trees stored just before the disk filled, whose attempts ended while nothing could be
            # written: their outcomes waited in memory, their leases were renewed meanwhile
            # (passes.unwritten), and they complete once there is room (issue 46, item 4).
            for root in stored:
                for tid in (root, f"{root}-a", f"{root}-b"):
                    found = await client.wait_status(tid, ("completed", "failed", "cancelled"), timeout=120)
                    assert found["status"] == "completed", found

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "database full" in r.getMessage()]
    backs = [r for r in caplog.records if r.levelno == logging.INFO and "database is back" in r.getMessage()]
    assert len(warnings) == 1 and len(backs) == 1, [r.getMessage() for r in caplog.records]
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info and r.name.startswith("taskgrove")]
    assert not tracebacks, tracebacks
