"""The `schedules.*` method table: JSON-RPC method names mapped to ScheduleService operations.

Each entry reads the params into the operation's typed request (agent/requests_services.py) once,
then calls the service with it.
"""

from __future__ import annotations

from taskgrove.agent.requests_services import CreateSchedule, ListSchedules, ScheduleRef, ScheduleRuns, UpdateSchedule
from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.rpc.tasks import typed
from taskgrove.agent.schedules import ScheduleService


def schedule_methods(service: ScheduleService) -> dict[str, Handler]:
    return {
        "schedules.create": typed(CreateSchedule.from_params, service.create),
        "schedules.get": typed(ScheduleRef.from_params, service.get),
        "schedules.list": typed(ListSchedules.from_params, service.list),
        "schedules.update": typed(UpdateSchedule.from_params, service.update),
        "schedules.delete": typed(ScheduleRef.from_params, service.delete),
        "schedules.trigger": typed(ScheduleRef.from_params, service.trigger),
        "schedules.runs": typed(ScheduleRuns.from_params, service.runs),
    }
