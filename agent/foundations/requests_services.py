"""The typed arguments of the services besides TaskService: schedules, `tasks.generate`, the
stored LLM keys (`config.llm_key.*`) and `/system`.

The same pattern as agent/foundations/requests.py (the task operations; this module is its sibling only to
keep each file short): a surface turns its request into one of these once, `from_params` reads a
JSON-RPC params object with the -32602 messages clients see, and the service takes only these.
What needs the service's own state (a stored schedule, the settings, the caller) is checked there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.requests import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET, params_object
from taskgrove.agent.foundations import params as rpc_params
from taskgrove.llm.client import PROVIDERS, normalize_provider
from taskgrove.llm.generate import GenerationInputError, check_inputs
from taskgrove.storage.fields import MAX_BUDGET_TOKENS, MAX_BUDGET_USD


# --- schedules (agent/services/schedule_service.py) --------------------------------------------------------------

@dataclass(slots=True)
class ScheduleRef:
    """schedules.get, schedules.delete, schedules.trigger: one schedule."""

    schedule_id: str

    @classmethod
    def from_params(cls, params: Any) -> ScheduleRef:
        return cls(_schedule_id(params_object(params)))  # type: ignore[arg-type]


@dataclass(slots=True)
class CreateSchedule:
    """schedules.create: a schedule of template `task_id`. `fields` are the settable fields as
    given (ScheduleService checks them all, as it does for an update)."""

    task_id: str
    fields: dict[str, Any]

    @classmethod
    def from_params(cls, params: Any) -> CreateSchedule:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", required=True)
        return cls(task_id, _fields(params))  # type: ignore[arg-type]


@dataclass(slots=True)
class UpdateSchedule:
    """schedules.update: the fields of `schedule_id` to change, as given (`task_id` included: the
    service refuses to change it)."""

    schedule_id: str
    fields: dict[str, Any]

    @classmethod
    def from_params(cls, params: Any) -> UpdateSchedule:
        params = params_object(params)
        return cls(_schedule_id(params), _fields(params))  # type: ignore[arg-type]


@dataclass(slots=True)
class ListSchedules:
    """schedules.list. `user_id` None: the caller's own (or everyone's for an unrestricted caller)."""

    user_id: str | None = None
    task_id: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    @classmethod
    def from_params(cls, params: Any) -> ListSchedules:
        params = params_object(params)
        return cls(rpc_params.string(params, "user_id"), rpc_params.string(params, "task_id"),
                   rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT),
                   rpc_params.integer(params, "offset", 0, low=0, high=MAX_OFFSET))


DEFAULT_RUNS, MAX_RUNS = 20, 1000  # schedules.runs: runs in one answer


@dataclass(slots=True)
class ScheduleRuns:
    """schedules.runs: the latest `limit` runs (trees) a schedule started."""

    schedule_id: str
    limit: int = DEFAULT_RUNS

    @classmethod
    def from_params(cls, params: Any) -> ScheduleRuns:
        params = params_object(params)
        return cls(_schedule_id(params),  # type: ignore[arg-type]
                   rpc_params.integer(params, "limit", DEFAULT_RUNS, low=1, high=MAX_RUNS))


def _schedule_id(params: Any) -> str | None:
    return rpc_params.string(params, "schedule_id", aliases=("id",), required=True)


def _fields(params: Any) -> dict[str, Any]:
    """The params but the schedule's id (its names are no field)."""
    return {k: v for k, v in params.items() if k not in ("schedule_id", "id")}


# --- tasks.generate (agent/services/generate_service.py) --------------------------------------------------

@dataclass(slots=True)
class GenerateTree:
    """tasks.generate: a natural-language `requirement` -> a task tree. `provider` as given (the
    service checks it against the configured vendors); `save` stores the tree, pending."""

    requirement: str
    temperature: float = 0.7
    max_tokens: int = 4000
    user_id: str | None = None
    provider: str | None = None
    model: str | None = None
    save: bool = False

    @classmethod
    def from_params(cls, params: Any) -> GenerateTree:
        params = params_object(params)
        raw = params.get("requirement")
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            raise invalid_params("requirement is required: it is mandatory for tasks.generate "
                                 "(a natural-language description of the work)")
        if not isinstance(raw, str):
            raise invalid_params(f"requirement must be a string, got {type(raw).__name__}")
        temperature = params.get("temperature")
        max_tokens = params.get("max_tokens")
        try:
            requirement, temperature, max_tokens = check_inputs(
                raw, 0.7 if temperature is None else temperature, 4000 if max_tokens is None else max_tokens)
        except GenerationInputError as exc:
            raise invalid_params(str(exc)) from None
        return cls(requirement, temperature, max_tokens, rpc_params.string(params, "user_id", max_length=255),
                   rpc_params.string(params, "llm_provider", aliases=("provider",), max_length=100),
                   rpc_params.string(params, "model", max_length=500), rpc_params.boolean(params, "save", False))


# --- config.llm_key.* (agent/services/key_service.py) -----------------------------------------------------------

