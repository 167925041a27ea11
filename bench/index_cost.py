"""Benchmark (issue 48, migrations 0020 and 0021): what the new indexes cost the write path.

Two apps in this process, each on a fresh database: one with the schema as migrated, one with it
put back as it was at 0019: 0020's two parked-task indexes dropped and 0019's ix_tasks_waiting_user
(user_id) recreated, and on SQLite the roots' indexes without 0021's `name`. They take turns, `--rounds` times, each round running `--trees` 5-task trees of `noop_executor` tasks
through tasks.create over ASGI (insert, claims, outcomes: every write a create costs) and a
fan-out of 1000, so the load of a shared machine falls on both alike. Medians over the rounds.

    python bench/index_cost.py [--rounds 6] [--trees 100] [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from typing import Any

import httpx

import run  # bench/run.py, beside this script
from taskgrove.agent.app import build_app
from taskgrove.agent.cli import freeze_long_lived_objects
from taskgrove.agent.foundations.settings import Settings

AS_0019 = ("DROP INDEX ix_tasks_waiting_created", "DROP INDEX ix_tasks_waiting_user",
           "CREATE INDEX ix_tasks_waiting_user ON tasks (user_id) WHERE waiting IS NOT NULL")
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
            if name == "as at 0019":
                engine = app.state.services.repo.engine
                async with engine.begin() as conn:
                    for sql in (*AS_0019, *(ROOTS_AS_0019 if engine.dialect.name == "sqlite" else ())):
                        await conn.exec_driver_sql(sql)
            clients[name] = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120))
            await one_round(clients[name], 10, "warm")
        for r in range(rounds):
            for name, http in clients.items():
                times[name].append(await one_round(http, trees, f"r{r}"))
    print("| schema | 5-task tree create (ms, median of rounds) | fan-out 1000 (ms) |\n|---|---|---|")
    for name, rows in times.items():
        print(f"| {name} | {statistics.median(t for t, _ in rows):.2f} | {statistics.median(f for _, f in rows):.1f} |")


def main() -> None:
    freeze_long_lived_objects()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--postgres", help="a PostgreSQL server's URL (two scratch databases are made there)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, run.fresh_postgres(args.postgres) as a, run.fresh_postgres(args.postgres) as b:
        if args.postgres:
            urls = {"as migrated": str(a), "as at 0019": str(b)}
        else:
            urls = {"as migrated": f"sqlite:///{tmp}/new.db", "as at 0019": f"sqlite:///{tmp}/old.db"}
        asyncio.run(measure(urls, args.rounds, args.trees))


if __name__ == "__main__":
    main()
