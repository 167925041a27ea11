"""Following a tree live over the service's WebSocket `/ws` until it settles, through dropped
connections.

When is a tree done? A failed task's dependents stay `pending` for good (DESIGN.md), so "every
task finished" may never come. The tree is settled when nothing is `in_progress` and no `pending`
task can still run (its required dependencies completed, its optional ones finished), or when its
root was cancelled and nothing is `in_progress`. A finished root alone is not enough: a root that
depends on none of its children may finish first. Decided only once every task's current state
has arrived, so never on a state older than the subscription.

Why the final event cannot be missed: when a connection drops, the watch waits (with backoff),
reads the whole tree again with `tasks.tree` (whatever changed meanwhile becomes an event, marked
`snapshot`), and only then subscribes again; if the tree settled during the outage, that read
shows it and the `final` event follows. The service drops the oldest events of a client that
reads too slowly, so a connection silent for `resync_after` seconds is checked the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic

from taskgrove.client.exceptions import (INVALID_PARAMS, PERMISSION_DENIED, NotFound, PermissionDenied, TaskgroveError,
                                     Unavailable, Unreachable, from_rpc_error)
from taskgrove.client.answers import AnswerT, Event, EventData, TaskStatus, TaskTree, Wait

log = logging.getLogger("taskgrove.client")

# One /ws connection watches at most this many tasks (the service's MAX_SUBSCRIPTIONS).
WS_SUBSCRIPTIONS = 1000
TASK_EVENTS = ("task_status", "task_progress", "task_completed", "task_failed")
FINISHED = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


@dataclass
class WatchedTask:
    """What a watch knows of one task of the tree, kept current by its events."""

    id: str
    name: str
    status: TaskStatus
    progress: float = 0.0
    dependencies: list[tuple[str, bool]] = field(default_factory=list)  # (task id, required)
    error: str | None = None
    waiting: Wait | None = None


class WatchState:
    """Every task of one tree, fed by /ws messages and by fresh reads of the tree."""

    def __init__(self, tree: TaskTree) -> None:
        self.root_id = tree.id
        self.tasks: dict[str, WatchedTask] = {}
        self.unseen: set[str] = set()
        self.questions: dict[str, tuple[str | None, str | None]] = {}  # task id -> the question handed out
        self.apply_tree(tree)
        self.unseen = set(self.tasks)  # the first subscription's snapshots decide, not this read

    def apply_tree(self, tree: TaskTree) -> tuple[list[Event[Any]], bool]:
        """Take a fresh read of the tree in; the events of what changed, and whether it has new tasks."""
        events: list[Event[Any]] = []
        grown = False
        for node in tree.walk():
            known = self.tasks.get(node.id)
            if known is None:
                grown = bool(self.tasks)  # tasks added to a tree already watched need subscribing
                self.tasks[node.id] = WatchedTask(
                    node.id, node.name, node.status, node.progress,
                    [(d.id, d.required) for d in node.dependencies], node.error, node.waiting)
                continue
            before = (known.status, known.progress, known.waiting)
            known.status, known.progress, known.waiting = node.status, node.progress, node.waiting
            known.error = node.error or known.error
            if (known.status, known.progress, known.waiting) != before:
                events.append(self._asked(_snapshot_event(node)))
        self.unseen.clear()
        return events, grown

    def apply_message(self, message: Mapping[str, Any]) -> Event[Any] | None:
        """Take one /ws message in; the event it is, or None when it changes nothing known."""
        kind = message.get("type")
        task_id = message.get("task_id")
        if kind == "error":
            raise _refusal(message)
        if kind not in TASK_EVENTS or not isinstance(task_id, str) or task_id not in self.tasks:
            return None
        event: Event[Any] = Event.model_validate(message)
        task = self.tasks[task_id]
        first = task_id in self.unseen
        self.unseen.discard(task_id)
        before = (task.status, task.progress, task.waiting)
        task.status = event.data.status
        if "waiting" in event.data.model_fields_set:  # it parked (its wait) or resumed (null)
            task.waiting = event.data.waiting
        elif task.status != TaskStatus.IN_PROGRESS:
            task.waiting = None
        if event.data.progress is not None:
            task.progress = float(event.data.progress)
        if task.status == TaskStatus.COMPLETED:
            task.progress = 1.0
        if event.data.error:
            task.error = event.data.error
        if event.data.snapshot and not first and (task.status, task.progress, task.waiting) == before:
            return None  # a reconnection's snapshot of what was known already
        return self._asked(event)

    def _asked(self, event: Event[Any]) -> Event[Any]:
        """`event`, marked as repeating when this watch already handed out the question it carries
        (the same wait: when it began and its prompt), so that each question is answered once."""
        waiting = event.data.waiting
        if waiting is None or not waiting.wants_input:
            return event
        question = (waiting.since, waiting.prompt)
        if self.questions.get(event.task_id) == question:
            return event.repeating()
        self.questions[event.task_id] = question
        return event

    def settled(self) -> bool:
        if self.unseen:
            return False
        if any(t.status == TaskStatus.IN_PROGRESS for t in self.tasks.values()):
            return False
        if self.tasks[self.root_id].status == TaskStatus.CANCELLED:
            return True
        return not any(self._runnable(t) for t in self.tasks.values())

    def succeeded(self) -> bool:
        return all(t.status == TaskStatus.COMPLETED for t in self.tasks.values())

    def final_event(self) -> Event[Any]:
        status = TaskStatus.COMPLETED if self.succeeded() else TaskStatus.FAILED
        root = self.tasks[self.root_id]
        return Event(type="final", task_id=self.root_id, context_id=self.root_id,
                     data=EventData(status=status, progress=root.progress, name=root.name,
                                    statuses={tid: t.status for tid, t in self.tasks.items()}))

    def _runnable(self, task: WatchedTask) -> bool:
        if task.status != TaskStatus.PENDING:
            return False
        for dep_id, required in task.dependencies:
            target = self.tasks.get(dep_id)
            if target is None:
                continue  # outside this tree: the service decides
            if target.status not in ((TaskStatus.COMPLETED,) if required else FINISHED):
                return False
        return True


def _snapshot_event(node: TaskTree) -> Event[Any]:
    kind = {TaskStatus.COMPLETED: "task_completed", TaskStatus.FAILED: "task_failed",
            TaskStatus.CANCELLED: "task_failed"}.get(node.status, "task_status")
    data: dict[str, Any] = {"status": node.status, "progress": node.progress, "name": node.name,
                            "snapshot": True, "waiting": node.waiting}
    if node.status == TaskStatus.COMPLETED:
        data["result"] = node.result
    elif node.status in FINISHED:
        data["error"] = node.error
    return Event.model_validate({"type": kind, "task_id": node.id, "context_id": node.task_tree_id, "data": data})


def _refusal(message: Mapping[str, Any]) -> TaskgroveError:
    """A /ws error message about a watched task: the exception the same refusal of tasks.get is."""
    given = message.get("data")
    data: dict[str, Any] = given if isinstance(given, dict) else {}
    code = data.get("code")
    text = str(message.get("message") or data.get("message") or "the service refused the subscription")
    if code == INVALID_PARAMS and "not found" in text:
        return NotFound(text, code=code, data=text, method="watch")
    if code == PERMISSION_DENIED:
        return PermissionDenied(text, code=code, data=text, method="watch")
    return from_rpc_error({"code": code, "message": text, "data": text}, method="watch")


class _Dropped(Exception):
    """The connection ended or could not be opened; the watch reconnects."""


class _Regrow(Exception):
    """The tree has tasks the connections do not watch yet; subscribe again at once."""


class TreeWatch(Generic[AnswerT]):
    """The events of one tree until it settles: `async for event in client.watch(tree_id)`.

    `tasks` is what the watch knows of every task, current as of the last event. Use it as an
    async context manager (`async with client.watch(...) as events:`) to close its connections
    as soon as the block ends, also when you stop reading before the `final` event."""

    def __init__(self, *, url: str, headers: Mapping[str, str], read_tree: Callable[[str], Awaitable[TaskTree]],
                 tree: str | TaskTree, responder: Callable[[str, Any], AnswerT], reconnect_for: float,
                 resync_after: float, backoff: float = 0.5, max_backoff: float = 10.0) -> None:
        self._ws_url = ("ws" + url[len("http"):] if url.startswith("http") else url) + "/ws"
        self._headers = dict(headers)
        self._read_tree = read_tree
        self._tree = tree
        self._responder = responder
        self._reconnect_for = reconnect_for
        self._resync_after = resync_after
        self._backoff = backoff
        self._max_backoff = max_backoff
        self.state: WatchState | None = None
        self.connections = 0  # connections opened so far (more than the chunks: it reconnected)
        self._events = self._run()

    @property
    def tasks(self) -> Mapping[str, WatchedTask]:
        return self.state.tasks if self.state is not None else {}

    def __aiter__(self) -> TreeWatch[AnswerT]:
        return self

    async def __anext__(self) -> Event[AnswerT]:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def __aenter__(self) -> TreeWatch[AnswerT]:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def _bind(self, event: Event[Any]) -> Event[AnswerT]:
        bound: Event[AnswerT] = event.bound(self._responder)
        return bound

    async def _run(self) -> AsyncGenerator[Event[AnswerT], None]:
        tree = self._tree if isinstance(self._tree, TaskTree) else await self._read_tree(self._tree)
        state = self.state = WatchState(tree)
        loop = asyncio.get_running_loop()
        outage: float | None = None
        failures = 0
        while True:
            try:
                async with contextlib.aclosing(self._messages(list(state.tasks))) as messages:
                    async for message in messages:
                        if message is None:  # a silent connection: are events lost? read the tree
                            try:
                                fresh = await self._read_tree(state.root_id)
                            except (Unreachable, Unavailable) as exc:
                                raise _Dropped(str(exc)) from None
                            events, grown = state.apply_tree(fresh)
                            for event in events:
                                yield self._bind(event)
                            if grown:
                                raise _Regrow
                        else:
                            outage, failures = None, 0
                            changed = state.apply_message(message)
                            if changed is not None:
                                yield self._bind(changed)
                        if state.settled():
                            yield self._bind(state.final_event())
                            return
                raise _Dropped("the service closed the connection")
            except _Regrow:
                continue
            except _Dropped as dropped:
                now = loop.time()
                outage = outage if outage is not None else now
                failures += 1
                if now - outage > self._reconnect_for:
                    raise Unreachable(f"lost the live connection to {self._ws_url} for more than "
                                      f"{self._reconnect_for:g} s ({dropped})", method="watch") from None
                step = min(self._max_backoff, self._backoff * 2.0 ** (failures - 1))
                log.info("watch of %s: %s; reconnecting in %.1f s", state.root_id, dropped, step)
                await asyncio.sleep(step / 2 + random.uniform(0, step / 2))
                try:
                    fresh = await self._read_tree(state.root_id)
                except (Unreachable, Unavailable):
                    continue  # still away: the next turn waits longer
                events, _grown = state.apply_tree(fresh)
                for event in events:
                    yield self._bind(event)
                if state.settled():
                    yield self._bind(state.final_event())
                    return

    async def _messages(self, task_ids: list[str]) -> AsyncGenerator[dict[str, Any] | None, None]:
        """The messages of /ws for `task_ids` over as many connections as they need, merged; None
        after `resync_after` seconds without any. Raises _Dropped when a connection ends."""
        chunks = [task_ids[i:i + WS_SUBSCRIPTIONS] for i in range(0, len(task_ids), WS_SUBSCRIPTIONS)] or [[]]
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(chunk: list[str]) -> None:
            try:
                async for message in self._connection(chunk):
                    queue.put_nowait(message)
                queue.put_nowait(_Dropped("the service closed the connection"))
            except BaseException as exc:  # handed to the reader, which raises it
                queue.put_nowait(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

        pumps = [asyncio.create_task(pump(chunk)) for chunk in chunks]
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), self._resync_after)
                except asyncio.TimeoutError:
                    yield None
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _connection(self, task_ids: list[str]) -> AsyncIterator[dict[str, Any]]:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        try:
            async with connect(self._ws_url, additional_headers=self._headers, max_size=None,
                               open_timeout=30) as socket:
                self.connections += 1
                for task_id in task_ids:
                    await socket.send(json.dumps({"action": "subscribe", "task_id": task_id}))
                async for raw in socket:
                    message = json.loads(raw)
                    if isinstance(message, dict):
                        yield message
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                said = _said(bytes(exc.response.body or b"")) or f"HTTP {status}"
                raise PermissionDenied(said, code=PERMISSION_DENIED, http_status=status, method="watch") from None
            raise _Dropped(f"the service refused the connection (HTTP {status})") from None
        except (OSError, WebSocketException, asyncio.TimeoutError, EOFError) as exc:
            raise _Dropped(str(exc) or type(exc).__name__) from None


def _said(body: bytes | None) -> str:
    try:
        return str(json.loads(body or b"")["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return ""
