"""`taskgrove tasks list|get|tree|execute|cancel|delete|watch|respond|logs|purge`: the tasks.* JSON-RPC methods of a
running service, as tables and trees for people or JSON (--json) for scripts."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from taskgrove.agent.remote.commands import Command, Group
from taskgrove.agent.remote.connection import RemoteError, json_argument
from taskgrove.agent.remote.follow import follow
from taskgrove.agent.remote.logs import logs_arguments, run_logs
from taskgrove.storage.status import TASK_STATUSES

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from taskgrove.client import AsyncClient



def _task_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="any task of the tree (the root for a whole tree)")


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", choices=TASK_STATUSES)
    parser.add_argument("--search", help="part of the name, or the start of the id")
    parser.add_argument("--roots", action="store_true", help="root tasks only (one per tree), with counts by status")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--offset", type=int, default=0, help="skip this many first (prefer --cursor on large lists)")
    parser.add_argument("--cursor", help="start after the page that printed this next_cursor (`\"\"`: the first page); "
                                         "the table then ends with the next page's cursor")


async def _list(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    # A table pages by cursor (its last line names the next page) unless --offset is given; --json
    # prints the plain list of SPEC.md unless --cursor asks for a page ({"tasks", "next_cursor"}).
    paged = args.cursor is not None or (not args.json and not args.offset)
    page = await client.list_page(status=args.status, search=args.search, roots=args.roots, limit=args.limit,
                                  cursor=(args.cursor or None) if paged else None,
                                  offset=None if paged else args.offset)
    rows = [task.dump() for task in page.tasks]
    if not paged:
        show.emit(console, rows, args.json, show.task_table)
        return 0
    if args.json:
        show.emit(console, {"tasks": rows, "next_cursor": page.next_cursor}, True)
        return 0
    show.emit(console, rows, False, show.task_table)
    console.print(f"next page: --cursor {page.next_cursor}" if page.next_cursor else "(last page)")
    return 0


async def _get(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs
    from taskgrove.client import NotFound

    try:
        task = await client.get(args.task_id)
    except NotFound:
        raise RemoteError(f"no task '{args.task_id}'", 1) from None
    show.emit(console, task.dump(), args.json, show.task_detail)
    return 0


async def _tree(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    show.emit(console, (await client.tree(args.task_id)).dump(), args.json, show.task_tree)
    return 0


def _execute_arguments(parser: argparse.ArgumentParser) -> None:
    _task_id(parser)
    parser.add_argument("--copy", action="store_true", help="run a copy of the tree (re-execute a finished one)")
    parser.add_argument("--watch", action="store_true", help="then follow the tree live, as `tasks watch` does")
    parser.add_argument("--timeout", type=float, help="with --watch: give up after this many seconds")


async def _execute(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answer = await client.execute(args.task_id, copy=args.copy)
    if args.watch and answer.success:
        if not args.json:
            console.print(f"started {show.escape(str(answer.root_task_id))}")
        return await follow(client, answer.task_id, as_json=args.json, timeout=args.timeout)
    show.emit(console, answer.dump(), args.json, lambda a: f"{show.status(str(a['status']))} "
                                                           f"{show.escape(str(a['message']))}")
    return 0 if answer.success else 1


def _cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_ids", nargs="+", metavar="task_id")


async def _cancel(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answers = await client.cancel(*args.task_ids)
    show.emit(console, [a.dump() for a in answers], args.json, lambda rows: "\n".join(
        f"{show.escape(str(r['task_id']))}: {show.status(str(r['status']))} {show.escape(str(r['message']))}"
        for r in rows))
    return 0 if all(a.cancelled for a in answers) else 1


async def _delete(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answer = await client.delete(args.task_id)
    show.emit(console, answer.dump(), args.json, lambda a: f"deleted {a['deleted_count']} task(s)")
    return 0 if answer.success else 1


def _respond_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="the task that waits for input")
    parser.add_argument("--value", required=True, metavar="JSON",
                        help="the answer as JSON: '{\"approved\": true}', '\"plan b\"', 42, null")


async def _respond(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    value = json_argument("--value", args.value)
    answer = await client.respond(args.task_id, value)
    show.emit(console, answer.dump(), args.json, lambda a: f"answered {show.escape(str(a['task_id']))}: {a['status']}")
    return 0


def _purge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--older-than", metavar="DURATION",
                        help="trees that ended longer ago than this: 30d, 12h, 90s or seconds "
                             "(default: the service's SERVICE_RETENTION)")


async def _purge(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answer = await client.purge(older_than=args.older_than or None)
    show.emit(console, answer.dump(), args.json, lambda a: (
        f"deleted {a['trees']} tree(s) ({a['tasks']} tasks), {a['idempotency_records']} idempotency record(s), "
        f"{a['events']} event(s)" if a["swept"] else "another instance is sweeping: nothing deleted here"))
    return 0 if answer.swept else 1


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    _task_id(parser)
    parser.add_argument("--timeout", type=float, help="give up after this many seconds (exit status 1)")


async def _watch(client: AsyncClient, args: argparse.Namespace, _console: Console) -> int:
    return await follow(client, args.task_id, as_json=args.json, timeout=args.timeout)


GROUP = Group("tasks", "tasks of a running service (tasks.* over JSON-RPC)", (
    Command("list", "tasks newest first (--roots: one row per tree)", _list, _list_arguments),
    Command("get", "one task's fields", _get, _task_id),
    Command("tree", "the whole tree a task belongs to", _tree, _task_id),
    Command("execute", "execute a tree or a task with its dependencies", _execute, _execute_arguments),
    Command("cancel", "cancel pending or running tasks", _cancel, _cancel_arguments),
    Command("delete", "delete a pending task and its descendants", _delete, _task_id),
    Command("watch", "follow a tree live over /ws; exit status 1 when it fails", _watch, _watch_arguments),
    Command("respond", "answer a task that waits for input (tasks.respond)", _respond, _respond_arguments),
    Command("logs", "a task's log lines (tasks.logs); --follow prints new ones until it ends", run_logs,
            logs_arguments),
    Command("purge", "admins: delete the trees that ended long ago, now (tasks.purge)", _purge, _purge_arguments),
))
