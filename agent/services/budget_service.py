"""Budgets of LLM work (docs/costs.md): the meter every LLM call asks, and config.budget.set|get.

Why the meter reads the database before each call: a budget covers a subtree whose tasks may run
on any instance, and a restart must not forget what was spent. Every call's usage is stored (the
task's `usage`, the user's day) before the client may make its next call (`LlmMeter.after`), and
the next call's check sums what is stored (`LlmMeter.before`). Calls that start at the same moment
in one subtree are each checked against what was stored before them, so concurrent calls can
together pass a budget by at most their own sizes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from taskgrove.agent.foundations.errors import permission_denied
from taskgrove.agent.foundations.requests_services import BudgetRef, SetBudget
from taskgrove.agent.foundations.calls import CallContext, Handler
from taskgrove.agent.foundations.calls import typed
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.usage_service import UsageService, today
from taskgrove.llm.budget import Limit, LLMBudgetExhausted, remaining, subtree_limits
from taskgrove.llm.client import LLMError
from taskgrove.llm.usage import CallUsage
from taskgrove.storage import usage_store as stored_usage
from taskgrove.storage.usage_store import UsageStore
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import now_iso

Price = Callable[[str, int, int], "float | None"]
Pause = Callable[[str], Awaitable[Any]]  # ExecutionContext.wait_for_input: raises Waiting, or the answer
Usable = Callable[[str], bool]  # whether a model's circuit breaker lets a call through (llm/breaker.py)


def fallback_models(limits: list[Limit]) -> tuple[str, ...]:
    """The models to try after the task's own, in order: those of the nearest `downgrade`
    budget, else of the nearest budget that names any (for an open circuit breaker)."""
    downgrade = next((lim.fallback_models for lim in limits if lim.policy == "downgrade"), ())
    return tuple(downgrade or next((lim.fallback_models for lim in limits if lim.fallback_models), ()))


class BudgetService:
    """Builds the meter of each LLM client and serves config.budget.set|get."""

    def __init__(self, repo: TaskRepository, settings: Settings, usage: UsageService) -> None:
        self.repo = repo
        self.store = UsageStore(repo)
        self.settings = settings
        self.usage = usage

    def meter(self, user_id: str | None, task: Mapping[str, Any] | None, pause: Pause | None = None,
              epoch: int | None = None) -> LlmMeter:
        """The meter of one client: a task's attempt (`task`: its row; `pause`: its
        ExecutionContext.wait_for_input; `epoch`: its claim's lease epoch) or the planner's
        (None: a `pause` budget fails it)."""
        return LlmMeter(self, user_id, task, pause, epoch)

    async def user_limit(self, user_id: str | None) -> Limit | None:
        """The user's daily budget (their own, else the settings') with today's usage, or None."""
        own = await self.store.get_budget(stored_usage.user_key(user_id))
        tokens, cost = ((own["max_tokens"], own["max_cost_usd"]) if own else
                        (self.settings.user_daily_budget_tokens, self.settings.user_daily_budget_usd))
        if tokens is None and cost is None:
            return None
        return Limit(f"user '{user_id or ''}' on {today()}", await self.usage.spent_today(user_id), tokens, cost)

    # --- config.budget.* -------------------------------------------------------------------

    def methods(self) -> dict[str, Handler]:
        """The JSON-RPC table (served on /system, as config.llm_key.*)."""
        return {"config.budget.set": typed(SetBudget.from_params, self.set),
                "config.budget.get": typed(BudgetRef.from_params, self.get)}

    async def set(self, request: SetBudget, ctx: CallContext) -> dict[str, Any]:
        """An admin sets (or with both limits null removes) a user's daily budget."""
        if not ctx.caller.unrestricted:
            raise permission_denied("Only an admin may set a user's budget (config.budget.set)")
        await self.store.set_budget(request.user_id, request.max_tokens, request.max_cost_usd, now_iso())
        return await self._answer(request.user_id)

    async def get(self, request: BudgetRef, ctx: CallContext) -> dict[str, Any]:
        """A user's daily budget, today's usage and what remains (one's own; anyone's for an admin)."""
        user_id = request.user_id if request.user_id is not None else ctx.caller.user_id
        if not ctx.caller.can_access(user_id):
            raise permission_denied(f"You may not read the budget of user '{user_id}'")
        return await self._answer(user_id)

    async def _answer(self, user_id: str | None) -> dict[str, Any]:
        own = await self.store.get_budget(stored_usage.user_key(user_id))
        limit = await self.user_limit(user_id)
        used = await self.usage.today_of(user_id)
        answer: dict[str, Any] = {"user_id": user_id, "source": "user" if own else "settings",
                                  "max_tokens": limit.max_tokens if limit else None,
                                  "max_cost_usd": limit.max_cost_usd if limit else None, "today": used}
        answer["remaining"] = remaining(limit, used) if limit else None
        return answer


