"""Old against new, over the real wire, in one run: is a change slower than the code before it?

Each checkout is a `taskgrove serve` started from that checkout's own `.venv` (make venv there
first: `git worktree add ../old <commit> && make -C ../old venv`). The two servers take turns
`--rounds` times, each round on a fresh SQLite file, so a noisy minute of the machine hits both;
the figures are medians over the rounds of each build's per-round medians, with the change.

    .venv/bin/python bench/ab.py ../old . --rounds 8

Per round and build: one-task trees (wall time a create), 1000-task fan-out, chain and diamond
(wall time and the server's CPU from /proc), `tasks.get`, `system.health` and 5-task trees driven
by wrk.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

import wire  # bench/wire.py, beside this script
from cpu import cpu_seconds  # bench/cpu.py

SHAPES = {"fan-out 1000": wire.fan_out, "chain 1000": wire.chain, "diamond 1000": wire.diamond}


def start(checkout: Path, workdir: str) -> wire.Server:
    """`taskgrove serve` of `checkout` on a fresh SQLite file in `workdir`."""
    wire.BIN = checkout.resolve() / ".venv" / "bin" / "taskgrove"
    server, _ = wire.start_taskgrove(workdir, None)
    return server


async def trees(server: wire.Server, shape_runs: int, one_task_runs: int) -> dict[str, float]:
    """Median wall time (ms) of each tree shape, and the server's CPU (ms) a tree of each shape."""
    out: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        for _ in range(20):  # warm-up
            await wire.create(http, [{"name": "warm", "schemas": wire.NOOP}])
        out["one task"] = 1000 * statistics.median(
            [await wire.create(http, [{"name": "one", "schemas": wire.NOOP}]) for _ in range(one_task_runs)])
        for name, make in SHAPES.items():
            await wire.create(http, make(1000, uuid.uuid4().hex[:8] + "-"))  # warm-up of the shape
            cpu_before = cpu_seconds(server.proc.pid)
            walls = [await wire.create(http, make(1000, uuid.uuid4().hex[:8] + "-")) for _ in range(shape_runs)]
            out[f"{name} CPU"] = 1000 * (cpu_seconds(server.proc.pid) - cpu_before) / shape_runs
            out[name] = 1000 * statistics.median(walls)
    return out


def one_round(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="taskgrove-ab-")
    server = start(checkout, workdir)
    try:
        figures = asyncio.run(trees(server, args.shape_runs, args.one_task_runs))
        asyncio.run(wire._seed(server.url))
        figures["tasks.get req/s"] = wire.wrk(server.url + "/tasks", {
            "jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": "seed"}}, args.duration)
        figures["system.health req/s"] = wire.wrk(server.url + "/system", {
            "jsonrpc": "2.0", "id": 1, "method": "system.health"}, args.duration)
        figures["5-task trees tasks/s"], _ = wire.small_trees_wrk(server.url, args.duration, uuid.uuid4().hex[:6])
        return figures
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="checkout of the code before (with its own .venv)")
    parser.add_argument("new", type=Path, help="checkout of the code after (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--shape-runs", type=int, default=3, help="trees of each shape per round")
    parser.add_argument("--one-task-runs", type=int, default=200)
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    args = parser.parse_args()
    os.environ.pop("SERVICE_DATABASE_URL", None)
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for n in range(args.rounds):
        order = ("old", "new") if n % 2 == 0 else ("new", "old")  # neither always goes first
        for build in order:
            started = time.monotonic()
            runs[build].append(one_round(getattr(args, build), args))
            print(f"round {n + 1} {build}: {time.monotonic() - started:.0f} s", flush=True)
    print(f"\nmedians of {args.rounds} rounds: old {args.old}, new {args.new}")
    for name in runs["old"][0]:
        old = statistics.median(r[name] for r in runs["old"])
        new = statistics.median(r[name] for r in runs["new"])
        print(f"{name:>22}: {old:9.2f} -> {new:9.2f}  ({100 * (new - old) / old:+.1f} %)")


if __name__ == "__main__":
    main()
