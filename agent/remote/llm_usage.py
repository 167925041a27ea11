"""`taskgrove usage show`: a user's LLM usage per day (usage.get) and daily budget
(config.budget.get) from a running service, as a table for people or JSON (--json) for scripts
(docs/costs.md)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.commands import Command, Group

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table

    from taskgrove.client import AsyncClient


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", help="whose usage (default: the token's user; another's needs an admin)")
    parser.add_argument("--days", type=int, default=7, help="days back, today included (1..366)")


async def _show(client: AsyncClient, args: argparse.Namespace, console: Console) -> int:
    from taskgrove.agent.remote import show  # rich loads only when a command runs

    answer = (await client.usage(user_id=args.user or None, days=args.days)).dump()
    answer["budget"] = (await client.budgets.get(user_id=args.user or None)).dump()
    show.emit(console, answer, args.json, _table)
    return 0


def _cost(value: Any) -> str:
    return "unknown" if value is None else f"${float(value):.6f}"


def _table(answer: Mapping[str, Any]) -> Table:
    from rich.markup import escape
    from rich.table import Table

    budget = answer.get("budget") or {}
    left = budget.get("remaining") or {}
    title = f"LLM usage of {escape(str(answer.get('user_id') or '(no user)'))}"
    if budget.get("max_tokens") is not None or budget.get("max_cost_usd") is not None:
        title += (f"; today's budget left: {left.get('tokens', '—')} tokens, "
                  f"{_cost(left.get('cost_usd')) if budget.get('max_cost_usd') is not None else '—'}")
    table = Table(title=title)
    for column in ("day", "calls", "prompt tokens", "completion tokens", "total tokens", "cost"):
        table.add_column(column)
    for day in answer.get("days") or ():
        table.add_row(escape(str(day["day"])), str(day["calls"]), str(day["prompt_tokens"]),
                      str(day["completion_tokens"]), str(day["total_tokens"]), _cost(day["cost_usd"]))
    return table


GROUP = Group("usage", "LLM usage and budgets of a running service (usage.get, config.budget.get)", (
    Command("show", "a user's LLM tokens and cost per day, and what today's budget leaves", _show, _show_arguments),
))
