"""Delegation by name or skill for a2a_agent_executor: which agent, may it be called now, how it went.

`inputs.agent` names an agent of the directory; `inputs.skill` asks for a skill (a skill id or a
tag), and the healthiest agent that has it is chosen. Executors may not import the service
(tests/test_layering.py), so the directory reaches them as `context.services["agent_directory"]`,
an object of the `AgentDirectory` protocol below that the service fills in
(agent/services/agent_lookup.py, storage-level reads and writes).

How one run goes (`delegate`):

1. The target: the agent named, or chosen for the skill; a later attempt that already started a
   remote task goes back to the agent its checkpoint names (`delegated_to`), whatever the skill
   would choose now. Its URL, its stored credential headers (never in the task, the result or a log).
2. The breaker (storage/agents.py `pass_gate`): open, the task WAITS instead of failing: a durable
   timer (no slot, survives restarts; `waiting.prompt` says which agent and until when) that ends
   at the cool-down, after which one task probes the agent and the others wait again. The timer's
   answer is a marker, so that a replayed run skips exactly its own breaker waits (`next_answer`)
   and the remote call's own waits (a question the agent asks) keep their places.
3. The call, by executors/a2a_remote.py as with `agent_url`, timed. Its outcome is the agent's
   health: a success, or an answer that was a clear "no" (the remote task failed or was refused:
   the agent works), counts as a success of the agent; no answer, a broken protocol, a transport
   error or a timeout counts as a failure, and enough of those in a row open the breaker.
4. The result says who was chosen and why: `delegated: {agent, chosen_by, skill}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError, Waiting

SERVICE = "agent_directory"
# The input a delegated call gets with the agent's directory name (never taken from a task's inputs):
# a question's wait names the agent as the directory, the dashboard and the A2A surface do.
DIRECTORY_NAME = "_directory_name"
BREAKER_MARK = "taskgrove:agent-breaker"  # the answer of a breaker wait (never an answer a person gives)
MIN_RECHECK = 1.0  # seconds: the shortest breaker wait (a cool-down that just ended, a busy probe)
MAX_RECHECK = 300.0
# The agent answered and said no: the agent works, the work did not (a2a_remote's messages).
_ANSWERED = ("remote A2A task ",)


@dataclass(frozen=True, slots=True)
class AgentTarget:
    """The agent a task goes to: its directory name, where its messages go, its credential."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    chosen_by: str = "agent"  # "agent" (named) or "skill"
    skill: str | None = None


class AgentDirectory(Protocol):
    """What the executor asks of the directory (agent/services/agent_lookup.py implements it)."""

    async def resolve(self, agent: str | None, skill: str | None, user_id: str | None) -> AgentTarget:
        """The agent named or the healthiest one with the skill, visible to `user_id`; raises
        LookupError with a message fit for the task's error."""
        ...

    async def gate(self, name: str) -> tuple[str, str | None]:
        """("go" | "probe" | "wait", until): may a call to the agent start now."""
        ...

    async def record(self, name: str, ok: bool, seconds: float, error: str | None) -> None:
        """One call's outcome: health, breaker, metrics."""
        ...


def _seconds_until(stamp: str | None) -> float:
    from datetime import datetime, timezone

    if not stamp:
        return MIN_RECHECK
    try:
        left = (datetime.fromisoformat(stamp) - datetime.now(timezone.utc)).total_seconds()
    except ValueError:
        return MIN_RECHECK
    return max(MIN_RECHECK, min(MAX_RECHECK, left))


def breaker_wait(wait: Any) -> str | None:
    """What a task waits for when its wait is an open breaker's timer (its prompt names the agent
    and when it tries again), else None: tasks.get shows it as `waiting_for` (docs/agents.md)."""
    if isinstance(wait, Mapping) and wait.get("kind") == "timer" and wait.get("default") == BREAKER_MARK:
        return str(wait.get("prompt") or "an agent's open breaker")
    return None


async def delegate(call: Executor, inputs: dict[str, Any], context: ExecutionContext) -> Any:
    """Run `call` (a RemoteAgentCall) against the agent `inputs` names or asks for by skill."""
    if inputs.get("agent_url"):
        return await call.execute({k: v for k, v in inputs.items() if k != DIRECTORY_NAME}, context)
    directory: AgentDirectory | None = context.services.get(SERVICE)
    if directory is None:
        raise ExecutorError("inputs.agent and inputs.skill need the service's directory of agents; give "
                            "agent_url instead", retryable=False)
    checkpoint = context.last_checkpoint if isinstance(context.last_checkpoint, dict) else {}
    started = checkpoint.get("remote_task_id") and isinstance(checkpoint.get("delegated_to"), str)
    try:
        if started:  # a remote task exists: follow it at the agent that has it
            target = await directory.resolve(checkpoint["delegated_to"], None, context.user_id)
            target = dataclasses.replace(target, chosen_by=checkpoint.get("chosen_by") or "agent",
                                         skill=checkpoint.get("skill"))
        else:
            target = await directory.resolve(inputs.get("agent"), inputs.get("skill"), context.user_id)
    except LookupError as exc:
        raise ExecutorError(str(exc.args[0] if exc.args else exc), retryable=False) from None
    while context.next_answer() == BREAKER_MARK:  # the breaker waits of earlier runs: passed
        context.hold("", 0, BREAKER_MARK)
    if not started:
        verdict, until = await directory.gate(target.name)
        if verdict == "wait":
            context.hold(f"agent {target.name}: its breaker is open (failing calls); trying again at {until}",
                         _seconds_until(until), BREAKER_MARK)
    sent = {**inputs, "agent_url": target.url,
            "headers": {**target.headers, **(inputs.get("headers") or {})}}
    sent.pop("agent", None)
    sent[DIRECTORY_NAME] = target.name  # a question's wait names the agent as the directory does
    sent.pop("skill", None)
    began = time.monotonic()
    try:
        result = await call.execute(sent, _remembering(context, target))
    except ExecutorError as exc:
        text = str(exc)
        answered = text.startswith(_ANSWERED)
        await directory.record(target.name, answered, time.monotonic() - began, None if answered else text)
        raise
    except Waiting:  # the agent asked a question: it answered
        await directory.record(target.name, True, time.monotonic() - began, None)
        raise
    except asyncio.CancelledError:
        raise
    await directory.record(target.name, True, time.monotonic() - began, None)
    if isinstance(result, dict):
        result = {**result, "delegated": {"agent": target.name, "chosen_by": target.chosen_by, "skill": target.skill}}
    return result


def _remembering(context: ExecutionContext, target: AgentTarget) -> ExecutionContext:
    """The context the call runs with: its checkpoints also name the agent, so that a later attempt
    follows the remote task at that agent (a skill may choose another one by then)."""
    write = context._checkpoint
    if write is None:
        return context
    mark = {"delegated_to": target.name, "chosen_by": target.chosen_by, "skill": target.skill}

    async def checkpoint(data: Any) -> None:
        await write({**data, **mark} if isinstance(data, dict) else data)

    copy = dataclasses.replace(context, _checkpoint=checkpoint)
    copy._waits = context._waits
    return copy
