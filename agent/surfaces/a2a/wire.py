"""Agent-surface shapes of SPEC.md: the run-summary data part, and SDK objects as JSON we control.

The SDK works with protobuf objects; the JSON SPEC.md shows is the A2A 0.3 form (`kind`, lowercase
states). We render through the SDK's own 0.3 conversions and then add what SPEC.md spells in
snake_case (`context_id`, `task_id`) beside the standard camelCase keys.

protobuf's `Struct` stores every number as a double, so `task_count: 3` comes back as `3.0`;
`restore_ints` turns whole floats back into integers everywhere except progress values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from a2a.compat.v0_3 import conversions
from a2a.helpers.proto_helpers import new_data_message
from a2a.types.a2a_pb2 import Message, Task, TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent
from google.protobuf.json_format import MessageToDict

from taskgrove.executors import struct_values

PROTOCOL = "a2a"
# Keys whose values are fractions by nature: a whole 1.0 must stay a float there.
FLOAT_KEYS = frozenset({"progress", "tree_progress", "task_progress"})
TERMINAL_STATES = frozenset({
    TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED,
})


def restore_ints(value: Any) -> Any:
    """Whole floats back to ints (protobuf Struct turned them into doubles), progress excepted."""
    return struct_values.restore_ints(value, FLOAT_KEYS)


def run_data(status: str, progress: float, root_task_id: str, task_count: int, **extra: Any) -> dict[str, Any]:
    """The data part every agent-surface status message carries (SPEC.md, Agent-surface task)."""
    data: dict[str, Any] = {
        "protocol": PROTOCOL,
        "status": status,
        "progress": float(progress),
        "root_task_id": root_task_id,
        "task_count": int(task_count),
    }
    data.update({k: v for k, v in extra.items() if v is not None})
    return data


def data_message(data: Mapping[str, Any], *, task_id: str | None = None, context_id: str | None = None) -> Message:
    return new_data_message(dict(data), task_id=task_id, context_id=context_id)


def message_data(message: Message) -> dict[str, Any]:
    """The first object data part of a message (the run summary), as plain JSON."""
    for part in message.parts:
        if part.HasField("data"):
            value = restore_ints(MessageToDict(part.data))
            if isinstance(value, dict):
                return value
    return {}


def snake_keys(obj: dict[str, Any]) -> dict[str, Any]:
    """Add `context_id` / `task_id` beside `contextId` / `taskId` (SPEC.md spells them so)."""
    if "contextId" in obj:
        obj["context_id"] = obj["contextId"]
    if obj.get("kind") in ("status-update", "artifact-update") and "taskId" in obj:
        obj["task_id"] = obj["taskId"]
    return obj


def spec_json(compat: dict[str, Any]) -> dict[str, Any]:
    """A 0.3 JSON object (task or event) in SPEC.md's form: snake keys added, ints restored."""
    return snake_keys(restore_ints(compat))


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def task_json(task: Task) -> dict[str, Any]:
    """The agent-surface task object: `kind: task`, `context_id` = root task id, status, artifacts, metadata."""
    return spec_json(_dump(conversions.to_compat_task(task)))


def event_json(event: Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent | Message) -> dict[str, Any]:
    """One streamed object in the 0.3 form; status updates carry `final` (true on a terminal state)."""
    if isinstance(event, Task):
        return task_json(event)
    if isinstance(event, TaskStatusUpdateEvent):
        return spec_json(_dump(conversions.to_compat_task_status_update_event(event)))
    if isinstance(event, TaskArtifactUpdateEvent):
        return spec_json(_dump(conversions.to_compat_task_artifact_update_event(event)))
    return spec_json(_dump(conversions.to_compat_message(event)))
