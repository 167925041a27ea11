"""Where the engine's events go: this instance's bus, and (PostgreSQL) the other instances.

Every status and progress change of an execution is published once, here, with the tree's
progress at that moment; surfaces subscribe to the bus (engine/bus.py).
"""

from __future__ import annotations

from typing import Any

from taskgrove.agent.engine.bus import EventBus
from taskgrove.agent.engine.notify import PgNotifier
from taskgrove.agent.engine.tree_run import TreeRun
from taskgrove.storage.clock import now_iso


class Publisher:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        # PostgreSQL only, set when the engine starts: carries events and cancels to the other
        # instances (engine/notify.py).
        self.notifier: PgNotifier | None = None

    @property
    def listened(self) -> bool:
        """Whether an event would reach anyone: a subscriber here (a stream, a webhook, a waiting
        A2A call, ...) or another instance. Nobody listens to most of a plain create's events;
        building them cost ~3 us each, three a task (hot callers ask first, publish() too)."""
        return self.bus.has_subscribers or (self.notifier is not None and self.notifier.peers)

    def publish(self, run: TreeRun, kind: str, tid: str, **data: Any) -> None:
        """An event about task `tid` of `run`."""
        if not self.listened and not self.bus.watched(kind):
            return
        row = run.rows.get(tid, {})
        event = {
            "type": kind,
            "task_id": tid,
            "root_task_id": run.tree_id,
            "name": row.get("name"),
            "user_id": row.get("user_id"),
            "tree_progress": run.progress,
            "task_count": run.task_count,
            "timestamp": now_iso(),
            **data,
        }
        self.emit(event)

    def emit(self, event: dict[str, Any]) -> None:
        self.bus.publish(event)
        if self.notifier is not None:
            self.notifier.event(event)
