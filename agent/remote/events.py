"""`taskgrove events emit NAME --payload JSON`: events.emit of a running service (docs/waits.md),
which resumes the tasks of your user that wait for that event."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from taskgrove.agent.remote.commands import Command, Group
from taskgrove.agent.remote.connection import RemoteError, json_argument

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from taskgrove.client import AsyncClient


def _emit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the event's name")
    parser.add_argument("--payload", default="{}", metavar="JSON", help="a JSON object (default {})")
    parser.add_argument("--user", dest="user_id", help="another user's event (admins only)")


async def _emit(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    payload = json_argument("--payload", args.payload)
    if not isinstance(payload, dict):
        raise RemoteError("--payload must be a JSON object, e.g. --payload '{\"service\": \"api\"}'", 2)
    answer = await client.emit(args.name, payload, user_id=args.user_id or None)
    show.emit(console, answer.dump(), args.json, lambda a: f"event {show.escape(str(a['name']))}: resumed "
                                                           f"{a['resumed']} task(s) "
                                                           f"{show.escape(', '.join(a['task_ids']))}".rstrip())
    return 0


GROUP = Group("events", "events of a running service (events.* over JSON-RPC)", (
    Command("emit", "emit an event: resumes your tasks that wait for it", _emit, _emit_arguments),
))
