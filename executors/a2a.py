"""a2a_agent_executor: hands the task's inputs to another A2A agent and reports what it did.

This module is what the executor registry loads at start-up: the executor's description and
input schema. The work is done by executors/a2a_remote.py with the official a2a-sdk client; that
module (and with it the SDK's client, protobuf and httpx) is imported when a task first runs this
executor, not when the service starts. How a run goes is told there.
"""

from __future__ import annotations

from typing import Any

from taskgrove.executors.base import ExecutionContext, Executor


class A2AAgentExecutor(Executor):
    """Sends a message to another A2A agent, relays its progress and returns its results."""

    id = "a2a_agent_executor"
    name = "Remote A2A agent"
    extension = "a2a"
    description = (
        "Sends inputs.message (text) and/or inputs.data (object) to the A2A agent at inputs.agent_url, or to "
        "the directory's agent named inputs.agent, or to the healthiest agent with the skill inputs.skill, "
        "with the official a2a-sdk client (streaming or polling), relays its progress and returns its "
        "final state, artifacts and task ids; cancelling the task cancels the remote task. A question of the "
        "agent (input-required, auth-required) makes the task wait (waiting.kind agent_input) for tasks.respond, "
        "whose answer goes back to the remote task."
    )
    input_schema = {
        "type": "object",
        # Where the message goes: a URL, an agent of the directory by name, or a skill (id or tag) whose
        # healthiest agent is chosen (executors/agent_delegation.py).
        "allOf": [{"oneOf": [{"required": ["agent_url"]}, {"required": ["agent"]}, {"required": ["skill"]}]},
                  {"anyOf": [{"required": ["message"]}, {"required": ["data"]}]}],
        "properties": {
            "agent_url": {"type": "string", "minLength": 1},
            "agent": {"type": "string", "minLength": 1, "maxLength": 64},
            "skill": {"type": "string", "minLength": 1, "maxLength": 256},
            "message": {"type": "string", "minLength": 1},
            "data": {"type": "object"},
            "metadata": {"type": "object"},
            "blocking": {"type": "boolean", "default": True},
            "streaming": {"type": "boolean"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400, "default": 300},
            "poll_interval": {"type": "number", "minimum": 0.05, "maximum": 60, "default": 0.5},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            # A question of the remote agent (input-required) is a wait answered with tasks.respond;
            # after this many seconds without an answer the task fails and the remote task is cancelled.
            "answer_timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 31_536_000},
        },
    }

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        # Lazy: the a2a-sdk client and protobuf load with the first remote call, not at start-up.
        from taskgrove.executors.a2a_remote import RemoteAgentCall

        self._call = RemoteAgentCall(params)

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        from taskgrove.executors.agent_delegation import delegate

        return await delegate(self._call, inputs, context)

    async def cancel(self) -> dict[str, Any] | None:
        return await self._call.cancel()
