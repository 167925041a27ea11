"""Wall time and CPU time per tree, over the real wire: where a tree's time goes.

Starts a real `taskgrove serve` (SQLite, or a scratch PostgreSQL database with --postgres), creates
trees of one shape with an httpx client, and reads /proc around them: the server process's CPU,
every PostgreSQL backend's CPU, and this client's. When wall time is about server CPU plus
PostgreSQL CPU, the two take turns and only less CPU on one side makes a tree faster.

    .venv/bin/python bench/cpu.py fan-out --trees 5
    .venv/bin/python bench/cpu.py chain --postgres postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/cpu.py 5-task --postgres ...   # wire.py's 5-task trees from wrk, 5 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid

import httpx

import wire  # bench/wire.py, beside this script
from run import fresh_postgres  # bench/run.py

SHAPES = {"fan-out": wire.fan_out, "chain": wire.chain, "diamond": wire.diamond}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def postgres_seconds() -> float:
    """CPU of every process named postgres on this machine (the backends of all databases)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "postgres":
                total += cpu_seconds(pid)
        except OSError:  # gone meanwhile
            pass
    return total


async def measure(server: wire.Server, shape: str, trees: int) -> None:
    make = SHAPES[shape]
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        for _ in range(2):  # warm-up
            await wire.create(http, make(1000, uuid.uuid4().hex[:8] + "-"))
        before = cpu_seconds(server.proc.pid), postgres_seconds(), time.process_time(), time.perf_counter()
        took = [await wire.create(http, make(1000, uuid.uuid4().hex[:8] + "-")) for _ in range(trees)]
        after = cpu_seconds(server.proc.pid), postgres_seconds(), time.process_time(), time.perf_counter()
    server_cpu, pg_cpu, client_cpu, wall = ((b - a) * 1000 / trees for a, b in zip(before, after))
    print(f"{shape} 1000: wall {wall:.0f} ms a tree (median {statistics.median(took) * 1000:.0f}), "
          f"server CPU {server_cpu:.0f} ms, PostgreSQL CPU {pg_cpu:.0f} ms, client CPU {client_cpu:.0f} ms")


def measure_small_trees(server: wire.Server, seconds: int = 5) -> None:
    """wire.py's 5-task trees from 8 wrk connections: where a tree's CPU goes under load."""
    wire.small_trees_wrk(server.url, 1, "warm")
    before = cpu_seconds(server.proc.pid), postgres_seconds(), time.perf_counter()
    rate, p50 = wire.small_trees_wrk(server.url, seconds, uuid.uuid4().hex[:8])
    after = cpu_seconds(server.proc.pid), postgres_seconds(), time.perf_counter()
    trees = rate / 5 * (after[2] - before[2])
    server_cpu, pg_cpu = ((b - a) * 1e6 / trees for a, b in zip(before[:2], after[:2]))
    print(f"5-task trees (wrk, 8 connections): {rate:.0f} tasks/s, p50 {p50 * 1000:.1f} ms, "
          f"server CPU {server_cpu:.0f} us a tree, PostgreSQL CPU {pg_cpu:.0f} us a tree")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", choices=sorted(SHAPES) + ["5-task"])
    parser.add_argument("--trees", type=int, default=5)
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    args = parser.parse_args()
    with fresh_postgres(args.postgres) as database_url:
        server, _ = wire.start_taskgrove(tempfile.mkdtemp(prefix="taskgrove-cpu-"), database_url)
        try:
            if args.shape == "5-task":
                measure_small_trees(server)
            else:
                asyncio.run(measure(server, args.shape, args.trees))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
