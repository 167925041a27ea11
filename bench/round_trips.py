"""The statements PostgreSQL runs between a request and its answer: round trips and commits.

Starts a real `taskgrove serve` on a scratch database whose sessions log every statement
(`ALTER DATABASE ... SET log_statement = 'all'`: the server's own record, nothing inside the
service is patched), warms it up, then sends one request at a time and prints what the server
log holds for that database between the request and its answer, by backend. With asyncpg's
statement cache warm, each logged statement is one round trip (Bind/Execute/Sync); BEGIN and
COMMIT are their own.

    .venv/bin/python bench/round_trips.py postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/round_trips.py URL --log /var/log/postgresql/postgresql-15-main.log

Needs read access to the server's log (Debian: /var/log/postgresql/, root or group adm).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx

import wire  # bench/wire.py, beside this script
from run import fresh_postgres  # bench/run.py

ENTRY = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] \S*@(\S+) LOG:  (?:statement|execute [^:]*): (.*)$")
DETAIL = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] \S*@(\S+) DETAIL:  parameters: (.*)$")
PARAM = re.compile(r"\$(\d+) = (NULL|'(?:[^']|'')*')")
PASS = "WITH w AS MATERIALIZED"  # statements.pass_statement: which parts a row uses, from its arguments
NOOP = {"method": "noop_executor"}


def statements_since(log: Path, offset: int, database: str, end: int) -> list[tuple[int, str]]:
    """(backend pid, statement's first 110 characters, or what an engine pass row does) of
    `database` logged between `offset` and `end`."""
    found: list[tuple[int, str]] = []
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read(end - offset).decode(errors="replace")
    for line in text.splitlines():
        match = ENTRY.match(line)
        if match and match.group(2) == database:
            found.append((int(match.group(1)), " ".join(match.group(3).split())[:110]))
        detail = DETAIL.match(line)
        if detail and detail.group(2) == database and found and found[-1][1].startswith(PASS):
            found[-1] = (found[-1][0], pass_row(dict(PARAM.findall(detail.group(3)))))
    return found


def pass_row(args: dict[str, str]) -> str:
    """What one row of the engine's pass statement does, from its arguments (statements.PASS_ARGS)."""
    parts = []
    if args.get("2", "'{}'") != "'{}'":
        parts.append(f"fenced writes {args['2']}")
    if args.get("4", "'{}'") != "'{}'":
        parts.append(f"claims {args['4']}")
    if args.get("7", "NULL") != "NULL":
        parts.append("end of the execution")
    return "engine pass row: " + (", ".join(parts) or "nothing")


async def one(http: httpx.AsyncClient, tasks: list[dict[str, Any]]) -> None:
    await wire.create(http, tasks)


def show(title: str, entries: list[tuple[int, str]]) -> None:
    commits = sum(1 for _, text in entries if text.upper().startswith("COMMIT"))
    begins = sum(1 for _, text in entries if text.upper().startswith("BEGIN"))
    print(f"\n## {title}: {len(entries)} statements ({begins} BEGIN, {commits} COMMIT; a statement outside "
          f"BEGIN/COMMIT is its own transaction)")
    for pid, text in entries:
        print(f"  [{pid}] {text}")


async def measure(url: str, database: str, log: Path, chain_links: int) -> None:
    admin = await asyncpg.connect(url)
    await admin.execute(f'ALTER DATABASE "{database}" SET log_statement = \'all\'')
    await admin.close()
    workdir = tempfile.mkdtemp(prefix="taskgrove-trips-")
    server, _ = wire.start_taskgrove(workdir, url)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            for _ in range(30):  # statement caches, pools, prepared statements: warm
                await one(http, [{"name": "warm", "schemas": NOOP}])
            await one(http, wire.chain(5, "warm-"))
            await asyncio.sleep(0.5)
            for label, tasks in (("one-task tree (tasks.create)", [{"name": "one", "schemas": NOOP}]),
                                 (f"chain of {chain_links} (tasks.create)",
                                  wire.chain(chain_links, uuid.uuid4().hex[:6] + "-"))):
                offset = log.stat().st_size
                await one(http, tasks)
                end = log.stat().st_size  # each backend writes its statement's line before running it
                show(label, statements_since(log, offset, database, end))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("postgres", help="a PostgreSQL server URL (a scratch database is made on it)")
    parser.add_argument("--log", help="the server's log file (default: the newest /var/log/postgresql/*.log)")
    parser.add_argument("--links", type=int, default=4, help="length of the chain shown")
    args = parser.parse_args()
    log = Path(args.log or max(glob.glob("/var/log/postgresql/*.log"), key=lambda p: Path(p).stat().st_mtime))
    with fresh_postgres(args.postgres) as url:
        assert url is not None
        asyncio.run(measure(url, url.rsplit("/", 1)[1], log, args.links))


if __name__ == "__main__":
    main()
