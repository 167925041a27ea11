"""The typed arguments of the task operations: where a request becomes typed.

A surface turns its request into one of these once (JSON-RPC params through `from_params`, GraphQL
and the other typed surfaces by building them from their own arguments), and `TaskService` takes
only these: no service or storage function reads a JSON-RPC params dict. `from_params` holds the
reading and validation of each method's params, with the -32602 messages clients see (aliases,
defaults and bounds included), so every surface words a mistake alike.

Plain frozen dataclasses with slots, no validation library: `tasks.get` and `tasks.create` are the
hot path, and each request is read once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.errors import invalid_params
from taskgrove.agent.rpc import params as rpc_params
from taskgrove.storage.status import TASK_STATUSES

# tasks.list and tasks.running.list: how many tasks one answer holds, and how far a page may start.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_OFFSET = 10**9


def _obj(params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise invalid_params("params must be an object")
    return params


def task_id_text(value: Any, name: str = "task_id") -> str:
    """A task id given as a typed argument (GraphQL, /ws, MCP resources): the text rules of
    `from_params` (non-empty, storable), named as tasks.* names it."""
    return rpc_params.text(value, name)


# --- reads ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GetTask:
    """tasks.get, tasks.detail: one task."""

    task_id: str

    @classmethod
    def from_params(cls, params: Any) -> GetTask:
        return cls(rpc_params.string(_obj(params), "task_id", aliases=("id",), required=True))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class GetTree:
    """tasks.tree: the whole tree `task_id` belongs to."""

    task_id: str

    @classmethod
    def from_params(cls, params: Any) -> GetTree:
        return cls(rpc_params.string(_obj(params), "task_id", aliases=("root_id", "id"), required=True))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ListChildren:
    """tasks.children: the direct children of `parent_id`."""

    parent_id: str

    @classmethod
    def from_params(cls, params: Any) -> ListChildren:
        return cls(rpc_params.string(_obj(params), "parent_id", aliases=("task_id",), required=True))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ListTasks:
    """tasks.list. `user_id` None: the caller's own tasks (or everyone's for an unrestricted caller)."""

    user_id: str | None = None
    status: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    root_only: bool = False
    search: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> ListTasks:
        params = _obj(params)
        user_id = rpc_params.string(params, "user_id")
        status = rpc_params.string(params, "status")
        if status is not None and status not in (*TASK_STATUSES, "deleted"):
            raise invalid_params(f"status must be one of {', '.join((*TASK_STATUSES, 'deleted'))}, got '{status}'")
        limit = rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
        offset = rpc_params.integer(params, "offset", 0, low=0, high=MAX_OFFSET)
        if status == "deleted":  # always an empty answer: what follows is not read (as before)
            return cls(user_id, status, limit, offset)
        root_only = rpc_params.boolean(params, "root_only", False)
        search = rpc_params.string(params, "search")
        if search is not None:
            search = search.strip()[:255] or None
        return cls(user_id, status, limit, offset, root_only, search)

    @classmethod
    def page(cls, status: str | None, limit: int | None, offset: int | None) -> ListTasks:
        """A page asked for with typed arguments (GraphQL `tasks`): the bounds of `from_params`."""
        return cls(status=status,
                   limit=DEFAULT_LIMIT if limit is None else rpc_params.bounded(limit, "limit", low=1, high=MAX_LIMIT),
                   offset=0 if offset is None else rpc_params.bounded(offset, "offset", low=0, high=MAX_OFFSET))


@dataclass(frozen=True, slots=True)
class ListRunning:
    """tasks.running.list: the tasks executing on this instance."""

    user_id: str | None = None
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_params(cls, params: Any) -> ListRunning:
        params = _obj(params)
        return cls(rpc_params.string(params, "user_id"),
                   rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT))


@dataclass(frozen=True, slots=True)
class RunningStatus:
    """tasks.running.status: the state of each of `task_ids`."""

    task_ids: list[str]

    @classmethod
    def from_params(cls, params: Any) -> RunningStatus:
        return cls(rpc_params.string_list(_obj(params), "task_ids", aliases=("context_ids",), required=True))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class CountRunning:
    """tasks.running.count. `user_id` None: the caller's own (or everyone's, unrestricted)."""

    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> CountRunning:
        return cls(rpc_params.string(_obj(params), "user_id"))
