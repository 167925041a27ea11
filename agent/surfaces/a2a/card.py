"""The agent card: the static part from `agent-card.json`, the address and version filled at start.

Rendered as plain JSON, without the a2a-sdk: serving the card must not load the SDK's server,
protobuf and pydantic (~20 MB and ~0.3 s of a start); they load on the first A2A request
(agent/surfaces/a2a/front.py). tests/test_a2a_card.py holds both forms to the SDK's own rendering.

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

import copy
import hashlib
import json
from datetime import datetime, timezone
from email.utils import format_datetime
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskgrove.agent.foundations.settings import Settings
from taskgrove.llm.client import PROVIDERS

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


# The fields of the A2A 1.0 AgentCard message (ProtoJSON names). Anything else in the template is
# dropped, as parsing it into the SDK's AgentCard did.
CARD_FIELDS = ("name", "description", "supportedInterfaces", "provider", "version", "documentationUrl",
               "capabilities", "securitySchemes", "securityRequirements", "defaultInputModes",
               "defaultOutputModes", "skills", "signatures", "iconUrl")
JSONRPC, HTTP_JSON, GRPC = "JSONRPC", "HTTP+JSON", "GRPC"  # the SDK's TransportProtocol values
V1_0, V0_3 = "1.0", "0.3"  # protocol versions the card advertises
REST_PREFIX = "/a2a"  # the HTTP+JSON transport's routes (agent/surfaces/a2a/rest.py)
BEARER_DESCRIPTION = "Authorization: Bearer <JWT signed with the service's secret> (or an Authorization cookie)"


def llm_configured(settings: Settings) -> bool:
    """An LLM is configured: a base URL, a default provider or a vendor key in the environment."""
    environ = getattr(settings, "environ", None) or {}
    return bool(settings.llm_base_url or settings.llm_provider
                or any(environ.get(p.key_var) for p in PROVIDERS.values()))


def build_card(settings: Settings, template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card for this service, in its 1.0 form (the ProtoJSON of the A2A AgentCard message):
    template + `version` + interfaces (at settings.base_url) + capabilities + security.

    Plain JSON, so that serving the card loads neither the a2a-sdk nor protobuf; the SDK's request
    handler gets the same card as a message when it is built (agent.surfaces.a2a.routes).
    tests/test_a2a_card.py checks that both forms are the bytes the SDK's own rendering gives.
    """
    data = template if template is not None else load_template()
    # run-time values (url, version, interfaces) never come from the file: a stale address must not win
    card: dict[str, Any] = {k: v for k, v in data.items()
                            if k in CARD_FIELDS and k not in ("version", "supportedInterfaces")}
    card["version"] = service_version()
    url = settings.base_url
    card["supportedInterfaces"] = [
        {"url": url, "protocolBinding": JSONRPC, "protocolVersion": V1_0},
        {"url": url, "protocolBinding": JSONRPC, "protocolVersion": V0_3},
        {"url": url.rstrip("/") + REST_PREFIX, "protocolBinding": HTTP_JSON, "protocolVersion": V1_0},
    ]
    if settings.grpc_address:  # SERVICE_GRPC_PORT: both wires' gRPC services on one port (agent/surfaces/a2a/grpc_server.py)
        card["supportedInterfaces"] += [{"url": settings.grpc_address, "protocolBinding": GRPC, "protocolVersion": v}
                                        for v in (V1_0, V0_3)]
    card["capabilities"] = {**card.get("capabilities", {}), "streaming": True, "pushNotifications": True}
    if settings.jwt_secret:  # tell a reading client what POST / and /a2a need (the card stays public)
        card["securitySchemes"] = {**card.get("securitySchemes", {}), "bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "bearerFormat": "JWT", "description": BEARER_DESCRIPTION}}}
        card["securityRequirements"] = [*card.get("securityRequirements", []), {"schemes": {"bearer": {}}}]
    modes = list(card.get("defaultInputModes", []))
    if llm_configured(settings):
        if TEXT_MODE not in modes:
            modes.insert(0, TEXT_MODE)
    else:  # without an LLM a text part is refused (-32005): the card must not invite one
        card["skills"] = [s for s in card.get("skills", []) if LLM_TAG not in s.get("tags", [])]
        modes = [m for m in modes if m != TEXT_MODE]
    card["defaultInputModes"] = modes
    return {k: v for k, v in card.items() if v not in ([], {}, "")}  # ProtoJSON leaves out empty fields


def card_json(card: dict[str, Any]) -> dict[str, Any]:
    """The 0.3-compatible card: the 1.0 fields plus the 0.3 ones, as the SDK's `agent_card_to_dict`
    adds them: `url`, `preferredTransport` and `protocolVersion` of the first 0.3 interface (JSON-RPC),
    `additionalInterfaces` for the others (gRPC, when SERVICE_GRPC_PORT is set), and the
    bearer scheme and requirement also in their 0.3 shape (`type: http`, `security`).

    Capabilities stay camelCase only (`pushNotifications`): ProtoJSON parsers accept the proto
    field name `push_notifications` as well, and the official client refuses a card that has both.
    """
    legacy, *others = [i for i in card["supportedInterfaces"] if i["protocolVersion"] == V0_3]
    body = copy.deepcopy(card)
    body.update(url=legacy["url"], preferredTransport=legacy["protocolBinding"], protocolVersion=V0_3)
    if others:  # gRPC when on: the 0.3 card lists every further 0.3 interface here
        body["additionalInterfaces"] = [{"transport": i["protocolBinding"], "url": i["url"]} for i in others]
    for scheme in body.get("securitySchemes", {}).values():
        if "httpAuthSecurityScheme" in scheme:
            scheme.update({"type": "http", **scheme["httpAuthSecurityScheme"]})
    if card.get("securityRequirements"):
        body["security"] = [{name: scopes.get("list", []) for name, scopes in r["schemes"].items()}
                            for r in card["securityRequirements"]]
    return body


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


def card_routes(card: dict[str, Any]) -> list[Route]:
    """GET on the well-known paths; public (no token needed even with JWT on)."""
    modified = datetime.now(timezone.utc).replace(microsecond=0)
    forms = {"1.0": CachedCard(card, modified), "0.3": CachedCard(card_json(card), modified)}

    async def agent_card(request: Request) -> Response:
        form = forms["1.0" if wants_v10(request) else "0.3"]
        if form.matches(request.headers.get("if-none-match")):
            return Response(status_code=304, headers=form.headers)
        return Response(form.content, media_type="application/json", headers=form.headers)

    return [Route(path, agent_card, methods=["GET"]) for path in (*CARD_PATHS, LEGACY_CARD_PATH)]
