"""`AsyncClient`: every operation of the service as one typed coroutine, named for what it does.

    async with AsyncClient("http://localhost:8000") as client:
        tree = await client.create(report)          # a builder Tree, or task dicts
        async for event in client.watch(tree.id):
            if event.wants_input:
                await event.respond({"approved": True})
        done = await client.tree(tree.id)

Each method sends one JSON-RPC call through `Connection.call` (client/rpc.py) with the call's
`Safety`, which decides what a lost answer may do (client/resend.py), and reads the answer into
its model (client/answers.py). `Client` (client/sync.py) offers the same methods without `await`.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from taskgrove.client.builder import TaskSpec
from taskgrove.client.answers import (JSON, Answer, Attempt, Budget, Cancellation, ClonePreview, Deletion, Emitted,
                                     Execution, Executors, Health, LlmKeyDeleted, LlmKeyStatus, LlmKeyStored,
                                     LogLine, LogPage, Purge, RunningCount, RunningStatus, Schedule,
                                     ScheduleDeletion, ScheduleRun, Task, TaskPage, TaskStatus, TaskTree, Usage)
from taskgrove.client.answers_automation import Generated
from taskgrove.client.automation import AsyncAgents, AsyncTriggers
from taskgrove.client.reading import not_found as _not_found, read_many as _many, read_one as _one
from taskgrove.client.resend import Retry, Safety
from taskgrove.client.rpc import Connection
from taskgrove.client.watch import TreeWatch

AnswerCall = Coroutine[Any, Any, Answer]


class _Unset:
    """Marks a field `update` leaves as it is (None is a value: it clears the field)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
TreeInput = TaskSpec | Mapping[str, Any] | Sequence[Mapping[str, Any]]


def tree_params(tree: TreeInput) -> dict[str, Any]:
    """tasks.create's params for a builder tree, a list of task dicts, or one task (nested `children` allowed)."""
    if isinstance(tree, TaskSpec):
        return {"tasks": tree.tasks()}
    if isinstance(tree, Mapping):
        return {"tasks": tree["tasks"]} if "tasks" in tree else {"tasks": [dict(tree)]}
    return {"tasks": [dict(task) for task in tree]}


