"""Benchmark over the real wire: a `taskgrove serve` process, clients in this process, and `wrk`.

Every figure is what a user meets: HTTP to a real server on loopback. The ceiling for request
rates is a bare Starlette JSON endpoint on the same uvicorn, measured in the same run, so the
rates are reported as shares of it (this machine's speed cancels out).

    python bench/wire.py [--repeat 5] [--duration 5] [--postgres postgresql://...]
    make bench          # the same, with the defaults

Each request-rate round runs wrk against the bare endpoint, tasks.get and system.health in turn,
so a share compares figures taken seconds apart; medians and ranges over the rounds are printed.

Needs `wrk` (Debian package) for the request rates; without it those rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from lean_http import LeanHttp  # bench/lean_http.py, beside this script
from run import fresh_postgres  # bench/run.py

BIN = Path(sys.executable).parent / "taskgrove"
NOOP = {"method": "noop_executor"}
TREES_SCRIPT = Path(__file__).with_name("trees.lua")
CEILING_APP = textwrap.dedent("""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def endpoint(request):
        body = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": {"status": "healthy"}})

    app = Starlette(routes=[Route("/", endpoint, methods=["POST"])])
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> float:
    start = time.monotonic()
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic() - start
        except OSError:
            if proc.poll() is not None or time.monotonic() - start > timeout:
                raise RuntimeError("server did not start") from None
            time.sleep(0.01)


class Server:
    def __init__(self, argv: list[str], env: dict[str, str], port: int, cwd: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_taskgrove(workdir: str, database_url: str | None, checkout: str | None = None) -> tuple[Server, float]:
    """A `taskgrove serve` of this checkout, or of `checkout` (an older git worktree) run from the
    same venv with that tree first on PYTHONPATH (the editable install's finder comes after it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    if checkout is not None:
        Path(workdir, "path").mkdir()
        Path(workdir, "path", "taskgrove").symlink_to(Path(checkout).resolve())
        env["PYTHONPATH"] = str(Path(workdir, "path"))
    env.update({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(port), "SERVICE_LOG_LEVEL": "warning",
                "SERVICE_DATABASE_URL": database_url or f"sqlite:///{workdir}/bench.db",
                # wrk is one client sending as fast as it can: the per-user request rate (a policy,
                # default 200/s) would measure the limit, not the service. The pending-task quota
                # stays at its default, so its check is part of every create measured.
                "SERVICE_RATE_LIMIT_PER_USER": os.environ.get("BENCH_RATE_LIMIT_PER_USER", "0")})
    started = time.monotonic()
    server = Server([str(BIN), "serve"], env, port, workdir)
    wait_port(port, server.proc)
    while True:  # cold start: until the agent card answers
        try:
            if httpx.get(f"{server.url}/.well-known/agent-card.json", timeout=1).status_code == 200:
                return server, time.monotonic() - started
        except httpx.HTTPError:
            time.sleep(0.01)


def start_ceiling(workdir: str) -> Server:
    Path(workdir, "ceiling_app.py").write_text(CEILING_APP)
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "ceiling_app:app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]
    server = Server(argv, dict(os.environ), port, workdir)
    wait_port(port, server.proc)
    return server


def wrk(url: str, body: dict[str, Any], duration: int, connections: int = 16) -> float:
    """Requests per second of POST `body` to `url` (wrk, 2 threads)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
                     'wrk.headers["Content-Type"] = "application/json"\n')
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{int(duration)}s", "-s", script.name, url],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(script.name)
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(out)


# --- workloads ------------------------------------------------------------------------------

def fan_out(n: int, p: str) -> list[dict[str, Any]]:
    return [{"id": f"{p}r", "name": "root", "schemas": NOOP}] + [
        {"id": f"{p}{i}", "name": "t", "parent_id": f"{p}r", "schemas": NOOP} for i in range(n - 1)]


def chain(n: int, p: str) -> list[dict[str, Any]]:
    return [{"id": f"{p}0", "name": "t", "schemas": NOOP}] + [
        {"id": f"{p}{i}", "name": "t", "parent_id": f"{p}0", "schemas": NOOP, "dependencies": [{"id": f"{p}{i - 1}"}]}
        for i in range(1, n)]


