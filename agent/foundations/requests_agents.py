"""The typed arguments of the directory of agents: `agents.add|get|list|refresh|remove`.

The pattern of agent/foundations/requests_services.py (its sibling, kept apart to keep each file
short): `from_params` reads a JSON-RPC params object once, with the -32602 messages clients see
naming the field; AgentService (agent/services/agent_service.py) takes only these. What needs the
service's state (the caller, the stored agents, the card itself) is checked there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.requests import params_object

# A directory name: what `inputs.agent` and the planner use, so short, plain and unambiguous.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
NAME_RULE = "1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
MAX_URL = 2048
MAX_TAGS, MAX_TAG = 20, 64
MAX_HEADERS, MAX_HEADER_VALUE = 20, 8192
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}\Z")  # an HTTP token (RFC 9110)
# Headers the client sets itself: a credential may not replace them.
RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection",
                              "idempotency-key", "traceparent"})
HEALTH = ("healthy", "failing", "open", "unknown")
DEFAULT_PAGE, MAX_PAGE = 50, 500
MAX_CONCURRENCY = 100_000


def agent_name(value: Any, field_name: str = "name") -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise invalid_params(f"{field_name} must be a directory name ({NAME_RULE}), got {value!r}"[:300])
    return value


def tags_of(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        raise invalid_params(f"tags must be an array of at most {MAX_TAGS} strings")
    out: list[str] = []
    for index, tag in enumerate(value):
        if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_TAG:
            raise invalid_params(f"tags[{index}] must be a non-empty string of at most {MAX_TAG} characters")
        rpc_params.checked_text(tag, f"tags[{index}]", MAX_TAG)
        if tag.strip() not in out:
            out.append(tag.strip())
    return out


def headers_of(value: Any) -> dict[str, str]:
    """Credential headers: names are HTTP tokens, values printable text. Errors name the header,
    never its value (it is a secret)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_HEADERS:
        raise invalid_params(f"headers must be an object of at most {MAX_HEADERS} header names and string values")
    out: dict[str, str] = {}
    for name, header_value in value.items():
        if not isinstance(name, str) or not HEADER_NAME.match(name):
            raise invalid_params(f"headers: {str(name)[:60]!r} is not an HTTP header name")
        if name.lower() in RESERVED_HEADERS:
            raise invalid_params(f"headers: {name} is set by the service itself and cannot be given")
        if not isinstance(header_value, str) or not header_value or len(header_value) > MAX_HEADER_VALUE \
                or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in header_value) or not header_value.isascii():
            raise invalid_params(f"headers.{name} must be a non-empty string of printable ASCII characters "
                                 f"(at most {MAX_HEADER_VALUE})")
        out[name] = header_value
    return out


def card_url_of(params: Mapping[str, Any]) -> str:
    url = rpc_params.string(params, "card_url", aliases=("url",), required=True, max_length=MAX_URL)
    assert url is not None
    url = url.strip()
    if not re.match(r"https?://[^\s/]+", url, re.IGNORECASE) or any(ch.isspace() for ch in url):
        raise invalid_params(f"card_url must be an http(s) URL of an agent card or of an agent, got {url!r}"[:300])
    return url


@dataclass(slots=True)
class AddAgent:
    """agents.add: the card at `card_url` joins the directory under `name` (default: derived from
    the card's name). `shared`: every user sees it (admins only). `headers`: the credential sent
    with every request to the agent, stored encrypted, never shown. `concurrency`: tasks for it in
    progress at once (default SERVICE_AGENT_CONCURRENCY)."""

    card_url: str
    name: str | None = None
    tags: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    shared: bool = False
    concurrency: int | None = None

    @classmethod
    def from_params(cls, params: Any) -> AddAgent:
        params = params_object(params)
        unknown = sorted(set(params) - {"card_url", "url", "name", "tags", "headers", "credential", "shared",
                                        "concurrency"})
        if unknown:
            raise invalid_params(f"{str(unknown[0])[:60]}: unknown field (fields: card_url, name, tags, headers, "
                                 "shared, concurrency)")
        name = params.get("name")
        headers = headers_of(params.get("headers"))
        credential = params.get("credential")
        if credential is not None:  # a bearer token, the common case, without spelling the header
            if not isinstance(credential, str):
                raise invalid_params("credential must be a string (sent as 'Authorization: Bearer <credential>')")
            headers = {**headers, **headers_of({"Authorization": f"Bearer {credential}"})}
        concurrency = params.get("concurrency")
        return cls(card_url_of(params), None if name is None else agent_name(name), tags_of(params.get("tags")),
                   headers, rpc_params.boolean(params, "shared", False),
                   None if concurrency is None else rpc_params.bounded(concurrency, "concurrency", low=1,
                                                                      high=MAX_CONCURRENCY))


@dataclass(slots=True)
class AgentRef:
    """agents.get, agents.refresh, agents.remove: one agent, by directory `name` (or `agent_id`).
    `accept` (agents.refresh): follow a change of the card's interfaces that a refresh flagged."""

    name: str | None = None
    agent_id: str | None = None
    accept: bool = False

    @classmethod
    def from_params(cls, params: Any) -> AgentRef:
        params = params_object(params)
        accept = rpc_params.boolean(params, "accept", False)
        if params.get("agent_id") is not None:
            return cls(agent_id=rpc_params.string(params, "agent_id", max_length=64), accept=accept)
        value = params.get("name", params.get("agent"))
        if value is None:
            raise invalid_params("name (the agent's directory name) or agent_id is required")
        return cls(name=agent_name(value), accept=accept)


@dataclass(slots=True)
class ListAgents:
    """agents.list: the agents the caller sees, optionally those with a skill (id or tag), a tag,
    or a health (healthy, failing, open, unknown); a page of `limit` after `cursor`."""

    skill: str | None = None
    tag: str | None = None
    health: str | None = None
    limit: int = DEFAULT_PAGE
    cursor: str | None = None

    @classmethod
    def from_params(cls, params: Any) -> ListAgents:
        params = params_object(params) if params is not None else {}
        health = rpc_params.string(params, "health", max_length=16)
        if health is not None and health not in HEALTH:
            raise invalid_params(f"health must be one of {', '.join(HEALTH)}, got {health!r}"[:300])
        cursor = params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise invalid_params("cursor must be a string: the next_cursor of the previous page")
        return cls(rpc_params.string(params, "skill", max_length=256), rpc_params.string(params, "tag", max_length=MAX_TAG),
                   health, rpc_params.integer(params, "limit", DEFAULT_PAGE, low=1, high=MAX_PAGE), cursor or None)
