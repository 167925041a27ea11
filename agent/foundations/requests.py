"""The typed arguments of the task operations: where a request becomes typed.

A surface turns its request into one of these once (JSON-RPC params through `from_params`, GraphQL
and the other typed surfaces by building them from their own arguments), and `TaskService` takes
only these: no service or storage function reads a JSON-RPC params dict. `from_params` holds the
reading and validation of each method's params, with the -32602 messages clients see (aliases,
defaults and bounds included), so every surface words a mistake alike.
The other services' requests (schedules, tasks.generate, LLM keys, /system) follow the same
pattern in agent/foundations/requests_services.py.

Plain dataclasses with slots, no validation library: `tasks.get` and `tasks.create` are the hot
path, and each request is read once. Not `frozen`: a frozen dataclass's `__init__` sets every field
through `object.__setattr__`, ~100 ns more per request (measured on `tasks.get`); treat them as
read-only all the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from taskgrove.agent.foundations import cursor
from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.settings import parse_duration
from taskgrove.storage import copy_plan, ids, new_tree
from taskgrove.storage.status import TASK_STATUSES
from taskgrove.storage.new_tree import TreeError

# tasks.list and tasks.running.list: how many tasks one answer holds, and how far a page may start.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_OFFSET = 10**9


def params_object(params: Any) -> Mapping[str, Any]:
    """JSON-RPC params that must be an object (by name): -32602 for an array or a value."""
    if type(params) is not dict and not isinstance(params, Mapping):  # the usual dict skips the ABC check
        raise invalid_params("params must be an object")
    return params


def task_id_text(value: Any, name: str = "task_id") -> str:
    """A task id given as a typed argument (GraphQL, /ws, MCP resources): the text rules of
    `from_params` (non-empty, storable), named as tasks.* names it."""
    return rpc_params.text(value, name)


# --- reads ------------------------------------------------------------------------------------

@dataclass(slots=True)
class TaskRef:
    """A request that names one task: `task_id`, read from `task_id` or one of `ALIASES`."""

    task_id: str
    ALIASES: ClassVar[tuple[str, ...]] = ("id",)

    @classmethod
    def from_params(cls, params: Any) -> Self:
        return cls(rpc_params.string(params_object(params), "task_id", aliases=cls.ALIASES, required=True))  # type: ignore[arg-type]


@dataclass(slots=True)
class GetTask(TaskRef):
    """tasks.get, tasks.detail: one task."""


@dataclass(slots=True)
class TaskAttempts:
    """tasks.attempts: the attempt history of `task_id`, or with `tree` of every task of its tree."""

    task_id: str
    tree: bool = False

    @classmethod
    def from_params(cls, params: Any) -> TaskAttempts:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        return cls(task_id, rpc_params.boolean(params, "tree", False))  # type: ignore[arg-type]


@dataclass(slots=True)
class GetTree(TaskRef):
    """tasks.tree: the whole tree `task_id` belongs to."""

    ALIASES: ClassVar[tuple[str, ...]] = ("root_id", "id")


@dataclass(slots=True)
class ListChildren:
    """tasks.children: the direct children of `parent_id`."""

    parent_id: str

    @classmethod
    def from_params(cls, params: Any) -> ListChildren:
        return cls(rpc_params.string(params_object(params), "parent_id", aliases=("task_id",), required=True))  # type: ignore[arg-type]


@dataclass(slots=True)
class ListTasks:
    """tasks.list. `user_id` None: the caller's own tasks (or everyone's for an unrestricted caller)."""

    user_id: str | None = None
    status: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    root_only: bool = False
    search: str | None = None
    waiting: bool | None = None  # True: only tasks parked on a wait (docs/waits.md); False: only the others
    # Keyset pagination (agent/foundations/cursor.py): `paged` when the params name `cursor` at all (then the
    # answer is {"tasks", "next_cursor"}, else the plain list of SPEC.md); `after`, the sort key
    # (created_at, id) the page continues below (None: the first page).
    paged: bool = False
    after: tuple[str, str] | None = None

    @classmethod
    def from_params(cls, params: Any) -> ListTasks:
        params = params_object(params)
        user_id = rpc_params.string(params, "user_id")
        status = rpc_params.string(params, "status")
        if status is not None and status not in (*TASK_STATUSES, "deleted"):
            raise invalid_params(f"status must be one of {', '.join((*TASK_STATUSES, 'deleted'))}, got '{status}'")
        limit = rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
        offset = rpc_params.integer(params, "offset", 0, low=0, high=MAX_OFFSET)
        paged = "cursor" in params
        after = cursor.decode(params["cursor"]) if paged else None
        if paged and offset:
            raise invalid_params("cursor and offset cannot be used together: a cursor says where the page starts")
        if status == "deleted":  # always an empty answer: what follows is not read (as before)
            return cls(user_id, status, limit, offset, paged=paged)
        root_only = rpc_params.boolean(params, "root_only", False)
        search = rpc_params.string(params, "search")
        if search is not None:
            search = search.strip()[:255] or None
        waiting = params.get("waiting")
        if waiting is not None and type(waiting) is not bool:
            raise invalid_params(f"waiting must be true or false, got {waiting!r}"[:300])
        return cls(user_id, status, limit, offset, root_only, search, waiting, paged, after)

    @classmethod
    def page(cls, status: str | None, limit: int | None, offset: int | None) -> ListTasks:
        """A page asked for with typed arguments (GraphQL `tasks`): the bounds of `from_params`."""
        return cls(status=status,
                   limit=DEFAULT_LIMIT if limit is None else rpc_params.bounded(limit, "limit", low=1, high=MAX_LIMIT),
                   offset=0 if offset is None else rpc_params.bounded(offset, "offset", low=0, high=MAX_OFFSET))


@dataclass(slots=True)
class ListRunning:
    """tasks.running.list: the tasks executing on this instance."""

    user_id: str | None = None
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_params(cls, params: Any) -> ListRunning:
        params = params_object(params)
        return cls(rpc_params.string(params, "user_id"),
                   rpc_params.integer(params, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT))


@dataclass(slots=True)
class RunningStatus:
    """tasks.running.status: the state of each of `task_ids`."""

    task_ids: list[str]

    @classmethod
    def from_params(cls, params: Any) -> RunningStatus:
        return cls(rpc_params.string_list(params_object(params), "task_ids", aliases=("context_ids",), required=True))  # type: ignore[arg-type]


@dataclass(slots=True)
class CountRunning:
    """tasks.running.count. `user_id` None: the caller's own (or everyone's, unrestricted)."""

    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> CountRunning:
        return cls(rpc_params.string(params_object(params), "user_id"))


# --- update, delete, cancel, copy, clone, execute ---------------------------------------------

@dataclass(slots=True)
class UpdateTask:
    """tasks.update: `fields` are the fields to change as given (the service checks each by its
    rule and names every problem at once), in the order given."""

    task_id: str
    fields: dict[str, Any]

    @classmethod
    def from_params(cls, params: Any) -> UpdateTask:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        return cls(task_id, {k: v for k, v in params.items() if k not in ("task_id", "id")})  # type: ignore[arg-type]


@dataclass(slots=True)
class DeleteTask(TaskRef):
    """tasks.delete: `task_id` and its subtree."""


@dataclass(slots=True)
class CancelTasks:
    """tasks.cancel, tasks.running.cancel: one answer per id."""

    task_ids: list[str]
    force: bool = False
    error_message: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> CancelTasks:
        params = params_object(params)
        ids = rpc_params.string_list(params, "task_ids", aliases=("context_ids", "task_id"), required=True)
        return cls(ids, rpc_params.boolean(params, "force", False),  # type: ignore[arg-type]
                   rpc_params.string(params, "error_message"))

    @classmethod
    def one(cls, task_id: str) -> CancelTasks:
        """One task, given as a typed argument (GraphQL cancelTask): the checks of `from_params`."""
        return cls(rpc_params.texts(task_id, "task_ids"))


@dataclass(slots=True)
class CopyTask:
    """tasks.copy: `children` also copies each direct child's dependencies."""

    task_id: str
    children: bool = False

    @classmethod
    def from_params(cls, params: Any) -> CopyTask:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        return cls(task_id, rpc_params.boolean(params, "children", False))  # type: ignore[arg-type]


