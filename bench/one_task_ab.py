"""One-task creates on one backend: DBOS, an older checkout and this one, taking turns (issue 48 item 1).

Each round runs, in an order that rotates from round to round: the peer script
(../shared/peers/dbos_peer.py with N=10, so its other shapes cost nothing; only its one-task p50
is read), then `taskgrove serve` of `--base` (a git worktree first on PYTHONPATH, as bench/peers.py
--base) and of this checkout, each on a fresh database: 20 warm-up creates, then `--creates`
one-task `noop_executor` creates, p50 and the server's CPU a create. Prints each round and the
medians over rounds, with the load average; a loaded two-core machine moves absolute times, so
only the figures of one round side by side (and their medians) are compared.

    .venv/bin/python bench/one_task_ab.py /tmp/base --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
from typing import Any

import httpx

import peers  # bench/peers.py, beside this script
import wire  # bench/wire.py
from cpu import cpu_seconds  # bench/cpu.py
from run import fresh_postgres  # bench/run.py

NOOP = [{"name": "one", "schemas": {"method": "noop_executor"}}]


async def creates(url: str, pid: int, count: int) -> tuple[float, float]:
    """p50 of `count` one-task creates (ms) and the server's CPU a create (ms)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(20):
            await wire.create(http, NOOP)
        cpu = cpu_seconds(pid)
        took = [await wire.create(http, NOOP) for _ in range(count)]
        return statistics.median(took) * 1000, (cpu_seconds(pid) - cpu) / count * 1000


def server_of(checkout: str | None, database_url: str | None, count: int) -> tuple[float, float]:
    workdir = tempfile.mkdtemp(prefix="taskgrove-one-")
    server, _ = wire.start_taskgrove(workdir, database_url, checkout)
    try:
        return asyncio.run(creates(server.url, server.proc.pid, count))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def dbos(python: str, database_url: str | None) -> tuple[float, float]:
    env = {**os.environ, "N": "10"}
    out = subprocess.run([python, str(peers.PEERS / "dbos_peer.py"), database_url or "sqlite"], capture_output=True,
                         text=True, check=True, cwd=tempfile.mkdtemp(prefix="peer-"), env=env).stdout
    return float(peers.json.loads(out.strip().splitlines()[-1])["one_task_p50_ms"]), 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the older checkout (git worktree)")
    parser.add_argument("--postgres", help="a PostgreSQL server URL (scratch databases are made on it)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--creates", type=int, default=200)
    parser.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", "/tmp/peer-venv/bin/python"))
    args = parser.parse_args()
    runs: dict[str, Any] = {
        "dbos": lambda url: dbos(args.peer_python, url),
        "base": lambda url: server_of(args.base, url, args.creates),
        "new": lambda url: server_of(None, url, args.creates)}
    names = list(runs)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names[round_ % 3:] + names[:round_ % 3]
        for name in order:
            with fresh_postgres(args.postgres) as url:
                got[name].append(runs[name](url))
        line = "  ".join(f"{n} {got[n][-1][0]:.2f} ms" + (f" (CPU {got[n][-1][1]:.2f})" if n != "dbos" else "")
                         for n in names)
        print(f"round {round_ + 1} ({'/'.join(order)}), load {os.getloadavg()[0]:.1f}: {line}  "
              f"dbos/new {got['dbos'][-1][0] / got['new'][-1][0]:.2f}x  "
              f"dbos/base {got['dbos'][-1][0] / got['base'][-1][0]:.2f}x", flush=True)
    med = {n: statistics.median(p for p, _ in got[n]) for n in names}
    cpu = {n: statistics.median(c for _, c in got[n]) for n in ("base", "new")}
    per_round = {n: statistics.median(d[0] / o[0] for d, o in zip(got["dbos"], got[n])) for n in ("base", "new")}
    print(f"medians: dbos {med['dbos']:.2f} ms, base {med['base']:.2f} ms (CPU {cpu['base']:.2f}), "
          f"new {med['new']:.2f} ms (CPU {cpu['new']:.2f}); dbos/base {per_round['base']:.2f}x, "
          f"dbos/new {per_round['new']:.2f}x (medians of the rounds' ratios)")


if __name__ == "__main__":
    main()
