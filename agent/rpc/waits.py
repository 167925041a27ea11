"""The methods of durable waits (agent/wait_service.py): answering a wait, emitting an event."""

from __future__ import annotations

from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.wait_service import WaitService


def wait_methods(service: WaitService) -> dict[str, Handler]:
    return {
        "tasks.respond": service.respond_rpc,
        "events.emit": service.emit_rpc,
    }
