"""Answering waits: `tasks.respond` and `events.emit` (docs/waits.md).

The service functions every surface calls (JSON-RPC, agent/services/wait_service.py, and through it MCP, the
CLI and the dashboard; GraphQL's resolvers; A2A's follow-up answers to input-required,
agent/surfaces/a2a/executor.py with agent/surfaces/a2a/input_required.py), with the typed requests of agent/foundations/requests.py:
`WaitService.respond(RespondToTask(task_id, value), ctx)` and
`WaitService.emit(EmitEvent(name, payload, user_id), ctx)` (`RespondToTask.of`, `EmitEvent.of`
check typed arguments as `from_params` checks params). They check who may answer and what the
answer may be; the engine (agent/engine/waits.py) ends the wait in the database, once, and
resumes the task wherever its tree runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from taskgrove.agent.engine.engine import AlreadyAnswered, Engine, NotWaiting
from taskgrove.agent.engine.waits import schema_problem
from taskgrove.agent.foundations.errors import invalid_params, permission_denied, task_not_found
from taskgrove.agent.foundations.requests import EmitEvent, RespondToTask
from taskgrove.agent.foundations.calls import CallContext, Handler, typed
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services import idempotent
from taskgrove.storage import idempotency, jsonvalues
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.results import Unstorable, storable
from taskgrove.storage.wait_store import WithEvent, public_wait, read

class EmitHook(NamedTuple):
    """What another concern does when an event is stored (triggers: agent/services/trigger_service.py)."""

    statement: WithEvent  # runs in the transaction that stores the event: stored with it or not at all
    after: Callable[[Any], dict[str, Any]]  # after the commit, with what the statement answered: keys of the answer


# The waits tasks.respond answers: a person's input, and a question of another agent (agent_input:
# a remote A2A task's input-required, whose answer the task sends back to it).
ANSWERABLE = ("input", "agent_input")


class WaitService:
    def __init__(self, repo: TaskRepository, engine: Engine, settings: Settings) -> None:
        self.repo = repo
        self.engine = engine
        self.settings = settings
        # What else storing an event does (TriggerService.emit_hook): each hook's statement runs in
        # the event's own transaction, its `after` once that committed.
        self.on_emit: list[EmitHook] = []

    # --- the service API ------------------------------------------------------------------

    async def respond(self, request: RespondToTask, ctx: CallContext) -> dict[str, Any]:
        """tasks.respond: answer the wait for input of `request.task_id` with `request.value`; the
        task resumes.

        Refused (RpcError): an unknown task (-32602), a caller who is neither its owner nor an
        admin (-32001), a task that waits for no input (-32602 "task X is not waiting for input"),
        a value the wait's schema refuses (-32602 naming the problem), a wait already answered
        (-32602 "already answered"). Returns {task_id, status: "resumed", wait}."""
        task_id = request.task_id
        row = await self.repo.get(task_id)
        if row is None:
            raise task_not_found(task_id)
        if not ctx.caller.can_access(row["user_id"]):
            raise permission_denied(f"Only the owner or an admin may answer task '{task_id}'")
        wait = read(row.get("waiting"))
        if not isinstance(wait, dict) or wait.get("kind") not in ANSWERABLE:
            raise invalid_params(f"task {task_id} is not waiting for input")
        value = self._storable(request.value)
        if (problem := schema_problem(wait.get("schema"), value)) is not None:
            raise invalid_params(problem)
        try:
            await self.engine.waits.answer(row, value)
        except NotWaiting:
            raise invalid_params(f"task {task_id} is not waiting for input") from None
        except AlreadyAnswered:
            raise invalid_params(f"task {task_id}: its wait was already answered (or timed out, or was cancelled)") \
                from None
        return {"task_id": task_id, "status": "resumed", "wait": public_wait(row["waiting"])}

    async def emit(self, request: EmitEvent, ctx: CallContext) -> dict[str, Any]:
        """events.emit: store event `request.name` of the caller's user (`request.user_id`: another
        user's, admins only) and resume every wait of that user it answers (docs/waits.md, "Which
        events count"). Returns {event_id, name, user_id, created_at, resumed: count, task_ids}."""
        caller = ctx.caller
        if request.user_id is not None and request.user_id != caller.user_id and not caller.unrestricted:
            raise permission_denied("Only an admin may emit events for another user")
        owner = request.user_id if request.user_id is not None else caller.user_id
        payload = self._storable(dict(request.payload), what="payload")
        statements = [hook.statement for hook in self.on_emit]
        key = idempotent.current()
        if key is not None and key.stored is not None:  # resent with its key: the first stored the event
            stored = key.stored
            resumed = await self.engine.waits.resume_for_event(owner, request.name, payload, stored["created_at"])
            answer = {**stored, "resumed": len(resumed), "task_ids": resumed}
        elif key is not None:  # the key marked in the event's transaction: stored once, whatever is cut
            answer = await self.engine.waits.emit(owner, request.name, payload,
                                                  [idempotency.marked(statements, key.owner, key.key, key.reserved_at)])
            answer["alongside"] = answer["alongside"][0]
        else:
            answer = await self.engine.waits.emit(owner, request.name, payload, statements)
        emitted = {"event_id": answer["event_id"], "name": request.name, "user_id": owner,
                   "created_at": answer["created_at"], "resumed": answer["resumed"], "task_ids": answer["task_ids"]}
        for hook, done in zip(self.on_emit, answer["alongside"]):  # triggers: {"triggered": n}
            emitted.update(hook.after(done))
        return emitted

    def _storable(self, value: Any, what: str = "value") -> Any:
        """The one JSON value gate, then the result's limits (an answer becomes a result)."""
        if (bad := jsonvalues.problem(value, what, jsonvalues.STORED_MAX_DEPTH)) is not None:
            raise invalid_params(bad)
        try:
            return storable(value, max_depth=self.settings.max_result_depth,
                            max_bytes=self.settings.max_result_bytes, what=what)
        except Unstorable as exc:
            raise invalid_params(str(exc)) from None


def wait_methods(service: WaitService) -> dict[str, Handler]:
    return {
        "tasks.respond": typed(RespondToTask.from_params, service.respond),
        "events.emit": typed(EmitEvent.from_params, service.emit),
    }
