"""`taskgrove tasks logs ID [--attempt N] [--follow]`: a task's log lines (tasks.logs), printed as
they come with --follow (docs/cli.md). Following polls `tasks.logs` from the last line's `seq`
until the task is finished and every line was printed: it works the same against any instance."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.client import Remote
from taskgrove.storage.status import FINISHED_STATUSES

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

POLL_SECONDS = 0.5
STREAM_COLOURS = {"stderr": "red", "http": "cyan", "log": "white", "stdout": "white"}


def logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="the task whose lines to show")
    parser.add_argument("--attempt", type=int, help="only this attempt's lines (1 for the first)")
    parser.add_argument("--follow", action="store_true", help="keep printing new lines until the task ends")


def _line(line: Mapping[str, Any]) -> str:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    level = f" {line['level']}" if line.get("level") and line["level"] != "info" else ""
    colour = STREAM_COLOURS.get(str(line["stream"]), "white")
    return (f"[dim]{str(line['at'])[11:23]} #{line['attempt']}[/] [{colour}]{line['stream']}{level}[/] "
            f"{show.escape(str(line['text']))}")


async def _pages(remote: Remote, params: dict[str, Any]) -> Any:
    """Every line stored so far after params["after"], a page at a time."""
    while True:
        page = await remote.call("tasks.logs", params)
        for line in page["lines"]:
            yield line
        if page["lines"]:
            params["after"] = page["lines"][-1]["seq"]
        if page["next_after"] is None:
            return


async def run_logs(remote: Remote, args: argparse.Namespace, console: "Console") -> int:
    params: dict[str, Any] = {"task_id": args.task_id}
    if args.attempt is not None:
        params["attempt"] = args.attempt
    while True:
        finished = args.follow and (await remote.call("tasks.get", {"task_id": args.task_id}) or {}).get(
            "status") in FINISHED_STATUSES
        async for line in _pages(remote, params):
            if args.json:
                print(json.dumps(line), flush=True)
            else:
                console.print(_line(line), highlight=False, soft_wrap=True)
        if not args.follow or finished:
            return 0
        await asyncio.sleep(POLL_SECONDS)
