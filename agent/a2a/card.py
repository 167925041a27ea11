"""The agent card: the static part from `agent-card.json`, the address and version filled at start.

The card advertises the same JSON-RPC endpoint twice, once as A2A 1.0 and once as 0.3, so the
official client picks 1.0 and older clients still find the 0.3 wire format they speak.

One card, two JSON forms. The A2A 1.0 card schema allows no field outside 1.0 (a top-level `url`,
`protocolVersion` or `preferredTransport` makes it invalid), while a 0.3 client cannot use a card
without `url` (the 0.3 SDKs and the 0.3 TCK find the endpoint there). A card request carries
nothing else that tells the two apart, and the 1.0 specification reads a request without an
`A2A-Version` header as 0.3. So:
- a request with `A2A-Version: 1.x` gets the 1.0 form, valid against the 1.0 card schema;
- any other request (and `/.well-known/agent.json`, the older location) gets the form the SDK
  serves by default: the 1.0 fields plus the 0.3 ones (`url`, `protocolVersion`,
  `preferredTransport`, `additionalInterfaces`). 1.0 clients that ignore unknown fields (the
  official SDK does) read it as a 1.0 card; 0.3 clients read it as theirs.
Both forms carry `Cache-Control` with a max-age, an `ETag` (per form) and `Last-Modified` (the
service's start), and answer a conditional GET whose `If-None-Match` matches with 304;
`Vary: A2A-Version` tells caches that the form depends on that header.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from email.utils import format_datetime
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    AgentCard,
    AgentInterface,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskgrove.agent.a2a.planner import llm_configured
from taskgrove.agent.a2a.rest import REST_PREFIX
from taskgrove.agent.settings import Settings

TEXT_MODE = "text/plain"
LLM_TAG = "llm"  # skills that need an LLM on the service (agent-card.json tags them so)
CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent-card")
LEGACY_CARD_PATH = "/.well-known/agent.json"  # where 0.2/0.3 clients look when agent-card.json fails
CARD_MAX_AGE = 300  # seconds a client may reuse the card (it changes only with a new release or address)


def service_version() -> str:
    try:
        return version("taskgrove")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


def card_template() -> Traversable:
    """`agent-card.json`: package data of `taskgrove` (the repository's top-level file when editable)."""
    return files("taskgrove").joinpath("agent-card.json")


def load_template(path: Traversable | None = None) -> dict[str, Any]:
    path = path if path is not None else card_template()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuntimeError(f"agent card template {path} is missing; it ships as package data of taskgrove") from None
    except ValueError as exc:
        raise RuntimeError(f"agent card template {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RuntimeError(f"agent card template {path} must hold a JSON object")
    return data


def build_card(settings: Settings, template: dict[str, Any] | None = None) -> AgentCard:
    """The card for this service: template + `url` (settings.base_url) + `version` + interfaces."""
    data = dict(template if template is not None else load_template())
    for key in ("url", "version", "supportedInterfaces", "supported_interfaces"):
        data.pop(key, None)  # run-time values only: a stale address in the file must not win
    card = ParseDict(data, AgentCard(), ignore_unknown_fields=True)
    card.version = service_version()
    url = settings.base_url
    card.supported_interfaces.extend([
        AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_1_0),
        AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_0_3),
        AgentInterface(url=url.rstrip("/") + REST_PREFIX, protocol_binding=TransportProtocol.HTTP_JSON,
                       protocol_version=PROTOCOL_VERSION_1_0),
    ])
    card.capabilities.streaming = True
    card.capabilities.push_notifications = True
    if settings.jwt_secret:  # tell a reading client what POST / and /a2a need (the card stays public)
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", bearer_format="JWT",
            description="Authorization: Bearer <JWT signed with the service's secret> (or an Authorization cookie)")))
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    if llm_configured(settings):
        if TEXT_MODE not in card.default_input_modes:
            card.default_input_modes.insert(0, TEXT_MODE)
    else:  # without an LLM a text part is refused (-32005): the card must not invite one
        kept = [s for s in card.skills if LLM_TAG not in s.tags]
        del card.skills[:]
        card.skills.extend(kept)
        kept_modes = [m for m in card.default_input_modes if m != TEXT_MODE]
        del card.default_input_modes[:]
        card.default_input_modes.extend(kept_modes)
    return card


def card_json(card: AgentCard) -> dict[str, Any]:
    """The 0.3-compatible card: 1.0 fields plus the 0.3 ones (`url`, `protocolVersion`, ...).

    Capabilities stay camelCase only (`pushNotifications`): ProtoJSON parsers accept the proto
    field name `push_notifications` as well, and the official client refuses a card that has both.
    """
    return agent_card_to_dict(card)


def card_json_v10(card: AgentCard) -> dict[str, Any]:
    """The 1.0 card: ProtoJSON of the AgentCard message, nothing else."""
    return MessageToDict(card, preserving_proto_field_name=False)


def wants_v10(request: Request) -> bool:
    version = request.headers.get("a2a-version", "").strip()
    return request.url.path != LEGACY_CARD_PATH and version.startswith("1")


class CachedCard:
    """One form of the card, rendered once, with its validators."""

    def __init__(self, body: dict[str, Any], modified: datetime) -> None:
        self.content = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        self.etag = '"' + hashlib.sha256(self.content).hexdigest()[:32] + '"'
        self.headers = {
            "ETag": self.etag,
            "Cache-Control": f"public, max-age={CARD_MAX_AGE}",
            "Last-Modified": format_datetime(modified, usegmt=True),
            "Vary": "A2A-Version",
        }

    def matches(self, if_none_match: str | None) -> bool:
        if not if_none_match:
            return False
        tags = [t.strip() for t in if_none_match.split(",")]
        return "*" in tags or any(t.removeprefix("W/") == self.etag for t in tags)


def card_routes(card: AgentCard) -> list[Route]:
    """GET on the well-known paths; public (no token needed even with JWT on)."""
    modified = datetime.now(timezone.utc).replace(microsecond=0)
    forms = {"1.0": CachedCard(card_json_v10(card), modified), "0.3": CachedCard(card_json(card), modified)}

    async def agent_card(request: Request) -> Response:
        form = forms["1.0" if wants_v10(request) else "0.3"]
        if form.matches(request.headers.get("if-none-match")):
            return Response(status_code=304, headers=form.headers)
        return Response(form.content, media_type="application/json", headers=form.headers)

    return [Route(path, agent_card, methods=["GET"]) for path in (*CARD_PATHS, LEGACY_CARD_PATH)]
