"""`taskgrove triggers list|get|create|delete|runs`: the triggers.* JSON-RPC methods of a running
service (docs/triggers.md), as tables for people or JSON (--json) for scripts.

The calls go through the client's raw `call` (the typed `client.triggers` of taskgrove.client is
newer than these commands); the answers are the methods' JSON as docs/triggers.md shows it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.commands import Command, Group
from taskgrove.agent.remote.connection import RemoteError, json_argument

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

    from taskgrove.client import AsyncClient

SINGLETON = ("skip", "queue", "replace")
DETAIL_FIELDS = ("id", "task_id", "user_id", "event", "match", "key", "debounce", "batch", "singleton", "cancel_on",
                 "enabled", "waiting", "matched", "runs", "debounced", "batched", "skipped", "cancelled",
                 "last_run_at", "last_root_task_id", "created_at", "updated_at")


def _trigger_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trigger_id")


def flow(row: Mapping[str, Any]) -> str:
    """A trigger's flow control in a few words: `debounce 1s (max 30s), key ticket_id, singleton replace`."""
    said = []
    debounce, batch = row.get("debounce"), row.get("batch")
    if isinstance(debounce, Mapping):
        most = debounce.get("max_wait_seconds")
        said.append(f"debounce {debounce.get('seconds'):g}s" + (f" (max {most:g}s)" if most is not None else ""))
    if isinstance(batch, Mapping):
        said.append(f"batch {batch.get('size')} / {batch.get('seconds'):g}s")
    for field in ("singleton", "cancel_on"):
        if row.get(field):
            said.append(f"{field} {row[field]}")
    if row.get("key"):
        said.append(f"key {row['key']}")
    return ", ".join(said) or "every event"


# --- list -------------------------------------------------------------------------------------------

def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task-id", help="only the triggers of this template (a root task id)")
    parser.add_argument("--event", help="only the triggers listening to this event")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--offset", type=int, default=0)


async def _list(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    params: dict[str, Any] = {"limit": args.limit, "offset": args.offset}
    for name, value in (("task_id", args.task_id), ("event", args.event)):
        if value:
            params[name] = value
    triggers = await client.call("triggers.list", params)
    show.emit(console, triggers, args.json, _table)
    return 0


def _table(rows: Sequence[Mapping[str, Any]]) -> "Table":
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for column in ("id", "template", "event", "match", "flow control", "enabled", "matched", "runs", "last run"):
        table.add_column(column)
    for row in rows:
        match = json.dumps(row["match"], ensure_ascii=False) if row.get("match") else "—"
        table.add_row(escape(str(row["id"])), escape(str(row["task_id"])), escape(str(row["event"])), escape(match),
                      escape(flow(row)), "yes" if row.get("enabled") else "no", str(row.get("matched", 0)),
                      str(row.get("runs", 0)), escape(str(row.get("last_run_at") or "—")))
    return table


# --- get ----------------------------------------------------------------------------------------------

async def _get(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    trigger = await client.call("triggers.get", {"trigger_id": args.trigger_id})
    if trigger is None:
        raise RemoteError(f"no trigger '{args.trigger_id}'", 1)
    show.emit(console, trigger, args.json, _detail)
    return 0


def _detail(trigger: Mapping[str, Any]) -> "Table":
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for field in DETAIL_FIELDS:
        if field in trigger:
            value = trigger[field]
            table.add_row(field, escape(json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list))
                                        else str(value if value is not None else "—")))
    return table


# --- create -------------------------------------------------------------------------------------------

def _create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="the template: the root of a stored tree, run as a copy for each event")
    parser.add_argument("event", help="the event name that starts a run")
    parser.add_argument("--id", dest="trigger_id", help="the trigger's id (default: a new one)")
    parser.add_argument("--match", metavar="JSON", help="payload keys and the values they must have: '{\"queue\": \"support\"}'")
    parser.add_argument("--key", help="the payload field that groups events (debounce, batch, singleton, cancel_on per key)")
    parser.add_argument("--debounce", type=float, metavar="SECONDS",
                        help="start once the key was quiet this long, with the last event's payload")
    parser.add_argument("--max-wait", type=float, metavar="SECONDS",
                        help="with --debounce: start at the latest this long after the first event")
    parser.add_argument("--batch", type=int, metavar="SIZE", help="one run for up to SIZE events (payloads as a list)")
    parser.add_argument("--batch-seconds", type=float, metavar="SECONDS",
                        help="with --batch: start once the first event waited this long (default 60)")
    parser.add_argument("--singleton", choices=SINGLETON,
                        help="while a run of the key goes: skip the new events, queue them, or replace the run")
    parser.add_argument("--cancel-on", metavar="EVENT", help="an event that cancels the running tree of its key")
    parser.add_argument("--disabled", action="store_true", help="create it disabled")


