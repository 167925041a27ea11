"""Plain-language A2A requests: a text part is a requirement, planned into a task tree by the LLM.

Other agents write "fetch the three reports and merge them", not a task tree in JSON. When an LLM
is configured, such a message goes through `tasks.generate` (the same prompt, generation, repair
round and tree validation), so a planned tree obeys every rule a sent tree does; it is stored for
the caller and executed like any other.

With `metadata.plan_only: true` (or `metadata.skill: "plan"`, the card's `plan` skill) the agent
task stops in `input-required` with the plan in its status message. A follow-up message on that
task (`taskId` set) then decides:
- approve: a data part `{"approve": true}` or the text "approve" (also "approved", "yes", "ok",
  "run", "go") runs the plan as shown;
- replace: a data part `{"tasks": [...]}` runs that tree instead;
- refine: any other text is added to the requirement and planned again (input-required again).

Without an LLM the card lists `application/json` only and a text part is an unsupported content
type (-32005, see message_tree.check_parts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from a2a.types.a2a_pb2 import Message, Task
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.a2a.wire import restore_ints
from taskgrove.agent.rpc.jsonrpc import CallContext

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.container import Services

APPROVE_WORDS = frozenset({"approve", "approved", "yes", "ok", "okay", "run", "go", "run it", "go ahead"})
PLAN_SKILL = "plan"
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


@dataclass
class Draft:
    """A plan waiting for the caller's decision, as kept in the agent task's status message."""

    requirement: str
    tasks: list[dict[str, Any]]

    def data(self) -> dict[str, Any]:
        return {"requirement": self.requirement, "plan": {"tasks": self.tasks}, "next": REPLY_HINT}


def draft_of(task: Task | None) -> Draft | None:
    """The plan an `input-required` agent task is waiting on, read from its status message."""
    if task is None or not task.status.HasField("message"):
        return None
    for part in task.status.message.parts:
        if part.WhichOneof("content") != "data":
            continue
        data = restore_ints(MessageToDict(part.data))
        plan = data.get("plan") if isinstance(data, dict) else None
        if isinstance(plan, dict) and isinstance(plan.get("tasks"), list) and isinstance(data.get("requirement"), str):
            return Draft(data["requirement"], plan["tasks"])
    return None


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


async def plan_tree(services: "Services", call: CallContext, requirement: str,
                    root_id: str | None = None) -> list[dict[str, Any]]:
    """A validated tree for `requirement` from `tasks.generate` (RpcError -32602 when it fails).

    `root_id` renames the plan's root (a refined plan keeps the agent task's context id).
    """
    answer = await services.task_methods["tasks.generate"]({"requirement": requirement}, call)
    tasks = [dict(t) for t in answer["tasks"]]
    if root_id is not None and tasks:
        old = tasks[0]["id"]
        for task in tasks:
            if task.get("id") == old:
                task["id"] = root_id
            if task.get("parent_id") == old:
                task["parent_id"] = root_id
            task["dependencies"] = [dict(d, id=root_id) if isinstance(d, dict) and d.get("id") == old else d
                                    for d in task.get("dependencies") or []]
    return tasks
