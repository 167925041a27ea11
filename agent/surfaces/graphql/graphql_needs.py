"""What the GraphQL surface reads of the services: `GraphQLServices`, a Protocol that
agent/services/container.py `Services` satisfies (checked by mypy, tests/test_types.py).

The edge's part (settings, metrics, admission: GraphQL requests are authenticated through
agent/surfaces/edge.py), then what its resolvers and subscriptions call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from taskgrove.agent.surfaces.edge import EdgeServices

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.engine.bus import EventBus
    from taskgrove.agent.engine.engine import Engine
    from taskgrove.agent.services.agent_wiring import AgentDirectoryParts
    from taskgrove.agent.services.execution_service import ExecutionService
    from taskgrove.agent.services.retention_service import Retention
    from taskgrove.agent.services.task_service import TaskService
    from taskgrove.agent.services.trigger_service import TriggerService
    from taskgrove.agent.services.wait_service import WaitService


class GraphQLServices(EdgeServices, Protocol):
    @property
    def bus(self) -> EventBus: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def tasks(self) -> TaskService: ...

    @property
    def executions(self) -> ExecutionService: ...

    @property
    def waits(self) -> WaitService: ...

    @property
    def retention(self) -> Retention | None: ...

    @property
    def agents(self) -> AgentDirectoryParts | None: ...

    @property
    def triggers(self) -> TriggerService | None: ...
