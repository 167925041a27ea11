"""Costs of LLM work (docs/costs.md): every call's usage to /metrics and the per-user daily sums,
the tree's sum on its root (`tree_usage`), and `usage.get`.

Why a service: the LLM client (llm/client.py) knows a call's tokens and price but not the
database; the engine's executors, tasks.generate and the plain-language planner all hand their
calls to `record` (through `on_usage`), so every surface's LLM work is counted once, the same way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from taskgrove.agent.foundations.errors import permission_denied
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.requests_services import UsageQuery
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.llm import usage as llm_usage
from taskgrove.llm.usage import CallUsage
from taskgrove.storage import usage_store as stored_usage
from taskgrove.storage.usage_store import UsageStore
from taskgrove.storage.repository import TaskRepository


def today() -> str:
    """The UTC day a call counts for (per-user daily sums and budgets)."""
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def daily_usage(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored daily row as a usage sum: its cost is unknown when a call of that day had no price,
    and then PRICED_COST carries the row's `cost_usd` (the priced calls' dollars) for the budget."""
    answer: dict[str, Any] = {key: int(row.get(key) or 0) for key in ("prompt_tokens", "completion_tokens", "total_tokens",
                                                      "calls")}
    cost = round(float(row.get("cost_usd") or 0.0), 10)
    if row.get("unpriced_calls"):
        answer["cost_usd"], answer[stored_usage.PRICED_COST] = None, cost
    else:
        answer["cost_usd"] = cost
    return answer


def tree_total(usages: Iterable[Any]) -> dict[str, Any]:
    """The usage of a whole tree as answers show it: the sum of its tasks' (zero calls when none
    used an LLM). Most trees used none (tasks.get of a root reads an empty list): their answer
    is a fresh empty sum at once, which is what summing nothing shows (total_of is None, and an
    empty sum has nothing for shown() to drop)."""
    if isinstance(usages, list) and not usages:
        return llm_usage.empty()
    return stored_usage.shown(llm_usage.total_of(usages) or llm_usage.empty())


class UsageService:
    """Counts LLM calls (metrics, daily sums) and answers what was used."""

    def __init__(self, repo: TaskRepository, metrics: Metrics) -> None:
        self.repo = repo
        self.store = UsageStore(repo)
        self.metrics = metrics

    async def record(self, user_id: str | None, call: CallUsage, task_id: str | None = None) -> None:
        """One call ended: count it in /metrics, add it to the user's day and to the task's
        stored usage, before the caller may make its next call (a restart then cannot forget
        what was spent, and the next budget check sees it)."""
        self.metrics.llm_call(call.provider, call.model, call.prompt_tokens, call.completion_tokens, call.cost_usd)
        amounts = {**call.as_usage(), "cost_usd": call.cost_usd or 0.0,
                   "unpriced_calls": 1 if call.cost_usd is None else 0}
        await self.store.record_call(user_id, today(), amounts, task_id, call.as_usage(), llm_usage.add)

    async def tree_usage(self, tree_id: str) -> dict[str, Any]:
        """The sum of a stored tree's usage (tasks.get on a root)."""
        return tree_total(await self.store.tree_usages(tree_id))

    async def spent_today(self, user_id: str | None) -> dict[str, Any]:
        """What the user's calls used today (UTC), with the priced calls' dollars when the cost
        is unknown (what the daily budget is held to: agent/services/budget_service.py)."""
        day = today()
        rows = await self.store.daily(user_id, day, day)
        return daily_usage(rows[0]) if rows else llm_usage.empty()

    async def today_of(self, user_id: str | None) -> dict[str, Any]:
        """What the user's calls used today (UTC), as answers show it."""
        return stored_usage.shown(await self.spent_today(user_id))

    async def days(self, user_id: str | None, days: int) -> list[dict[str, Any]]:
        """The user's usage per day over the last `days` days (UTC), days without calls left out."""
        until = dt.datetime.now(dt.timezone.utc).date()
        since = (until - dt.timedelta(days=days - 1)).isoformat()
        rows = await self.store.daily(user_id, since, until.isoformat())
        return [{"day": row["day"], **stored_usage.shown(daily_usage(row))} for row in rows]

    async def get(self, request: UsageQuery, ctx: CallContext) -> dict[str, Any]:
        """usage.get: the user's usage today and per day (the caller's own; another's for an admin)."""
        caller = ctx.caller
        user_id = request.user_id if request.user_id is not None else caller.user_id
        if not caller.can_access(user_id):
            raise permission_denied(f"You may not read the usage of user '{user_id}'")
        return {"user_id": user_id, "today": await self.today_of(user_id),
                "days": await self.days(user_id, request.days)}
