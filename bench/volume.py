"""Benchmark (issue 32): the everyday reads at 1,000 tasks and at a large table, over HTTP against
real `taskgrove serve` processes, and restart to ready.

Two steps, because a large fill takes longer than the reads:

    python bench/volume.py fill --url sqlite:////tmp/v/1m.db --tasks 1000000
    python bench/volume.py read --db 1000=sqlite:////tmp/v/1k.db --db 1000000=sqlite:////tmp/v/1m.db [--rounds 6]

`fill` stores N tasks through the service's own store path (`TaskService.create_tree`: the rows
`prepare_new_tree` makes, inserted by `TaskRepository.insert`) in trees of 10 tasks for 50 users,
mostly completed (as a long-lived service's table is), and one tree of 1,000 tasks more (`tasks.tree`);
it continues a fill that was stopped. On PostgreSQL it ends with VACUUM ANALYZE, as autovacuum
would after a load (autovacuum is off on this machine's test server). `read` starts one `taskgrove serve` per database (this
process is the client, over sockets), times each read in rounds that alternate the databases (a
shared machine's load falls on every size alike), then restarts each server `--restarts` times,
timing process start until /readyz answers 200, alternating the databases again. Medians, per size.
PostgreSQL: a URL per size (`1000=postgresql://.../volume_1000`); the databases must exist.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.settings import Settings

USERS = 50
TREE = 10
BIG_TREE = "big"  # the root of the one 1,000-task tree
STATUSES = ["completed"] * 17 + ["failed", "cancelled", "pending"]  # per tree, by its number
QUIET = {"SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_MAX_PENDING_PER_USER": "0", "SERVICE_LOG_LEVEL": "warning"}


def tree(n: int) -> list[dict[str, Any]]:
    user, status = f"user{n % USERS}", STATUSES[n % len(STATUSES)]
    root = {"id": f"t{n:07}", "name": f"tree {n}", "user_id": user, "status": status}
    return [root, *({"id": f"t{n:07}-{i}", "name": "step", "parent_id": root["id"], "user_id": user,
                     "status": status} for i in range(TREE - 1))]


def big_tree() -> list[dict[str, Any]]:
    root = {"id": BIG_TREE, "name": "a tree of 1000", "user_id": "user0", "status": "completed"}
    return [root, *({"id": f"{BIG_TREE}-{i}", "name": "step", "parent_id": BIG_TREE, "user_id": "user0",
                     "status": "completed"} for i in range(999))]


# --- fill -----------------------------------------------------------------------------------

async def fill(url: str, tasks: int) -> None:
    settings = Settings.from_env({"SERVICE_DATABASE_URL": url, **QUIET})
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        services = app.state.services
        anyone = Caller()
        if await services.repo.get(BIG_TREE) is None:
            await services.tasks.create_tree(NewTree.from_params(big_tree()), anyone)
        trees = tasks // TREE
        start = await _first_missing(services, trees)
        started, last = time.perf_counter(), time.perf_counter()
        for n in range(start, trees):
            await services.tasks.create_tree(NewTree.from_params(tree(n)), anyone)
            if time.perf_counter() - last > 30:
                last = time.perf_counter()
                print(f"{(n + 1) * TREE:,} tasks, {time.perf_counter() - started:.0f} s", flush=True)
        if services.repo.engine.dialect.name == "postgresql":  # what autovacuum does after a load
            async with services.repo.engine.connect() as conn:
                await (await conn.execution_options(isolation_level="AUTOCOMMIT")).exec_driver_sql("VACUUM ANALYZE")
        print(f"filled {url} to {trees * TREE:,} tasks (and the tree of 1000) in {time.perf_counter() - started:.0f} s")


async def _first_missing(services: Any, trees: int) -> int:
    """The first tree number not stored yet (a fill continues where a stopped one ended)."""
    low, high = 0, trees
    while low < high:
        middle = (low + high) // 2
        if await services.repo.get(f"t{middle:07}") is None:
            high = middle
        else:
            low = middle + 1
    return low


# --- the servers ----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `taskgrove serve` on a database; `start` returns the seconds until /readyz said 200."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url, self.workdir = url, workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        env.update({"SERVICE_DATABASE_URL": self.url, "SERVICE_API_HOST": "127.0.0.1",
                    "SERVICE_API_PORT": str(self.port), **QUIET})
        started = time.perf_counter()
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "taskgrove"), "serve"], env=env,
                                     cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                if httpx.get(f"{self.base}/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - started > 120:
                raise SystemExit(f"taskgrove serve on {self.url} did not get ready")
            time.sleep(0.005)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
            self.proc = None


# --- the reads ------------------------------------------------------------------------------

async def rpc(http: httpx.AsyncClient, method: str, params: dict[str, Any]) -> Any:
    response = await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    answer = response.json()
    assert "result" in answer, answer
    return answer["result"]


async def shapes(http: httpx.AsyncClient) -> dict[str, tuple[str, Any]]:
    """The reads timed, each with a cursor taken from the table as it is now. Page sizes are such
    that every page is full at 1,000 tasks too (a user has 20 tasks there), so the two sizes
    compare pages of the same length."""
    by_user = await rpc(http, "tasks.list", {"user_id": "user7", "limit": 10, "cursor": None})
    roots = await rpc(http, "tasks.list", {"root_only": True, "limit": 20, "cursor": None})
    both = await rpc(http, "tasks.list", {"user_id": "user7", "root_only": True, "limit": 2, "cursor": None})
    deep = None  # the cursor of a full page up to 5,000 rows down (at 1,000 tasks: the last full page)
    for _ in range(50):
        following = (await rpc(http, "tasks.list", {"limit": 100, "cursor": deep}))["next_cursor"]
        if following is None or len((await rpc(http, "tasks.list", {"limit": 100, "cursor": following}))["tasks"]) < 100:
            break
        deep = following
    some = (await rpc(http, "tasks.list", {"user_id": "user7", "limit": 1}))[0]["id"]
    return {
        "list by user_id (10)": ("tasks.list", {"user_id": "user7", "limit": 10}),
        "by user_id, page 2 by cursor": ("tasks.list", {"user_id": "user7", "limit": 10, "cursor": by_user["next_cursor"]}),
        # SPEC.md's default limit: user7 has 20 tasks at 1,000, so the page is 20 rows there and 100 at a million
        "list by user_id, limit 100 (20 rows at 1,000)": ("tasks.list", {"user_id": "user7"}),
        "search 'step' by user_id, limit 100 (20 rows at 1,000)": ("tasks.list", {"user_id": "user7", "search": "step"}),
        "root_only (20)": ("tasks.list", {"root_only": True, "limit": 20}),
        "root_only, page 2 by cursor": ("tasks.list", {"root_only": True, "limit": 20, "cursor": roots["next_cursor"]}),
        "root_only by user_id (2)": ("tasks.list", {"user_id": "user7", "root_only": True, "limit": 2}),
        "root_only by user_id, page 2 by cursor": ("tasks.list", {"user_id": "user7", "root_only": True, "limit": 2,
                                                                  "cursor": both["next_cursor"]}),
        # by status (SPEC.md's `status`): a common one, rare ones, and one no stored task has
        "status completed (100)": ("tasks.list", {"status": "completed", "limit": 100}),
        "status failed (100)": ("tasks.list", {"status": "failed", "limit": 100}),
        "status pending (100)": ("tasks.list", {"status": "pending", "limit": 100}),
        "status in_progress (none stored)": ("tasks.list", {"status": "in_progress", "limit": 100}),
        "user_id and status failed (10)": ("tasks.list", {"user_id": "user7", "status": "failed", "limit": 10}),
        "user_id and status pending (none of user7's)": ("tasks.list", {"user_id": "user7", "status": "pending",
                                                                         "limit": 10}),
        # the dashboard's tree list with a status, and search (a part of the name, or the start of an id)
        "root_only and status failed (20)": ("tasks.list", {"root_only": True, "status": "failed", "limit": 20}),
        "search 'step' (20; most tasks)": ("tasks.list", {"search": "step", "limit": 20}),
        "search 'tree' root_only (20; every root)": ("tasks.list", {"search": "tree", "root_only": True, "limit": 20}),
        "search 'tree 42' root_only (20)": ("tasks.list", {"search": "tree 42", "root_only": True, "limit": 20}),
        "search 'tree 42' root_only status failed (20)": ("tasks.list", {"search": "tree 42", "root_only": True,
                                                                          "status": "failed", "limit": 20}),
        "search 'tree 42' by user_id (10)": ("tasks.list", {"search": "tree 42", "user_id": "user42", "limit": 10}),
        "search id 't000004' (20)": ("tasks.list", {"search": "t000004", "limit": 20}),
        "search 'no such name' (20)": ("tasks.list", {"search": "no such name", "limit": 20}),
        "waiting (none stored; 20)": ("tasks.list", {"waiting": True, "limit": 20}),
        "waiting by user_id (none stored; 20)": ("tasks.list", {"waiting": True, "user_id": "user7", "limit": 20}),
        "everything, first page (100)": ("tasks.list", {"limit": 100}),
        "offset 900 (100)": ("tasks.list", {"limit": 100, "offset": 900}),
        "offset 5000 (100; empty at 1,000)": ("tasks.list", {"limit": 100, "offset": 5000}),
        "up to 5000 down by cursor (100)": ("tasks.list", {"limit": 100, "cursor": deep}),
        "tasks.get": ("tasks.get", {"task_id": some}),
        "tasks.tree of 1000 tasks": ("tasks.tree", {"task_id": BIG_TREE}),
        "/metrics": ("GET", "/metrics"),
    }


async def timed(http: httpx.AsyncClient, what: tuple[str, Any], calls: int) -> list[float]:
    method, params = what
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        if method == "GET":
            assert (await http.get(params)).status_code == 200
        else:
            await rpc(http, method, params)
        times.append((time.perf_counter() - started) * 1000)
    return times


def cpu_ms(pid: int) -> float:
    """The CPU time all threads of process `pid` have run so far, in ms (the kernel's scheduler
    statistics, in nanoseconds: a read's few hundred microseconds are measurable, where /proc's
    clock ticks are 10 ms). A thread that ended before the call is not counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e6


