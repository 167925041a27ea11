"""Instructions the server executes per request and per tree: an A/B that the machine's noise does not move.

Wall times on a shared two-core machine differ by 10-15 % between runs of the same code, more than
the 3-5 % an issue may allow a change. Instructions counted by valgrind's callgrind do not depend
on what else the machine does. Each checkout's `taskgrove serve` (its own `.venv`, a fresh SQLite
file, PYTHONHASHSEED=0) runs under callgrind; each workload is driven over HTTP from this process
with the counters zeroed before it and dumped after it (callgrind_control), so start-up and the
client are not counted. Under valgrind the server is ~50x slower, so the workloads are small.

    .venv/bin/python bench/instructions.py ../old . [--repeat 2]

Counts still vary a little (how outcomes fall into passes depends on timing): --repeat runs each
checkout again and prints the median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

import wire  # bench/wire.py, beside this script

Workload = Callable[[httpx.AsyncClient], Awaitable[int]]  # returns how many units it drove


def _trees(make: Callable[[int, str], list], size: int, count: int) -> Workload:
    async def drive(http: httpx.AsyncClient) -> int:
        for _ in range(count):
            await wire.create(http, make(size, uuid.uuid4().hex[:8] + "-"))
        return count
    return drive


async def _gets(http: httpx.AsyncClient) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": "seed"}}
    for _ in range(300):
        assert "result" in (await http.post("/tasks", json=body)).json()
    return 300


async def _health(http: httpx.AsyncClient) -> int:
    for _ in range(300):
        await http.post("/system", json={"jsonrpc": "2.0", "id": 1, "method": "system.health"})
    return 300


# Long enough that the server's periodic work (lease renewals, WAL checkpoints, the loops' timers)
# averages out: with 10 s the idle rate of one checkout moved 0.5-1.0M a second between runs,
# which moved a 100-create window by several per cent once subtracted.
IDLE_SECONDS = 30


async def _idle(http: httpx.AsyncClient) -> int:
    await asyncio.sleep(IDLE_SECONDS)
    return 1


WORKLOADS: dict[str, Workload] = {
    # 150 creates are 300 commits: one WAL checkpoint (storage/connections.py CHECKPOINT_EVERY) in
    # every window, whatever its phase (with 100, a window held one or none: +-10 % a create).
    "one task": _trees(lambda n, p: [{"name": "one", "schemas": wire.NOOP}], 1, 150),
    "5-task tree": _trees(wire.fan_out, 5, 50),
    "fan-out 1000": _trees(wire.fan_out, 1000, 2),
    "chain 1000": _trees(wire.chain, 1000, 2),
    "diamond 1000": _trees(wire.diamond, 1000, 2),
    "tasks.get": _gets,
    "system.health": _health,
}


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _dumped_instructions(out_dir: Path, before: set[Path]) -> int:
    """The Ir total of the dump file(s) written since `before` was listed."""
    for _ in range(200):
        new = set(out_dir.glob("cg.out*")) - before
        if new:
            break
        time.sleep(0.05)
    total = 0
    for path in new:
        for _ in range(100):  # the file is written by the server: wait until its totals are there
            match = re.search(r"^(?:totals|summary): (\d+)", path.read_text(errors="replace"), re.MULTILINE)
            if match:
                total += int(match.group(1))
                break
            time.sleep(0.05)
    return total


def measure(checkout: Path) -> dict[str, float]:
    """Instructions per unit of each workload for one checkout's server."""
    workdir = Path(tempfile.mkdtemp(prefix="taskgrove-instr-"))
    venv = checkout.resolve() / ".venv" / "bin"
    port = wire.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": str(port), "SERVICE_LOG_LEVEL": "warning",
                "SERVICE_DATABASE_URL": f"sqlite:///{workdir}/bench.db", "SERVICE_RATE_LIMIT_PER_USER": "0",
                "SERVICE_CREATE_WAIT_TIMEOUT": "600", "PYTHONHASHSEED": "0"})
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/cg.out", "--dump-instr=no",
            str(venv / "python"), str(venv / "taskgrove"), "serve"]
    server = wire.Server(argv, env, port, str(workdir))
    pid = server.proc.pid
    try:
        wire.wait_port(port, server.proc, timeout=600)
        return asyncio.run(_drive(server.url, pid, workdir))
    finally:
        server.stop()


