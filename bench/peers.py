"""taskgrove against its peer (DBOS) and against the floor, in one run: ratios, not clock times.

For each backend, in turn and in one process run: the peer script (../shared/peers/dbos_peer.py,
run by the Python of a separate venv that has `dbos`; none of its code lives here), a real
`taskgrove serve` on a fresh store driven over HTTP with the same shapes (one task p50 of 200; 1000
tasks as fan-out, chain and diamond, medians of 3), and the floor (bench/floor.py: the bare SQL of
a chain link). It prints one JSON line per backend and the ratios:

- peer / taskgrove for each shape (above 1: taskgrove is faster); the one task twice, with httpx
  and with a lean HTTP/1.1 client (bench/lean_http.py), taking turns, each beside a bare Starlette
  endpoint on the same uvicorn measured with the same client: httpx alone costs about 0.5 ms a
  request, more than the server's work for one task, where the peer is a function call;
- taskgrove chain / the floor's 1000 links; the server's CPU a link / the floor's CPU a link
  (SQLite: the bare SQL runs in the floor's process, so its CPU is the SQL's);
- per-step overhead p50 and p99: a chain step's interval (completed_at of link n minus that of
  link n-1, read back with tasks.tree) minus the floor's link time at the same quantile.

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install 'dbos==3.4.*'
    .venv/bin/python bench/peers.py --peer-python /tmp/peer-venv/bin/python \\
        --postgres postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/peers.py ... --method noop_executor --method 'sleep_executor:{"seconds": 0}'
    .venv/bin/python bench/peers.py ... --base /tmp/base   # an older checkout's server too, same run

A method is an executor id, optionally with the tasks' inputs as JSON after a colon. `noop_executor`
is pure (completed inline, agent/engine/inline.py); `sleep_executor` with 0 seconds is a durable
no-op (claimed, run as an attempt, its outcome written by the next pass). `--base`: a checkout
(git worktree) whose `taskgrove serve` runs from the same venv with that checkout first on
PYTHONPATH (the editable install's finder comes after it), on a fresh store of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

import floor  # bench/floor.py, beside this script
import wire  # bench/wire.py
from lean_http import LeanHttp  # bench/lean_http.py
from cpu import cpu_seconds, postgres_seconds  # bench/cpu.py
from run import fresh_postgres  # bench/run.py

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
SHAPES = (("fan_out", wire.fan_out), ("chain", wire.chain), ("diamond", wire.diamond))


def peer(python: str, backend_url: str | None) -> dict[str, float]:
    """The peer script's JSON line (milliseconds); a fresh SQLite file or the given empty database."""
    out = subprocess.run([python, str(PEERS / "dbos_peer.py"), backend_url or "sqlite"], capture_output=True,
                         text=True, check=True, cwd=tempfile.mkdtemp(prefix="peer-")).stdout
    return json.loads(out.strip().splitlines()[-1])


def with_method(tasks: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    """The tasks with the executor (and inputs) of a method spec: `id` or `id:{json inputs}`."""
    name, _, inputs = method.partition(":")
    extra = {"inputs": json.loads(inputs)} if inputs else {}
    return [dict(task, schemas={"method": name}, **extra) for task in tasks]


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


async def step_intervals(http: httpx.AsyncClient, root_id: str) -> list[float]:
    """Seconds between one chain link's completion and the next's (tasks.tree)."""
    answer = (await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.tree",
                                              "params": {"task_id": root_id}})).json()["result"]
    done = sorted(_stamp(child["completed_at"]) for child in answer.get("children") or [])
    return [b - a for a, b in zip(done, done[1:])]


async def one_tasks(http: httpx.AsyncClient, lean: LeanHttp, method: str, count: int = 200) -> dict[str, float]:
    """p50 of `count` one-task creates with httpx and with the lean client, taking turns."""
    for _ in range(20):
        await wire.create(http, with_method([{"name": "warm"}], method))
        await wire.create(lean, with_method([{"name": "warm"}], method))
    by_httpx, by_lean = [], []
    for _ in range(count):
        by_httpx.append(await wire.create(http, with_method([{"name": "one"}], method)))
        by_lean.append(await wire.create(lean, with_method([{"name": "one"}], method)))
    return {"one_task_p50_ms": round(statistics.median(by_httpx) * 1000, 3),
            "one_task_lean_p50_ms": round(statistics.median(by_lean) * 1000, 3)}