CLONE_MODES = ("copy", "link", "archive", "mixed")


@dataclass(slots=True)
class CloneTask:
    """tasks.clone. `reset`: the values cloned tasks start from (storage.copy_plan.reset_values);
    `overrides`: the other fields an object `reset_fields` sets, applied to linked and archived
    tasks too."""

    task_id: str
    mode: str = "copy"
    recursive: bool = True
    with_children: bool = False
    link_ids: list[str] = dataclasses.field(default_factory=list)
    save: bool = True
    reset: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(copy_plan.RESETTABLE))
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Any) -> CloneTask:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        mode = rpc_params.string(params, "origin_type") or "copy"
        if mode not in CLONE_MODES:
            raise invalid_params(f"origin_type must be one of {', '.join(CLONE_MODES)}, got '{mode}'")
        recursive = rpc_params.boolean(params, "recursive", True)
        with_children = rpc_params.boolean(params, "_recursive", False, aliases=("children",))
        link_ids = rpc_params.string_list(params, "link_task_ids") or []
        save = rpc_params.boolean(params, "save", True)
        if mode == "mixed" and not link_ids:
            raise invalid_params("origin_type 'mixed' needs link_task_ids: the ids to link instead of copy")
        raw = params.get("reset_fields")
        try:
            reset = copy_plan.reset_values(raw)
        except TreeError as exc:
            raise invalid_params(str(exc)) from None
        overrides = {k: v for k, v in raw.items() if k not in copy_plan.RESETTABLE} if isinstance(raw, Mapping) else {}
        return cls(task_id, mode, recursive, with_children, link_ids, save, reset, overrides)  # type: ignore[arg-type]


