"""The SDK request handler, wired to our executor, database stores and push sender.

Three behaviours are added to the SDK's DefaultRequestHandler:
- a send that carries a push config is answered at once (SPEC.md: "With push_notification_config,
  execution is asynchronous and the immediate result has status in_progress"), unless the request
  itself says to wait (0.3 `blocking: true`, 1.0 `returnImmediately: false`): then, as A2A says, the
  answer comes at a terminal or interrupted state;
- a push config set on a running agent task (with its headers and method) starts notifications;
- a 0.3 `tasks/pushNotificationConfig/get` without `pushNotificationConfigId` (optional in 0.3)
  answers the task's first config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    SendMessageRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import InvalidParamsError

from taskgrove.agent.surfaces.a2a import store, unavailable
from taskgrove.agent.surfaces.a2a.caller_context import BLOCKING_KEY, CALL_KEY, PUSH_KEY, wire_for
from taskgrove.agent.surfaces.a2a.executor import TaskTreeAgentExecutor
from taskgrove.agent.surfaces.a2a.message_tree import TreeRequestContextBuilder, push_requested
from taskgrove.agent.surfaces.a2a.push import PushConfigError, PushTargets, SpecPushSender, check_url

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices


class TaskgroveRequestHandler(DefaultRequestHandler):
    def __init__(self, *args: object, push_targets: PushTargets, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._push_targets = push_targets

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        if push_requested(params, context) and not context.state.get(BLOCKING_KEY):
            params.configuration.return_immediately = True
        return await super().on_message_send(params, context)

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        if params.task_id and not params.id:
            listed = await self.on_list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=params.task_id, tenant=params.tenant), context)
            if not listed.configs:
                raise InvalidParamsError(message=f"Task {params.task_id} has no push notification config")
            return listed.configs[0]
        return await super().on_get_task_push_notification_config(params, context)

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        stored = await super().on_create_task_push_notification_config(params, context)
        self._push_targets.enable(params.task_id, context.state.get(PUSH_KEY) or [],
                                  wire=wire_for(context), urls=[params.url], traceparent=getattr(context.state.get(CALL_KEY), "traceparent", None))
        return stored


@dataclass
class AgentSurface:
    """The SDK handler and the parts of it that own background work."""

    handler: TaskgroveRequestHandler
    executor: TaskTreeAgentExecutor
    push_sender: SpecPushSender

    async def shutdown(self) -> None:
        """Stop agent executions and undelivered notifications. The trees they follow are durable
        executions: an agent task cut off here is settled from its tree's stored outcome when next read
        (TaskTreeAgentExecutor.settle)."""
        await self.handler.aclose()
        await self.push_sender.aclose()


def build_surface(services: "A2AServices", card: AgentCard) -> AgentSurface:
    unavailable.quiet_sdk_logs()  # the database going away is logged once, by storage/outage.py
    engine = services.repo.engine
    tasks = store.task_store(engine)
    configs = store.push_config_store(engine, store.push_encryption_key(services.settings.secret_key))
    targets = PushTargets()
    executor = TaskTreeAgentExecutor(services, tasks, targets)
    tasks.settle = executor.settle
    sender = SpecPushSender(configs, targets, allow_private=services.settings.allow_private_urls)

    async def url_allowed(url: str) -> bool:
        try:
            await check_url(url, services.settings.allow_private_urls)
        except PushConfigError:
            return False
        return True

    handler = TaskgroveRequestHandler(
        agent_executor=executor,
        task_store=tasks,
        agent_card=card,
        push_config_store=configs,
        push_sender=sender,
        request_context_builder=TreeRequestContextBuilder(services, targets, tasks),
        push_url_validator=url_allowed,
        push_targets=targets,
    )
    return AgentSurface(handler, executor, sender)