def diamond(n: int, p: str, width: int = 10) -> list[dict[str, Any]]:
    """Layers of `width`, each task depending on the whole previous layer, under one root."""
    tasks = [{"id": f"{p}r", "name": "root", "schemas": NOOP}]
    for layer in range((n - 1) // width):
        for i in range(width):
            deps = [{"id": f"{p}{layer - 1}-{j}"} for j in range(width)] if layer else []
            tasks.append({"id": f"{p}{layer}-{i}", "name": "t", "parent_id": f"{p}r", "schemas": NOOP,
                          "dependencies": deps})
    return tasks


async def create(http: httpx.AsyncClient | LeanHttp, tasks: list[dict[str, Any]]) -> float:
    """Seconds from sending a `tasks.create` of `tasks` to its answer, which must be completed."""
    started = time.perf_counter()
    answer = (await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                                              "params": tasks})).json()
    took = time.perf_counter() - started
    if "error" in answer or answer["result"]["status"] != "completed":
        raise RuntimeError(f"tree did not complete: {str(answer)[:300]}")
    return took


async def trees(url: str, repeat: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"one task": [], "fan-out 1000": [], "chain 1000": [], "diamond 1000": []}
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for _ in range(20):  # warm-up
            await create(http, [{"name": "warm", "schemas": NOOP}])
        for _ in range(max(100, repeat * 20)):
            out["one task"].append(await create(http, [{"name": "one", "schemas": NOOP}]))
        for _ in range(repeat):
            for name, make in (("fan-out 1000", fan_out), ("chain 1000", chain), ("diamond 1000", diamond)):
                out[name].append(await create(http, make(1000, uuid.uuid4().hex[:8] + "-")))
    return out


async def concurrent_small_trees(url: str, clients: int = 8, per_client: int = 60) -> tuple[float, float]:
    """5-task trees from `clients` concurrent clients: tasks per second and p50 latency."""
    latencies: list[float] = []

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for _ in range(per_client):
                p = uuid.uuid4().hex[:8] + "-"
                latencies.append(await create(http, fan_out(5, p)))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - started
    return clients * per_client * 5 / took, statistics.median(latencies)


def small_trees_wrk(url: str, duration: int, run: str, connections: int = 8) -> tuple[float, float]:
    """5-task trees from `connections` concurrent wrk connections (bench/trees.lua, ids unique per
    `run`): tasks per second and p50 latency. A C client, so the figure is the server's: the httpx
    client of `concurrent_small_trees` takes as much CPU per request as the server does."""
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{int(duration)}s", "-s", str(TREES_SCRIPT),
                          url + "/tasks", "--", run], capture_output=True, text=True, check=True).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("failed", "p50", "Requests/sec:")))
    if int(lines["failed"]) != 0:  # an answer that is not a completed tree: the figure would lie
        raise RuntimeError(f"5-task trees: {lines['failed']} answers were not completed trees\n{out}")
    return float(lines["Requests/sec:"]) * 5, float(lines["p50"].split()[0]) / 1000


async def memory_per_task(server: Server, count: int = 10_000) -> float:
    """RSS growth per stored task (bytes), creating `count` tasks in trees of 100."""
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        before = server.rss_mb()
        for n in range(count // 100):
            await create(http, fan_out(100, f"m{n}-"))
        after = server.rss_mb()
    return (after - before) * 1024 * 1024 / count


def cold_starts(repeat: int, database_url: str | None) -> dict[str, list[float]]:
    """Start to agent card (ms) and idle RSS (MB): on a new database (the first start creates
    the schema) and again on the same database (every later start)."""
    out: dict[str, list[float]] = {"first start ms": [], "first start RSS MB": [], "restart ms": [],
                                   "restart RSS MB": []}
    for _ in range(repeat if database_url is None else 0):
        workdir = tempfile.mkdtemp(prefix="taskgrove-bench-")
        try:
            for label in ("first start", "restart"):
                server, took = start_taskgrove(workdir, None)
                time.sleep(0.5)  # idle: what it holds once serving
                out[f"{label} ms"].append(took * 1000)
                out[f"{label} RSS MB"].append(server.rss_mb())
                server.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    """median (min-max) of `values`."""
    values = sorted(values)
    return f"{fmt.format(statistics.median(values))} ({fmt.format(values[0])}-{fmt.format(values[-1])})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    parser.add_argument("--rates-only", action="store_true",
                        help="only the wrk request rates against the bare endpoint (issue 48, item 5)")
    args = parser.parse_args()
    print(f"backend: {'postgresql' if args.postgres else 'sqlite'}; medians of {args.repeat} runs (min-max)")
    for name, values in ({} if args.rates_only else cold_starts(args.repeat, args.postgres)).items():
        if values:  # measured on SQLite only
            print(f"{name:>19}: {spread(values)}")
    with fresh_postgres(args.postgres) as database_url:  # a scratch database, dropped afterwards
        measure_server(args, database_url)


