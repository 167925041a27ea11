"""The agent card: the static part from `agent-card.json`, the address and version filled at start.

The card advertises the same JSON-RPC endpoint twice, once as A2A 1.0 and once as 0.3, so the
official client picks 1.0 and older clients still find the 0.3 wire format they speak.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import AgentCard, AgentInterface
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from google.protobuf.json_format import ParseDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.settings import Settings

CARD_TEMPLATE = Path(__file__).resolve().parents[2] / "agent-card.json"
CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent-card")


def service_version() -> str:
    try:
        return version("taskgrove")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


def load_template(path: Path = CARD_TEMPLATE) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RuntimeError(f"agent card template {path} is missing; it ships beside pyproject.toml") from None
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
    ])
    card.capabilities.streaming = True
    card.capabilities.push_notifications = True
    return card


def card_json(card: AgentCard) -> dict[str, Any]:
    """The SDK's card JSON: 1.0 fields plus the 0.3 ones (`url`, `protocolVersion`, ...).

    Capabilities stay camelCase only (`pushNotifications`): ProtoJSON parsers accept the proto
    field name `push_notifications` as well, and the official client refuses a card that has both.
    """
    return agent_card_to_dict(card)


def card_routes(card: AgentCard) -> list[Route]:
    """GET on both well-known paths; public (no token needed even with JWT on)."""
    body = card_json(card)

    async def agent_card(_request: Request) -> Response:
        return JSONResponse(body)

    return [Route(path, agent_card, methods=["GET"]) for path in CARD_PATHS]
