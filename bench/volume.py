"""Benchmark (issue 32): list shapes and /metrics at 1,000 tasks and at a large table.

Fills one database per size through the service's own store path (`TaskService.create_tree`: the rows
`prepare_new_tree` makes, inserted by `TaskRepository.insert`), in trees of 10 tasks for 50 users,
mostly completed (as a long-lived service's table is), then times each read in-process through
the ASGI app (httpx, no sockets), in rounds that alternate the databases (a shared machine's load
falls on every size alike): the median of every call of a read, per size.

    python bench/volume.py [--sizes 1000,300000] [--rounds 5 --calls 10]
    python bench/volume.py --postgres postgresql://postgres@127.0.0.1:5432/x   # volume_1000, volume_300000: empty
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
    deep = None  # the cursor of a full page up to 5,000 rows down (at 1,000 tasks: the last full page)
    for _ in range(50):
        following = (await rpc(http, {"limit": 100, "cursor": deep}))["next_cursor"]
        if following is None or len((await rpc(http, {"limit": 100, "cursor": following}))["tasks"]) < 100:
            break
        deep = following
    return {
        "list by user_id": {"user_id": "user7", "limit": 10},
        "list by user_id, page 2 by cursor": {"user_id": "user7", "limit": 10, "cursor": by_user["next_cursor"]},
        "root_only": {"root_only": True, "limit": 50},
        "root_only, page 2 by cursor": {"root_only": True, "limit": 50, "cursor": roots["next_cursor"]},
        "everything, first page": {"limit": 100},
        "offset 5000": {"limit": 100, "offset": 5000},
        "up to 5000 down by cursor": {"limit": 100, "cursor": deep},
        "/metrics": "/metrics",
    }


async def timed(http: httpx.AsyncClient, what: dict[str, Any] | str, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        if isinstance(what, str):
            assert (await http.get(what)).status_code == 200
        else:
            await rpc(http, what)
        times.append((time.perf_counter() - started) * 1000)
    return times


def database_url(args: argparse.Namespace, size: int) -> str:
    if args.postgres:
        return args.postgres.rsplit("/", 1)[0] + f"/{args.database_prefix}_{size}"
    return f"sqlite:///{tempfile.mkdtemp()}/volume-{size}.db"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,300000", help="task counts, one database each")
    parser.add_argument("--calls", type=int, default=10, help="calls per shape, size and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", help="a PostgreSQL URL; databases <prefix>_<size> next to it must exist, empty")
    parser.add_argument("--database-prefix", default="volume")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    times: dict[str, dict[int, list[float]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[int, httpx.AsyncClient] = {}
        for size in sizes:
            settings = Settings.from_env({"SERVICE_DATABASE_URL": database_url(args, size),
                                          "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_MAX_PENDING_PER_USER": "0",
                                          "SERVICE_LOG_LEVEL": "warning"})
            app = build_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            started = time.perf_counter()
            await fill(app.state.services, 0, size // TREE)
            print(f"filled {size} tasks in {time.perf_counter() - started:.1f} s", flush=True)
            clients[size] = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=60))
        reads = {size: await shapes(client) for size, client in clients.items()}
        # Rounds alternate the databases, so the load of this shared machine falls on both alike.
        for _ in range(args.rounds):
            for size, client in clients.items():
                for name, what in reads[size].items():
                    times.setdefault(name, {}).setdefault(size, []).extend(await timed(client, what, args.calls))
    print(f"| read | " + " | ".join(f"{size:,} tasks" for size in sizes) + " | ratio |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for name, row in times.items():
        medians = {size: statistics.median(row[size]) for size in sizes}
        ratio = medians[sizes[-1]] / medians[sizes[0]]
        print(f"| {name} | " + " | ".join(f"{medians[size]:.2f} ms" for size in sizes) + f" | {ratio:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())