def measure_server(args: argparse.Namespace, database_url: str | None) -> None:
    workdir = tempfile.mkdtemp(prefix="taskgrove-bench-")
    server, _ = start_taskgrove(workdir, database_url)
    ceiling = start_ceiling(workdir) if shutil.which("wrk") else None
    try:
        if ceiling is not None:
            asyncio.run(_seed(server.url))
            measure_rates(server, ceiling, args.repeat, args.duration)
        if args.rates_only:
            return
        figures = asyncio.run(trees(server.url, args.repeat))
        for name, values in figures.items():
            values.sort()
            if name == "one task":
                print(f"{name:>13}: p50 {values[len(values) // 2] * 1000:7.2f} ms   "
                      f"p95 {values[int(len(values) * 0.95)] * 1000:7.2f} ms")
            else:
                print(f"{name:>13}: median {statistics.median(values) * 1000:7.1f} ms   "
                      f"best {values[0] * 1000:7.1f} ms   worst {values[-1] * 1000:7.1f} ms")
        if ceiling is not None:
            small = [small_trees_wrk(server.url, args.duration, f"r{n}") for n in range(args.repeat)]
            print(f"5-task trees, 8 wrk connections: {spread([r for r, _ in small])} tasks/s, "
                  f"p50 {spread([p * 1000 for _, p in small], '{:.1f}')} ms")
        small = [asyncio.run(concurrent_small_trees(server.url)) for _ in range(max(1, args.repeat // 2))]
        print(f"5-task trees, 8 httpx clients (one Python process): {spread([r for r, _ in small])} tasks/s, "
              f"p50 {spread([p * 1000 for _, p in small], '{:.1f}')} ms")
        print(f"memory per stored task: {asyncio.run(memory_per_task(server)):.0f} bytes")
    finally:
        server.stop()
        if ceiling is not None:
            ceiling.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# What each rate is measured on: (label, which server, path, body).
RATES = (("bare", "ceiling", "/", {"jsonrpc": "2.0", "id": 1, "method": "x"}),
         ("tasks.get", "server", "/tasks", {"jsonrpc": "2.0", "id": 1, "method": "tasks.get",
                                            "params": {"task_id": "seed"}}),
         ("system.health", "server", "/system", {"jsonrpc": "2.0", "id": 1, "method": "system.health"}))


def measure_rates(server: Server, ceiling: Server, repeat: int, duration: int) -> None:
    """wrk against the bare endpoint and ours in turn, `repeat` rounds (a noisy moment hits every
    figure): requests a second, their share of the bare endpoint's in the same round, and the
    server's CPU a request (user + system, from /proc: what a busy machine inflates least)."""
    rates: dict[str, list[float]] = {label: [] for label, *_ in RATES}
    cpu: dict[str, list[float]] = {label: [] for label, *_ in RATES}
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    for _ in range(repeat):
        for label, which, path, body in RATES:
            target = ceiling if which == "ceiling" else server
            before = _cpu_seconds(target.proc.pid)
            rate = wrk(target.url + path, body, duration)
            rates[label].append(rate)
            cpu[label].append((_cpu_seconds(target.proc.pid) - before) * 1e6 / (rate * duration))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"{'bare Starlette':>14}: {spread(rates['bare'])} req/s, CPU {spread(cpu['bare'])} us a request")
    for label in ("tasks.get", "system.health"):
        shares = [x / b for x, b in zip(rates[label], rates["bare"])]
        by_cpu = [b / x for x, b in zip(cpu[label], cpu["bare"])]
        print(f"{label:>14}: {spread(rates[label])} req/s, {spread(shares, '{:.2f}')} of bare (same round); "
              f"CPU {spread(cpu[label])} us a request, bare's CPU / ours {spread(by_cpu, '{:.2f}')}")


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/<pid>/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _seed(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                                        "params": [{"id": "seed", "name": "seed", "schemas": NOOP}]})


if __name__ == "__main__":
    main()
