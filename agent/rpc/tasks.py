"""The `tasks.*` method table: JSON-RPC method names mapped to TaskService operations."""

from __future__ import annotations

from taskgrove.agent.rpc.jsonrpc import Handler
from taskgrove.agent.service import TaskService


def task_methods(service: TaskService) -> dict[str, Handler]:
    return {
        "tasks.create": service.create,
        "tasks.get": service.get,
        "tasks.detail": service.get,
        "tasks.update": service.update,
        "tasks.delete": service.delete,
        "tasks.copy": service.copy,
        "tasks.clone": service.clone,
        "tasks.list": service.list,
        "tasks.children": service.children,
        "tasks.tree": service.tree,
        "tasks.execute": service.execute,
        "execute_task_tree": service.execute,
        "tasks.running.list": service.running_list,
        "tasks.running.status": service.running_status,
        "tasks.running.count": service.running_count,
        "tasks.cancel": service.cancel,
        "tasks.running.cancel": service.cancel,
    }