@dataclass(slots=True)
class ExecuteTask:
    """tasks.execute, execute_task_tree. `webhook_config` as given: the service checks it
    (agent/engine/webhooks.py WebhookConfig.parse, which needs the settings and may resolve names)."""

    task_id: str
    streaming: bool = False
    copy_execution: bool = False
    copy_children: bool = False
    webhook_config: Any = None

    @classmethod
    def from_params(cls, params: Any) -> ExecuteTask:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        return cls(task_id, rpc_params.boolean(params, "use_streaming", False),  # type: ignore[arg-type]
                   rpc_params.boolean(params, "copy_execution", False),
                   rpc_params.boolean(params, "copy_children", False), params.get("webhook_config"))


# --- create ---------------------------------------------------------------------------------

@dataclass(slots=True)
class NewTree:
    """tasks.create and every other way to store a new tree (GraphQL createTask, A2A data parts,
    tasks.generate, the command line, executors): its tasks flat, each parent before its children,
    as storage.new_tree.prepare_new_tree validates them."""

    tasks: list[dict[str, Any]]

    @classmethod
    def from_params(cls, params: Any, max_tasks: int = new_tree.DEFAULT_MAX_TREE_TASKS) -> NewTree:
        """`params.tasks` (array or object) or `params` itself (array or object), nested children
        flattened (parent first, siblings in order). Stops as soon as the tree has more than
        `max_tasks` tasks (SERVICE_MAX_TREE_TASKS), so an oversized request costs no more than
        the limit."""
        try:
            return cls(_flat_tasks(params, max_tasks))
        except TreeError as exc:
            raise invalid_params(str(exc)) from None


def _flat_tasks(params: Any, max_tasks: int) -> list[dict[str, Any]]:
    # `type(x) is list/dict` first: the usual JSON values skip the slower Mapping ABC check.
    if type(params) is not list and isinstance(params, Mapping) and "tasks" in params:
        params = params["tasks"]
    if type(params) is not list and isinstance(params, Mapping):
        params = [params]
    if not isinstance(params, list) or not params:
        raise TreeError("tasks must be a non-empty array of task objects or one task object")
    if len(params) > max_tasks:
        raise new_tree.too_many_tasks(max_tasks, len(params))
    flat: list[dict[str, Any]] = []
    # Explicit stack (no recursion over nesting depth), items pushed in reverse to keep order.
    stack: list[tuple[Any, str | None, str]] = [
        (item, None, f"tasks[{index}]") for index, item in reversed(list(enumerate(params)))
    ]
    while stack:
        item, parent_id, where = stack.pop()
        if len(flat) >= max_tasks:
            raise new_tree.too_many_tasks(max_tasks)
        if type(item) is not dict and not isinstance(item, Mapping):
            raise TreeError(f"{where}: each task must be an object, got {type(item).__name__}")
        task = dict(item)
        children = task.pop("children", None)
        if parent_id is not None and task.get("parent_id") is None:
            task["parent_id"] = parent_id
        flat.append(task)
        if children:
            if not isinstance(children, list):
                raise TreeError(f"{where}: children must be an array")
            if not task.get("id"):
                task["id"] = ids.new_id()
            stack.extend((child, task["id"], f"{where}.children[{index}]")
                         for index, child in reversed(list(enumerate(children))))
    return flat


