"""Sustained mixed load on a real `taskgrove serve`: does it wear down over half an hour? (issue 48, item 6)

Four clients in turn create 5-task trees (`noop_executor`), read them (tasks.get, tasks.list),
and now and then cancel a running tree and run a tree whose task fails and is retried; a fifth
client holds a WebSocket that subscribes to a recent tree, reads for two seconds and reconnects.
The end prints, for every minute, the create p50, operations a second, failures, the server's RSS
and CPU a operation, each against the first minute (the issue's bar: p50 and throughput within 10 %).

This two-core machine's own speed moves by tens of percent for minutes at a time (up to 1.67x on
the probe below; bench/README.md), so a minute can miss the bar with nothing worn. Two figures
tell the machine from wear: a probe (a separate process that runs the same pure-Python work every
second; the CPU time it takes is the machine's speed, which load from the soak does not change),
and the trend: the median of the last five full minutes against the first five (wear grows; a
burst of the machine comes and goes).

    .venv/bin/python bench/soak.py --minutes 30
    .venv/bin/python bench/soak.py --minutes 30 --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import httpx
import websockets

import wire  # bench/wire.py, beside this script
from cpu import cpu_seconds  # bench/cpu.py
from run import fresh_postgres  # bench/run.py

NOOP = {"method": "noop_executor"}
RETRIED = {"name": "retried", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 0.2},
           "timeout_seconds": 0.05, "retry": {"max_attempts": 2, "backoff": "fixed", "base_seconds": 0.05}}


class Record:
    """(seconds since start, kind, latency seconds, ok) of every operation."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ops: list[tuple[float, str, float, bool]] = []
        self.roots: list[str] = []

    async def timed(self, kind: str, call: Any) -> Any:
        began = time.monotonic()
        ok, answer = True, None
        try:
            answer = await call
            ok = not (isinstance(answer, dict) and "error" in answer)
        except Exception:  # a failed operation is counted, never raised: the soak goes on
            ok = False
        self.ops.append((began - self.started, kind, time.monotonic() - began, ok))
        return answer


async def rpc(http: httpx.AsyncClient, method: str, params: Any) -> dict[str, Any]:
    response = await http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return response.json()


