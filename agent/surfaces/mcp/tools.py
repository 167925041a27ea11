"""The MCP tools: one per JSON-RPC method, with the input JSON Schema of its params and a
description written for an LLM that has to build a correct task tree.

A tool is only a name, a schema and the JSON-RPC method it calls: the call goes to the same
handler as /tasks and /system (services.task_methods / system_methods), so validation,
permission rules and error messages live once, in agent/services/task_service.py and agent/services/system_service.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskgrove.agent.surfaces.mcp.agent_tools import agent_specs
from taskgrove.agent.surfaces.mcp.trigger_tools import trigger_specs
from taskgrove.storage.status import TASK_STATUSES, TaskStatus


@dataclass(frozen=True)
class ToolSpec:
    name: str
    method: str  # the JSON-RPC method the tool calls
    table: str  # "tasks" or "system"
    description: str
    schema: dict[str, Any]


TASK_ID = {"type": "string", "minLength": 1, "description": "The id of a stored task."}
SETTABLE_STATUSES = [s for s in TASK_STATUSES if s != TaskStatus.IN_PROGRESS]


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def task_schema(executor_ids: list[str]) -> dict[str, Any]:
    """One task of a new tree (tasks.create)."""
    method: dict[str, Any] = {"type": "string", "description": "The executor that runs this task."}
    if executor_ids:
        method["enum"] = executor_ids
    return {
        "type": "object",
        "required": ["name"],
        "properties": {
            "id": {"type": "string", "minLength": 1,
                   "description": "Your id for this task (a UUID is generated when omitted); other tasks of "
                                  "the same call refer to it in parent_id and dependencies."},
            "name": {"type": "string", "minLength": 1, "description": "Short human-readable name."},
            "description": {"type": "string"},
            "parent_id": {"type": ["string", "null"],
                          "description": "The task this one is filed under. Organises the tree only: it does "
                                         "NOT make the parent wait or run first. Exactly one task (the root) has "
                                         "no parent_id; every other task's parent must be in the same call."},
            "dependencies": {
                "type": "array",
                "description": "The tasks that must finish before this one starts; this alone decides the "
                               "order. Results of dependencies are passed to this task's executor. Ids must "
                               "be tasks of the same call; no cycles.",
                "items": {"type": "object", "required": ["id"], "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "required": {"type": "boolean", "default": True,
                                 "description": "true: the dependency must complete; false: it only has to "
                                                "end (completed, failed or cancelled)."}}},
            },
            "priority": {"type": "integer", "minimum": 0, "maximum": 3, "default": 1,
                         "description": "0 is most urgent; among runnable tasks lower numbers run first."},
            "schemas": _obj({"method": method, "input_schema": {"type": "object"}},
                            ) | {"description": "schemas.method names the executor. A task without one "
                                                "just groups its children and completes."},
            "inputs": {"type": "object", "description": "The executor's inputs (see system_executors)."},
            "params": {"type": "object", "description": "Executor configuration (e.g. executor_id)."},
            "user_id": {"type": "string", "description": "Owner; defaults to the caller. One owner per tree."},
            "retry": {"type": "object", "description": "Retry policy (max_attempts, backoff...)."},
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0},
            "status": {"type": "string", "enum": SETTABLE_STATUSES,
                       "description": "Normally omitted (new tasks are pending)."},
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }


def tool_specs(executor_ids: list[str]) -> list[ToolSpec]:
    executors = ", ".join(executor_ids) or "none"
    tree_rules = (
        "A tree is a flat list of tasks. parent_id only organises tasks into one tree (exactly one root "
        "without parent_id); it never orders execution. dependencies decide order: a task runs when "
        "every required dependency has completed. Independent tasks run concurrently, by priority "
        f"(0 first). Executors available here (schemas.method): {executors}."
    )
    return [
        ToolSpec("tasks_create", "tasks.create", "tasks",
                 "Create a task tree and execute it at once; returns the root with nested children after "
                 "execution (or when the service's wait time is up; poll tasks_tree then). " + tree_rules
                 + " An invalid tree is refused whole and nothing is stored.",
                 _obj({"tasks": {"type": "array", "minItems": 1, "items": task_schema(executor_ids),
                                 "description": "Every task of the tree, root included."}}, ["tasks"])),
        ToolSpec("tasks_get", "tasks.get", "tasks",
                 "Read one task (status, progress, inputs, result, error). Returns null when it does not exist.",
                 _obj({"task_id": TASK_ID}, ["task_id"])),
        ToolSpec("tasks_tree", "tasks.tree", "tasks",
                 "Read the whole tree a task belongs to: the root with nested children, each with its "
                 "status and result.",
                 _obj({"task_id": TASK_ID}, ["task_id"])),
        ToolSpec("tasks_list", "tasks.list", "tasks",
                 "List tasks you may see, newest first.",
                 _obj({"user_id": {"type": "string"},
                       "status": {"type": "string", "enum": [*TASK_STATUSES, "deleted"]},
                       "waiting": {"type": "boolean", "description": "true: only tasks that wait (for an "
                                                                     "answer, an event or a time); false: the others."},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                       "offset": {"type": "integer", "minimum": 0, "default": 0}})),
        ToolSpec("tasks_children", "tasks.children", "tasks",
                 "The direct children (by parent_id) of a task, in creation order.",
                 _obj({"parent_id": TASK_ID}, ["parent_id"])),
        ToolSpec("tasks_update", "tasks.update", "tasks",
                 "Change fields of a task and get the updated task. dependencies may only change while the "
                 "task is pending and must stay inside its tree without cycles; parent_id and user_id cannot "
                 "change; archives are read-only.",
                 _obj({"task_id": TASK_ID,
                       "status": {"type": "string", "enum": list(TASK_STATUSES)},
                       "name": {"type": "string", "minLength": 1},
                       "description": {"type": "string"},
                       "priority": {"type": "integer", "minimum": 0, "maximum": 3},
                       "inputs": {"type": "object", "description": "Replaces the inputs."},
                       "params": {"type": "object"},
                       "schemas": {"type": "object"},
                       "dependencies": task_schema(executor_ids)["properties"]["dependencies"],
                       "result": {"description": "Replaces the result."},
                       "error": {"type": ["string", "null"]},
                       "progress": {"type": "number", "minimum": 0, "maximum": 1},
                       "started_at": {"type": ["string", "null"]},
                       "completed_at": {"type": ["string", "null"]},
                       "retry": {"type": "object"},
                       "timeout_seconds": {"type": ["number", "null"]}}, ["task_id"])),
        ToolSpec("tasks_delete", "tasks.delete", "tasks",
                 "Delete a task and its subtree; only when all of them are pending and no other task "
                 "depends on them.",
                 _obj({"task_id": TASK_ID}, ["task_id"])),
        ToolSpec("tasks_copy", "tasks.copy", "tasks",
                 "Copy a task's subtree (and the tasks depending on it) as a new pending tree; not executed. "
                 "Run the copy with tasks_execute.",
                 _obj({"task_id": TASK_ID,
                       "children": {"type": "boolean", "default": False,
                                    "description": "Also copy each direct child's dependencies."}}, ["task_id"])),
        ToolSpec("tasks_clone", "tasks.clone", "tasks",
                 "Clone a tree: copy (new pending tasks), link (keeps results; whole tree must be completed), "
                 "archive (read-only snapshot) or mixed (link_task_ids linked, the rest copied). save=false "
                 "only previews the tasks.",
                 _obj({"task_id": TASK_ID,
                       "origin_type": {"type": "string", "enum": ["copy", "link", "archive", "mixed"],
                                       "default": "copy"},
                       "link_task_ids": {"type": "array", "items": {"type": "string"}},
                       "recursive": {"type": "boolean", "default": True},
                       "children": {"type": "boolean", "default": False},
                       "reset_fields": {"type": ["array", "object"], "items": {"type": "string"}},
                       "save": {"type": "boolean", "default": True}}, ["task_id"])),
        ToolSpec("tasks_execute", "tasks.execute", "tasks",
                 "Execute a stored tree (a root runs the whole tree; a child runs with its dependencies; only "
                 "pending and failed tasks run). Sends progress notifications while it runs and returns the "
                 "final tree.",
                 _obj({"task_id": TASK_ID,
                       "copy_execution": {"type": "boolean", "default": False,
                                          "description": "Run a fresh copy instead of the task itself."},
                       "copy_children": {"type": "boolean", "default": False}}, ["task_id"])),
        ToolSpec("tasks_cancel", "tasks.cancel", "tasks",
                 "Cancel tasks (running work is stopped). One result per task.",
                 _obj({"task_ids": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                       "force": {"type": "boolean", "default": False},
                       "error_message": {"type": "string"}}, ["task_ids"])),
        ToolSpec("tasks_generate", "tasks.generate", "tasks",
                 "Ask the service's LLM to turn a requirement into a task tree built from the available "
                 f"executors ({executors}); save=true also creates it. Needs an LLM key on the service.",
                 _obj({"requirement": {"type": "string", "minLength": 1},
                       "user_id": {"type": "string"},
                       "llm_provider": {"type": "string"},
                       "model": {"type": "string"},
                       "temperature": {"type": "number", "minimum": 0, "maximum": 2},
                       "max_tokens": {"type": "integer", "minimum": 1, "maximum": 200000},
                       "save": {"type": "boolean", "default": False}}, ["requirement"])),
        ToolSpec("tasks_running", "tasks.running.list", "tasks",
                 "The tasks executing right now.",
                 _obj({"user_id": {"type": "string"},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}})),
        ToolSpec("tasks_respond", "tasks.respond", "tasks",
                 "Answer a task that waits for input (its `waiting` shows kind input, the prompt and the JSON "
                 "Schema the answer must pass); the task goes on with `value` as its answer. Refused: a value the "
                 "schema refuses, a task that waits for no input, a second answer.",
                 _obj({"task_id": TASK_ID,
                       "value": {"description": "The answer: any JSON value the wait's schema accepts."}},
                      ["task_id", "value"])),
        ToolSpec("events_emit", "events.emit", "tasks",
                 "Emit an event: every task of your user that waits for an event of this name, and whose "
                 "match keys all have the same values in the payload, goes on with the payload as its result. "
                 "Returns how many waits it resumed (resumed, task_ids).",
                 _obj({"name": {"type": "string", "minLength": 1, "maxLength": 255},
                       "payload": {"type": "object", "default": {}},
                       "user_id": {"type": "string", "description": "Another user's event (admins only)."}},
                      ["name"])),
        ToolSpec("tasks_purge", "tasks.purge", "tasks",
                 "Admins only: delete now every tree whose every task ended longer ago than older_than (with "
                 "its executions and logs), old idempotency records, old events no waiting task can count, and "
                 "schedules' runs beyond the newest kept. Nothing running, waiting or pending is touched. Returns "
                 "what was deleted (swept false: another instance was sweeping).",
                 _obj({"older_than": {"type": ["string", "number"],
                                      "description": "A duration: 30d, 12h, 15m, 90s, or a number of seconds. "
                                                     "Default: the service's SERVICE_RETENTION."}})),
        *schedule_specs(),
        *(ToolSpec(*spec) for spec in agent_specs()),
        *(ToolSpec(*spec) for spec in trigger_specs()),
        ToolSpec("system_executors", "system.executors", "system",
                 "The executors this service offers, with their input schemas: what schemas.method may name.",
                 _obj({})),
        ToolSpec("system_health", "system.health", "system",
                 "Service health, version and number of running tasks.",
                 _obj({})),
    ]


SCHEDULE_ID = {"type": "string", "minLength": 1, "description": "The id of a schedule."}


def schedule_fields() -> dict[str, Any]:
    """What schedules_create and schedules_update may set (agent/services/schedule_service.py checks them)."""
    return {
        "cron": {"type": "string", "description": "Five-field cron expression (minute hour day-of-month month "
                                                  "day-of-week), read in `timezone`. Give cron or interval_seconds."},
        "interval_seconds": {"type": "number", "minimum": 1, "description": "Run every this many seconds."},
        "timezone": {"type": "string", "default": "UTC", "description": "IANA time zone of the cron expression."},
        "enabled": {"type": "boolean", "default": True},
        "max_runs": {"type": "integer", "minimum": 1, "description": "Stop after this many runs."},
        "start_at": {"type": "string", "description": "ISO 8601 date-time: no run before it (the first interval "
                                                      "slot)."},
        "end_at": {"type": "string", "description": "ISO 8601 date-time: no run after it."},
        "overlap": {"type": "string", "enum": ["skip", "allow"], "default": "skip",
                    "description": "skip: a slot whose previous run still runs is skipped."},
        "catch_up": {"type": "string", "enum": ["latest", "none"], "default": "latest",
                     "description": "After downtime: latest runs once for the missed slots; none runs none."},
        "webhook_config": {"type": "object", "required": ["url"],
                           "description": "Events of every run are posted here, as for tasks_execute."},
    }


def schedule_specs() -> list[ToolSpec]:
    return [
        ToolSpec("schedules_create", "schedules.create", "tasks",
                 "Run a stored tree on a cron expression or an interval: each run executes a fresh copy of the "
                 "template tree (task_id, a root), whose original_task_id points to the template. Returns the "
                 "schedule with next_run_at.",
                 _obj({"task_id": TASK_ID, **schedule_fields()}, ["task_id"])),
        ToolSpec("schedules_get", "schedules.get", "tasks",
                 "Read one schedule (next_run_at, last_run_at, last_root_task_id, runs). Null when it does not exist.",
                 _obj({"schedule_id": SCHEDULE_ID}, ["schedule_id"])),
        ToolSpec("schedules_list", "schedules.list", "tasks",
                 "List the schedules you may see, newest first.",
                 _obj({"user_id": {"type": "string"}, "task_id": TASK_ID,
                       "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                       "offset": {"type": "integer", "minimum": 0, "default": 0}})),
        ToolSpec("schedules_update", "schedules.update", "tasks",
                 "Change a schedule (its template cannot change); enabled=false stops new runs. Setting cron "
                 "replaces interval_seconds and the other way round.",
                 _obj({"schedule_id": SCHEDULE_ID, **schedule_fields()}, ["schedule_id"])),
        ToolSpec("schedules_delete", "schedules.delete", "tasks",
                 "Delete a schedule: no new runs; the runs made so far stay.",
                 _obj({"schedule_id": SCHEDULE_ID}, ["schedule_id"])),
        ToolSpec("schedules_trigger", "schedules.trigger", "tasks",
                 "Run the schedule's template now (one more run; the next slot is unchanged). Returns the "
                 "schedule and root_task_id, the run's root.",
                 _obj({"schedule_id": SCHEDULE_ID}, ["schedule_id"])),
    ]
