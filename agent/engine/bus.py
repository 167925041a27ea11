"""The one in-process event bus: every status and progress change is published here once.

SSE streams, WebSocket and GraphQL subscriptions, webhooks and A2A push notifications all
subscribe to it. Each subscriber has its own bounded queue; a subscriber that falls behind loses
its oldest events (and is told so) instead of slowing the engine down.

A service that must hear one rare kind of event for the life of the process (a cancelled task,
say) watches that kind instead of subscribing: a watcher is called with each event of its kinds
and does not count as a subscriber, so events nobody subscribed to are still not built
(engine/publish.py `Publisher.listened`) for a plain run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

Event = dict[str, Any]
Filter = Callable[[Event], bool]
Watcher = Callable[[Event], None]

# Event types, shared by every surface (SPEC.md, Streaming events).
TASK_START = "task_start"
PROGRESS = "progress"
TASK_COMPLETED = "task_completed"
TASK_FAILED = "task_failed"
TASK_CANCELLED = "task_cancelled"
FINAL = "final"


class BusSubscription:
    def __init__(self, bus: "EventBus", match: Filter, maxsize: int) -> None:
        self._bus = bus
        self._match = match
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=maxsize)
        self.dropped = 0
        self.closed = False

    def offer(self, event: Event) -> None:
        if self.closed or not self._match(event):
            return
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(event)

    async def get(self) -> Event:
        return await self.queue.get()

    def close(self) -> None:
        self.closed = True
        self._bus._subscribers.discard(self)

    async def __aiter__(self) -> AsyncIterator[Event]:
        try:
            while not self.closed:
                yield await self.queue.get()
        finally:
            self.close()

    def __enter__(self) -> "BusSubscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[BusSubscription] = set()
        self._watchers: dict[str, list[Watcher]] = {}

    def watch(self, kinds: tuple[str, ...], watcher: Watcher) -> Callable[[], None]:
        """Call `watcher` (synchronously: it must only hand the event on) with every event of
        `kinds`; returns the function that stops it."""
        for kind in kinds:
            self._watchers.setdefault(kind, []).append(watcher)

        def unwatch() -> None:
            for kind in kinds:
                watchers = self._watchers.get(kind, [])
                if watcher in watchers:
                    watchers.remove(watcher)
                if not watchers:
                    self._watchers.pop(kind, None)
        return unwatch

    def watched(self, kind: str) -> bool:
        """Whether a watcher wants events of `kind` (an event nobody subscribed to is built for it)."""
        return kind in self._watchers

    def subscribe(self, match: Filter | None = None, *, maxsize: int = 1000) -> BusSubscription:
        sub = BusSubscription(self, match or (lambda _e: True), maxsize)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: Event) -> None:
        for sub in tuple(self._subscribers):
            sub.offer(event)
        for watcher in tuple(self._watchers.get(event.get("type", ""), ())):
            watcher(event)

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