async def read(sizes: list[int], urls: list[str], rounds: int, calls: int, restarts: int, workdir: Path) -> None:
    servers = [Server(url, workdir) for url in urls]
    ready: dict[int, list[float]] = {i: [] for i in range(len(urls))}
    times: dict[str, dict[int, list[float]]] = {}
    cpu: dict[str, dict[int, list[float]]] = {}  # the server's CPU per call, a mean per round
    try:
        for server in servers:  # the first start may migrate the database: not counted
            server.start()
        clients = [httpx.AsyncClient(base_url=s.base, timeout=120) for s in servers]
        reads = [await shapes(c) for c in clients]
        for _ in range(rounds):  # alternating the databases: the machine's load falls on each alike
            for i, client in enumerate(clients):
                for name, what in reads[i].items():
                    pid = servers[i].proc.pid if servers[i].proc else 0
                    before = cpu_ms(pid)
                    times.setdefault(name, {}).setdefault(i, []).extend(await timed(client, what, calls))
                    cpu.setdefault(name, {}).setdefault(i, []).append((cpu_ms(pid) - before) / calls)
        for client in clients:
            await client.aclose()
        for _ in range(restarts):
            for i, server in enumerate(servers):
                server.stop()
                ready[i].append(server.start())
    finally:
        for server in servers:
            server.stop()
    report(sizes, times, ready)
    print("\nThe server's CPU per call (all its threads; on PostgreSQL the database's own work is not in it), "
          "median of the rounds:\n")
    report(sizes, cpu, {i: [] for i in range(len(urls))})


