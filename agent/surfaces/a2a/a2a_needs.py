"""What the A2A surface reads of the services: `A2AServices`, a Protocol that
agent/services/container.py `Services` satisfies (checked by mypy, tests/test_types.py).

Every module of this package takes it instead of the whole container, so what the A2A surface
depends on is written in one place: the edge's part (settings, metrics, admission: its requests go
through agent/surfaces/edge.py) and the parts below.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from taskgrove.agent.surfaces.edge import EdgeServices

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.engine.bus import EventBus
    from taskgrove.agent.engine.engine import Engine
    from taskgrove.agent.foundations.calls import Handler
    from taskgrove.agent.services.execution_service import ExecutionService
    from taskgrove.agent.services.idempotent import IdempotentMethods
    from taskgrove.agent.services.task_service import TaskService
    from taskgrove.agent.services.wait_service import WaitService
    from taskgrove.storage.repository import TaskRepository


class A2AServices(EdgeServices, Protocol):
    @property
    def repo(self) -> TaskRepository: ...

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
    def task_methods(self) -> dict[str, Handler]: ...

    @property
    def idempotency(self) -> IdempotentMethods | None: ...

    @property
    def shutdown_hooks(self) -> list[Callable[[], Awaitable[None]]]: ...
