"""A fan-out of 100 `rest_executor` GETs to a local HTTP server, in process (the ASGI app, SQLite).

What it measures: the per-attempt cost of an executor that makes an HTTP client (bench/README.md,
"A TLS context per client"). The target is Python's own `http.server` on 127.0.0.1:8799.

    .venv/bin/python bench/rest_fanout.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.settings import Settings

PORT = 8799


def tree(prefix: str, size: int) -> list[dict]:
    get = {"schemas": {"method": "rest_executor"}, "inputs": {"url": f"http://127.0.0.1:{PORT}/", "method": "GET"}}
    return [{"id": prefix, "name": "root"}] + [
        {"id": f"{prefix}-{i}", "name": "get", "parent_id": prefix, **get} for i in range(size)]


async def measure(rounds: int) -> list[float]:
    settings = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tempfile.mkdtemp()}/bench.db",
                                  "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_ALLOW_PRIVATE_URLS": "true"})
    app = build_app(settings)
    walls = []
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench",
                                     timeout=120) as http:
            for n in range(rounds + 1):  # the first is a warm-up
                started = time.perf_counter()
                answer = (await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                                                          "params": tree(f"r{n}", 100)})).json()
                walls.append(time.perf_counter() - started)
                assert answer["result"]["status"] == "completed", answer
    return walls[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    target = subprocess.Popen([sys.executable, "-m", "http.server", str(PORT), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        walls = asyncio.run(measure(args.rounds))
    finally:
        target.kill()
    print(f"100 rest_executor tasks: median {statistics.median(walls) * 1000:.0f} ms "
          f"({', '.join(f'{w * 1000:.0f}' for w in walls)})")


if __name__ == "__main__":
    main()
