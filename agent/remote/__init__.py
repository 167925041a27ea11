"""The remote command line: `taskgrove GROUP COMMAND` against a running service over its public
JSON-RPC and /ws surfaces (nothing here touches a database), and `taskgrove run FILE --url`. Every
call goes through the project's one HTTP client, taskgrove.client.AsyncClient (docs/client.md):
its typed answers, errors and retries are the command line's too.

GROUPS lists the command groups; each is a commands.Group in its own module, so one more group is
one module and one line here. Errors a person can act on end as one line on stderr with an exit
status: 1 a failed call or tree, 2 an unreachable service or bad input, 3 a missing or refused token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from taskgrove.agent.remote.commands import Group
from taskgrove.agent.remote.connection import RemoteError, add_connection_options, connect, explain
from taskgrove.agent.remote.events import GROUP as EVENTS
from taskgrove.agent.remote.llm_usage import GROUP as USAGE
from taskgrove.agent.remote.schedules import GROUP as SCHEDULES
from taskgrove.agent.remote.tasks import GROUP as TASKS
from taskgrove.agent.remote.triggers import GROUP as TRIGGERS

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.client import AsyncClient

GROUPS: tuple[Group, ...] = (TASKS, SCHEDULES, TRIGGERS, EVENTS, USAGE)


def add_groups(sub: argparse._SubParsersAction) -> None:
    """One sub-command per group, one sub-sub-command per command, each with --url/--token/--json."""
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common)
    common.add_argument("--json", action="store_true", help="JSON for scripts instead of tables")
    for group in GROUPS:
        parser = sub.add_parser(group.name, help=group.help)
        commands = parser.add_subparsers(dest="remote_command", required=True)
        for command in group.commands:
            child = commands.add_parser(command.name, help=command.help, parents=[common])
            command.arguments(child)
            child.set_defaults(remote_run=command.run)


def is_remote(args: argparse.Namespace) -> bool:
    return hasattr(args, "remote_run")


def run_command(args: argparse.Namespace) -> int:
    """Run the chosen remote command; its exit status."""
    from rich.console import Console

    console = Console()
    return run(args.url, args.token, lambda client: args.remote_run(client, args, console))


def run(url: str, token: str | None, work: Callable[[AsyncClient], Awaitable[int]]) -> int:
    """`work` against the service at `url`; a refused or failed call is printed as one line, not a
    traceback."""
    from taskgrove.client import TaskgroveError

    async def main() -> int:
        async with connect(url, token) as client:
            try:
                return await work(client)
            except TaskgroveError as exc:
                raise explain(exc, client.url, token) from None

    try:
        return asyncio.run(main())
    except RemoteError as exc:
        print(f"taskgrove: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `taskgrove tasks list | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
