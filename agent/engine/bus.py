"""The one in-process event bus: every status and progress change is published here once.

SSE streams, WebSocket and GraphQL subscriptions, webhooks and A2A push notifications all
subscribe to it. Each subscriber has its own bounded queue; a subscriber that falls behind loses
its oldest events (and is told so) instead of slowing the engine down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

Event = dict[str, Any]
Filter = Callable[[Event], bool]

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

    def subscribe(self, match: Filter | None = None, *, maxsize: int = 1000) -> BusSubscription:
        sub = BusSubscription(self, match or (lambda _e: True), maxsize)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: Event) -> None:
        for sub in tuple(self._subscribers):
            sub.offer(event)

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
