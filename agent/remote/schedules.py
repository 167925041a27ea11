"""`taskgrove schedules list`: the schedules.* JSON-RPC methods of a running service, as a table for
people or JSON (--json) for scripts."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.commands import Command, Group

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

    from taskgrove.client import AsyncClient


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task-id", help="only the schedules of this template (a root task id)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--offset", type=int, default=0)


async def _list(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    schedules = await client.schedules.list(task_id=args.task_id or None, limit=args.limit, offset=args.offset)
    show.emit(console, [schedule.dump() for schedule in schedules], args.json, _table)
    return 0


def _table(rows: Sequence[Mapping[str, Any]]) -> "Table":
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for column in ("id", "template", "when", "enabled", "next run", "last run", "runs", "skipped"):
        table.add_column(column)
    for row in rows:
        when = f"cron {row['cron']} {row.get('timezone') or 'UTC'}" if row.get("cron") \
            else f"every {row.get('interval_seconds')} s"
        table.add_row(escape(str(row["id"])), escape(str(row["task_id"])), escape(when),
                      "yes" if row.get("enabled") else "no", escape(str(row.get("next_run_at") or "—")),
                      escape(str(row.get("last_run_at") or "—")), str(row.get("runs", 0)),
                      str(row.get("skipped", 0)))
    return table


GROUP = Group("schedules", "schedules of a running service (schedules.* over JSON-RPC)", (
    Command("list", "schedules newest first: when they run next, how often they ran", _list, _list_arguments),
))