def report(sizes: list[int], times: dict[str, dict[int, list[float]]], ready: dict[int, list[float]]) -> None:
    columns = range(len(sizes))
    print("| read | " + " | ".join(f"{size:,} tasks" for size in sizes) + " | ratio |")
    print("|---|" + "---|" * (len(sizes) + 1))
    rows = {name: {i: statistics.median(row[i]) for i in columns} for name, row in times.items()}
    if all(ready[i] for i in columns):  # --restarts 0: reads only
        rows["restart to ready (/readyz 200)"] = {i: statistics.median(ready[i]) * 1000 for i in columns}
    for name, medians in rows.items():
        ratio = medians[len(sizes) - 1] / medians[0]
        print(f"| {name} | " + " | ".join(f"{medians[i]:.2f} ms" for i in columns) + f" | {ratio:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    filling = steps.add_parser("fill", help="store N tasks (continues a stopped fill)")
    filling.add_argument("--url", required=True)
    filling.add_argument("--tasks", type=int, required=True)
    reading = steps.add_parser("read", help="time the reads over HTTP, one server per --db")
    reading.add_argument("--db", action="append", required=True, help="SIZE=URL, smallest first")
    reading.add_argument("--rounds", type=int, default=6)
    reading.add_argument("--calls", type=int, default=10, help="calls per read, database and round")
    reading.add_argument("--restarts", type=int, default=5)
    reading.add_argument("--workdir", default=".")
    args = parser.parse_args()
    if args.step == "fill":
        asyncio.run(fill(args.url, args.tasks))
    else:
        dbs = [db.split("=", 1) for db in args.db]
        asyncio.run(read([int(size) for size, _ in dbs], [url for _, url in dbs], args.rounds, args.calls, args.restarts, Path(args.workdir)))


if __name__ == "__main__":
    main()