class AsyncClient:
    """A client of one taskgrove service, for asyncio code.

    `url` defaults to TASKGROVE_URL (else http://127.0.0.1:8000), `token` to TASKGROVE_TOKEN.
    `timeout`: seconds (or an httpx.Timeout) per HTTP request, 120 s read by default since
    tasks.create answers once its tree has run. `retry`: when and how calls are sent again
    (client/resend.py: 5 tries, Retry-After honoured). `transport`: an httpx transport, e.g.
    `httpx.ASGITransport(app)` to talk to an app in the same process. Close it with `aclose()`
    or use it as `async with AsyncClient(...) as client:` (one connection pool for all calls)."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = None, retry: Retry | None = None,
                 headers: Mapping[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 verify: Any = True) -> None:
        self._conn = Connection(url, token, timeout=timeout, retry=retry, headers=headers, transport=transport,
                                verify=verify)
        self.schedules = AsyncSchedules(self._conn)
        self.keys = AsyncLlmKeys(self._conn)
        self.budgets = AsyncBudgets(self._conn)
        self.agents = AsyncAgents(self._conn)
        self.triggers = AsyncTriggers(self._conn)

    @property
    def url(self) -> str:
        return self._conn.url

    @property
    def retry(self) -> Retry:
        return self._conn.retry

    async def aclose(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def call(self, method: str, params: Any = None, *, write: bool = False) -> JSON:
        """Any JSON-RPC method by name, for what this client does not wrap yet; the raw JSON result.
        `write=True` marks a call that changes something: it is then never resent after an answer was lost."""
        return await self._conn.call(method, params, safety=Safety.ONCE if write else Safety.READ)

    # --- creating and running ----------------------------------------------------------------------

    async def create(self, tree: TreeInput, *, idempotency_key: str | None = None) -> TaskTree:
        """Store a tree and run it; the root with its children once the tree has run, waits for
        an answer, or SERVICE_CREATE_WAIT_TIMEOUT passed. `tree`: a builder `Tree`, a list of task
        dicts, or one task dict. Safe to resend (its Idempotency-Key; a builder tree names its ids)."""
        return _one(TaskTree, await self._conn.call("tasks.create", tree_params(tree), safety=Safety.KEYED,
                                                    idempotency_key=idempotency_key))

    async def execute(self, task_id: str, *, copy: bool = False, copy_children: bool = False,
                      webhook: Mapping[str, Any] | None = None, idempotency_key: str | None = None) -> Execution:
        """Run a stored tree (a root) or a task with its dependencies; returns once it started.
        `copy=True` runs a copy (a finished tree again); `webhook` is a webhook_config."""
        params: dict[str, Any] = {"task_id": task_id, "copy_execution": copy, "copy_children": copy_children}
        if webhook is not None:
            params["webhook_config"] = dict(webhook)
        return _one(Execution, await self._conn.call("tasks.execute", params, safety=Safety.KEYED,
                                                     idempotency_key=idempotency_key))

    async def copy(self, task_id: str, *, children: bool = False, idempotency_key: str | None = None) -> TaskTree:
        """A pending copy of the task's subtree and its dependents (tasks.copy); not run."""
        return _one(TaskTree, await self._conn.call("tasks.copy", {"task_id": task_id, "children": children},
                                                    safety=Safety.KEYED, idempotency_key=idempotency_key))

    async def clone(self, task_id: str, *, origin_type: str = "copy", recursive: bool = True,
                    children: bool = False, link_task_ids: Sequence[str] | None = None,
                    reset_fields: Sequence[str] | Mapping[str, Any] | None = None,
                    idempotency_key: str | None = None) -> TaskTree:
        """A stored clone of the tree (tasks.clone): `origin_type` copy, link, archive or mixed."""
        return _one(TaskTree, await self._conn.call(
            "tasks.clone", _clone_params(task_id, origin_type, recursive, children, link_task_ids, reset_fields,
                                         save=True), safety=Safety.KEYED, idempotency_key=idempotency_key))

    async def clone_preview(self, task_id: str, *, origin_type: str = "copy", recursive: bool = True,
                            children: bool = False, link_task_ids: Sequence[str] | None = None,
                            reset_fields: Sequence[str] | Mapping[str, Any] | None = None) -> ClonePreview:
        """The tasks a clone would store, nothing stored (tasks.clone with save false): edit, then create."""
        return _one(ClonePreview, await self._conn.call(
            "tasks.clone", _clone_params(task_id, origin_type, recursive, children, link_task_ids, reset_fields,
                                         save=False), safety=Safety.READ))

    async def generate(self, requirement: str, *, save: bool = False, provider: str | None = None,
                       model: str | None = None, temperature: float | None = None, max_tokens: int | None = None,
                       user_id: str | None = None) -> Generated:
        """A task tree planned by the service's LLM from a plain-language `requirement`
        (tasks.generate): `tasks`, ready for `create`. `save=True` also stores it, pending (not
        run): start it with `execute(answer.root_task_id)`. The LLM key is the caller's stored
        one or the service's (an `X-LLM-API-KEY` header given to the client's `headers` wins).
        Without `save` nothing is stored, so a lost answer is asked again (the LLM call and its
        usage are then spent twice); with `save` it is not resent (the service does not honour
        an Idempotency-Key for it): `Unreachable` with `maybe_sent=True`."""
        params: dict[str, Any] = {"requirement": requirement, "save": save}
        for name, value in (("provider", provider), ("model", model), ("temperature", temperature),
                            ("max_tokens", max_tokens), ("user_id", user_id)):
            if value is not None:
                params[name] = value
        return _one(Generated, await self._conn.call("tasks.generate", params,
                                                     safety=Safety.ONCE if save else Safety.IDEMPOTENT))

    # --- reading -----------------------------------------------------------------------------------

    async def get(self, task_id: str) -> Task:
        """One task; NotFound when there is none (or the caller may not see it: PermissionDenied)."""
        found = await self._conn.call("tasks.get", {"task_id": task_id}, safety=Safety.READ)
        if found is None:
            raise _not_found(f"Task '{task_id}' not found", "tasks.get")
        return _one(Task, found)

    async def tree(self, task_id: str) -> TaskTree:
        """The whole tree `task_id` belongs to, from its root, with nested children."""
        return _one(TaskTree, await self._conn.call("tasks.tree", {"task_id": task_id}, safety=Safety.READ))

    async def children(self, task_id: str) -> builtins.list[Task]:
        """The direct children of a task, in creation order."""
        return _many(Task, await self._conn.call("tasks.children", {"parent_id": task_id}, safety=Safety.READ))

    async def list(self, *, status: TaskStatus | str | None = None, user_id: str | None = None,
                   search: str | None = None, roots: bool = False, waiting: bool | None = None,
                   page_size: int = 100) -> AsyncIterator[Task]:
        """Every matching task, newest first, read a page at a time by cursor as you iterate:
        `async for task in client.list(status="failed"):`. `roots=True`: one root per tree (with
        `status_counts`); `waiting=True`: only tasks that wait."""
        cursor: str | None = None
        while True:
            page = await self.list_page(status=status, user_id=user_id, search=search, roots=roots,
                                        waiting=waiting, limit=page_size, cursor=cursor)
            for task in page.tasks:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def list_page(self, *, status: TaskStatus | str | None = None, user_id: str | None = None,
                        search: str | None = None, roots: bool = False, waiting: bool | None = None,
                        limit: int = 100, cursor: str | None = None, offset: int | None = None) -> TaskPage:
        """One page of tasks.list: by `cursor` (None: the first page; pass each page's
        `next_cursor`), or by `offset` (then `next_cursor` is None)."""
        params: dict[str, Any] = {"limit": limit, "root_only": roots}
        if offset is not None:
            params["offset"] = offset
        else:
            params["cursor"] = cursor
        for name, value in (("status", status), ("user_id", user_id), ("search", search), ("waiting", waiting)):
            if value is not None:
                params[name] = value.value if isinstance(value, TaskStatus) else value
        found = await self._conn.call("tasks.list", params, safety=Safety.READ)
        if isinstance(found, list):
            return TaskPage(tasks=_many(Task, found), next_cursor=None)
        return _one(TaskPage, found)

    async def attempts(self, task_id: str, *, tree: bool = False) -> builtins.list[Attempt]:
        """The task's attempts, oldest first (with `tree=True`, every task's of its tree)."""
        return _many(Attempt, await self._conn.call("tasks.attempts", {"task_id": task_id, "tree": tree},
                                                    safety=Safety.READ))

    async def logs(self, task_id: str, *, attempt: int | None = None, after: int | None = None,
                   follow: bool = False, poll_seconds: float = 0.5) -> AsyncIterator[LogLine]:
        """The task's log lines, oldest first, a page at a time as you iterate; with
        `follow=True`, new lines as they come until the task is finished and all were read."""
        params: dict[str, Any] = {"task_id": task_id}
        if attempt is not None:
            params["attempt"] = attempt
        if after is not None:
            params["after"] = after
        while True:
            finished = follow and (await self.get(task_id)).status.finished
            while True:
                page = await self.logs_page(**params)
                for line in page.lines:
                    yield line
                if page.lines:
                    params["after"] = page.lines[-1].seq
                if page.next_after is None:
                    break
            if not follow or finished:
                return
            await asyncio.sleep(poll_seconds)

    async def logs_page(self, task_id: str, *, attempt: int | None = None, after: int | None = None,
                        limit: int | None = None) -> LogPage:
        """One page of tasks.logs (`next_after`: pass it as `after` for the next; None: the last)."""
        params: dict[str, Any] = {"task_id": task_id}
        for name, value in (("attempt", attempt), ("after", after), ("limit", limit)):
            if value is not None:
                params[name] = value
        return _one(LogPage, await self._conn.call("tasks.logs", params, safety=Safety.READ))

    async def running_status(self, task_ids: Iterable[str]) -> builtins.list[RunningStatus]:
        """The status of each task named (`not_found` / `permission_denied` where it has none for you)."""
        return _many(RunningStatus, await self._conn.call("tasks.running.status", {"task_ids": list(task_ids)},
                                                          safety=Safety.READ))

    async def running_count(self, *, user_id: str | None = None) -> RunningCount:
        """How many tasks are in progress (a user's, or all the caller may count)."""
        return _one(RunningCount, await self._conn.call("tasks.running.count",
                                                        {"user_id": user_id} if user_id else {}, safety=Safety.READ))

    async def usage(self, *, user_id: str | None = None, days: int = 7) -> Usage:
        """A user's LLM usage today and per day over the last `days` (default: the caller's)."""
        params: dict[str, Any] = {"days": days}
        if user_id is not None:
            params["user_id"] = user_id
        return _one(Usage, await self._conn.call("usage.get", params, safety=Safety.READ))

    # --- changing --------------------------------------------------------------------------------

    async def update(self, task_id: str, *, name: str = UNSET, description: str | None = UNSET,
                     status: TaskStatus | str = UNSET, priority: int = UNSET, inputs: Mapping[str, Any] = UNSET,
                     params: Mapping[str, Any] = UNSET, schemas: Mapping[str, Any] = UNSET,
                     dependencies: Sequence[Mapping[str, Any]] = UNSET, result: JSON = UNSET,
                     error: str | None = UNSET, progress: float = UNSET) -> Task:
        """Change the fields given (tasks.update; inputs and result are replaced); the updated task."""
        fields = {"name": name, "description": description, "status": status, "priority": priority,
                  "inputs": inputs, "params": params, "schemas": schemas, "dependencies": dependencies,
                  "result": result, "error": error, "progress": progress}
        body: dict[str, Any] = {"task_id": task_id}
        for key, value in fields.items():
            if value is not UNSET:
                body[key] = value.value if isinstance(value, TaskStatus) else value
        return _one(Task, await self._conn.call("tasks.update", body, safety=Safety.IDEMPOTENT))

    async def cancel(self, *task_ids: str, force: bool = False,
                     error_message: str | None = None) -> builtins.list[Cancellation]:
        """Cancel pending or running tasks; one Cancellation per id (`cancelled`, or why not)."""
        params: dict[str, Any] = {"task_ids": list(task_ids), "force": force}
        if error_message is not None:
            params["error_message"] = error_message
        return _many(Cancellation, await self._conn.call("tasks.cancel", params, safety=Safety.IDEMPOTENT))

    async def delete(self, task_id: str) -> Deletion:
        """Delete a pending task and its descendants (Conflict when something blocks it)."""
        return _one(Deletion, await self._conn.call("tasks.delete", {"task_id": task_id}, safety=Safety.ONCE))

    async def respond(self, task_id: str, value: JSON) -> Answer:
        """Answer a task that waits for input (tasks.respond); the value must fit the wait's schema.
        Conflict when the task does not wait (any more): a wait takes exactly one answer."""
        return _one(Answer, await self._conn.call("tasks.respond", {"task_id": task_id, "value": value},
                                                  safety=Safety.ONCE))

    async def emit(self, name: str, payload: Mapping[str, Any] | None = None, *,
                   user_id: str | None = None, idempotency_key: str | None = None) -> Emitted:
        """Emit an event: resumes the caller's tasks that wait for it (admins: `user_id`'s) and
        feeds the triggers that match it. Safe to resend: the service honours its Idempotency-Key."""
        params: dict[str, Any] = {"name": name, "payload": dict(payload or {})}
        if user_id is not None:
            params["user_id"] = user_id
        return _one(Emitted, await self._conn.call("events.emit", params, safety=Safety.KEYED,
                                                   idempotency_key=idempotency_key))

    async def purge(self, *, older_than: str | float | None = None) -> Purge:
        """Admins: one retention sweep now, of trees that ended longer ago than `older_than`
        (`30d`, `12h`, `90s` or seconds; default the service's SERVICE_RETENTION)."""
        params = {"older_than": older_than} if older_than is not None else {}
        return _one(Purge, await self._conn.call("tasks.purge", params, safety=Safety.IDEMPOTENT))

    # --- live --------------------------------------------------------------------------------------

    def watch(self, tree: str | TaskTree, *, reconnect_for: float = 300.0,
              resync_after: float = 30.0) -> TreeWatch[AnswerCall]:
        """The events of a tree until it settles, over the service's WebSocket; the last one is
        `final`. `tree`: any task id of it (or a TaskTree already read). A dropped connection is
        reconnected for up to `reconnect_for` seconds, the tree read again meanwhile, so the
        final event is never missed. Waits for input come as events: `await event.respond(value)`."""
        return TreeWatch(url=self._conn.url, headers=self._conn.headers, read_tree=self.tree, tree=tree,
                         responder=self.respond, reconnect_for=reconnect_for, resync_after=resync_after,
                         backoff=self._conn.retry.backoff, max_backoff=self._conn.retry.max_backoff)

    async def wait(self, tree_id: str, *, timeout: float | None = None) -> TaskTree:
        """Wait until the tree settles (see `watch`), then read it; asyncio.TimeoutError after `timeout` s.
        A task waiting for an answer keeps the tree unsettled: answer it (from another task or watch)."""
        async def settle() -> str:
            async with self.watch(tree_id) as events:
                async for event in events:
                    if event.is_final:
                        return event.task_id
            return tree_id

        return await self.tree(await asyncio.wait_for(settle(), timeout))

    # --- the service ------------------------------------------------------------------------------

    async def health(self) -> Health:
        return _one(Health, await self._conn.call("system.health", safety=Safety.READ))

    async def executors(self) -> Executors:
        """The executors this service offers (ids for a task's executor)."""
        return _one(Executors, await self._conn.call("system.executors", safety=Safety.READ))


