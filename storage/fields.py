"""The field rules of a task: one table saying, per settable field, what value it accepts and how
a wrong one is worded.

Why one table: tasks.create (storage.new_tree), tasks.update (agent.services.task_service), tasks.clone's
reset_fields (storage.copy_plan.reset_values) and the planner's validation (llm.generate) all check the
same fields; with the rule written once, a client sees the same sentence for the same mistake
whichever call it made. The limits come from the column widths in storage.models.

What is *not* here: the JSON value gate (non-finite numbers, lone surrogates, depth: storage.
jsonvalues), references between tasks (parent_id, dependencies: storage.new_tree) and the sharing
policies (concurrency, rate_limit: storage.sharing), which need more than one value to decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from taskgrove.storage.models import ORIGIN_TYPES, TASK_STATUSES, tasks_table


def _width(column: str) -> int:
    """A String column's width, read from the table so a migration that widens it widens the rule."""
    return tasks_table.c[column].type.length  # type: ignore[attr-defined]  # a String column


MAX_NAME = _width("name")
MAX_ID = _width("id")
MAX_USER = _width("user_id")
MAX_TIMESTAMP = _width("started_at")
MAX_TEXT = 1_000_000  # description and error: Text columns, bounded so one task stays readable
MAX_COUNTER = 2**31 - 1  # token counters are 32-bit integer columns
MAX_TIMEOUT = 7 * 86_400.0

Check = Callable[[Any], "str | None"]


def _text(field: str, limit: int, *, required: bool = False) -> Check:
    """A string column: no NUL (PostgreSQL refuses it), at most `limit` characters; null allowed
    unless `required` (then it must also not be blank)."""
    def check(value: Any) -> str | None:
        if value is None:
            return f"{field} is required" if required else None
        if not isinstance(value, str):
            return f"{field} must be a string{'' if required else ' or null'}, got {_kind(value)}"
        if "\x00" in value:
            return f"{field} must not contain NUL characters"
        if required and not value.strip():
            return f"{field} must not be empty"
        if len(value) > limit:
            return f"{field} is longer than {limit} characters"
        return None
    return check


def _kind(value: Any) -> str:
    """A wrong value's type as a message names it (JSON's null, Python's names otherwise)."""
    return "null" if value is None else type(value).__name__


def _object(field: str) -> Check:
    def check(value: Any) -> str | None:
        return None if isinstance(value, Mapping) else f"{field} must be an object, got {_kind(value)}"
    return check


def _counter(field: str) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
            return f"{field} must be an integer from 0 to {MAX_COUNTER}, got {value!r}"[:300]
        return None
    return check


def check_priority(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3:
        return f"priority must be an integer from 0 (urgent) to 3 (low), got {value!r}"
    return None


def check_progress(value: Any) -> str | None:
    # Compared without float(): an integer like 10**400 has no float and must not raise.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
        return f"progress must be a number from 0.0 to 1.0, got {shown}"[:300]
    return None


def _one_of(field: str, choices: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"{field} must be one of {', '.join(choices)}, got {value!r}"[:300]
    return check


def check_timeout(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
        return f"timeout_seconds must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, or null"
    return None


def check_retry(value: Any) -> str | None:
    """Only the shape; the policy's own fields are agent.engine.retry_policy.RetryPolicy's to judge."""
    if value is not None and not isinstance(value, Mapping):
        return "retry must be an object such as {\"max_attempts\": 3}"
    return None


BUDGET_POLICIES = ("fail", "downgrade", "pause")
BUDGET_KEYS = ("max_tokens", "max_cost_usd", "on_exhausted", "fallback_models")
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_USD = 1e9
MAX_FALLBACK_MODELS = 10


def check_budget(value: Any) -> str | None:
    """A task's `budget` (docs/costs.md): a limit in tokens and/or US dollars for its subtree's
    LLM calls, what happens when it runs out, and the models to fall back to."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return 'budget must be an object such as {"max_tokens": 10000, "max_cost_usd": 0.5}, or null'
    unknown = sorted(set(value) - set(BUDGET_KEYS))
    if unknown:
        return f"budget has unknown keys {unknown}; allowed: {', '.join(BUDGET_KEYS)}"[:300]
    tokens, cost = value.get("max_tokens"), value.get("max_cost_usd")
    if tokens is None and cost is None:
        return "budget needs max_tokens or max_cost_usd (or both)"
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not 1 <= tokens <= MAX_BUDGET_TOKENS):
        return f"budget.max_tokens must be an integer from 1 to {MAX_BUDGET_TOKENS}, got {tokens!r}"[:300]
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float))
                             or not 0 < cost <= MAX_BUDGET_USD):
        return f"budget.max_cost_usd must be a number above 0 and at most {MAX_BUDGET_USD:g}, got {cost!r}"[:300]
    policy = value.get("on_exhausted", "fail")
    if policy not in BUDGET_POLICIES:
        return f"budget.on_exhausted must be one of {', '.join(BUDGET_POLICIES)}, got {policy!r}"[:300]
    models = value.get("fallback_models", [])
    if (not isinstance(models, list) or len(models) > MAX_FALLBACK_MODELS
            or not all(isinstance(m, str) and 0 < len(m) <= 200 for m in models)):
        return f"budget.fallback_models must be a list of at most {MAX_FALLBACK_MODELS} model names"
    if policy == "downgrade" and not models:
        return "budget.on_exhausted 'downgrade' needs budget.fallback_models (the models to switch to, in order)"
    return None


def _any(value: Any) -> str | None:
    return None


RULES: dict[str, Check] = {
    "id": _text("id", MAX_ID),
    "name": _text("name", MAX_NAME, required=True),
    "description": _text("description", MAX_TEXT),
    "user_id": _text("user_id", MAX_USER),
    "parent_id": _text("parent_id", _width("parent_id")),
    "priority": check_priority,
    "inputs": _object("inputs"),
    "params": _object("params"),
    "schemas": _object("schemas"),
    "status": _one_of("status", TASK_STATUSES),
    "progress": check_progress,
    "result": _any,  # any JSON value at creation and in a clone (see UPDATE_RULES)
    "error": _text("error", MAX_TEXT),
    "started_at": _text("started_at", MAX_TIMESTAMP),
    "completed_at": _text("completed_at", _width("completed_at")),
    "product_id": _text("product_id", _width("product_id")),
    "original_task_id": _text("original_task_id", _width("original_task_id")),
    "origin_type": _one_of("origin_type", ORIGIN_TYPES),
    "token_success": _counter("token_success"),
    "token_failed": _counter("token_failed"),
    "timeout_seconds": check_timeout,
    "retry": check_retry,
    "budget": check_budget,
}


def _result_on_update(value: Any) -> str | None:
    if value is not None and not isinstance(value, Mapping):
        return "result must be an object or null (SPEC.md)"
    return None


# tasks.update is stricter about `result` than create and clone: SPEC.md's rule for the field,
# which create and clone predate and still relax (a stored tree may carry any JSON result).
UPDATE_RULES: dict[str, Check] = {**RULES, "result": _result_on_update}


def problem(field: str, value: Any, rules: Mapping[str, Check] = RULES) -> str | None:
    """What is wrong with `value` for `field`, or None; a field without a rule takes any value."""
    check = rules.get(field)
    return None if check is None else check(value)
