"""The directory of agents' parts, built once for a service (agent/services/container.py holds one).

Kept out of the container so that it stays a list of services: the store, the encrypted
credentials, the service of `agents.*`, the lookup executors and the planner use (put into the
engine's service map as `agent_directory` and `agent_planner`), the refresher, and the hook that
gives a task delegated by name its default concurrency key.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations.agent_metrics import AgentMetrics
from taskgrove.agent.foundations.calls import Handler
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.agent_lookup import DirectoryLookup
from taskgrove.agent.services.agent_refresh import AgentRefresher
from taskgrove.agent.services.agent_service import AgentService, agent_methods
from taskgrove.agent.services.task_service import TaskService
from taskgrove.executors.agent_delegation import SERVICE
from taskgrove.storage.agent_secrets import AgentSecrets
from taskgrove.storage.agents import AgentStore
from taskgrove.storage.repository import TaskRepository

PLANNER = "agent_planner"  # the engine service generate_service asks for the planner's agents


@dataclass
class AgentDirectoryParts:
    service: AgentService
    lookup: DirectoryLookup
    refresher: AgentRefresher

    @classmethod
    def build(cls, repo: TaskRepository, settings: Settings, metrics: Metrics,
              engine_services: MutableMapping[str, Any], tasks: TaskService) -> "AgentDirectoryParts":
        store = AgentStore(repo.connections)
        secrets = AgentSecrets(settings.secret_key)
        service = AgentService(store, secrets, settings)
        lookup = DirectoryLookup(store, secrets, settings, AgentMetrics(metrics))
        engine_services[SERVICE] = lookup
        engine_services[PLANNER] = lookup.for_plan
        tasks.row_hooks.append(lookup.limit_delegations)
        return cls(service, lookup, AgentRefresher(service, lookup))

    def methods(self) -> dict[str, Handler]:
        return agent_methods(self.service)