class AsyncSchedules:
    """`client.schedules`: runs of a stored tree by cron or interval (docs/schedules.md)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def create(self, task_id: str, *, cron: str | None = None, interval_seconds: float | None = None,
                     timezone: str | None = None, **options: Any) -> Schedule:
        """A schedule for the stored tree `task_id` (its root): `cron` (five fields, in `timezone`)
        or `interval_seconds`; other options (max_runs, start_at, end_at, overlap, catch_up,
        webhook_config, enabled) as docs/schedules.md names them."""
        params: dict[str, Any] = {"task_id": task_id, **options}
        for name, value in (("cron", cron), ("interval_seconds", interval_seconds), ("timezone", timezone)):
            if value is not None:
                params[name] = value
        return _one(Schedule, await self._conn.call("schedules.create", params, safety=Safety.ONCE))

    async def get(self, schedule_id: str) -> Schedule:
        """One schedule; NotFound when there is none."""
        found = await self._conn.call("schedules.get", {"schedule_id": schedule_id}, safety=Safety.READ)
        if found is None:
            raise _not_found(f"schedule_id: schedule '{schedule_id}' not found", "schedules.get")
        return _one(Schedule, found)

    async def list(self, *, task_id: str | None = None, limit: int = 100, offset: int = 0) -> builtins.list[Schedule]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if task_id is not None:
            params["task_id"] = task_id
        return _many(Schedule, await self._conn.call("schedules.list", params, safety=Safety.READ))

    async def update(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change a schedule's fields (cron, interval_seconds, timezone, enabled, ...)."""
        return _one(Schedule, await self._conn.call("schedules.update", {"schedule_id": schedule_id, **changes},
                                                    safety=Safety.IDEMPOTENT))

    async def delete(self, schedule_id: str) -> ScheduleDeletion:
        return _one(ScheduleDeletion, await self._conn.call("schedules.delete", {"schedule_id": schedule_id},
                                                            safety=Safety.ONCE))

    async def trigger(self, schedule_id: str) -> Schedule:
        """Run the schedule's tree now (`root_task_id`: the new tree)."""
        return _one(Schedule, await self._conn.call("schedules.trigger", {"schedule_id": schedule_id},
                                                    safety=Safety.ONCE))

    async def runs(self, schedule_id: str, *, limit: int | None = None) -> builtins.list[ScheduleRun]:
        params: dict[str, Any] = {"schedule_id": schedule_id}
        if limit is not None:
            params["limit"] = limit
        return _many(ScheduleRun, await self._conn.call("schedules.runs", params, safety=Safety.READ))