async def ceiling(url: str, count: int = 200) -> dict[str, float]:
    """p50 of a JSON POST to the bare Starlette endpoint with each client: what the client and
    uvicorn cost before any work of ours."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "x"}
    by_httpx, by_lean = [], []
    async with httpx.AsyncClient(base_url=url) as http, LeanHttp(url) as lean:
        for i in range(count + 20):
            started = time.perf_counter()
            (await http.post("/", json=body)).json()
            middle = time.perf_counter()
            (await lean.post("/", json=body)).json()
            if i >= 20:
                by_httpx.append(middle - started)
                by_lean.append(time.perf_counter() - middle)
    return {"ceiling_httpx_p50_ms": round(statistics.median(by_httpx) * 1000, 3),
            "ceiling_lean_p50_ms": round(statistics.median(by_lean) * 1000, 3)}


async def taskgrove(url: str, pid: int, method: str, trees: int = 3) -> dict[str, Any]:
    """Our side of the peer script's shapes over HTTP, with CPU and per-step times of the chains."""
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        async with LeanHttp(url) as lean:
            out.update(await one_tasks(http, lean, method))
        for name, make in SHAPES:
            took, steps = [], []
            cpu, pg_cpu = cpu_seconds(pid), postgres_seconds()
            for _ in range(trees):
                prefix = uuid.uuid4().hex[:8] + "-"
                took.append(await wire.create(http, with_method(make(1000, prefix), method)))
                if name == "chain":
                    steps.extend(await step_intervals(http, f"{prefix}0"))
            out[f"{name}_1000_ms"] = round(statistics.median(took) * 1000, 1)
            if name == "chain":  # what a link costs: the steps between its reads aside
                out["chain_server_cpu_a_link_us"] = round((cpu_seconds(pid) - cpu) / trees / 1000 * 1e6, 1)
                out["chain_postgres_cpu_a_link_us"] = round((postgres_seconds() - pg_cpu) / trees / 1000 * 1e6, 1)
                steps.sort()
                out["step_p50_us"] = round(steps[len(steps) // 2] * 1e6, 1)
                out["step_p99_us"] = round(steps[int(len(steps) * 0.99)] * 1e6, 1)
    return out


def ours(database_url: str | None, methods: list[str], checkout: str | None = None) -> dict[str, dict[str, Any]]:
    """Our figures for each method, from this checkout's server or `checkout`'s (see --base)."""
    workdir = tempfile.mkdtemp(prefix="taskgrove-peers-")
    server, _ = wire.start_taskgrove(workdir, database_url, checkout)
    bare = wire.start_ceiling(workdir)
    try:
        edge = asyncio.run(ceiling(bare.url))
        return {method: {**asyncio.run(taskgrove(server.url, server.proc.pid, method)), **edge} for method in methods}
    finally:
        bare.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def ratios(dbos: dict[str, float], tg: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    out = {f"dbos/taskgrove {key}": round(dbos[key] / tg[key], 2) for key in dbos if key in tg}
    out["dbos/taskgrove one task, lean client"] = round(dbos["one_task_p50_ms"] / tg["one_task_lean_p50_ms"], 2)
    out["bare Starlette p50 ms, httpx / lean client"] = f"{tg['ceiling_httpx_p50_ms']} / {tg['ceiling_lean_p50_ms']}"
    out["chain / floor (1000 bare links)"] = round(tg["chain_1000_ms"] / bare["chain_1000_ms"], 2)
    out["server CPU a link / floor CPU a link"] = round(tg["chain_server_cpu_a_link_us"] / bare["cpu_a_link_us"], 2)
    if bare["postgres_cpu_a_link_us"] > 0:
        out["PostgreSQL CPU a link / floor's"] = round(tg["chain_postgres_cpu_a_link_us"]
                                                        / bare["postgres_cpu_a_link_us"], 2)
    out["step overhead p50 us"] = round(tg["step_p50_us"] - bare["link_p50_us"], 1)
    out["step overhead p99 us"] = round(tg["step_p99_us"] - bare["link_p99_us"], 1)
    return out


def one_backend(admin_url: str | None, python: str, methods: list[str], base: str | None) -> None:
    backend = "postgresql" if admin_url else "sqlite"
    started, load = time.time(), os.getloadavg()
    with fresh_postgres(admin_url) as peer_url:
        dbos = peer(python, peer_url)
    tg: dict[str, dict[str, Any]] = {}
    for build, checkout in (("new", None), ("base", base)):
        if build == "new" or checkout is not None:
            with fresh_postgres(admin_url) as database_url:
                tg[build] = ours(database_url, methods, checkout)
    with fresh_postgres(admin_url) as floor_url:
        bare = (floor.pg_floor(floor_url) if floor_url else floor.sqlite_floor()).summary()
    print(json.dumps({"backend": backend, "load_at_start": load, "load_at_end": os.getloadavg(),
                      "seconds": round(time.time() - started), "dbos_ms": dbos, "taskgrove": tg, "floor": bare}))
    for build, by_method in tg.items():
        for method, figures in by_method.items():
            for name, value in ratios(dbos, figures, bare).items():
                print(f"{backend:>10} {build:>4} {method:>30}  {name:<40} {value}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", help="a PostgreSQL server URL (scratch databases are made on it)")
    parser.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", "/tmp/peer-venv/bin/python"),
                        help="a Python with dbos installed (not the project's venv)")
    parser.add_argument("--method", action="append", help="executor of our tasks (repeatable; noop_executor)")
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--base", help="an older checkout whose server is measured in the same run")
    args = parser.parse_args()
    methods = args.method or ["noop_executor"]
    if args.only != "postgresql":
        one_backend(None, args.peer_python, methods, args.base)
    if args.postgres and args.only != "sqlite":
        one_backend(args.postgres, args.peer_python, methods, args.base)


if __name__ == "__main__":
    main()