async def client(url: str, record: Record, until: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        n = 0
        while time.monotonic() < until:
            n += 1
            p = uuid.uuid4().hex[:8] + "-"
            await record.timed("create", rpc(http, "tasks.create", wire.fan_out(5, p)))
            record.roots = (record.roots + [f"{p}r"])[-50:]
            await record.timed("get", rpc(http, "tasks.get", {"task_id": f"{p}r"}))
            await record.timed("list", rpc(http, "tasks.list", {"limit": 20}))
            if n % 10 == 0:
                await record.timed("retried", rpc(http, "tasks.create", [dict(RETRIED, id=f"{p}x")]))
            if n % 10 == 5:
                slow = asyncio.create_task(rpc(http, "tasks.create", [{"id": f"{p}s", "name": "slow",
                                                                       "schemas": {"method": "sleep_executor"},
                                                                       "inputs": {"seconds": 30}}]))
                await asyncio.sleep(0.05)
                await record.timed("cancel", rpc(http, "tasks.cancel", {"task_id": f"{p}s"}))
                await record.timed("cancelled create", slow)


async def watcher(url: str, record: Record, until: float) -> None:
    ws_url = url.replace("http://", "ws://") + "/ws"
    while time.monotonic() < until:
        async def session() -> None:
            async with websockets.connect(ws_url) as ws:
                if record.roots:
                    await ws.send(json.dumps({"action": "subscribe", "task_id": record.roots[-1]}))
                end = time.monotonic() + 2
                while (left := end - time.monotonic()) > 0:
                    try:
                        await asyncio.wait_for(ws.recv(), left)
                    except TimeoutError:
                        break
        await record.timed("ws session", session())


async def vacuum(database_url: str | None, every: float, until: float) -> None:
    """Stand in for autovacuum, which this machine's test server has switched off (`SHOW autovacuum`).

    A production PostgreSQL vacuums the hot rows' dead versions on its own; without it the soak would
    measure a server nobody runs. Plain VACUUM ANALYZE of the scratch database every `every` seconds
    (0: never, to see what growth alone does)."""
    if database_url is None or every <= 0:
        return
    import asyncpg

    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()


# The probe: fixed pure-Python work once a second, printing (monotonic time, CPU ms it took).
PROBE = """
import time
while True:
    began = time.process_time()
    sum(i * i for i in range(100_000))
    print(time.monotonic(), (time.process_time() - began) * 1000, flush=True)
    time.sleep(1)
"""


async def probe(samples: list[tuple[float, float]], until: float) -> None:
    """Collect the probe's samples until `until` (monotonic), then stop it."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PROBE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        while time.monotonic() < until:
            line = await proc.stdout.readline()
            if not line:
                break
            at, took = line.split()
            samples.append((float(at), float(took)))
    finally:
        proc.kill()
        await proc.wait()


async def soak(server: wire.Server, minutes: float, clients: int, database_url: str | None = None,
               vacuum_every: float = 0) -> None:
    record = Record()
    probed: list[tuple[float, float]] = []
    until = time.monotonic() + minutes * 60
    rss: list[float] = []
    cpu: list[float] = []  # server + its database backends, CPU seconds so far, at each minute's start
    database = database_url.rsplit("/", 1)[1] if database_url else None
    backends: dict[str, float] = {}  # CPU seconds of every backend seen, kept after it exits

    async def memory() -> None:
        while time.monotonic() < until + 60:
            rss.append(server.rss_mb())
            cpu.append(cpu_seconds(server.proc.pid) + backend_seconds(database, backends))
            await asyncio.sleep(max(0.0, record.started + 60 * len(rss) - time.monotonic()))

    sampler = asyncio.create_task(memory())
    await asyncio.gather(*(client(server.url, record, until) for _ in range(clients)),
                         watcher(server.url, record, until), vacuum(database_url, vacuum_every, until),
                         probe(probed, until))
    await asyncio.sleep(max(0.0, record.started + 60 * len(rss) - time.monotonic()) + 0.1)
    sampler.cancel()
    report(record, rss, cpu, [(at - record.started, took) for at, took in probed])


def backend_seconds(database: str | None, seen: dict[str, float]) -> float:
    """CPU of the PostgreSQL backends serving `database` (their process titles name it), 0 on SQLite.
    `seen` keeps each backend's last reading, so one that exits (a pool connection replaced, the
    clients stopping) does not take its CPU out of the sum.

    CPU per operation is the soak's load-proof measure: on a shared machine another job's burst moves
    p50 and throughput, but what wears down (dead row versions, grown indexes, longer histories) shows
    as more CPU for the same operation on the server's or the database's side."""
    if database is None:
        return 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            title = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            if title.startswith("postgres:") and f" {database} " in title:
                started = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]  # a reused pid is another key
                seen[f"{pid}@{started}"] = cpu_seconds(pid)
        except OSError:
            continue  # a backend that ended between the listing and the read
    return sum(seen.values())


def report(record: Record, rss: list[float], cpu: list[float], probed: list[tuple[float, float]]) -> None:
    minutes: dict[int, list[tuple[float, str, float, bool]]] = {}
    for op in record.ops:
        minutes.setdefault(int(op[0] // 60), []).append(op)
    probe_ms: dict[int, list[float]] = {}
    for at, took in probed:
        probe_ms.setdefault(int(at // 60), []).append(took)
    rows = []
    for minute, ops in sorted(minutes.items()):
        creates = [lat for _, kind, lat, ok in ops if kind == "create" and ok]
        spent = cpu[minute + 1] - cpu[minute] if minute + 1 < len(cpu) else float("nan")
        rows.append((minute, statistics.median(creates) * 1000 if creates else float("nan"), len(ops) / 60,
                     sum(1 for op in ops if not op[3]), rss[minute] if minute < len(rss) else float("nan"),
                     spent * 1000 / len(ops), statistics.median(probe_ms.get(minute) or [float("nan")])))
    first = rows[0]
    print("minute  create p50 ms  ops/s   failed  RSS MB  CPU ms/op   p50/first  ops/first  cpu/first  probe/first")
    for minute, p50, rate, failed, mb, per_op, probe_at in rows:
        print(f"{minute:>6}  {p50:12.2f}  {rate:6.1f}  {failed:6d}  {mb:6.1f}  {per_op:9.3f}  {p50 / first[1]:9.2f}"
              f"  {rate / first[2]:9.2f}  {per_op / first[5]:9.2f}  {probe_at / first[6]:11.2f}")
    full = rows[:-1] if len(rows) > 1 else rows  # the last minute is cut short
    if len(full) >= 10:  # the trend: the last five full minutes against the first five
        def median_of(part: list[tuple[Any, ...]], column: int) -> float:
            return statistics.median(row[column] for row in part)
        head, tail = full[:5], full[-5:]
        print(json.dumps({"last5_vs_first5": {name: round(median_of(tail, column) / median_of(head, column), 3)
                                              for name, column in (("create_p50", 1), ("ops", 2),
                                                                   ("cpu_per_op", 5), ("probe", 6))}}))
    worst_p50 = max(row[1] / first[1] for row in full)
    worst_rate = min(row[2] / first[2] for row in full)
    worst_cpu = max(row[5] / first[5] for row in full)
    print(json.dumps({"worst_p50_vs_first": round(worst_p50, 3), "worst_ops_vs_first": round(worst_rate, 3),
                      "worst_cpu_per_op_vs_first": round(worst_cpu, 3),
                      "within_10_percent": worst_p50 <= 1.1 and worst_rate >= 0.9,
                      "cpu_within_10_percent": worst_cpu <= 1.1,
                      "failed": sum(1 for op in record.ops if not op[3])}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    parser.add_argument("--vacuum-every", type=float, default=60,
                        help="PostgreSQL: seconds between VACUUM ANALYZE runs standing in for autovacuum (0: none)")
    parser.add_argument("--database", help="a store to soak as it is (e.g. one filled by bench/volume.py fill) "
                        "instead of a fresh one: does a large table wear an operation down?")
    parser.add_argument("--checkout", help="an older checkout's server (bench/wire.py start_taskgrove)")
    args = parser.parse_args()
    with fresh_postgres(None if args.database else args.postgres) as fresh_url:
        database_url = args.database or fresh_url
        server, _ = wire.start_taskgrove(tempfile.mkdtemp(prefix="taskgrove-soak-"), database_url, args.checkout)
        try:
            asyncio.run(soak(server, args.minutes, args.clients,
                             database_url if database_url and database_url.startswith("postgres") else None,
                             args.vacuum_every))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
