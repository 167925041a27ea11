"""Benchmark (issue 48, migrations 0020 and 0021): what the new indexes cost the write path.

Two apps in this process, each on a fresh database: one with the schema as migrated, one with it
put back as it was at 0019 (each made by DDL after the start, the same way): 0020's two parked-task indexes dropped and 0019's ix_tasks_waiting_user
(user_id) recreated, and on SQLite the roots' indexes without 0021's `name`. They take turns, `--rounds` times, each round running `--trees` 5-task trees of `noop_executor` tasks
through tasks.create over ASGI (insert, claims, outcomes: every write a create costs) and a
fan-out of 1000, so the load of a shared machine falls on both alike. Medians over the rounds.

    python bench/index_cost.py [--rounds 6] [--trees 100] [--postgres postgresql://postgres@127.0.0.1:5432/test]
    python bench/index_cost.py --sql-rows 4000 --rounds 10        # SQLite, the statements alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from typing import Any

import httpx

import run  # bench/run.py, beside this script
from taskgrove.agent.app import build_app
from taskgrove.agent.cli import freeze_long_lived_objects
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.models import with_defaults

AS_0019 = ("DROP INDEX ix_tasks_waiting_created", "DROP INDEX ix_tasks_waiting_user",
           "CREATE INDEX ix_tasks_waiting_user ON tasks (user_id) WHERE waiting IS NOT NULL")
AS_MIGRATED = ("DROP INDEX ix_tasks_waiting_created", "DROP INDEX ix_tasks_waiting_user",
               "CREATE INDEX ix_tasks_waiting_user ON tasks (user_id, created_at, id) WHERE waiting IS NOT NULL",
               "CREATE INDEX ix_tasks_waiting_created ON tasks (created_at, id) WHERE waiting IS NOT NULL")
ROOTS_AS_MIGRATED = ("DROP INDEX ix_tasks_roots_created", "DROP INDEX ix_tasks_roots_user",
                     "CREATE INDEX ix_tasks_roots_created ON tasks (created_at, id, name) WHERE parent_id IS NULL",
                     "CREATE INDEX ix_tasks_roots_user ON tasks (user_id, created_at, id, name) WHERE parent_id IS NULL")
ROOTS_AS_0019 = ("DROP INDEX ix_tasks_roots_created", "DROP INDEX ix_tasks_roots_user",
                 "CREATE INDEX ix_tasks_roots_created ON tasks (created_at, id) WHERE parent_id IS NULL",
                 "CREATE INDEX ix_tasks_roots_user ON tasks (user_id, created_at, id) WHERE parent_id IS NULL")


def five(prefix: str) -> list[dict[str, Any]]:
    root = {"id": f"{prefix}r", "name": "root", "schemas": run.NOOP}
    return [root, *({"id": f"{prefix}{i}", "name": "step", "parent_id": root["id"], "schemas": run.NOOP}
                    for i in range(4))]


async def one_round(http: httpx.AsyncClient, trees: int, tag: str) -> tuple[float, float]:
    started = time.perf_counter()
    for n in range(trees):
        await run.rpc(http, "tasks.create", five(f"{tag}-{n}-"))
    per_tree = (time.perf_counter() - started) / trees
    fan_out = await run.run_tree(http, run.with_prefix(run.fan_out(1000), f"{tag}-f-"))
    return per_tree * 1000, fan_out * 1000


async def measure(urls: dict[str, str], rounds: int, trees: int) -> None:
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, url in urls.items():
            app = build_app(Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_RATE_LIMIT_PER_USER": "0",
                                               "SERVICE_MAX_PENDING_PER_USER": "0", "SERVICE_LOG_LEVEL": "warning"}))
            await stack.enter_async_context(app.router.lifespan_context(app))
            # Both schemas are made the same way, after the start: on PostgreSQL an A/A run, where the
            # second database only recreated the migrated indexes, ran fan-outs 13 % faster than the first
            # one left alone (750 against 654 ms), which would have read as a cost of the indexes.
            engine = app.state.services.repo.engine
            sqlite = engine.dialect.name == "sqlite"
            statements = (*AS_0019, *(ROOTS_AS_0019 if sqlite else ())) if name == "as at 0019" else \
                (*AS_MIGRATED, *(ROOTS_AS_MIGRATED if sqlite else ()))
            async with engine.begin() as conn:
                for sql in statements:
                    await conn.exec_driver_sql(sql)
            clients[name] = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120))
            await one_round(clients[name], 10, "warm")
        for r in range(rounds):  # each schema goes first every other round
            for name, http in (list(clients.items()) if r % 2 == 0 else list(reversed(clients.items()))):
                times[name].append(await one_round(http, trees, f"r{r}"))
    print("| schema | 5-task tree create (ms, median of rounds) | fan-out 1000 (ms) | creates by round | fan-outs by round |\n"
          "|---|---|---|---|---|")
    for name, rows in times.items():
        print(f"| {name} | {statistics.median(t for t, _ in rows):.2f} | {statistics.median(f for _, f in rows):.1f} | "
              + " ".join(f"{t:.1f}" for t, _ in rows) + " | " + " ".join(f"{f:.0f}" for _, f in rows) + " |")


def sql_only(rounds: int, rows: int) -> None:
    """SQLite, the statements alone (no service, no disk): per round and schema, `rows` tasks
    inserted in 5-task trees (a stored row of every column) and each moved pending -> in_progress
    -> completed, in one transaction on an in-memory database; this process's CPU time per task,
    median of the rounds, and the length of each statement's program (EXPLAIN), which says what
    an index adds to it whatever the machine's load."""
    import sqlite3

    from taskgrove.storage import sqlite_schema

    def database(old: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        for statement in (*sqlite_schema.STATEMENTS, *((*AS_0019, *ROOTS_AS_0019) if old else ())):
            conn.execute(statement)
        return conn

    template = with_defaults({"id": "x", "name": "step", "user_id": "user7", "task_tree_id": "x", "created_at": "",
                              "updated_at": ""})
    insert = f"INSERT INTO tasks ({', '.join(template)}) VALUES ({', '.join('?' for _ in template)})"
    change = "UPDATE tasks SET status = ?, updated_at = ? WHERE id = ?"
    databases = {"as migrated": database(False), "as at 0019": database(True)}
    times: dict[str, list[float]] = {name: [] for name in databases}
    for r in range(rounds):
        for name, conn in (list(databases.items()) if r % 2 == 0 else list(reversed(databases.items()))):
            started = time.process_time()
            conn.execute("BEGIN")
            for n in range(rows):
                root = f"r{r}-{n // 5}"
                task_id = root if n % 5 == 0 else f"{root}-{n % 5}"
                values = {**template, "id": task_id, "parent_id": None if task_id == root else root,
                          "task_tree_id": root, "created_at": f"2026-11-29T10:{r:02}:00.{n:06}+00:00"}
                conn.execute(insert, [json.dumps(v) if isinstance(v, (dict, list)) else v for v in values.values()])
                for status in ("in_progress", "completed"):
                    conn.execute(change, (status, values["created_at"], task_id))
            conn.execute("COMMIT")
            times[name].append((time.process_time() - started) / rows * 1e6)
    print("| schema (SQLite, statements only) | CPU us a task (insert, two status changes) | insert's program | "
          "update's program | by round |\n|---|---|---|---|---|")
    for name, conn in databases.items():
        steps = [len(conn.execute(f"EXPLAIN {sql}", [None] * sql.count("?")).fetchall()) for sql in (insert, change)]
        print(f"| {name} | {statistics.median(times[name]):.2f} | {steps[0]} ops | {steps[1]} ops | "
              + " ".join(f"{t:.1f}" for t in times[name]) + " |")


def main() -> None:
    freeze_long_lived_objects()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--postgres", help="a PostgreSQL server's URL (two scratch databases are made there)")
    parser.add_argument("--sql-rows", type=int, help="SQLite statements only, this many tasks a round (sql_only)")
    args = parser.parse_args()
    if args.sql_rows:
        sql_only(args.rounds, args.sql_rows)
        return
    with tempfile.TemporaryDirectory() as tmp, run.fresh_postgres(args.postgres) as a, run.fresh_postgres(args.postgres) as b:
        if args.postgres:
            urls = {"as migrated": str(a), "as at 0019": str(b)}
        else:
            urls = {"as migrated": f"sqlite:///{tmp}/new.db", "as at 0019": f"sqlite:///{tmp}/old.db"}
        asyncio.run(measure(urls, args.rounds, args.trees))


if __name__ == "__main__":
    main()
