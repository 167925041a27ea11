"""`Client`: the methods of `AsyncClient` without `await`, for scripts, notebooks and threads.

    with Client("http://localhost:8000") as client:
        tree = client.create(report)
        for event in client.watch(tree.id):
            if event.wants_input:
                event.respond({"approved": True})

Why it wraps AsyncClient instead of repeating it on a blocking httpx client: the retries, the
errors and above all the watch (several WebSocket connections, reconnection, the tree read again)
then exist once. The AsyncClient runs on an event loop in a thread of its own (anyio's blocking
portal, which httpx already depends on), so a Client also works where a loop is running already
(a notebook, a web handler). Calls from several threads share that one loop and connection pool.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

from taskgrove.client.aio import UNSET, AsyncBudgets, AsyncClient, AsyncLlmKeys, AsyncSchedules, TreeInput
from taskgrove.client.answers import (JSON, Answer, Attempt, Budget, Cancellation, ClonePreview, Deletion, Emitted,
                                     Event, Execution, Executors, Health, LlmKeyDeleted, LlmKeyStatus, LlmKeyStored,
                                     LogLine, LogPage, Purge, RunningCount, RunningStatus, Schedule,
                                     ScheduleDeletion, ScheduleRun, Task, TaskPage, TaskStatus, TaskTree, Usage)
from taskgrove.client.answers_automation import (Agent, AgentPage, AgentRemoval, Generated, Trigger, TriggerDeletion,
                                                 TriggerRun)
from taskgrove.client.automation import AsyncAgents, AsyncTriggers
from taskgrove.client.resend import Retry
from taskgrove.client.watch import TreeWatch, WatchedTask

T = TypeVar("T")


class _Portal:
    """An event loop in a daemon thread, and the way to run coroutines and iterators on it."""

    def __init__(self) -> None:
        self._manager: AbstractContextManager[BlockingPortal] = start_blocking_portal()
        self.portal = self._manager.__enter__()

    def run(self, call: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await call()

        return self.portal.call(run)

    def iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        """The items of an async iterator, one blocking step at a time; closed when the caller stops."""
        iterator = self.run(_async(make))
        try:
            while True:
                more, item = self.run(lambda: _next(iterator))
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                self.run(close)

    def close(self) -> None:
        self._manager.__exit__(None, None, None)


def _async(make: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def made() -> T:
        return make()

    return made


async def _next(iterator: AsyncIterator[T]) -> tuple[bool, T | None]:
    # A (more, item) pair, not StopAsyncIteration: an exception of that kind must not cross the portal.
    try:
        return True, await iterator.__anext__()
    except StopAsyncIteration:
        return False, None


class Client:
    """A client of one taskgrove service, for code without asyncio: the methods of AsyncClient
    (same names, same arguments, same answers), each blocking until its answer.

    `url` defaults to TASKGROVE_URL (else http://127.0.0.1:8000), `token` to TASKGROVE_TOKEN;
    `timeout`, `retry`, `headers`, `transport` as for AsyncClient. Close it with `close()` or use
    it as `with Client(...) as client:`."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = None, retry: Retry | None = None,
                 headers: Mapping[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 verify: Any = True) -> None:
        self._portal = _Portal()
        try:
            self._async: AsyncClient = self._portal.run(_async(lambda: AsyncClient(
                url, token, timeout=timeout, retry=retry, headers=headers, transport=transport, verify=verify)))
        except BaseException:
            self._portal.close()
            raise
        self.schedules = Schedules(self._portal, self._async.schedules)
        self.keys = LlmKeys(self._portal, self._async.keys)
        self.budgets = Budgets(self._portal, self._async.budgets)
        self.agents = Agents(self._portal, self._async.agents)
        self.triggers = Triggers(self._portal, self._async.triggers)
        self._closed = False

    @property
    def url(self) -> str:
        return self._async.url

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.run(self._async.aclose)
        finally:
            self._portal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _run(self, call: Callable[[], Awaitable[T]]) -> T:
        return self._portal.run(call)

    def call(self, method: str, params: Any = None, *, write: bool = False) -> JSON:
        """AsyncClient.call."""
        return self._run(lambda: self._async.call(method, params, write=write))

    # --- creating and running ----------------------------------------------------------------------

    def create(self, tree: TreeInput, *, idempotency_key: str | None = None) -> TaskTree:
        """Store a tree and run it (AsyncClient.create)."""
        return self._run(lambda: self._async.create(tree, idempotency_key=idempotency_key))

    def execute(self, task_id: str, *, copy: bool = False, copy_children: bool = False,
                webhook: Mapping[str, Any] | None = None, idempotency_key: str | None = None) -> Execution:
        """Run a stored tree or a task with its dependencies (AsyncClient.execute)."""
        return self._run(lambda: self._async.execute(task_id, copy=copy, copy_children=copy_children,
                                                     webhook=webhook, idempotency_key=idempotency_key))

    def copy(self, task_id: str, *, children: bool = False, idempotency_key: str | None = None) -> TaskTree:
        """AsyncClient.copy."""
        return self._run(lambda: self._async.copy(task_id, children=children, idempotency_key=idempotency_key))

    def clone(self, task_id: str, *, origin_type: str = "copy", recursive: bool = True, children: bool = False,
              link_task_ids: Sequence[str] | None = None,
              reset_fields: Sequence[str] | Mapping[str, Any] | None = None,
              idempotency_key: str | None = None) -> TaskTree:
        """AsyncClient.clone."""
        return self._run(lambda: self._async.clone(task_id, origin_type=origin_type, recursive=recursive,
                                                   children=children, link_task_ids=link_task_ids,
                                                   reset_fields=reset_fields, idempotency_key=idempotency_key))

    def clone_preview(self, task_id: str, *, origin_type: str = "copy", recursive: bool = True,
                      children: bool = False, link_task_ids: Sequence[str] | None = None,
                      reset_fields: Sequence[str] | Mapping[str, Any] | None = None) -> ClonePreview:
        """AsyncClient.clone_preview."""
        return self._run(lambda: self._async.clone_preview(task_id, origin_type=origin_type, recursive=recursive,
                                                           children=children, link_task_ids=link_task_ids,
                                                           reset_fields=reset_fields))

    def generate(self, requirement: str, *, save: bool = False, provider: str | None = None, model: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None,
                 user_id: str | None = None) -> Generated:
        """A task tree planned from a plain-language requirement (AsyncClient.generate)."""
        return self._run(lambda: self._async.generate(requirement, save=save, provider=provider, model=model,
                                                      temperature=temperature, max_tokens=max_tokens,
                                                      user_id=user_id))

    # --- reading -----------------------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """One task; NotFound when there is none."""
        return self._run(lambda: self._async.get(task_id))

    def tree(self, task_id: str) -> TaskTree:
        """The whole tree `task_id` belongs to."""
        return self._run(lambda: self._async.tree(task_id))

    def children(self, task_id: str) -> builtins.list[Task]:
        return self._run(lambda: self._async.children(task_id))

    def list(self, *, status: TaskStatus | str | None = None, user_id: str | None = None, search: str | None = None,
             roots: bool = False, waiting: bool | None = None, page_size: int = 100) -> Iterator[Task]:
        """Every matching task, newest first, a page at a time as you iterate (AsyncClient.list)."""
        return self._portal.iterate(lambda: self._async.list(status=status, user_id=user_id, search=search,
                                                             roots=roots, waiting=waiting, page_size=page_size))

    def list_page(self, *, status: TaskStatus | str | None = None, user_id: str | None = None,
                  search: str | None = None, roots: bool = False, waiting: bool | None = None, limit: int = 100,
                  cursor: str | None = None, offset: int | None = None) -> TaskPage:
        """One page of tasks.list (AsyncClient.list_page)."""
        return self._run(lambda: self._async.list_page(status=status, user_id=user_id, search=search, roots=roots,
                                                       waiting=waiting, limit=limit, cursor=cursor, offset=offset))

    def attempts(self, task_id: str, *, tree: bool = False) -> builtins.list[Attempt]:
        return self._run(lambda: self._async.attempts(task_id, tree=tree))

    def logs(self, task_id: str, *, attempt: int | None = None, after: int | None = None, follow: bool = False,
             poll_seconds: float = 0.5) -> Iterator[LogLine]:
        """The task's log lines (AsyncClient.logs)."""
        return self._portal.iterate(lambda: self._async.logs(task_id, attempt=attempt, after=after, follow=follow,
                                                             poll_seconds=poll_seconds))

    def logs_page(self, task_id: str, *, attempt: int | None = None, after: int | None = None,
                  limit: int | None = None) -> LogPage:
        return self._run(lambda: self._async.logs_page(task_id, attempt=attempt, after=after, limit=limit))

    def running_status(self, task_ids: Iterable[str]) -> builtins.list[RunningStatus]:
        return self._run(lambda: self._async.running_status(task_ids))

    def running_count(self, *, user_id: str | None = None) -> RunningCount:
        return self._run(lambda: self._async.running_count(user_id=user_id))

    def usage(self, *, user_id: str | None = None, days: int = 7) -> Usage:
        return self._run(lambda: self._async.usage(user_id=user_id, days=days))

    # --- changing --------------------------------------------------------------------------------

    def update(self, task_id: str, *, name: str = UNSET, description: str | None = UNSET,
               status: TaskStatus | str = UNSET, priority: int = UNSET, inputs: Mapping[str, Any] = UNSET,
               params: Mapping[str, Any] = UNSET, schemas: Mapping[str, Any] = UNSET,
               dependencies: Sequence[Mapping[str, Any]] = UNSET, result: JSON = UNSET,
               error: str | None = UNSET, progress: float = UNSET) -> Task:
        """Change the fields given (AsyncClient.update)."""
        return self._run(lambda: self._async.update(
            task_id, name=name, description=description, status=status, priority=priority, inputs=inputs,
            params=params, schemas=schemas, dependencies=dependencies, result=result, error=error, progress=progress))

    def cancel(self, *task_ids: str, force: bool = False,
                     error_message: str | None = None) -> builtins.list[Cancellation]:
        return self._run(lambda: self._async.cancel(*task_ids, force=force, error_message=error_message))

    def delete(self, task_id: str) -> Deletion:
        return self._run(lambda: self._async.delete(task_id))

    def respond(self, task_id: str, value: JSON) -> Answer:
        """Answer a task that waits for input (AsyncClient.respond)."""
        return self._run(lambda: self._async.respond(task_id, value))

    def emit(self, name: str, payload: Mapping[str, Any] | None = None, *, user_id: str | None = None,
             idempotency_key: str | None = None) -> Emitted:
        """AsyncClient.emit."""
        return self._run(lambda: self._async.emit(name, payload, user_id=user_id, idempotency_key=idempotency_key))

    def purge(self, *, older_than: str | float | None = None) -> Purge:
        return self._run(lambda: self._async.purge(older_than=older_than))

    # --- live --------------------------------------------------------------------------------------

    def watch(self, tree: str | TaskTree, *, reconnect_for: float = 300.0, resync_after: float = 30.0) -> Watch:
        """The events of a tree until it settles (AsyncClient.watch); `event.respond(value)` answers a wait."""
        return Watch(self, self._async.watch(tree, reconnect_for=reconnect_for, resync_after=resync_after))

    def wait(self, tree_id: str, *, timeout: float | None = None) -> TaskTree:
        """Wait until the tree settles, then read it (AsyncClient.wait)."""
        return self._run(lambda: self._async.wait(tree_id, timeout=timeout))

    def health(self) -> Health:
        return self._run(self._async.health)

    def executors(self) -> Executors:
        return self._run(self._async.executors)


class Watch:
    """A Client's watch: iterate it (`for event in client.watch(...)`); `tasks` as TreeWatch's.
    Use `with` to close its connections when you stop before the final event."""

    def __init__(self, client: Client, watch: TreeWatch[Any]) -> None:
        self._client = client
        self._watch = watch
        self._events = client._portal.iterate(lambda: watch)

    @property
    def tasks(self) -> Mapping[str, WatchedTask]:
        return self._watch.tasks

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> Event[Answer]:
        event = next(self._events)
        bound: Event[Answer] = event.bound(self._client.respond)
        return bound

    def close(self) -> None:
        self._events.close()  # type: ignore[attr-defined]

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Schedules:
    """`client.schedules` (AsyncSchedules without await)."""

    def __init__(self, portal: _Portal, schedules: AsyncSchedules) -> None:
        self._portal = portal
        self._async = schedules

    def create(self, task_id: str, *, cron: str | None = None, interval_seconds: float | None = None,
               timezone: str | None = None, **options: Any) -> Schedule:
        return self._portal.run(lambda: self._async.create(task_id, cron=cron, interval_seconds=interval_seconds,
                                                           timezone=timezone, **options))

    def get(self, schedule_id: str) -> Schedule:
        return self._portal.run(lambda: self._async.get(schedule_id))

    def list(self, *, task_id: str | None = None, limit: int = 100, offset: int = 0) -> builtins.list[Schedule]:
        return self._portal.run(lambda: self._async.list(task_id=task_id, limit=limit, offset=offset))

    def update(self, schedule_id: str, **changes: Any) -> Schedule:
        return self._portal.run(lambda: self._async.update(schedule_id, **changes))

    def delete(self, schedule_id: str) -> ScheduleDeletion:
        return self._portal.run(lambda: self._async.delete(schedule_id))

    def trigger(self, schedule_id: str) -> Schedule:
        return self._portal.run(lambda: self._async.trigger(schedule_id))

    def runs(self, schedule_id: str, *, limit: int | None = None) -> builtins.list[ScheduleRun]:
        return self._portal.run(lambda: self._async.runs(schedule_id, limit=limit))


class Agents:
    """`client.agents` (AsyncAgents without await)."""

    def __init__(self, portal: _Portal, agents: AsyncAgents) -> None:
        self._portal = portal
        self._async = agents

    def add(self, card_url: str, *, name: str | None = None, tags: Sequence[str] | None = None,
            headers: Mapping[str, str] | None = None, credential: str | None = None, shared: bool = False,
            concurrency: int | None = None) -> Agent:
        return self._portal.run(lambda: self._async.add(card_url, name=name, tags=tags, headers=headers,
                                                        credential=credential, shared=shared,
                                                        concurrency=concurrency))

    def get(self, name: str) -> Agent:
        return self._portal.run(lambda: self._async.get(name))

    def list(self, *, skill: str | None = None, tag: str | None = None, health: str | None = None,
             page_size: int = 50) -> Iterator[Agent]:
        """Every agent the caller sees, a page at a time as you iterate (AsyncAgents.list)."""
        return self._portal.iterate(lambda: self._async.list(skill=skill, tag=tag, health=health,
                                                             page_size=page_size))

    def list_page(self, *, skill: str | None = None, tag: str | None = None, health: str | None = None,
                  limit: int = 50, cursor: str | None = None) -> AgentPage:
        return self._portal.run(lambda: self._async.list_page(skill=skill, tag=tag, health=health, limit=limit,
                                                              cursor=cursor))

    def refresh(self, name: str, *, accept: bool = False) -> Agent:
        return self._portal.run(lambda: self._async.refresh(name, accept=accept))

    def remove(self, name: str) -> AgentRemoval:
        return self._portal.run(lambda: self._async.remove(name))


class Triggers:
    """`client.triggers` (AsyncTriggers without await)."""

    def __init__(self, portal: _Portal, triggers: AsyncTriggers) -> None:
        self._portal = portal
        self._async = triggers

    def create(self, task_id: str, event: str, *, match: Mapping[str, Any] | None = None, key: str | None = None,
               debounce: Mapping[str, Any] | None = None, batch: Mapping[str, Any] | None = None,
               singleton: str | None = None, cancel_on: str | None = None, enabled: bool = True,
               trigger_id: str | None = None) -> Trigger:
        return self._portal.run(lambda: self._async.create(
            task_id, event, match=match, key=key, debounce=debounce, batch=batch, singleton=singleton,
            cancel_on=cancel_on, enabled=enabled, trigger_id=trigger_id))

    def get(self, trigger_id: str) -> Trigger:
        return self._portal.run(lambda: self._async.get(trigger_id))

    def list(self, *, task_id: str | None = None, event: str | None = None, user_id: str | None = None,
             page_size: int = 100) -> Iterator[Trigger]:
        """Every matching trigger, newest first, a page at a time as you iterate (AsyncTriggers.list)."""
        return self._portal.iterate(lambda: self._async.list(task_id=task_id, event=event, user_id=user_id,
                                                             page_size=page_size))

    def list_page(self, *, task_id: str | None = None, event: str | None = None, user_id: str | None = None,
                  limit: int = 100, offset: int = 0) -> builtins.list[Trigger]:
        return self._portal.run(lambda: self._async.list_page(task_id=task_id, event=event, user_id=user_id,
                                                              limit=limit, offset=offset))

    def update(self, trigger_id: str, **changes: Any) -> Trigger:
        return self._portal.run(lambda: self._async.update(trigger_id, **changes))

    def delete(self, trigger_id: str) -> TriggerDeletion:
        return self._portal.run(lambda: self._async.delete(trigger_id))

    def runs(self, trigger_id: str, *, key: str | None = None, limit: int | None = None) -> builtins.list[TriggerRun]:
        return self._portal.run(lambda: self._async.runs(trigger_id, key=key, limit=limit))


class LlmKeys:
    """`client.keys` (AsyncLlmKeys without await)."""

    def __init__(self, portal: _Portal, keys: AsyncLlmKeys) -> None:
        self._portal = portal
        self._async = keys

    def set(self, api_key: str, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyStored:
        return self._portal.run(lambda: self._async.set(api_key, provider=provider, user_id=user_id))

    def get(self, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyStatus:
        return self._portal.run(lambda: self._async.get(provider=provider, user_id=user_id))

    def delete(self, *, provider: str | None = None, user_id: str | None = None) -> LlmKeyDeleted:
        return self._portal.run(lambda: self._async.delete(provider=provider, user_id=user_id))


class Budgets:
    """`client.budgets` (AsyncBudgets without await)."""

    def __init__(self, portal: _Portal, budgets: AsyncBudgets) -> None:
        self._portal = portal
        self._async = budgets

    def get(self, *, user_id: str | None = None) -> Budget:
        return self._portal.run(lambda: self._async.get(user_id=user_id))

    def set(self, user_id: str, *, max_tokens: int | None = None, max_cost_usd: float | None = None) -> Budget:
        return self._portal.run(lambda: self._async.set(user_id, max_tokens=max_tokens, max_cost_usd=max_cost_usd))