def create_params(args: argparse.Namespace) -> dict[str, Any]:
    """triggers.create's params from the options; bad input is exit status 2 before any call."""
    params: dict[str, Any] = {"task_id": args.task_id, "event": args.event, "enabled": not args.disabled}
    if args.trigger_id:
        params["trigger_id"] = args.trigger_id
    if args.match is not None:
        match = json_argument("--match", args.match)
        if not isinstance(match, dict):
            raise RemoteError("--match must be a JSON object, e.g. --match '{\"queue\": \"support\"}'", 2)
        params["match"] = match
    if args.max_wait is not None and args.debounce is None:
        raise RemoteError("--max-wait goes with --debounce", 2)
    if args.batch_seconds is not None and args.batch is None:
        raise RemoteError("--batch-seconds goes with --batch", 2)
    if args.debounce is not None:
        params["debounce"] = {"seconds": args.debounce, "max_wait_seconds": args.max_wait}
    if args.batch is not None:
        params["batch"] = {"size": args.batch, "seconds": args.batch_seconds}
    for name, value in (("key", args.key), ("singleton", args.singleton), ("cancel_on", args.cancel_on)):
        if value is not None:
            params[name] = value
    return params


async def _create(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    trigger = await client.call("triggers.create", create_params(args), write=True)
    show.emit(console, trigger, args.json, lambda t: f"trigger {show.escape(str(t['id']))}: event "
                                                     f"{show.escape(str(t['event']))} runs "
                                                     f"{show.escape(str(t['task_id']))} ({show.escape(flow(t))})")
    return 0


# --- delete, runs -----------------------------------------------------------------------------------

async def _delete(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answer = await client.call("triggers.delete", {"trigger_id": args.trigger_id}, write=True)
    show.emit(console, answer, args.json, lambda a: f"deleted trigger {show.escape(str(a['trigger_id']))}"
              if a.get("success") else f"no trigger {show.escape(str(a['trigger_id']))}")
    return 0 if answer.get("success") else 1


def _runs_arguments(parser: argparse.ArgumentParser) -> None:
    _trigger_id(parser)
    parser.add_argument("--key", help="only the runs of this key value")
    parser.add_argument("--limit", type=int, default=100)


async def _runs(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    params: dict[str, Any] = {"trigger_id": args.trigger_id, "limit": args.limit}
    if args.key is not None:
        params["key"] = args.key
    found = await client.call("triggers.runs", params)
    if found is None:
        raise RemoteError(f"no trigger '{args.trigger_id}'", 1)
    show.emit(console, found, args.json, _runs_table)
    return 0


def _runs_table(rows: Sequence[Mapping[str, Any]]) -> "Table":
    from rich.markup import escape
    from rich.table import Table

    from taskgrove.agent.remote import show

    table = Table()
    for column in ("root", "key", "events", "status", "started", "ended", "cancel reason"):
        table.add_column(column)
    for row in rows:
        table.add_row(escape(str(row["root_task_id"])), escape(str(row.get("key") or "—")), str(row.get("events")),
                      show.status(str(row.get("status") or "—")), escape(str(row.get("started_at") or "—")),
                      escape(str(row.get("ended_at") or "—")), escape(str(row.get("cancel_reason") or "")))
    return table


GROUP = Group("triggers", "event triggers of a running service (triggers.* over JSON-RPC)", (
    Command("list", "triggers newest first: their event, flow control and counts", _list, _list_arguments),
    Command("get", "one trigger's fields and how many of its events wait", _get, _trigger_id),
    Command("create", "run a copy of a stored tree for each matching event", _create, _create_arguments),
    Command("delete", "delete a trigger (its waiting events are dropped, its runs stay)", _delete, _trigger_id),
    Command("runs", "the runs a trigger started, newest first", _runs, _runs_arguments),
))
