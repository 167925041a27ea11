"""What the MCP surface reads of the services: `McpServices`, a Protocol that
agent/services/container.py `Services` satisfies (checked by mypy, tests/test_types.py).

The edge's part (settings, metrics, admission: /mcp requests go through agent/surfaces/edge.py),
then what its tools and resources call. No SDK import here: agent/surfaces/mcp/__init__.py names
it without loading the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from taskgrove.agent.surfaces.edge import EdgeServices

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.engine.bus import EventBus
    from taskgrove.agent.engine.engine import Engine
    from taskgrove.agent.foundations.calls import Handler
    from taskgrove.agent.services.task_service import TaskService
    from taskgrove.executors.registry import ExecutorRegistry


class McpServices(EdgeServices, Protocol):
    @property
    def bus(self) -> EventBus: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def registry(self) -> ExecutorRegistry: ...

    @property
    def tasks(self) -> TaskService: ...

    @property
    def task_methods(self) -> dict[str, Handler]: ...

    @property
    def system_methods(self) -> dict[str, Handler]: ...
