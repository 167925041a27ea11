"""Benchmark (issue 32): list shapes and /metrics at 1,000 tasks and at a large table.

Fills one database through the service's own store path (`TaskService.create_tree`: the rows
`prepare_new_tree` makes, inserted by `TaskRepository.insert`), in trees of 10 tasks for 50 users,
mostly completed (as a long-lived service's table is), then times each read in-process through
the ASGI app (httpx, no sockets): the median of `--calls` calls, at each size in `--sizes`.

    python bench/volume.py [--sizes 1000,300000] [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import httpx

from taskgrove.agent.app import build_app
from taskgrove.agent.auth import Caller
from taskgrove.agent.requests import NewTree
from taskgrove.agent.settings import Settings

USERS = 50
TREE = 10
STATUSES = ["completed"] * 17 + ["failed", "cancelled", "pending"]  # per tree, by its number


def tree(n: int) -> list[dict[str, Any]]:
    user, status = f"user{n % USERS}", STATUSES[n % len(STATUSES)]
    root = {"id": f"t{n:07}", "name": f"tree {n}", "user_id": user, "status": status}
    return [root, *({"id": f"t{n:07}-{i}", "name": "step", "parent_id": root["id"], "user_id": user,
                     "status": status} for i in range(TREE - 1))]


async def fill(services: Any, start: int, trees: int) -> None:
    anyone = Caller()
    for n in range(start, start + trees):
        await services.tasks.create_tree(NewTree.from_params(tree(n)), anyone)


async def rpc(http: httpx.AsyncClient, params: dict[str, Any]) -> Any:
    response = await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.list", "params": params})
    return response.json()["result"]


async def shapes(http: httpx.AsyncClient) -> dict[str, dict[str, Any] | str]:
    """The reads timed, each with a cursor taken from the table as it is now. Page sizes are such
    that every page is full at 1,000 tasks too (a user has 20 tasks there, 100 trees in all), so
    the two sizes compare pages of the same length."""
    by_user = await rpc(http, {"user_id": "user7", "limit": 10, "cursor": None})
    roots = await rpc(http, {"root_only": True, "limit": 50, "cursor": None})
    deep: Any = {"next_cursor": None}
    for _ in range(50):  # up to 5,000 rows down by cursor, short of the last page
        following = await rpc(http, {"limit": 100, "cursor": deep["next_cursor"]})
        if following["next_cursor"] is None:
            break
        deep = following
    return {
        "list by user_id": {"user_id": "user7", "limit": 10},
        "list by user_id, page 2 by cursor": {"user_id": "user7", "limit": 10, "cursor": by_user["next_cursor"]},
        "root_only": {"root_only": True, "limit": 50},
        "root_only, page 2 by cursor": {"root_only": True, "limit": 50, "cursor": roots["next_cursor"]},
        "everything, first page": {"limit": 100},
        "offset 5000": {"limit": 100, "offset": 5000},
        "up to 5000 down by cursor": {"limit": 100, "cursor": deep["next_cursor"]},
        "/metrics": "/metrics",
    }


async def timed(http: httpx.AsyncClient, what: dict[str, Any] | str, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        if isinstance(what, str):
            assert (await http.get(what)).status_code == 200
        else:
            await rpc(http, what)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,300000", help="task counts to measure at, ascending")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--postgres", help="a PostgreSQL URL (an empty database) instead of a SQLite file")
    args = parser.parse_args()
    url = args.postgres or f"sqlite:///{tempfile.mkdtemp()}/volume.db"
    settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_RATE_LIMIT_PER_USER": "0",
                                  "SERVICE_MAX_PENDING_PER_USER": "0", "SERVICE_LOG_LEVEL": "warning"})
    app = build_app(settings)
    results: dict[str, dict[int, float]] = {}
    async with app.router.lifespan_context(app):
        services = app.state.services
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=60) as http:
            stored = 0
            for size in (int(s) for s in args.sizes.split(",")):
                started = time.perf_counter()
                await fill(services, stored // TREE, (size - stored) // TREE)
                stored = size
                print(f"filled to {size} tasks in {time.perf_counter() - started:.1f} s", flush=True)
                for name, what in (await shapes(http)).items():
                    results.setdefault(name, {})[size] = await timed(http, what, args.calls)
    sizes = sorted({size for row in results.values() for size in row})
    print("| read | " + " | ".join(f"{size:,} tasks" for size in sizes) + " | ratio |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for name, row in results.items():
        ratio = row[sizes[-1]] / row[sizes[0]]
        print(f"| {name} | " + " | ".join(f"{row[size]:.2f} ms" for size in sizes) + f" | {ratio:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())
