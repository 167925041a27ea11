"""The floor of a chain link: the engine's own statements for a link, with no engine around them.

A chain link is one engine pass: the fenced write of link n's outcome (with its attempt's history
row) and the claim of link n+1, in one transaction. This module stores a chain in a fresh store
and runs exactly those passes through the storage functions the engine's pass calls
(executions.sqlite_pass on the loop thread's SQLite connection, its settings and its commit;
statements.pass_statement on one asyncpg connection with the engine's settings), one after the
other, nothing else running. What a link costs here is the least a chain link can cost.

    .venv/bin/python bench/floor.py                       # SQLite (a fresh file)
    .venv/bin/python bench/floor.py --postgres postgresql://postgres@127.0.0.1:5432/test

bench/peers.py runs it in the same run as the peer comparison and sets it against taskgrove's
chain over HTTP (per-step overhead, CPU of a link against its bare SQL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from cpu import postgres_seconds  # bench/cpu.py, beside this script
from run import fresh_postgres  # bench/run.py
from taskgrove.storage import executions, statements, tree_insert
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.db import create_engine, create_loop_engine, migrate
from taskgrove.storage.models import with_defaults
from taskgrove.storage.pg import PASS_SETTINGS

OWNER, UNTIL, STAMP = "bench", "2999-01-01T00:00:00.000000+00:00", "2026-01-01T00:00:00.000000+00:00"
# What the pass writes for a completed noop_executor attempt (agent/engine/live_attempts.py).
OUTCOME = {"status": "completed", "progress": 1.0, "result": {"ok": True}, "error": None, "completed_at": STAMP,
           "updated_at": STAMP, "lease_owner": None, "lease_expires_at": None}


@dataclass
class Floor:
    """Per-link wall times (seconds) and CPU a link (seconds): this process's (the SQL's driver
    and, on SQLite, the SQL itself) and PostgreSQL's backends'."""

    backend: str
    walls: list[float]
    client_cpu: float
    server_cpu: float

    def p(self, q: float) -> float:
        ordered = sorted(self.walls)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

    def summary(self) -> dict[str, Any]:
        return {"backend": self.backend, "links": len(self.walls),
                "link_p50_us": round(self.p(0.5) * 1e6, 1), "link_p99_us": round(self.p(0.99) * 1e6, 1),
                "link_mean_us": round(statistics.fmean(self.walls) * 1e6, 1),
                "chain_1000_ms": round(statistics.fmean(self.walls) * 1000 * 1000, 1),
                "cpu_a_link_us": round(self.client_cpu * 1e6, 1),
                "postgres_cpu_a_link_us": round(self.server_cpu * 1e6, 1)}


def link(tid: str, previous: str | None) -> dict[str, Any]:
    return with_defaults({"id": tid, "name": tid, "task_tree_id": "root", "parent_id": None if tid == "root" else "root",
                          "dependencies": [{"id": previous, "required": True}] if previous else [],
                          "status": "pending", "created_at": STAMP, "updated_at": STAMP})


def history(tid: str) -> dict[str, Attempt]:
    return {tid: Attempt(tid, 1, STAMP, STAMP, STAMP, "completed", None)}


def chain_rows(links: int) -> list[dict[str, Any]]:
    return [link("root", None)] + [link(f"t{i}", f"t{i - 1}" if i else None) for i in range(links)]


async def _migrated(async_url: str, rows: list[dict[str, Any]] | None) -> None:
    """The newest schema; with `rows` (PostgreSQL), the chain stored too."""
    engine = create_engine(async_url)
    await migrate(engine)
    if rows is not None:
        async with engine.begin() as c:
            await c.run_sync(lambda s: tree_insert.insert_tree(s, rows, None, OWNER, UNTIL, STAMP))
    await engine.dispose()


def sqlite_floor(links: int = 1000, workdir: str | None = None) -> Floor:
    """The SQLite pass of each link on the loop thread's connection (LOOP_PRAGMAS), committed as
    Connections.run_here commits it: in this process, so its CPU is the SQL's (and the storage
    function's few Python calls)."""
    path = Path(workdir or tempfile.mkdtemp(prefix="taskgrove-floor-")) / "floor.db"
    asyncio.run(_migrated(f"sqlite+aiosqlite:///{path}", None))
    engine = create_loop_engine(f"sqlite:///{path}")
    assert engine is not None
    with engine.begin() as conn:
        tree_insert.insert_tree(conn, chain_rows(links + 1), None, OWNER, UNTIL, STAMP)
    with engine.connect() as conn:
        claimed = executions.sqlite_pass(conn, (), ["t0"], OWNER, UNTIL, STAMP)[1]
        conn.connection.driver_connection.commit()
        epoch = claimed["t0"]["lease_epoch"]
        walls: list[float] = []
        cpu = time.process_time()
        for i in range(1, links + 1):
            started = time.perf_counter()
            accepted, claimed, _ = executions.sqlite_pass(conn, [(f"t{i - 1}", epoch, OUTCOME)], [f"t{i}"], OWNER,
                                                          UNTIL, STAMP, (), history(f"t{i - 1}"))
            conn.connection.driver_connection.commit()
            walls.append(time.perf_counter() - started)
            assert accepted == {f"t{i - 1}"} and f"t{i}" in claimed, (accepted, claimed)
            epoch = claimed[f"t{i}"]["lease_epoch"]
        cpu = time.process_time() - cpu
    engine.dispose()
    return Floor("sqlite", walls, cpu / links, 0.0)


async def _pg_passes(url: str, links: int) -> Floor:
    conn = await asyncpg.connect(url, server_settings=PASS_SETTINGS)
    sql = statements.pass_statement().postgresql

    async def one_pass(writes: list[Any], claims: list[str], done: str | None) -> list[Any]:
        params = executions.pg_step_params(writes, claims, OWNER, UNTIL, STAMP, (), done and history(done))
        return await conn.fetchmany(sql, params)

    epoch = (await one_pass([], ["t0"], None))[0][2]
    walls: list[float] = []
    cpu, pg_cpu = time.process_time(), postgres_seconds()
    for i in range(1, links + 1):
        started = time.perf_counter()
        found = await one_pass([(f"t{i - 1}", epoch, OUTCOME)], [f"t{i}"], f"t{i - 1}")
        walls.append(time.perf_counter() - started)
        assert [row[0] for row in found] == ["written", "claimed"], found
        epoch = found[1][2]
    cpu, pg_cpu = time.process_time() - cpu, postgres_seconds() - pg_cpu
    await conn.close()
    return Floor("postgresql", walls, cpu / links, pg_cpu / links)


def pg_floor(url: str, links: int = 1000) -> Floor:
    """The PostgreSQL pass of each link (one statement, one round trip, one commit) on a
    database of its own (`url` is a scratch database: fresh_postgres)."""
    asyncio.run(_migrated(url.replace("postgresql://", "postgresql+asyncpg://", 1), chain_rows(links + 1)))
    return asyncio.run(_pg_passes(url, links))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    parser.add_argument("--links", type=int, default=1000)
    args = parser.parse_args()
    if args.postgres is None:
        print(json.dumps(sqlite_floor(args.links).summary()))
        return
    with fresh_postgres(args.postgres) as url:
        assert url is not None
        print(json.dumps(pg_floor(url, args.links).summary()))


if __name__ == "__main__":
    main()
