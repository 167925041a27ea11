"""Questions that cross the hop: a remote agent's `input-required` (or `auth-required`) becomes a
durable wait of the local task, and its answer goes back to the remote task (docs/agents.md).

`RemoteQuestions` is the answer-handling half of `RemoteAgentCall` (executors/a2a_remote.py),
kept here so that each file has one job. When the remote task asks, the local attempt parks on a
wait of kind `agent_input` (ExecutionContext.wait_for_agent): the question's text as `prompt`, the
schema of its data part where it gives one, the agent's name and URL, the remote ids. While it
waits it holds no slot and no memory; the remote task id is in the task's checkpoint, with how many
answers were already sent and `asking: true`, so any instance, after any restart, can continue it.

`tasks.respond` resumes the same attempt, which runs again from the start: it re-attaches to the
remote task (the checkpoint), passes the waits whose answers it already sent (they return at once,
in order), and sends the new answer as the next message of the same remote task and context, then
follows the task to its end or to its next question (another wait). The answer is a text part when
it is a string, else a data part `{"value": ...}` (what a taskgrove agent reads, docs/waits.md).
Sending is at-least-once, like every side effect of an attempt: the message id is derived from the
attempt's idempotency key and the answer's number, so an agent can recognise a resend.

A parked task's remote work is cancelled, when the local task is cancelled or its wait times out,
by executors/a2a_cancel.py (agent/services/remote_questions.py calls it): no executor runs for a
parked task, so the checkpoint written here says what to cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from a2a.client import Client, ClientCallContext
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    AgentCard,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict

from taskgrove.executors.a2a_states import state_name
from taskgrove.executors.base import ExecutionContext
from taskgrove.executors.struct_values import restore_ints

ASKING = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
MAX_PROMPT = 10_000  # characters of a remote question kept as the wait's prompt


def _status_data(status: TaskStatus) -> dict[str, Any]:
    """The first object-valued data part of a status message, or {}."""
    if not status.HasField("message"):
        return {}
    for part in status.message.parts:
        if part.HasField("data"):
            value = restore_ints(MessageToDict(part.data), frozenset({"progress"}))
            if isinstance(value, dict):
                return value
    return {}


def _status_text(status: TaskStatus) -> str:
    if not status.HasField("message"):
        return ""
    return "\n".join(p.text for p in status.message.parts if p.HasField("text")).strip()


def usable_schema(schema: Any) -> dict[str, Any] | None:
    """The remote question's schema when it is a JSON Schema object that can check answers; else
    None (a remote agent's broken schema must not fail the local task: the answer is then free)."""
    if not isinstance(schema, dict) or not schema:
        return None
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except (jsonschema.SchemaError, TypeError, ValueError):
        return None
    return schema


def question_of(task: Task, agent_name: str | None, agent_url: str) -> dict[str, Any]:
    """The wait a remote task's question becomes: prompt, schema, and who asks (`agent`).

    `agent.asked_by` carries the `agent` of the remote question's own data part: a taskgrove
    remote that relays a question from an agent further down the chain names it there."""
    status = task.status
    data = _status_data(status)
    auth = status.state == TaskState.TASK_STATE_AUTH_REQUIRED
    prompt = _status_text(status) or (data.get("prompt") if isinstance(data.get("prompt"), str) else "") or (
        f"The agent {agent_name or agent_url} needs authorization to go on" if auth
        else f"The agent {agent_name or agent_url} asks for input")
    agent: dict[str, Any] = {"name": agent_name, "url": agent_url, "remote_task_id": task.id or None,
                             "remote_context_id": task.context_id or None, "state": state_name(status.state)}
    if isinstance(data.get("agent"), dict):
        agent["asked_by"] = data["agent"]
    return {"prompt": prompt[:MAX_PROMPT], "schema": usable_schema(data.get("schema")), "agent": agent}


def answer_message(value: Any, task: Task, message_id: str) -> Message:
    """The answer as the next message of the remote task and its context: text for a string,
    else a data part `{"value": ...}` (a taskgrove agent's form of an answer)."""
    part = new_text_part(value) if isinstance(value, str) else new_data_part({"value": value})
    return Message(role=Role.ROLE_USER, message_id=message_id, task_id=task.id, context_id=task.context_id,
                   parts=[part])


def answer_id(context: ExecutionContext, number: int) -> str:
    """The message id of the answer number `number` of this attempt: the same on every resend."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"taskgrove-a2a-answer:{context.idempotency_key}:{number}").hex


def sent_answers(checkpoint: Any) -> int:
    """How many answers earlier runs of this attempt sent to the remote task (the checkpoint's)."""
    sent = checkpoint.get("answers_sent") if isinstance(checkpoint, dict) else None
    return sent if isinstance(sent, int) and not isinstance(sent, bool) and sent >= 0 else 0


class RemoteQuestions:
    """The answer handling of RemoteAgentCall (a mixin: it shares that class's state)."""

    _task: Task | None
    _card: AgentCard | None
    _client: Client | None
    _reply: Message | None
    _url: str
    _directory_name: str | None

    if TYPE_CHECKING:
        async def _absorb(self, event: StreamResponse, context: ExecutionContext) -> None: ...  # RemoteAgentCall's

    def _asks(self) -> bool:
        """The remote task waits for an answer (input-required, auth-required)."""
        return self._reply is None and self._task is not None and self._task.status.state in ASKING

    async def _answer_questions(self, context: ExecutionContext, url: str, streaming: bool,
                                poll_interval: float, timeout: float | None) -> None:
        """While the remote task asks: park on its question (a wait), or send the answer the wait
        already has and follow the task to its end or its next question."""
        sent = sent_answers(context.last_checkpoint)
        for _ in range(sent):  # answered and sent by earlier runs: each returns its stored answer
            await context.wait_for_agent({})
        while self._asks():
            assert self._task is not None
            await self._note(context, url, sent, asking=True)  # before the park: a cancel then finds it
            name = self._directory_name or (self._card.name if self._card is not None else None)
            question = question_of(self._task, name, self._url)
            value = await context.wait_for_agent(question, timeout)  # parks (Waiting) until answered
            asked = self._task.status.SerializeToString(deterministic=True)
            request = SendMessageRequest(message=answer_message(value, self._task, answer_id(context, sent)))
            # Its own Idempotency-Key (the client's default is the first message's): a resend of this
            # answer is the same request, another answer a new one.
            call = ClientCallContext(service_parameters={"Idempotency-Key": f"{context.idempotency_key}:answer:{sent}"})
            await self._follow_answer(request, call, context, streaming, poll_interval, asked)
            sent += 1
            await self._note(context, url, sent, asking=False)

    async def _note(self, context: ExecutionContext, url: str, sent: int, *, asking: bool) -> None:
        """The checkpoint: the remote task, where it lives, how many answers it got, whether it asks."""
        assert self._task is not None
        await context.checkpoint({"remote_task_id": self._task.id, "remote_context_id": self._task.context_id,
                                  "agent_url": url, "answers_sent": sent, "asking": asking})

    async def _follow_answer(self, request: SendMessageRequest, call: ClientCallContext, context: ExecutionContext,
                             streaming: bool, poll_interval: float, asked: bytes) -> None:
        """Send the answer, then follow the task until it ends or asks something new (the status
        that asked the question answered is not a new question: the agent has not read it yet)."""
        assert self._client is not None

        def settled() -> bool:
            assert self._task is not None
            state = self._task.status.state
            if self._reply is not None:
                return True
            if state in ASKING:
                return self._task.status.SerializeToString(deterministic=True) != asked
            return state in (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                             TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED)

        async with contextlib.aclosing(self._client.send_message(request, context=call)) as events:  # type: ignore[type-var]  # an async generator
            async for event in events:
                await self._absorb(event, context)
                if streaming and settled():
                    break
        while not settled():
            await asyncio.sleep(poll_interval)
            assert self._task is not None
            task = await self._client.get_task(GetTaskRequest(id=self._task.id))
            await self._absorb(StreamResponse(task=task), context)

