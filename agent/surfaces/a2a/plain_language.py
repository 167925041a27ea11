"""Plain-language A2A requests: a text part is a requirement, planned into a task tree by the LLM.

Other agents write "fetch the three reports and merge them", not a task tree in JSON. When an LLM
is configured, such a message goes through `tasks.generate` (the same prompt, generation, repair
round and tree validation), so a planned tree obeys every rule a sent tree does; it is stored for
the caller and executed like any other.

With `metadata.plan_only: true` (or `metadata.skill: "plan"`, the card's `plan` skill) the plan's
approval is a wait (docs/waits.md), not a mechanism of its own: the planned tree is stored at once
with a gate, a `human_input_executor` child of the root asking "Run this plan?", on which every
task of the plan without dependencies of its own depends. The tree is executed and parks on the
gate, so the agent task is `input-required` through the one path of agent/surfaces/a2a/input_required.py,
with the plan in its data part. A follow-up message on that task (`taskId` set) then decides:
- approve: a data part `{"approve": true}` (or `{"value": "approve"}`) or the text "approve" (also
  "approved", "yes", "ok", "run", "go") answers the gate (WaitService.respond) and the plan runs;
- replace: a data part `{"tasks": [...]}`: the stored plan is cancelled and deleted, that tree is
  stored under the same root id (the agent task's context) and run;
- refine: any other text is added to the requirement, the stored plan cancelled and deleted, and
  the new plan stored and gated the same way (input-required again).

Without an LLM the card lists `application/json` only and a text part is an unsupported content
type (-32005, see message_tree.check_parts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from a2a.types.a2a_pb2 import Message
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.surfaces.a2a.wire import restore_ints
from taskgrove.agent.foundations.calls import CallContext

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

APPROVE_WORDS = frozenset({"approve", "approved", "yes", "ok", "okay", "run", "go", "run it", "go ahead"})
PLAN_SKILL = "plan"
GATE_QUESTION = "Run this plan?"
GATE_EXECUTOR = "human_input_executor"
GATE_ANSWER = "approve"
GATE_SCHEMA = {"type": "string", "enum": [GATE_ANSWER]}  # replace and refine are follow-ups, not answers
REPLY_HINT = ('Reply on this task (message.taskId) with {"approve": true} or the text "approve" to run this '
              'plan, a data part {"tasks": [...]} to run your own tree instead, or more text to plan again')


def texts_of(message: Message) -> list[str]:
    return [part.text for part in message.parts if part.WhichOneof("content") == "text" and part.text.strip()]


def requirement_of(message: Message) -> str:
    """The text parts, plus any data parts as JSON context for the planner (never dropped silently)."""
    text = "\n".join(texts_of(message))
    data = [restore_ints(MessageToDict(p.data)) for p in message.parts if p.WhichOneof("content") == "data"]
    if data:
        text += "\n\nData given with the request (JSON): " + json.dumps(data if len(data) > 1 else data[0])
    return text


def wants_plan_only(metadata: Mapping[str, Any]) -> bool:
    return metadata.get("plan_only") is True or metadata.get("skill") == PLAN_SKILL


def decision(message: Message) -> tuple[str, Any]:
    """What a follow-up message says: ("approve", None), ("replace", tasks) or ("refine", text)."""
    for part in message.parts:
        if part.WhichOneof("content") != "data":
            continue
        data = restore_ints(MessageToDict(part.data))
        if isinstance(data, dict) and data.get("approve") is True:
            return "approve", None
        if isinstance(data, dict) and "tasks" in data:
            return "replace", data["tasks"]
        if isinstance(data, list):
            return "replace", data
    text = " ".join(texts_of(message)).strip()
    if text.lower().rstrip(".!") in APPROVE_WORDS:
        return "approve", None
    if text:
        return "refine", text
    return "none", None


def gate_id(root_id: str) -> str:
    """The id of the task a plan's approval waits on: one per tree, found again from the root."""
    return f"{root_id}-approval"


def gated(tasks: list[dict[str, Any]], requirement: str) -> list[dict[str, Any]]:
    """`tasks` (a planned tree, ids set) plus the gate its approval waits on.

    Every task without dependencies of its own (so, transitively, every task) depends on the gate,
    the root included: nothing of the plan runs before it is approved, whatever the tree's shape."""
    root = tasks[0]["id"]
    gate = {"id": gate_id(root), "name": GATE_EXECUTOR, "schemas": {"method": GATE_EXECUTOR}, "parent_id": root,
            "dependencies": [],
            "inputs": {"prompt": f"{requirement}\n\n{GATE_QUESTION}", "schema": GATE_SCHEMA}}
    on_gate = [{"id": gate["id"], "required": True}]
    return [dict(t, dependencies=list(t.get("dependencies") or []) or on_gate) for t in tasks] + [gate]


def requirement_asked(prompt: str) -> str:
    """The requirement a gate's prompt asks about (refining adds to it)."""
    return prompt.removesuffix(f"\n\n{GATE_QUESTION}")


def plan_data(rows: list[dict[str, Any]], prompt: str) -> dict[str, Any]:
    """What an agent task waiting on a plan's gate shows beside the wait: the requirement, the
    stored plan (the gate included: it is what runs) and how to decide."""
    tasks = [{"id": r["id"], "name": r["name"], "parent_id": r["parent_id"], "priority": r["priority"],
              "dependencies": r["dependencies"], "inputs": r["inputs"]} for r in rows]
    return {"requirement": requirement_asked(prompt), "plan": {"tasks": tasks}, "next": REPLY_HINT}


def rooted_at(tasks: list[dict[str, Any]], root_id: str) -> list[dict[str, Any]]:
    """`tasks` with the root renamed `root_id` (a new tree for an agent task keeps its context id)."""
    tasks = [dict(t) for t in tasks]
    old = tasks[0].get("id") if tasks else None
    for task in tasks:
        if task is tasks[0] or (old is not None and task.get("id") == old):
            task["id"] = root_id
        if old is not None and task.get("parent_id") == old:
            task["parent_id"] = root_id
        task["dependencies"] = [dict(d, id=root_id) if isinstance(d, dict) and old is not None and d.get("id") == old
                                else d for d in task.get("dependencies") or []]
    return tasks


async def plan_tree(services: "A2AServices", call: CallContext, requirement: str,
                    root_id: str | None = None) -> list[dict[str, Any]]:
    """A validated tree for `requirement` from `tasks.generate` (RpcError -32602 when it fails).

    `root_id` renames the plan's root (a refined plan keeps the agent task's context id).
    """
    answer = await services.task_methods["tasks.generate"]({"requirement": requirement}, call)
    tasks = [dict(t) for t in answer["tasks"]]
    return rooted_at(tasks, root_id) if root_id is not None and tasks else tasks
