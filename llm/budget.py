"""Budgets of LLM work (docs/costs.md): the arithmetic of a limit, without storage.

A limit is a task's `budget` (over its subtree's calls) or a user's daily budget. It is checked
before a call, by what the call may use at most (its `max_tokens`, and their price when the model
has one), and after it, by what was used. Dollars are always judged by what the priced calls
cost (`llm_usage.priced_cost`): a call of a model without a price makes the shown cost unknown,
and must not make the dollar limit stop counting. Such a call itself cannot be priced beforehand:
it is made while the known spend is under `max_cost_usd` (its tokens count for `max_tokens`).
`agent/services/budget_service.py` reads the stored sums and hands them here; the LLM client asks its
`Meter` (llm/client.py) before and after each call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field

from taskgrove.llm import usage as llm_usage
from taskgrove.llm.client import LLMError


class LLMBudgetExhausted(LLMError):
    """A budget cannot cover the next call (or was exceeded by the last one). Not retried: the
    next attempt would meet the same budget."""

    retryable = False


@dataclass(frozen=True)
class Limit:
    """One budget and what its calls used so far. `where`: 'task <id>' or 'user <id> on <day>'."""

    where: str
    used: Mapping[str, Any]
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    policy: str = "fail"
    fallback_models: Sequence[str] = field(default_factory=tuple)

    @classmethod
    def of_budget(cls, where: str, budget: Mapping[str, Any], used: Mapping[str, Any]) -> Limit:
        return cls(where, used, budget.get("max_tokens"), budget.get("max_cost_usd"),
                   budget.get("on_exhausted", "fail"), tuple(budget.get("fallback_models") or ()))

    def describe_use(self) -> str:
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{int(self.used.get('total_tokens') or 0)} of {self.max_tokens} tokens")
        if self.max_cost_usd is not None:
            unpriced = " (calls of models without a price not included)" if self.used.get("cost_usd") is None else ""
            parts.append(f"${llm_usage.priced_cost(self.used):.6f}{unpriced} of ${self.max_cost_usd:g}")
        return "used " + " and ".join(parts)

    def exhausted(self, extra_tokens: int = 0, extra_cost: float | None = 0.0) -> bool:
        """Whether this limit cannot take `extra_tokens` more and `extra_cost` more dollars (None:
        a model without a price, allowed only while the known spend is under the limit)."""
        used_tokens = int(self.used.get("total_tokens") or 0)
        if self.max_tokens is not None and used_tokens + extra_tokens > self.max_tokens:
            return True
        if self.max_cost_usd is None:
            return False
        spent = llm_usage.priced_cost(self.used)
        if extra_cost is None:
            return spent >= self.max_cost_usd
        return spent + extra_cost > self.max_cost_usd

    def exhausted_error(self, what: str) -> LLMBudgetExhausted:
        return LLMBudgetExhausted(f"budget of {self.where} exhausted: {self.describe_use()}; {what}")


def subtree_limits(rows: list[dict[str, Any]], task_id: str) -> list[Limit]:
    """The budgets over `task_id` (its own and its ancestors'), each with its subtree's usage."""
    by_id = {row["id"]: row for row in rows}
    children: dict[str | None, list[str]] = {}
    for row in rows:
        children.setdefault(row["parent_id"], []).append(row["id"])
    limits = []
    current = by_id.get(task_id)
    while current is not None:
        if isinstance(current.get("budget"), Mapping):
            limits.append(Limit.of_budget(f"task '{current['id']}'", current["budget"],
                                          _subtree_usage(by_id, children, current["id"])))
        current = by_id.get(current["parent_id"]) if current["parent_id"] else None
    return limits


def _subtree_usage(by_id: Mapping[str, Any], children: Mapping[Any, list[str]], top: str) -> dict[str, Any]:
    stack, usages = [top], []
    while stack:
        tid = stack.pop()
        usages.append(by_id[tid].get("usage"))
        stack.extend(children.get(tid, ()))
    return llm_usage.total_of(u for u in usages if isinstance(u, Mapping)) or llm_usage.empty()


def budget_remaining(rows: list[dict[str, Any]], task_id: str) -> dict[str, Any] | None:
    """What the task's own budget still allows over its subtree (tasks.get), or None without one."""
    own = next((lim for lim in subtree_limits(rows, task_id) if lim.where == f"task '{task_id}'"), None)
    return None if own is None else remaining(own, own.used)


def remaining(limit: Limit, used: Mapping[str, Any]) -> dict[str, Any]:
    """What a limit still allows (None for a kind it does not limit, or a cost unknown)."""
    tokens = None if limit.max_tokens is None else max(0, limit.max_tokens - int(used.get("total_tokens") or 0))
    cost = None
    if limit.max_cost_usd is not None and used.get("cost_usd") is not None:
        cost = round(max(0.0, limit.max_cost_usd - float(used["cost_usd"])), 10)
    return {"tokens": tokens, "cost_usd": cost}