def measure_bare() -> float:
    """Instructions a request of bench/wire.py's bare Starlette endpoint costs on the same uvicorn
    (wire.CEILING_APP, started as wire.start_ceiling starts it), driven and counted as above: what
    item 5 of issue 48 compares `system.health` and `tasks.get` with, without wrk's noise."""
    workdir = Path(tempfile.mkdtemp(prefix="taskgrove-instr-bare-"))
    (workdir / "ceiling_app.py").write_text(wire.CEILING_APP)
    port = wire.free_port()
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/cg.out", "--dump-instr=no",
            sys.executable, "-m", "uvicorn", "ceiling_app:app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]
    server = wire.Server(argv, {**os.environ, "PYTHONHASHSEED": "0"}, port, str(workdir))
    try:
        wire.wait_port(port, server.proc, timeout=600)
        return asyncio.run(_drive_bare(server.url, server.proc.pid, workdir))
    finally:
        server.stop()


async def _bare(http: httpx.AsyncClient) -> int:
    for _ in range(300):
        await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "system.health"})
    return 300


async def _drive_bare(url: str, pid: int, workdir: Path) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await _bare(http)  # warm-up
        idle_rate = (await _count(pid, workdir, _idle, http))[0] / IDLE_SECONDS
        counted, units, took = await _count(pid, workdir, _bare, http)
    return (counted - idle_rate * took) / units


async def _drive(url: str, pid: int, workdir: Path) -> dict[str, float]:
    """Instructions per unit of each workload, less what the idle server spends in the same time:
    under valgrind a request takes ~50x its real time, so timers that wake once a second would
    otherwise be counted ~50x over (on the real server they are well under 1 % of a request)."""
    out: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await wire._seed(url)
        for drive in WORKLOADS.values():  # warm-up: every path once, imports and caches done
            await drive(http)
        idle_rate = (await _count(pid, workdir, _idle, http))[0] / IDLE_SECONDS
        for name, drive in WORKLOADS.items():
            counted, units, took = await _count(pid, workdir, drive, http)
            out[name] = (counted - idle_rate * took) / units
    out["idle second"] = idle_rate
    return out


async def _count(pid: int, workdir: Path, drive: Workload, http: httpx.AsyncClient) -> tuple[int, int, float]:
    """(instructions, units, seconds) of one workload."""
    _control(pid, "-z")
    before = set(workdir.glob("cg.out*"))
    started = time.monotonic()
    units = await drive(http)
    took = time.monotonic() - started
    _control(pid, "-d")
    return _dumped_instructions(workdir, before), units, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="these workloads only")
    parser.add_argument("--bare", action="store_true",
                        help="also the bare Starlette endpoint of bench/wire.py: requests' shares of its count")
    args = parser.parse_args()
    for name in set(WORKLOADS) - set(args.only or WORKLOADS):
        del WORKLOADS[name]
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(args.repeat):
        for build in ("old", "new"):
            runs[build].append(measure(getattr(args, build)))
            print(f"{build}: " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in runs[build][-1].items()), flush=True)
    print(f"\ninstructions per unit (median of {args.repeat}): old {args.old}, new {args.new}")
    for name in [*WORKLOADS, "idle second"]:
        old = statistics.median(r[name] for r in runs["old"])
        new = statistics.median(r[name] for r in runs["new"])
        print(f"{name:>14}: {old / 1e6:9.3f}M -> {new / 1e6:9.3f}M  ({100 * (new - old) / old:+.1f} %)")
    if args.bare:
        bare = statistics.median(measure_bare() for _ in range(args.repeat))
        print(f"\nbare Starlette endpoint: {bare / 1e6:.3f}M a request; its count / ours (old, new):")
        for name in ("tasks.get", "system.health"):
            if name in WORKLOADS:
                shares = [bare / statistics.median(r[name] for r in runs[b]) for b in ("old", "new")]
                print(f"{name:>14}: {shares[0]:.2f} -> {shares[1]:.2f}")


if __name__ == "__main__":
    main()
