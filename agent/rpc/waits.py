"""The methods of durable waits (agent/wait_service.py): answering a wait, emitting an event."""

from __future__ import annotations

from taskgrove.agent.requests import EmitEvent, RespondToTask
from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.rpc.tasks import typed
from taskgrove.agent.wait_service import WaitService


def wait_methods(service: WaitService) -> dict[str, Handler]:
    return {
        "tasks.respond": typed(RespondToTask.from_params, service.respond),
        "events.emit": typed(EmitEvent.from_params, service.emit),
    }