class AsyncLlmKeys:
    """`client.keys`: a user's stored LLM keys, encrypted at rest; never read back (docs/auth.md)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def set(self, api_key: str, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyStored:
        return _one(LlmKeyStored, await self._conn.call(
            "config.llm_key.set", _key_params(provider, user_id, api_key=api_key), safety=Safety.IDEMPOTENT))

    async def get(self, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyStatus:
        return _one(LlmKeyStatus, await self._conn.call("config.llm_key.get", _key_params(provider, user_id),
                                                        safety=Safety.READ))

    async def delete(self, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyDeleted:
        return _one(LlmKeyDeleted, await self._conn.call("config.llm_key.delete", _key_params(provider, user_id),
                                                         safety=Safety.IDEMPOTENT))


class AsyncBudgets:
    """`client.budgets`: a user's daily LLM budget (docs/costs.md)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def get(self, *, user_id: str | None = None) -> Budget:
        return _one(Budget, await self._conn.call("config.budget.get", {"user_id": user_id} if user_id else {},
                                                  safety=Safety.READ))

    async def set(self, user_id: str, *, max_tokens: int | None = None, max_cost_usd: float | None = None) -> Budget:
        """Admins: a user's own limits (both None removes them: the settings' budget applies)."""
        return _one(Budget, await self._conn.call(
            "config.budget.set", {"user_id": user_id, "max_tokens": max_tokens, "max_cost_usd": max_cost_usd},
            safety=Safety.IDEMPOTENT))


def _clone_params(task_id: str, origin_type: str, recursive: bool, children: bool,
                  link_task_ids: Sequence[str] | None, reset_fields: Sequence[str] | Mapping[str, Any] | None,
                  *, save: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"task_id": task_id, "origin_type": origin_type, "recursive": recursive,
                              "children": children, "save": save}
    if link_task_ids is not None:
        params["link_task_ids"] = list(link_task_ids)
    if reset_fields is not None:
        params["reset_fields"] = dict(reset_fields) if isinstance(reset_fields, Mapping) else list(reset_fields)
    return params


def _key_params(provider: str | None, user_id: str | None, **extra: Any) -> dict[str, Any]:
    params = dict(extra)
    if provider is not None:
        params["provider"] = provider
    if user_id is not None:
        params["user_id"] = user_id
    return params
