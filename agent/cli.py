"""`taskgrove serve | run FILE [--url] | token USER | mcp | tasks ...`.

`serve` and `run FILE` (without --url) use this process's settings and database; `mcp`, `tasks ...`
and `run FILE --url` are clients of a running service (agent/remote/), with one --url/--token handling.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from taskgrove.agent.remote import add_groups, is_remote, run_command
from taskgrove.agent.remote.connection import add_connection_options
from taskgrove.agent.foundations.settings import Settings, SettingsError
from taskgrove.storage.status import TaskStatus


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="taskgrove", description="Task orchestration service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service (host/port from SERVICE_API_HOST/PORT)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    run = sub.add_parser("run", help="create and execute a task tree from a JSON file, with live progress")
    run.add_argument("file", type=Path)
    run.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    run.add_argument("--url", default=None,
                     help="run on this running service instead of the embedded database (token: --token or "
                          "TASKGROVE_TOKEN)")
    run.add_argument("--token", default=os.environ.get("TASKGROVE_TOKEN"),
                     help="with --url: Bearer token when the service has JWT on (or TASKGROVE_TOKEN)")
    run.add_argument("--json", action="store_true", help="with --url: events and the outcome as JSON lines")
    token = sub.add_parser("token", help="mint a JWT for a user with SERVICE_JWT_SECRET")
    token.add_argument("user_id")
    token.add_argument("--role", action="append", dest="roles", default=[], help="repeatable, e.g. --role admin")
    token.add_argument("--expires-in", type=float, default=3600.0, help="seconds; 0 for no expiry")
    mcp = sub.add_parser("mcp", help="an MCP server on stdio forwarding to a running service (desktop MCP clients)")
    add_connection_options(mcp)
    add_groups(sub)
    args = parser.parse_args(argv)
    # Clients of a running service: this process's SERVICE_* settings do not matter.
    if args.command == "mcp":
        from taskgrove.agent.surfaces.mcp.stdio_proxy import serve_stdio

        asyncio.run(serve_stdio(args.url, args.token))
        return
    if is_remote(args):
        sys.exit(run_command(args))
    if args.command == "run" and args.url:
        sys.exit(_run_remote(args.url, args.token, args.file, args.json, args.timeout))

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        sys.exit(f"taskgrove: configuration error: {exc}")
    if args.command == "serve":
        _serve(settings, args.host, args.port)
    elif args.command == "run":
        sys.exit(asyncio.run(_run(settings, args.file, args.timeout)))
    elif args.command == "token":
        from taskgrove.agent.foundations.auth import mint_token

        try:
            print(mint_token(settings, args.user_id, args.roles, args.expires_in or None))
        except ValueError as exc:
            sys.exit(f"taskgrove: {exc}")


def _serve(settings: Settings, host: str | None, port: int | None) -> None:
    import uvicorn

    from taskgrove.agent.app import build_app
    from taskgrove.agent.foundations.logconfig import configure as configure_logging

    settings = settings.with_(api_host=host or settings.api_host, api_port=port or settings.api_port)
    configure_logging(settings.log_format, settings.log_level)
    app = build_app(settings)
    freeze_long_lived_objects()
    keep_freed_memory()
    # uvicorn re-raises the signal that stopped it once shutdown is complete, to the handler in
    # place before it started: make that one a no-op, so a drained SIGTERM exits with status 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    # Open connections (an SSE stream, a waiting tasks.create) get the same grace as running tasks.
    # WebSocket messages over the request limit are closed by uvicorn with 1009 (message too big).
    uvicorn.run(app, host=settings.api_host, port=settings.api_port, log_config=None,
                log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) or None,
                ws_max_size=settings.max_request_bytes)


# Allocations between two young-generation collections (CPython's default is 700). A request or
# a pass allocates thousands of short-lived containers that reference counting frees anyway;
# collecting every 700 made a 1000-task fan-out spend 4-5 % of its time in the collector for
# nothing (bench/README.md, issues 25-28 third round). Cyclic garbage waits at most this long.
YOUNG_GC_THRESHOLD = 10_000


def freeze_long_lived_objects() -> None:
    """Everything imported and built before serving lives as long as the process: keep it out
    of the cyclic garbage collector's full passes, which otherwise stall a large tree's execution
    by tens of milliseconds; and collect the young generation less often (YOUNG_GC_THRESHOLD).
    Once per process, at the entry point (not in build_app: a test process builds hundreds of
    apps and would freeze their garbage)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