class LLMAttemptStale(LLMError):
    """The attempt lost its task (its lease epoch changed): it must not spend any more."""

    retryable = False


class LlmMeter:
    """One LLM client's meter (llm/client.py `Meter`): checks the budgets over its task and its
    user before each call, stores each call's usage after it."""

    def __init__(self, budgets: BudgetService, user_id: str | None, task: Mapping[str, Any] | None,
                 pause: Pause | None = None, epoch: int | None = None) -> None:
        self.budgets = budgets
        self.pause = pause
        self.user_id = user_id
        self.task_id = task.get("id") if task is not None else None
        self.tree_id = task.get("task_tree_id") if task is not None else None
        self.epoch = epoch  # the attempt's fencing token: a call of an attempt that lost it is not made

    async def limits(self, fenced: bool = False) -> list[Limit]:
        """The budgets over the task and the user's day, with what is stored as used. `fenced`
        (before a call): raise LLMAttemptStale when the task's stored lease epoch is no longer
        the attempt's (another instance took the task over: it makes the calls now)."""
        found = []
        if self.tree_id is not None:
            rows = await self.budgets.store.tree_budget_rows(self.tree_id)
            if fenced and self.epoch is not None:
                own = next((row for row in rows if row["id"] == self.task_id), None)
                if own is None or own["lease_epoch"] != self.epoch:
                    raise LLMAttemptStale(f"this attempt no longer holds task '{self.task_id}' (another instance "
                                          "took it over, or it was deleted); the next LLM call was not made")
            if any(row.get("budget") for row in rows):
                found = subtree_limits(rows, self.task_id)  # type: ignore[arg-type]  # set with tree_id
        user = await self.budgets.user_limit(self.user_id)
        return found + ([user] if user is not None else [])

    async def before(self, provider: str, model: str, max_tokens: int, prompt_tokens: int, price: Price,
                     usable: Usable) -> str:
        """The model to call: `model` when every budget can cover the call by its max_tokens,
        else the first of a `downgrade` budget's fallback_models that they can cover; a model
        whose circuit breaker is open (`usable` says no) is passed over for the next of the
        budgets' fallback_models (when every one is open, `model`: its breaker fails the call
        fast). A `pause` budget parks the task on a wait for input (docs/waits.md) until a
        person answers, then checks again (the budget may have been raised meanwhile)."""
        while True:
            limits = await self.limits(fenced=True)
            if not limits:
                return model
            chosen, error, policy = self._choose(limits, model, max_tokens, prompt_tokens, price, usable)
            if chosen is not None:
                return chosen
            assert error is not None
            if policy != "pause" or self.pause is None:
                raise error
            await self.pause(f"{error}. Raise the budget (tasks.update of the task's budget), then answer this "
                             "wait to go on.")

    @staticmethod
    def _choose(limits: list[Limit], model: str, max_tokens: int, prompt_tokens: int, price: Price,
                usable: Usable) -> tuple[str | None, LLMBudgetExhausted | None, str]:
        """(the model the budgets can cover, None, '') or (None, the refusal, the blocking policy)."""
        fallbacks = fallback_models(limits)
        blocking: Limit | None = None
        for name in (model, *fallbacks):
            if not usable(name):
                continue
            cost = price(name, prompt_tokens, max_tokens)
            blocking = next((lim for lim in limits if lim.exhausted(max_tokens, cost)), None)
            if blocking is None:
                return name, None, ""
            if blocking.policy != "downgrade":
                break
        if blocking is None:  # every breaker open: the client's check fails the call fast
            return model, None, ""
        tried = "" if blocking.policy != "downgrade" else f" (nor by its fallback models {list(fallbacks)})"
        error = blocking.exhausted_error(f"the next call (max_tokens {max_tokens}, model {model}) cannot be "
                                         f"covered{tried} and was not made")
        return None, error, blocking.policy

    async def after(self, call: CallUsage) -> None:
        """Add the call's usage to what is stored (the task's, the user's day), then refuse to go
        on past a `fail` budget the call exceeded."""
        await self.budgets.usage.record(self.user_id, call, self.task_id)
        for limit in await self.limits():
            if limit.policy == "fail" and limit.exhausted():
                raise limit.exhausted_error("the last call went past it")


__all__ = ["BudgetService", "LlmMeter", "LLMAttemptStale", "LLMBudgetExhausted"]
