"""The floor of a PostgreSQL chain: what one engine pass costs with no engine around it.

A chain of N tasks is N passes, one after the other: the outcome of link n and the claim of link
n+1, in one round trip and one transaction. This script stores such a chain in a scratch
database and runs exactly those passes (the engine's statement, its connection settings) on one
asyncpg connection, with nothing else running: the time a pass takes here is the least a chain
link can take on this machine.

    .venv/bin/python bench/pg_pass.py postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/pg_pass.py URL --no-flush   # synchronous_commit=off: the WAL flush's share
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from run import fresh_postgres  # bench/run.py, beside this script
from taskgrove.storage import executions, statements, tree_insert
from taskgrove.storage.db import create_engine, migrate
from taskgrove.storage.models import with_defaults
from taskgrove.storage.pg import PASS_SETTINGS

OWNER, UNTIL, STAMP = "bench", "2999-01-01T00:00:00.000000+00:00", "2026-01-01T00:00:00.000000+00:00"


def link(tid: str, previous: str | None) -> dict:
    return with_defaults({"id": tid, "name": tid, "task_tree_id": "root", "parent_id": None if tid == "root" else "root",
                          "dependencies": [{"id": previous, "required": True}] if previous else [],
                          "status": "pending", "created_at": STAMP, "updated_at": STAMP})


async def measure(url: str, links: int, flush: bool) -> None:
    engine = create_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    await migrate(engine)
    rows = [link("root", None)] + [link(f"t{i}", f"t{i - 1}" if i else None) for i in range(links)]
    async with engine.begin() as c:
        await c.run_sync(lambda s: tree_insert.insert_tree(s, rows, None, OWNER, UNTIL, STAMP))
    await engine.dispose()
    settings = {**PASS_SETTINGS, **({} if flush else {"synchronous_commit": "off"})}
    conn = await asyncpg.connect(url, server_settings=settings)
    sql = statements.pass_statement().postgresql

    async def one_pass(writes: list, claims: list) -> list:
        params = executions.pg_step_params(writes, claims, OWNER, UNTIL, STAMP)
        return await conn.fetchmany(sql, params)

    epoch = (await one_pass([], ["t0"]))[0][2]
    outcome = {"status": "completed", "progress": 1.0, "result": {"ok": True}, "error": None, "completed_at": STAMP,
               "updated_at": STAMP, "lease_owner": None, "lease_expires_at": None}
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(1, links):
        found = await one_pass([(f"t{i - 1}", epoch, outcome)], [f"t{i}"])
        assert [row[0] for row in found] == ["written", "claimed"], found  # the outcome stored, the next link claimed
        epoch = found[1][2]
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    await conn.close()
    print(f"{links - 1} passes{'' if flush else ' (synchronous_commit=off)'}: "
          f"{wall / (links - 1) * 1e6:.0f} us a pass, of which {cpu / (links - 1) * 1e6:.0f} us client CPU")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    parser.add_argument("--links", type=int, default=2000)
    parser.add_argument("--no-flush", action="store_true", help="synchronous_commit=off on the pass connection")
    args = parser.parse_args()
    with fresh_postgres(args.postgres) as url:
        asyncio.run(measure(url, args.links, not args.no_flush))


if __name__ == "__main__":
    main()
