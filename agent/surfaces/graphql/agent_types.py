"""The GraphQL types of the directory of agents (docs/agents.md), built from the answers of
`agents.*` (agent/services/agent_service.py `public`).

Each type is made from the wire dict every other surface returns, so GraphQL shows what `/tasks`
shows, only typed. There is no field for a credential: `public` has already dropped it and says
only `has_credentials`, and a type cannot show what it does not declare. What a remote card says
that we do not interpret (an interface's binding, a flagged change) stays JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import Any, Optional

import strawberry
from strawberry.scalars import JSON


def _timestamp(value: Any) -> Optional[datetime]:
    if not value:
        return None
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@strawberry.enum(description="An agent's health: HEALTHY, FAILING (its last call failed), OPEN (breaker), "
                             "UNKNOWN (never called); agents.list's `health` in lower case.")
class AgentHealthEnum(Enum):
    HEALTHY = "healthy"
    FAILING = "failing"
    OPEN = "open"
    UNKNOWN = "unknown"


@strawberry.type(description="A skill an agent's card offers; a2a_agent_executor's `skill` names its id or a tag.")
class AgentSkillType:
    id: str
    name: Optional[str]
    description: Optional[str]
    tags: list[str]
    examples: list[str]
    input_modes: list[str]
    output_modes: list[str]

    @classmethod
    def from_wire(cls, skill: Mapping[str, Any]) -> AgentSkillType:
        return cls(id=str(skill.get("id", "")), name=skill.get("name"), description=skill.get("description"),
                   tags=[str(t) for t in skill.get("tags") or ()], examples=[str(e) for e in skill.get("examples") or ()],
                   input_modes=[str(m) for m in skill.get("input_modes") or ()],
                   output_modes=[str(m) for m in skill.get("output_modes") or ()])


@strawberry.type(description="One of an agent's last calls.")
class AgentCallType:
    at: Optional[datetime]
    ok: bool
    ms: Optional[float] = strawberry.field(description="How long the call took, in milliseconds.")
    error: Optional[str]

    @classmethod
    def from_wire(cls, call: Mapping[str, Any]) -> AgentCallType:
        return cls(at=_timestamp(call.get("at")), ok=bool(call.get("ok")), ms=call.get("ms"), error=call.get("error"))


@strawberry.type(description="An agent's health, from real calls (docs/agents.md, Health and the breaker).")
class AgentHealthType:
    state: AgentHealthEnum
    calls: int
    successes: int
    failures: int
    consecutive_failures: int
    p50_ms: Optional[float] = strawberry.field(description="Median latency of the last 100 calls, in milliseconds.")
    p95_ms: Optional[float] = strawberry.field(description="95th percentile of the last 100 calls, in milliseconds.")
    last_error: Optional[str]
    last_call_at: Optional[datetime]
    last_success_at: Optional[datetime]
    recent: list[AgentCallType] = strawberry.field(description="The last calls, oldest first (at most 10).")

    @classmethod
    def from_wire(cls, health: Mapping[str, Any]) -> AgentHealthType:
        return cls(state=AgentHealthEnum(health.get("state", "unknown")), calls=int(health.get("calls") or 0),
                   successes=int(health.get("successes") or 0), failures=int(health.get("failures") or 0),
                   consecutive_failures=int(health.get("consecutive_failures") or 0),
                   p50_ms=health.get("p50_ms"), p95_ms=health.get("p95_ms"), last_error=health.get("last_error"),
                   last_call_at=_timestamp(health.get("last_call_at")),
                   last_success_at=_timestamp(health.get("last_success_at")),
                   recent=[AgentCallType.from_wire(c) for c in health.get("recent") or ()])


@strawberry.type(description="An A2A agent of the directory. Its credential is never shown: hasCredentials says "
                             "whether one is stored.")
class AgentType:
    agent_id: str
    name: str = strawberry.field(description="The directory name (a2a_agent_executor's inputs.agent).")
    card_url: str
    shared: bool
    user_id: Optional[str]
    tags: list[str]
    card_name: Optional[str]
    description: Optional[str]
    version: Optional[str]
    protocol_version: Optional[str]
    skills: list[AgentSkillType]
    interfaces: JSON = strawberry.field(description="Where messages go: [{url, protocol_binding, protocol_version}].")
    fetched_at: Optional[datetime]
    refresh_error: Optional[str]
    changed: Optional[JSON] = strawberry.field(description="A change of the card's interfaces a refresh flagged and "
                                                           "did not follow (accept it with refreshAgent); null otherwise.")
    has_credentials: bool
    concurrency: int
    concurrency_key: str
    health: AgentHealthType
    breaker: str = strawberry.field(description="closed, open or probing.")
    breaker_until: Optional[datetime]
    created_at: Optional[datetime]
    updated_at: Optional[datetime]

    @classmethod
    def from_wire(cls, agent: Mapping[str, Any]) -> AgentType:
        return cls(agent_id=agent["agent_id"], name=agent["name"], card_url=agent["card_url"], shared=agent["shared"],
                   user_id=agent.get("user_id"), tags=list(agent.get("tags") or ()), card_name=agent.get("card_name"),
                   description=agent.get("description"), version=agent.get("version"),
                   protocol_version=agent.get("protocol_version"),
                   skills=[AgentSkillType.from_wire(s) for s in agent.get("skills") or ()],
                   interfaces=agent["interfaces"], fetched_at=_timestamp(agent.get("fetched_at")),
                   refresh_error=agent.get("refresh_error"), changed=agent.get("changed"),
                   has_credentials=bool(agent.get("has_credentials")), concurrency=int(agent["concurrency"]),
                   concurrency_key=agent["concurrency_key"], health=AgentHealthType.from_wire(agent["health"]),
                   breaker=agent.get("breaker") or "closed", breaker_until=_timestamp(agent.get("breaker_until")),
                   created_at=_timestamp(agent.get("created_at")), updated_at=_timestamp(agent.get("updated_at")))


@strawberry.type(description="A page of agents (agents.list): pass nextCursor as cursor for the next; null on the last.")
class AgentPage:
    agents: list[AgentType]
    next_cursor: Optional[str]

    @classmethod
    def from_wire(cls, page: Mapping[str, Any]) -> AgentPage:
        return cls(agents=[AgentType.from_wire(a) for a in page["agents"]], next_cursor=page.get("next_cursor"))


@strawberry.input(description="A new agent of the directory (agents.add). headers/credential are stored encrypted "
                              "and never shown; shared needs an admin.")
class AddAgentInput:
    card_url: str
    name: Optional[str] = strawberry.UNSET
    tags: Optional[list[str]] = strawberry.UNSET
    headers: Optional[JSON] = strawberry.UNSET
    credential: Optional[str] = strawberry.UNSET
    shared: Optional[bool] = strawberry.UNSET
    concurrency: Optional[int] = strawberry.UNSET

    def params(self) -> dict[str, Any]:
        """The params of agents.add: the fields the client gave (explicit null included)."""
        out: dict[str, Any] = {"card_url": self.card_url}
        for key in ("name", "tags", "headers", "credential", "shared", "concurrency"):
            value = getattr(self, key)
            if value is not strawberry.UNSET:
                out[key] = value
        return out


@strawberry.type(description="Which agent asks, for a task whose wait is an agent's question (kind agent_input).")
class WaitingAgentType:
    name: Optional[str] = strawberry.field(description="The directory name, or null for an agent called by URL.")
    url: Optional[str]
    remote_task_id: Optional[str]
    remote_context_id: Optional[str]
    state: Optional[str] = strawberry.field(description="input-required or auth-required (the remote task's state).")
    asked_by: Optional[JSON] = strawberry.field(
        default=None, description="The agent further down the chain that asked, when the agent relays a question.")

    @classmethod
    def from_wire(cls, agent: Any) -> Optional[WaitingAgentType]:
        if not isinstance(agent, Mapping):
            return None
        return cls(name=agent.get("name"), url=agent.get("url"), remote_task_id=agent.get("remote_task_id"),
                   remote_context_id=agent.get("remote_context_id"), state=agent.get("state"),
                   asked_by=agent.get("asked_by"))
