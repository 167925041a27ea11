"""`taskgrove tasks logs ID [--attempt N] [--follow]`: a task's log lines (tasks.logs), printed as
they come with --follow (docs/cli.md). Following is the client's `logs(..., follow=True)`: it polls
`tasks.logs` from the last line's `seq` until the task is finished and every line was read, so it
works the same against any instance."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from taskgrove.client import AsyncClient, LogLine

POLL_SECONDS = 0.5
STREAM_COLOURS = {"stderr": "red", "http": "cyan", "log": "white", "stdout": "white"}


def logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="the task whose lines to show")
    parser.add_argument("--attempt", type=int, help="only this attempt's lines (1 for the first)")
    parser.add_argument("--follow", action="store_true", help="keep printing new lines until the task ends")


def _line(line: LogLine) -> str:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    level = f" {line.level}" if line.level and line.level != "info" else ""
    colour = STREAM_COLOURS.get(line.stream, "white")
    return f"[dim]{line.at[11:23]} #{line.attempt}[/] [{colour}]{line.stream}{level}[/] {show.escape(line.text)}"


async def run_logs(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    async for line in client.logs(args.task_id, attempt=args.attempt, follow=args.follow,
                                  poll_seconds=POLL_SECONDS):
        if args.json:
            print(json.dumps(line.dump()), flush=True)
        else:
            console.print(_line(line), highlight=False, soft_wrap=True)
    return 0
