"""The method of task logs (agent/log_service.py): `tasks.logs`, on `/tasks` and `/`."""

from __future__ import annotations

from taskgrove.agent.log_service import LogService
from taskgrove.agent.requests import TaskLogs
from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.rpc.tasks import typed


def log_methods(service: LogService) -> dict[str, Handler]:
    return {"tasks.logs": typed(TaskLogs.from_params, service.logs)}