# --- retention (agent/services/retention_service.py, docs/retention.md) ------------------------------------------

@dataclass(slots=True)
class PurgeTasks:
    """tasks.purge: one retention sweep now, of trees ended more than `older_than` seconds ago
    (None: SERVICE_RETENTION). Given as a duration (`30d`, `12h`, `90s`) or a number of seconds."""

    older_than: float | None = None

    @classmethod
    def from_params(cls, params: Any) -> PurgeTasks:
        params = {} if params is None else params_object(params)
        raw = params.get("older_than")
        if raw is None:
            return cls()
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise invalid_params(f"older_than must be a duration like 30d, 12h, 90s or a number of seconds, "
                                 f"got {raw!r}"[:300])
        try:
            return cls(parse_duration(str(raw)))
        except ValueError as exc:
            raise invalid_params(f"older_than {exc}"[:300]) from None


# --- durable waits (agent/services/wait_service.py, docs/waits.md) ---------------------------------------

@dataclass(slots=True)
class RespondToTask:
    """tasks.respond: the answer `value` (any JSON value, null included) to the wait for input of
    `task_id`. Typed surfaces build it from their arguments; the value is checked by the service."""

    task_id: str
    value: Any = None

    @classmethod
    def from_params(cls, params: Any) -> RespondToTask:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        if "value" not in params:
            raise invalid_params("value is required (null is a value)")
        return cls(task_id, params["value"])  # type: ignore[arg-type]

    @classmethod
    def of(cls, task_id: Any, value: Any) -> RespondToTask:
        """Typed arguments (GraphQL, MCP, the CLI): the text rules of `from_params` for the id."""
        return cls(task_id_text(task_id), value)


@dataclass(slots=True)
class EmitEvent:
    """events.emit: event `name` with its `payload` (an object), for `user_id` (admins only;
    None: the caller's user)."""

    name: str
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    user_id: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> EmitEvent:
        params = params_object(params)
        name = rpc_params.string(params, "name", required=True, max_length=255)
        return cls(name, rpc_params.obj(params, "payload") or {},  # type: ignore[arg-type]
                   rpc_params.string(params, "user_id", max_length=255))

    @classmethod
    def of(cls, name: Any, payload: Any = None, user_id: Any = None) -> EmitEvent:
        """Typed arguments (GraphQL, MCP, the CLI): the checks of `from_params`."""
        return cls.from_params({"name": name, "payload": payload, "user_id": user_id})


# --- task logs ----------------------------------------------------------------------------------

# tasks.logs: lines in one page (the default and the most).
LOG_PAGE_LINES = 1000


@dataclass(slots=True)
class TaskLogs:
    """tasks.logs: the log lines of `task_id` (docs/observability.md), of one `attempt` or all,
    after the line `after` (a `seq`), at most `limit`; `follow`: then stream new lines (SSE)."""

    task_id: str
    attempt: int | None = None
    after: int | None = None
    limit: int = LOG_PAGE_LINES
    follow: bool = False

    @classmethod
    def from_params(cls, params: Any) -> TaskLogs:
        params = params_object(params)
        task_id = rpc_params.string(params, "task_id", aliases=("id",), required=True)
        return cls(task_id,  # type: ignore[arg-type]
                   _optional_int(params, "attempt", low=1, high=2**31 - 1),
                   _optional_int(params, "after", low=0, high=2**63 - 1),
                   rpc_params.integer(params, "limit", LOG_PAGE_LINES, low=1, high=LOG_PAGE_LINES),
                   rpc_params.boolean(params, "follow", False))

    @classmethod
    def of(cls, task_id: Any, attempt: int | None = None, after: int | None = None,
           limit: int = LOG_PAGE_LINES) -> TaskLogs:
        """Typed arguments (/ws, the CLI): the rules of `from_params`."""
        return cls(task_id_text(task_id),
                   None if attempt is None else rpc_params.bounded(attempt, "attempt", low=1, high=2**31 - 1),
                   None if after is None else rpc_params.bounded(after, "after", low=0, high=2**63 - 1),
                   rpc_params.bounded(limit, "limit", low=1, high=LOG_PAGE_LINES))


def _optional_int(params: Mapping[str, Any], name: str, *, low: int, high: int) -> int | None:
    """An optional integer param: absent or null is None, else within [low, high] (-32602 naming
    it; the bounds of the column it is compared with, so no database refuses it)."""
    value = params.get(name)
    return None if value is None else rpc_params.bounded(value, name, low=low, high=high)
