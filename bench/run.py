"""Benchmark: create-to-completed latency of task trees through the real HTTP surface.

Runs the ASGI app in-process (httpx ASGITransport, so no socket noise) on a fresh SQLite file, or
on PostgreSQL with --postgres URL. Each figure is "tasks.create sent" -> "every task completed and
readable through tasks.get"; tasks.create answers once the tree has finished.

    python bench/run.py [--repeat 5] [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from taskgrove.agent.app import build_app
from taskgrove.agent.cli import freeze_long_lived_objects
from taskgrove.agent.foundations.settings import Settings

NOOP = {"method": "noop_executor"}


def fan_out(n: int) -> list[dict[str, Any]]:
    root = {"id": "root", "name": "root", "schemas": NOOP}
    return [root] + [{"id": f"t{i}", "name": f"t{i}", "parent_id": "root", "schemas": NOOP} for i in range(n - 1)]


def chain(n: int) -> list[dict[str, Any]]:
    tasks = [{"id": "t0", "name": "t0", "schemas": NOOP}]
    for i in range(1, n):
        tasks.append({"id": f"t{i}", "name": f"t{i}", "parent_id": "t0", "schemas": NOOP,
                      "dependencies": [{"id": f"t{i - 1}"}]})
    return tasks


def with_prefix(tasks: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    out = []
    for t in tasks:
        t = dict(t, id=prefix + t["id"])
        if "parent_id" in t:
            t["parent_id"] = prefix + t["parent_id"]
        if "dependencies" in t:
            t["dependencies"] = [{"id": prefix + d["id"]} for d in t["dependencies"]]
        out.append(t)
    return out


async def rpc(http: httpx.AsyncClient, method: str, params: Any) -> Any:
    response = await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    answer = response.json()
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer["result"]


async def run_tree(http: httpx.AsyncClient, tasks: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    await rpc(http, "tasks.create", tasks)
    last = await rpc(http, "tasks.get", {"task_id": tasks[-1]["id"]})
    elapsed = time.perf_counter() - start
    tree = await rpc(http, "tasks.tree", {"task_id": tasks[0]["id"]})
    assert last["status"] == "completed", last
    assert _count_completed(tree) == len(tasks), "every task completed"
    return elapsed


def _count_completed(node: dict[str, Any]) -> int:
    return (node["status"] == "completed") + sum(_count_completed(c) for c in node["children"])


async def measure(url: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], list[float]]:
    # One client as fast as it can: the per-user request rate (a policy, default 200/s) is off, as
    # in bench/wire.py; the pending-task quota keeps its default, so its check is measured.
    app = build_app(Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_RATE_LIMIT_PER_USER": "0"}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=60) as http:
            await run_tree(http, with_prefix(fan_out(10), "warm-"))
            results = {}
            for label, shape in (("fan-out 1000", fan_out(1000)), ("chain 1000", chain(1000))):
                results[label] = [await run_tree(http, with_prefix(shape, f"{label[:3]}{i}-"))
                                  for i in range(args.repeat)]
            singles = [await run_tree(http, [{"id": f"one{i}", "name": "one", "schemas": NOOP}])
                       for i in range(args.single)]
    return results, singles


@contextlib.contextmanager
def fresh_postgres(admin_url: str | None) -> Iterator[str | None]:
    """A scratch database on the given server, dropped afterwards (None without --postgres)."""
    if admin_url is None:
        yield None
        return
    import asyncpg

    name = f"tg_bench_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> None:
    freeze_long_lived_objects()  # as `taskgrove serve` does before serving
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--single", type=int, default=200, help="one-task trees for the p50")
    parser.add_argument("--postgres", help="PostgreSQL URL instead of a SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fresh_postgres(args.postgres) as pg_url:
        url = pg_url or f"sqlite:///{tmp}/bench.db"
        results, singles = asyncio.run(measure(url, args))
    backend = "postgresql" if args.postgres else "sqlite"
    backend = "postgresql" if args.postgres else "sqlite"
    print(f"backend: {backend}")
    for label, times in results.items():
        print(f"{label:>14}: best {min(times) * 1000:7.1f} ms   median {statistics.median(times) * 1000:7.1f} ms")
    singles.sort()
    print(f"{'one task':>14}: p50 {statistics.median(singles) * 1000:7.2f} ms   "
          f"p95 {singles[int(len(singles) * 0.95)] * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
