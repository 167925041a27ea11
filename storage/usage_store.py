"""LLM usage per user and UTC day, and users' daily budgets (docs/costs.md).

Functions of a sync connection, run through `TaskRepository.transact` (one transaction each). The
daily row is an upsert (INSERT ... ON CONFLICT DO UPDATE, which SQLite and PostgreSQL both have)
so two instances counting calls of the same user on the same day add up instead of racing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from taskgrove.storage.models import llm_usage_daily_table as D
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.models import user_budgets_table as B

_SUMMED = ("prompt_tokens", "completion_tokens", "total_tokens", "cost_usd", "calls", "unpriced_calls")

# A usage sum as answers show it (docs/costs.md). A stored sum whose `cost_usd` is unknown (a call
# of a model without a price) also keeps PRICED_COST, the dollars of its priced calls: the sum a
# dollar budget is held to (llm/budget.py), never shown. Named here because storage/task_view.py's
# `public` drops it and storage imports nothing above it; llm/usage.py does the arithmetic.
PRICED_COST = "priced_cost_usd"


def shown(usage: Any) -> Any:
    """A usage sum as answers show it (without PRICED_COST); anything else (None) as it is."""
    if usage is not None and isinstance(usage, Mapping) and PRICED_COST in usage:  # None: most tasks
        return {key: value for key, value in usage.items() if key != PRICED_COST}
    return usage


def user_key(user_id: str | None) -> str:
    """The key of a user's rows: '' for calls without a user (a key cannot be NULL)."""
    return user_id or ""


def add_daily(c: Connection, user_id: str | None, day: str, amounts: Mapping[str, Any]) -> None:
    """Add one call's amounts (the keys of `_SUMMED`) to the user's row of `day`."""
    insert = postgresql.insert if c.dialect.name == "postgresql" else sqlite.insert
    values = {key: amounts.get(key) or 0 for key in _SUMMED}
    statement = insert(D).values(user_id=user_key(user_id), day=day, **values)
    statement = statement.on_conflict_do_update(
        index_elements=[D.c.user_id, D.c.day],
        set_={key: D.c[key] + statement.excluded[key] for key in _SUMMED})
    c.execute(statement)


def daily(c: Connection, user_id: str | None, since: str, until: str) -> list[dict[str, Any]]:
    """The user's daily rows from `since` to `until` (days, inclusive), oldest first."""
    rows = c.execute(select(D).where(D.c.user_id == user_key(user_id), D.c.day >= since, D.c.day <= until)
                     .order_by(D.c.day)).mappings().all()
    return [dict(row) for row in rows]


def get_budget(c: Connection, user_id: str) -> dict[str, Any] | None:
    """The daily budget an admin set for the user, or None."""
    row = c.execute(select(B.c.max_tokens, B.c.max_cost_usd).where(B.c.user_id == user_id)).mappings().first()
    return dict(row) if row else None


def set_budget(c: Connection, user_id: str, max_tokens: int | None, max_cost_usd: float | None, stamp: str) -> None:
    """Set (or, with both limits None, remove) the user's own daily budget."""
    c.execute(delete(B).where(B.c.user_id == user_id))
    if max_tokens is not None or max_cost_usd is not None:
        c.execute(B.insert().values(user_id=user_id, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                                    updated_at=stamp))


def tree_usages(c: Connection, tree_id: str) -> list[Any]:
    """The `usage` of every task of a tree that has one (tasks.get sums them on the root)."""
    rows = c.execute(select(T.c.usage).where(T.c.task_tree_id == tree_id)).all()
    return [row[0] for row in rows if isinstance(row[0], dict)]  # JSON null: a task without LLM work


def record_call(c: Connection, user_id: str | None, day: str, amounts: Mapping[str, Any],
                task_id: str | None = None, call_usage: Mapping[str, Any] | None = None,
                add: Callable[[Any, Any], dict[str, Any]] | None = None) -> None:
    """One LLM call ended: add it to the user's day and, for a task's call, add `call_usage` to
    the task's stored `usage` (`add`: llm/usage.py's sum, handed in because storage imports
    nothing above it), in one transaction, before the next call may begin.

    An increment of what is stored, never a value computed from a copy in memory: an attempt
    resumed after a wait, or whose run was re-read meanwhile, or one that lost its lease, counts
    each of its calls exactly once (the money was spent, whoever holds the task now). The row is
    locked first (PostgreSQL) so that two attempts' calls cannot both read the same sum."""
    add_daily(c, user_id, day, amounts)
    if task_id is None or add is None:
        return
    stored = c.execute(select(T.c.usage).where(T.c.id == task_id).with_for_update()).scalar()
    total = add(stored if isinstance(stored, Mapping) else None, call_usage)
    c.execute(update(T).where(T.c.id == task_id).values(usage=total))


def tree_budget_rows(c: Connection, tree_id: str) -> list[dict[str, Any]]:
    """id, parent_id, budget and usage of every task of a tree (the budgets over subtrees), and
    lease_epoch (an attempt's meter checks that it still holds its task before each call)."""
    rows = c.execute(select(T.c.id, T.c.parent_id, T.c.budget, T.c.usage, T.c.lease_epoch)
                     .where(T.c.task_tree_id == tree_id))
    return [dict(row) for row in rows.mappings()]


class Transacts(Protocol):
    """What UsageStore needs of TaskRepository (which imports this module, so it is not imported here)."""

    async def transact(self, fn: Callable[..., Any], *args: Any, inline: bool = False) -> Any: ...


class UsageStore:
    """LLM usage's and budgets' named operations, each one transaction of its own running the
    statement function above of the same name: what the usage and budget services, an LLM
    client's meter and tasks.get call (issue 44: nothing above storage hands functions to `transact`)."""

    def __init__(self, repo: Transacts) -> None:
        self._transact = repo.transact

    async def record_call(self, user_id: str | None, day: str, amounts: Mapping[str, Any],
                          task_id: str | None = None, call_usage: Mapping[str, Any] | None = None,
                          add: Callable[[Any, Any], dict[str, Any]] | None = None) -> None:
        await self._transact(record_call, user_id, day, amounts, task_id, call_usage, add)

    async def tree_usages(self, tree_id: str) -> list[Any]:
        return await self._transact(tree_usages, tree_id, inline=True)

    async def daily(self, user_id: str | None, since: str, until: str) -> list[dict[str, Any]]:
        return await self._transact(daily, user_id, since, until, inline=True)

    async def get_budget(self, user_id: str) -> dict[str, Any] | None:
        return await self._transact(get_budget, user_id, inline=True)

    async def set_budget(self, user_id: str, max_tokens: int | None, max_cost_usd: float | None, stamp: str) -> None:
        await self._transact(set_budget, user_id, max_tokens, max_cost_usd, stamp)

    async def tree_budget_rows(self, tree_id: str) -> list[dict[str, Any]]:
        return await self._transact(tree_budget_rows, tree_id, inline=True)
