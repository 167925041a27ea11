"""The typed arguments of the trigger operations (`triggers.*`, agent/services/trigger_service.py).

The pattern of agent/foundations/requests_services.py (schedules): `from_params` is the one place a
method's params are read (names, aliases, bounds, the -32602 messages); `of` does the same for the
surfaces whose arguments are already typed (GraphQL, the command line). A trigger's own fields are
carried as given and checked by the service against the stored trigger, as schedules' are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.requests import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET, params_object

DEFAULT_RUNS, MAX_RUNS = 20, 1000  # triggers.runs: runs in one answer
ID_NAMES = ("trigger_id", "id")


def _trigger_id(params: Any) -> str:
    return rpc_params.string(params, "trigger_id", aliases=("id",), required=True, max_length=64)  # type: ignore[return-value]


def _fields(params: Any) -> dict[str, Any]:
    """The params but the trigger's id (its names are no field)."""
    return {k: v for k, v in params.items() if k not in ID_NAMES}


@dataclass(slots=True)
class TriggerRef:
    """triggers.get, triggers.delete: one trigger."""

    trigger_id: str

    @classmethod
    def from_params(cls, params: Any) -> TriggerRef:
        return cls(_trigger_id(params_object(params)))


@dataclass(slots=True)
class CreateTrigger:
    """triggers.create: a trigger of template `task_id`; `fields` as given (the service checks them);
    `trigger_id` (alias `id`): the id to give it (default: a new UUID)."""

    task_id: str
    fields: dict[str, Any]
    trigger_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> CreateTrigger:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", required=True, max_length=64)
        trigger_id = rpc_params.string(params, "trigger_id", aliases=("id",), max_length=64)
        return cls(task_id, _fields(params), trigger_id)  # type: ignore[arg-type]


@dataclass(slots=True)
class UpdateTrigger:
    """triggers.update: the fields of `trigger_id` to change, as given."""

    trigger_id: str
    fields: dict[str, Any]

    @classmethod
    def from_params(cls, params: Any) -> UpdateTrigger:
        params = params_object(params)
        return cls(_trigger_id(params), _fields(params))


@dataclass(slots=True)
class ListTriggers:
    """triggers.list. `user_id` None: the caller's own (everyone's for an unrestricted caller)."""

    user_id: str | None = None
    task_id: str | None = None
    event: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    @classmethod
    def from_params(cls, params: Any) -> ListTriggers:
        params = params_object(params)
        return cls(rpc_params.string(params, "user_id", max_length=255),
                   rpc_params.string(params, "task_id", max_length=64),
                   rpc_params.string(params, "event", max_length=255),
                   rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT),
                   rpc_params.integer(params, "offset", 0, low=0, high=MAX_OFFSET))


@dataclass(slots=True)
class TriggerRuns:
    """triggers.runs: the latest `limit` runs a trigger started (of one `key` when given)."""

    trigger_id: str
    key: str | None = None
    limit: int = DEFAULT_RUNS

    @classmethod
    def from_params(cls, params: Any) -> TriggerRuns:
        params = params_object(params)
        return cls(_trigger_id(params), rpc_params.string(params, "key", max_length=255),
                   rpc_params.integer(params, "limit", DEFAULT_RUNS, low=1, high=MAX_RUNS))
