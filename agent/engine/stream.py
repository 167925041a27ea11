"""Engine events in the wire shapes of SPEC.md (SSE of tasks.execute, webhook payloads)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from taskgrove.agent.engine.bus import FINAL, TASK_CANCELLED, TASK_COMPLETED, TASK_FAILED
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.clock import now_iso

# Cancellation has no event type of its own in SPEC.md: it is reported as task_failed with
# status "cancelled".
_WIRE_TYPE = {TASK_CANCELLED: TASK_FAILED}


def wire_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """One engine event as the SSE stream sends it."""
    kind = event["type"]
    out: dict[str, Any] = {
        "type": _WIRE_TYPE.get(kind, kind),
        "task_id": event["task_id"],
        "root_task_id": event["root_task_id"],
        "status": event["status"],
        "progress": event.get("progress", 0.0),
        "timestamp": event["timestamp"],
    }
    if event.get("message") is not None:
        out["message"] = event["message"]
    if kind == TASK_COMPLETED:
        out["result"] = event.get("result")
    elif kind in (TASK_FAILED, TASK_CANCELLED):
        out["error"] = event.get("error")
    elif kind == FINAL:
        out["final"] = True
        out["result"] = run_summary(event)
    return out


def run_summary(event: Mapping[str, Any]) -> dict[str, Any]:
    status = event["status"] if event["type"] == FINAL else TaskStatus.IN_PROGRESS.value
    progress = event["progress"] if event["type"] == FINAL else event.get("tree_progress", 0.0)
    return {"status": status, "progress": progress, "root_task_id": event["root_task_id"],
            "task_count": event.get("task_count")}


async def sse_events(events: AsyncIterable[Mapping[str, Any]], tree_id: str) -> AsyncIterator[dict[str, Any]]:
    """Events of one execution until `final`, then `stream_end`.

    `events`: what to send, normally `follow.follow_execution`, which always ends with `final`.
    """
    async for event in events:
        yield wire_event(event)
        if event["type"] == FINAL:
            break
    yield {"type": "stream_end", "task_id": tree_id, "root_task_id": tree_id, "timestamp": now_iso()}