DEFAULT_PROVIDER = "default"  # a key used for any provider without a key of its own
ALL_PROVIDERS = "all"  # get, delete: every key of the user
MAX_KEY_LENGTH = 4096


@dataclass(slots=True)
class SetLlmKey:
    """config.llm_key.set: store `api_key` for `provider` (None: named by the key or `default`) of
    `user_id` (None: the caller). Never shown in a repr, an error or a log line."""

    api_key: str = dataclasses.field(repr=False)
    provider: str | None = None
    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> SetLlmKey:
        params = params_object(params)
        return cls(_api_key(params), _provider(params, allow_all=False),
                   rpc_params.string(params, "user_id", max_length=255))


@dataclass(slots=True)
class LlmKeyRef:
    """config.llm_key.get, config.llm_key.delete: the keys of `user_id` (None: the caller) for
    `provider` (None: every provider, given as `all` or not at all)."""

    provider: str | None = None
    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> LlmKeyRef:
        params = params_object(params)
        provider = _provider(params, allow_all=True)
        return cls(None if provider == ALL_PROVIDERS else provider,
                   rpc_params.string(params, "user_id", max_length=255))


def _provider(params: Mapping[str, Any], *, allow_all: bool) -> str | None:
    """The canonical provider name from params (aliases resolved), None when not given."""
    raw = rpc_params.string(params, "provider", max_length=64)
    if raw is None:
        return None
    name = raw.strip().lower()
    if name in (DEFAULT_PROVIDER, ALL_PROVIDERS):
        if name == ALL_PROVIDERS and not allow_all:
            raise invalid_params("provider 'all' is only meaningful for config.llm_key.delete")
        return name
    known = normalize_provider(name)
    if known is None:
        choices = ", ".join([DEFAULT_PROVIDER, *PROVIDERS])
        raise invalid_params(f"Unknown provider '{raw[:64]}'; use one of: {choices}")
    return known


def _api_key(params: Mapping[str, Any]) -> str:
    """The key to store; errors describe it without ever repeating it."""
    value = params.get("api_key")
    if value is None:
        raise invalid_params("api_key is required")
    if not isinstance(value, str):
        raise invalid_params(f"api_key must be a string, got a {type(value).__name__}")
    value = value.strip()
    if not value:
        raise invalid_params("api_key must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise invalid_params(f"api_key is longer than {MAX_KEY_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise invalid_params("api_key must not contain control characters")
    return value


# --- /system (agent/services/system_service.py) -------------------------------------------------------------------

@dataclass(slots=True)
class InitExamples:
    """examples.init: store the example trees, again when `force` even if some are stored."""

    force: bool = False

    @classmethod
    def from_params(cls, params: Any) -> InitExamples:
        return cls(rpc_params.boolean(params_object(params), "force", False))


# --- usage.get (agent/services/usage_service.py) ----------------------------------------------------------

MAX_USAGE_DAYS = 366


@dataclass(slots=True)
class UsageQuery:
    """usage.get: a user's LLM usage per UTC day over the last `days` days (the caller's own
    unless `user_id` names another, which only an admin may)."""

    user_id: str | None = None
    days: int = 7

    @classmethod
    def from_params(cls, params: Any) -> UsageQuery:
        params = params_object(params)
        return cls(rpc_params.string(params, "user_id", max_length=255),
                   rpc_params.integer(params, "days", 7, low=1, high=MAX_USAGE_DAYS))


# --- config.budget.* (agent/services/budget_service.py) -----------------------------------------------------


@dataclass(slots=True)
class SetBudget:
    """config.budget.set: a user's own daily LLM budget (an admin's call). Both limits null (or
    absent) removes it, so the user is held to SERVICE_USER_DAILY_BUDGET_USD / _TOKENS again."""

    user_id: str
    max_tokens: int | None = None
    max_cost_usd: float | None = None

    @classmethod
    def from_params(cls, params: Any) -> SetBudget:
        params = params_object(params)
        user_id = rpc_params.string(params, "user_id", required=True, max_length=255)
        tokens, cost = params.get("max_tokens"), params.get("max_cost_usd")
        if tokens is not None:
            tokens = rpc_params.bounded(tokens, "max_tokens", low=1, high=MAX_BUDGET_TOKENS)
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float))
                                 or not 0 < cost <= MAX_BUDGET_USD):
            raise invalid_params(f"max_cost_usd must be a number above 0 and at most {MAX_BUDGET_USD:g}, "
                                 f"got {cost!r}"[:300])
        unknown = sorted(set(params) - {"user_id", "max_tokens", "max_cost_usd"})
        if unknown:
            raise invalid_params(f"unknown params {unknown}; config.budget.set takes user_id, max_tokens, "
                                 f"max_cost_usd"[:300])
        return cls(user_id, tokens, None if cost is None else float(cost))  # type: ignore[arg-type]


@dataclass(slots=True)
class BudgetRef:
    """config.budget.get: whose daily budget (the caller's own when absent)."""

    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> BudgetRef:
        return cls(rpc_params.string(params_object(params), "user_id", max_length=255))
