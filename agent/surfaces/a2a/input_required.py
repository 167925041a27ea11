"""Durable waits through A2A: a tree that waits for input makes its agent task `input-required`.

While a task of an agent task's tree waits for input (docs/waits.md), or for the answer to a
question a remote agent asked it (kind `agent_input`, docs/agents.md), the agent task is
`input-required` (1.0: TASK_STATE_INPUT_REQUIRED) and its status message carries the wait: the
prompt as a text part, and in the data part (the run summary) `task_id`, `prompt`, `schema`,
`deadline` and `next` (how to answer). The database is the truth about what waits: this module
reads the tree's rows, never the status message, to know which task an answer is for.

A follow-up message on that agent task (message.taskId) answers the wait: a data part
`{"value": ...}` (optionally `"task_id"`, to pick one of several waiting tasks), or text parts
when the wait's schema takes a string (or there is no schema). The answer goes through the one
service rule, `WaitService.respond` (owner or admin, the schema, exactly once); the executor
(agent/surfaces/a2a/executor.py) calls it and follows the resumed tree. A message that is no answer, or a
value the service refuses, leaves the agent task `input-required` with the reason (`problem`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from a2a.types.a2a_pb2 import Message
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.surfaces.a2a.plain_language import texts_of
from taskgrove.agent.surfaces.a2a.wire import restore_ints
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.wait_store import public_wait

ANSWER_KEY = "value"
# The waits an A2A caller answers: a person's input, and another agent's question from any depth.
ASKED = ("input", "agent_input")


@dataclass(frozen=True)
class InputWait:
    """One task of the tree waiting for input, as the agent task shows it."""

    task_id: str
    prompt: str
    schema: Any
    since: str | None
    deadline: str | None
    # Who asks, when the question is another agent's (a wait of kind agent_input: a remote A2A
    # task of this tree asked, docs/agents.md): its name, url, remote ids, and who asked it.
    agent: Mapping[str, Any] | None = None

    @property
    def takes_text(self) -> bool:
        """Whether a text part is an answer: no schema, or one whose answer is a string."""
        schema = self.schema
        if not isinstance(schema, Mapping):
            return schema is None or schema is True
        kind = schema.get("type")
        if kind is None and isinstance(schema.get("enum"), list):
            return all(isinstance(v, str) for v in schema["enum"])
        return kind == "string" or (isinstance(kind, list) and "string" in kind)

    def hint(self) -> str:
        text = ' or text' if self.takes_text else ''
        return (f'Reply on this task (message.taskId) with a data part {{"value": ...}}{text}: the answer '
                f"to task {self.task_id}, valid against its schema")

    def data(self, problem: str | None = None) -> dict[str, Any]:
        """What the status message's data part carries beside the run summary."""
        data = {"task_id": self.task_id, "prompt": self.prompt, "schema": self.schema, "since": self.since,
                "deadline": self.deadline, "next": self.hint()}
        if self.agent is not None:
            data["agent"] = dict(self.agent)
        if problem is not None:
            data["problem"] = problem
        return data

    def text(self, problem: str | None = None) -> str:
        """The prompt as the text part (after the reason an answer was not taken), naming the agent
        that asks when it is another agent's question."""
        prompt = self.prompt
        if self.agent is not None:
            prompt = f"The agent {self.agent.get('name') or self.agent.get('url') or 'downstream'} asks: {prompt}"
        return prompt if problem is None else f"Not accepted: {problem}\n\n{prompt}"


@dataclass(frozen=True)
class Answer:
    """A follow-up message on an `input-required` agent task, read against its tree's waits.

    `wait` None: no task of the tree waits for input any more (answered another way, timed out):
    the follow-up just follows the tree again. `problem` set: the message is no answer; the
    agent task stays input-required with the reason. Else `value` answers `wait` as `call`."""

    wait: InputWait | None
    call: CallContext
    value: Any = None
    problem: str | None = None


def waits_for_input(rows: Iterable[Mapping[str, Any]]) -> list[InputWait]:
    """The tasks among a tree's `rows` that wait for input, the oldest wait first."""
    found = []
    for row in rows:
        wait = _public(row.get("waiting"))
        if wait is not None and wait.get("kind") in ASKED and row["status"] == TaskStatus.IN_PROGRESS:
            agent = wait.get("agent") if isinstance(wait.get("agent"), Mapping) else None
            found.append((wait.get("since") or "", InputWait(row["id"], wait.get("prompt") or "", wait.get("schema"),
                                                              wait.get("since"), wait.get("deadline"), agent)))
    return [wait for _, wait in sorted(found, key=lambda pair: pair[0])]


def _public(waiting: Any) -> dict[str, Any] | None:
    """A row's wait, whether the read gave the stored text or the public object."""
    if waiting is None or isinstance(waiting, dict):
        return waiting
    return public_wait(waiting)


def read_answer(message: Message, waits: list[InputWait], call: CallContext,
                shown: Mapping[str, Any] | None = None) -> Answer:
    """What a follow-up message answers, and to which wait: the one the message names
    (`task_id` beside `value`), else the one the agent task shows (`shown`: its status message's
    data), which must still be waiting: an answer is never given to a question the caller has
    not seen (a wait that timed out with its default, then a later one)."""
    if not waits:
        return Answer(None, call)
    for part in message.parts:
        if part.WhichOneof("content") != "data":
            continue
        data = restore_ints(MessageToDict(part.data))
        if isinstance(data, dict) and ANSWER_KEY in data:
            wait, problem = _target(waits, data.get("task_id"), shown)
            return Answer(wait, call, value=data[ANSWER_KEY], problem=problem)
    wait, problem = _target(waits, None, shown)
    texts = texts_of(message)
    if problem is None and texts and not wait.takes_text:
        problem = 'this wait takes a JSON value: send a data part {"value": ...}'
    elif problem is None and not texts:
        problem = 'the message carries no answer: send a data part {"value": ...}'
    return Answer(wait, call, value="\n".join(texts), problem=problem)


def _target(waits: list[InputWait], named: Any, shown: Mapping[str, Any] | None) -> tuple[InputWait, str | None]:
    """The wait an answer is for, or the one to show instead with why the answer was not taken."""
    if named is not None:
        wait = next((w for w in waits if w.task_id == named), None)
        return (wait, None) if wait is not None else (waits[0], f"task {named} of this tree is not waiting for input")
    if shown is None or "task_id" not in shown:
        return waits[0], None
    wait = next((w for w in waits if w.task_id == shown["task_id"] and w.since == shown.get("since")), None)
    if wait is None:
        return waits[0], (f"task {shown['task_id']} no longer waits for the input asked for before; "
                          f"task {waits[0].task_id} asks now")
    return wait, None
