"""The `tasks.*` method table: JSON-RPC method names mapped to TaskService operations.

Each entry reads the params into the operation's typed request (agent/requests.py) once, then
calls the service with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from taskgrove.agent.requests import (CancelTasks, CloneTask, CopyTask, CountRunning, DeleteTask, ExecuteTask, GetTask,
                                      GetTree, ListChildren, ListRunning, ListTasks, NewTree, RunningStatus,
                                      TaskAttempts, UpdateTask)
from taskgrove.agent.rpc.jsonrpc import CallContext, Handler
from taskgrove.agent.service import TaskService


def typed(read: Callable[[Any], Any], operation: Callable[[Any, CallContext], Awaitable[Any]]) -> Handler:
    """A handler that reads the params with `read` and calls `operation` with the result. Not a
    coroutine itself (one frame less on every call): a params error raises where the caller
    awaits the handler, as the operation's own errors do."""
    def handler(params: Any, ctx: CallContext) -> Awaitable[Any]:
        return operation(read(params), ctx)

    return handler


def without_params(operation: Callable[[CallContext], Awaitable[Any]]) -> Handler:
    """A handler for an operation that takes no parameters: whatever params come are ignored."""
    def handler(_params: Any, ctx: CallContext) -> Awaitable[Any]:
        return operation(ctx)

    return handler


def task_methods(service: TaskService) -> dict[str, Handler]:
    return {
        "tasks.create": typed(partial(NewTree.from_params, max_tasks=service.settings.max_tree_tasks), service.create),
        "tasks.get": typed(GetTask.from_params, service.get),
        "tasks.detail": typed(GetTask.from_params, service.get),
        "tasks.update": typed(UpdateTask.from_params, service.update),
        "tasks.delete": typed(DeleteTask.from_params, service.delete),
        "tasks.copy": typed(CopyTask.from_params, service.copy),
        "tasks.clone": typed(CloneTask.from_params, service.clone),
        "tasks.list": typed(ListTasks.from_params, service.list),
        "tasks.children": typed(ListChildren.from_params, service.children),
        "tasks.tree": typed(GetTree.from_params, service.tree),
        "tasks.attempts": typed(TaskAttempts.from_params, service.attempts),
        "tasks.execute": typed(ExecuteTask.from_params, service.execute),
        "execute_task_tree": typed(ExecuteTask.from_params, service.execute),
        "tasks.running.list": typed(ListRunning.from_params, service.running_list),
        "tasks.running.status": typed(RunningStatus.from_params, service.running_status),
        "tasks.running.count": typed(CountRunning.from_params, service.running_count),
        "tasks.cancel": typed(CancelTasks.from_params, service.cancel),
        "tasks.running.cancel": typed(CancelTasks.from_params, service.cancel),
    }
