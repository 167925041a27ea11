"""`taskgrove events emit NAME --payload JSON`: events.emit of a running service (docs/waits.md),
which resumes the tasks of your user that wait for that event."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from taskgrove.agent.remote.client import Remote, RemoteError, json_argument
from taskgrove.agent.remote.commands import Command, Group

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console


def _emit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the event's name")
    parser.add_argument("--payload", default="{}", metavar="JSON", help="a JSON object (default {})")
    parser.add_argument("--user", dest="user_id", help="another user's event (admins only)")


async def _emit(remote: Remote, args: argparse.Namespace, console: "Console") -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    payload = json_argument("--payload", args.payload)
    if not isinstance(payload, dict):
        raise RemoteError("--payload must be a JSON object, e.g. --payload '{\"service\": \"api\"}'", 2)
    params = {"name": args.name, "payload": payload}
    if args.user_id:
        params["user_id"] = args.user_id
    answer = await remote.call("events.emit", params)
    show.emit(console, answer, args.json, lambda a: f"event {show.escape(str(a['name']))}: resumed {a['resumed']} "
                                                    f"task(s) {show.escape(', '.join(a['task_ids']))}".rstrip())
    return 0


GROUP = Group("events", "events of a running service (events.* over JSON-RPC)", (
    Command("emit", "emit an event: resumes your tasks that wait for it", _emit, _emit_arguments),
))
