"""The MCP tools of the directory of agents (docs/agents.md): one per `agents.*` method.

Beside agent/surfaces/mcp/tools.py, which makes them ToolSpecs and lists them with the others (so
this module needs nothing of it); like every tool, each is a name, the JSON-RPC method it calls,
its table, a description and a schema (agent/services/agent_service.py holds the rules).
"""

from __future__ import annotations

from typing import Any

Spec = tuple[str, str, str, str, dict[str, Any]]  # ToolSpec's fields, in its order
NAME = {"type": "string", "minLength": 1, "maxLength": 64,
        "description": "The agent's directory name (what a2a_agent_executor's inputs.agent names)."}


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **({"required": required} if required else {})}


def agent_specs() -> list[Spec]:
    return [
        ("agents_add", "agents.add", "tasks",
                 "Add an A2A agent to the directory from its card (card_url: the card's URL or the agent's base "
                 "URL). Trees then delegate to it by name (a2a_agent_executor with inputs.agent) or by one of its "
                 "skills (inputs.skill). headers/credential are stored encrypted and never shown; shared (every "
                 "user sees it) needs an admin.",
                 _obj({"card_url": {"type": "string", "minLength": 1}, "name": NAME,
                       "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
                       "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                       "credential": {"type": "string", "description": "Sent as Authorization: Bearer <credential>."},
                       "shared": {"type": "boolean", "default": False},
                       "concurrency": {"type": "integer", "minimum": 1,
                                       "description": "Tasks for this agent in progress at once."}}, ["card_url"])),
        ("agents_get", "agents.get", "tasks",
                 "Read one agent: its skills (with examples), interfaces, health (calls, failures, p50/p95 latency, "
                 "last error) and breaker. Null when it does not exist.", _obj({"name": NAME}, ["name"])),
        ("agents_list", "agents.list", "tasks",
                 "List the agents you may delegate to, optionally those with a skill (id or tag), a tag or a health "
                 "(healthy, failing, open, unknown); a page of limit, then pass next_cursor as cursor.",
                 _obj({"skill": {"type": "string"}, "tag": {"type": "string"},
                       "health": {"type": "string", "enum": ["healthy", "failing", "open", "unknown"]},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                       "cursor": {"type": ["string", "null"]}})),
        ("agents_refresh", "agents.refresh", "tasks",
                 "Fetch an agent's card again. A change of its interfaces is flagged in `changed` and not followed "
                 "unless accept is true.",
                 _obj({"name": NAME, "accept": {"type": "boolean", "default": False}}, ["name"])),
        ("agents_remove", "agents.remove", "tasks", "Remove an agent from the directory.",
                 _obj({"name": NAME}, ["name"])),
    ]