# glibc malloc: freed memory at the top of the heap is kept up to this much before it is given back
# to the system, and the heap grows by this much more than it needs (mallopt M_TRIM_THRESHOLD and
# M_TOP_PAD). With the defaults (128 kB, adjusted as memory is freed) a 1000-task tree's answer and
# reads gave their memory back and faulted it in again: ~700 page faults a fan-out tree on a server
# that had served a few hundred small trees, against ~5 for 23da58d (bench/README.md, fifth round).
KEEP_FREED_BYTES = 64 * 1024 * 1024
GROW_BY_BYTES = 16 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_TOP_PAD = -1, -2  # glibc's <malloc.h>


def keep_freed_memory() -> None:
    """Tell glibc's malloc to keep freed memory (KEEP_FREED_BYTES, GROW_BY_BYTES) instead of
    returning it to the system after every large request. Memory stays at what the busiest moment
    needed, plus at most KEEP_FREED_BYTES. Once per process, at the entry point; nothing on a C
    library without mallopt (musl, macOS)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    mallopt(_M_TOP_PAD, GROW_BY_BYTES)


def _run_remote(url: str, token: str | None, path: Path, as_json: bool, timeout: float | None) -> int:
    from taskgrove.agent.remote import run
    from taskgrove.agent.remote.run import run_remote

    try:
        payload: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"taskgrove: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    return run(url, token, lambda client: run_remote(client, payload, as_json=as_json, timeout=timeout))


async def _run(settings: Settings, path: Path, timeout: float | None) -> int:
    """Create the tree in the embedded database, execute it, draw progress; 1 if anything failed."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from taskgrove.agent.services.container import Services
    from taskgrove.agent.foundations.errors import RpcError
    from taskgrove.agent.foundations.requests import NewTree
    from taskgrove.agent.foundations.calls import CallContext

    try:
        payload: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"taskgrove: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    console = Console()
    services = Services.build(settings)
    await services.start()
    try:
        try:
            rows = await services.tasks.create_tree(NewTree.from_params(payload, settings.max_tree_tasks),
                                                    CallContext().caller)
        except RpcError as exc:
            console.print(f"[red]Invalid tree:[/red] {exc.message}")
            return 2
        root_id = rows[0]["id"]
        run = await services.engine.run_keeper.execute(root_id, {})
        names = {row["id"]: row["name"] for row in rows}
        status: dict[str, tuple[str, float]] = {row["id"]: (TaskStatus.PENDING.value, 0.0) for row in rows}
        sub = services.bus.subscribe(lambda e: e["root_task_id"] == root_id)

        def table() -> Table:
            grid = Table(title=f"Tree {root_id}")
            grid.add_column("task")
            grid.add_column("status")
            grid.add_column("progress", justify="right")
            colours: dict[str, str] = {TaskStatus.COMPLETED: "green", TaskStatus.FAILED: "red", TaskStatus.CANCELLED: "yellow",
                       TaskStatus.IN_PROGRESS: "cyan"}
            for tid, (state, progress) in status.items():
                bar = "#" * int(progress * 20)
                grid.add_row(names[tid], f"[{colours.get(state, 'white')}]{state}[/]", f"{bar:<20} {progress:>4.0%}")
            return grid

        with Live(table(), console=console, refresh_per_second=10) as live:
            waiter = asyncio.create_task(services.engine.run_keeper.wait(run, timeout))
            while not waiter.done():
                getter = asyncio.create_task(sub.get())
                done, _ = await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    event = getter.result()
                    if event["task_id"] in status:
                        status[event["task_id"]] = (event["status"], event.get("progress") or 0.0)
                else:
                    getter.cancel()
                live.update(table())
            final = {row["id"]: row for row in await services.repo.tree(root_id)}
            for tid in status:
                status[tid] = (final[tid]["status"], final[tid]["progress"])
            live.update(table())
        sub.close()
        failed = [row for row in final.values() if row["status"] != TaskStatus.COMPLETED]
        for row in failed:
            if row["error"]:
                console.print(f"[red]{row['name']}:[/red] {row['error']}")
        return 1 if failed else 0
    finally:
        await services.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
