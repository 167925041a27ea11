"""The MCP tools of event triggers (docs/triggers.md): one per `triggers.*` method.

Beside agent/surfaces/mcp/tools.py, which makes them ToolSpecs and lists them with the others (the
pattern of agent_tools.py); each is a name, the JSON-RPC method it calls, its table, a
description and a schema (agent/services/trigger_service.py holds the rules).
"""

from __future__ import annotations

from typing import Any

Spec = tuple[str, str, str, str, dict[str, Any]]  # ToolSpec's fields, in its order
TRIGGER_ID = {"type": "string", "minLength": 1, "description": "The id of a trigger."}
SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": 604800}


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **({"required": required} if required else {})}


def trigger_fields() -> dict[str, Any]:
    """What triggers_create and triggers_update may set."""
    return {
        "event": {"type": "string", "minLength": 1, "maxLength": 255, "description": "The event name it listens to."},
        "match": {"type": ["object", "null"], "description": "Payload keys and the values they must have."},
        "key": {"type": ["string", "null"], "description": "The payload field runs are keyed by (debounce, batch, "
                                                           "singleton and cancel_on work per key)."},
        "debounce": {"type": ["object", "null"], "description": "One run with the last payload once the key has "
                     "been quiet for seconds (or max_wait_seconds after its first event).",
                     "properties": {"seconds": SECONDS, "max_wait_seconds": SECONDS}, "required": ["seconds"]},
        "batch": {"type": ["object", "null"], "description": "One run per size events (inputs.events, a list), or "
                  "after seconds (default 60) with fewer.",
                  "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 1000}, "seconds": SECONDS},
                  "required": ["size"]},
        "singleton": {"type": ["string", "null"], "enum": ["skip", "queue", "replace", None],
                      "description": "One run per key at a time: skip the new events, queue them, or replace "
                                     "(cancel the running one, start the new)."},
        "cancel_on": {"type": ["string", "null"], "description": "An event name whose event with the same key "
                                                                  "cancels the key's running runs."},
        "enabled": {"type": "boolean", "default": True},
    }


def trigger_specs() -> list[Spec]:
    return [
        ("triggers_create", "triggers.create", "tasks",
         "Start a copy of a stored tree (task_id: its root) for every matching event (events_emit): the payload "
         "is the root's inputs.event (inputs.events with batch). Returns the trigger.",
         _obj({"task_id": {"type": "string", "minLength": 1}, **trigger_fields()}, ["task_id", "event"])),
        ("triggers_get", "triggers.get", "tasks",
         "Read one trigger with its counters (matched, runs, debounced, batched, skipped, cancelled) and how many "
         "events wait. Null when it does not exist.", _obj({"trigger_id": TRIGGER_ID}, ["trigger_id"])),
        ("triggers_list", "triggers.list", "tasks", "List the triggers you may see, newest first.",
         _obj({"task_id": {"type": "string"}, "event": {"type": "string"}, "user_id": {"type": "string"},
               "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
               "offset": {"type": "integer", "minimum": 0, "default": 0}})),
        ("triggers_update", "triggers.update", "tasks",
         "Change a trigger (its template cannot change); enabled=false stops taking events in.",
         _obj({"trigger_id": TRIGGER_ID, **trigger_fields()}, ["trigger_id"])),
        ("triggers_delete", "triggers.delete", "tasks",
         "Delete a trigger: its waiting events are dropped; the runs it started stay.",
         _obj({"trigger_id": TRIGGER_ID}, ["trigger_id"])),
        ("triggers_runs", "triggers.runs", "tasks",
         "The runs a trigger started, newest first: root_task_id, key, events, status, final_status, and "
         "cancel_reason when the trigger cancelled it.",
         _obj({"trigger_id": TRIGGER_ID, "key": {"type": "string"},
               "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 20}}, ["trigger_id"])),
    ]
