"""The `schedules.*` method table: JSON-RPC method names mapped to ScheduleService operations."""

from __future__ import annotations

from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.schedules import ScheduleService


def schedule_methods(service: ScheduleService) -> dict[str, Handler]:
    return {
        "schedules.create": service.create,
        "schedules.get": service.get,
        "schedules.list": service.list,
        "schedules.update": service.update,
        "schedules.delete": service.delete,
        "schedules.trigger": service.trigger,
    }
