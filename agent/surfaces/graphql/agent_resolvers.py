"""GraphQL arguments -> the AgentService operations `/tasks` uses (`agents.*`), answers -> AgentType.

Like resolvers.py for tasks, each resolver only renames: it builds the typed request of the
operation (agent/foundations/requests_agents.py, from the same params object `/tasks` would get,
so its argument rules and messages are the same) and calls the same AgentService method with the
call's CallContext, so permissions (own agents plus the shared ones; shared ones changed by admins
only) live in one place.
"""

from __future__ import annotations

from typing import Any

import strawberry

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.requests_agents import DEFAULT_PAGE, AddAgent, AgentRef, ListAgents
from taskgrove.agent.services.agent_service import AgentService
from taskgrove.agent.surfaces.graphql.agent_types import AddAgentInput, AgentHealthEnum, AgentPage, AgentType
from taskgrove.agent.surfaces.graphql.graphql_errors import checked, from_rpc, internal, service_call
from taskgrove.agent.surfaces.graphql.list_budget import budget_of


def _service(info: strawberry.Info) -> AgentService:
    parts = info.context.services.agents
    if parts is None:  # Services.build always sets it; a hand-built context might not
        raise internal()
    service: AgentService = parts.service
    return service


def _ref(name: str | None, agent_id: str | None = None, accept: bool | None = None) -> AgentRef:
    params: dict[str, Any] = {}
    if name is not None:
        params["name"] = name
    if agent_id is not None:
        params["agent_id"] = agent_id
    if accept is not None:
        params["accept"] = accept
    return checked(AgentRef.from_params, params)


async def agents(info: strawberry.Info, skill: str | None, tag: str | None, health: AgentHealthEnum | None,
                 limit: int | None, cursor: str | None) -> AgentPage:
    """agents.list: a page of the agents the caller sees, filtered like agents.list."""
    budget = budget_of(info)
    budget.check(limit if isinstance(limit, int) and limit > 0 else DEFAULT_PAGE)  # before reading
    params = {key: value for key, value in (("skill", skill), ("tag", tag), ("limit", limit), ("cursor", cursor))
              if value is not None}
    if health is not None:
        params["health"] = health.value
    request = checked(ListAgents.from_params, params)
    async with budget.turn():  # one list of the request at a time (list_budget.py says why)
        page = await service_call(_service(info).list, request, info.context.call)
        budget.spend(len(page["agents"]))
        return AgentPage.from_wire(page)


async def agent(info: strawberry.Info, name: str | None, agent_id: str | None) -> AgentType | None:
    """agents.get: one agent by directory name (or agentId); null when there is none."""
    found = await service_call(_service(info).get, _ref(name, agent_id), info.context.call)
    return None if found is None else AgentType.from_wire(found)


async def add_agent(info: strawberry.Info, agent_input: AddAgentInput | None) -> AgentType:
    """agents.add: the card is fetched (SSRF guard, trusted keys) and the agent stored."""
    if agent_input is None:
        raise from_rpc(invalid_params("agentInput is required"))
    request = checked(AddAgent.from_params, agent_input.params())
    return AgentType.from_wire(await service_call(_service(info).add, request, info.context.call))


async def refresh_agent(info: strawberry.Info, name: str | None, accept: bool | None) -> AgentType:
    """agents.refresh: the card fetched again; a change of interfaces followed only with accept."""
    request = _ref(name, accept=accept)
    return AgentType.from_wire(await service_call(_service(info).refresh, request, info.context.call))


async def remove_agent(info: strawberry.Info, name: str | None) -> bool:
    """agents.remove: true when the agent was removed."""
    answer = await service_call(_service(info).remove, _ref(name), info.context.call)
    return bool(answer["success"])
