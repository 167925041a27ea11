"""The agent card is rendered without the a2a-sdk, and the SDK loads on the first A2A request.

agent/surfaces/a2a/card.py builds both forms of the card (1.0 and the 0.3-compatible one) as plain JSON, so
that a start-up and the card requests never import the SDK's server, protobuf or pydantic. These
tests hold that rendering to the SDK's own, byte for byte, for every variant of the card: with and
without JWT, with and without an LLM, at several addresses. The reference below is the card as
it was built through the SDK's AgentCard message before (parsed from the template, then rendered
with `MessageToDict` for 1.0 and `agent_card_to_dict` for 0.3).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from typing import Any

import pytest
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_rest_routes
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
from starlette.routing import Mount, Route

from taskgrove.agent.surfaces.a2a.card import (
    LLM_TAG,
    REST_PREFIX,
    TEXT_MODE,
    CachedCard,
    build_card,
    card_json,
    llm_configured,
    load_template,
    service_version,
)
from taskgrove.agent.surfaces.a2a.front import REST_ROUTES
from taskgrove.agent.foundations.settings import Settings


def sdk_card(settings: Settings, template: dict[str, Any]) -> AgentCard:
    """The card as the service built it through the SDK's message before card.py went plain."""
    data = dict(template)
    for key in ("url", "version", "supportedInterfaces", "supported_interfaces"):
        data.pop(key, None)
    card = ParseDict(data, AgentCard(), ignore_unknown_fields=True)
    card.version = service_version()
    url = settings.base_url
    card.supported_interfaces.extend([
        AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_1_0),
        AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_0_3),
        AgentInterface(url=url.rstrip("/") + REST_PREFIX, protocol_binding=TransportProtocol.HTTP_JSON,
                       protocol_version=PROTOCOL_VERSION_1_0),
    ])
    if settings.grpc_address:
        card.supported_interfaces.extend([
            AgentInterface(url=settings.grpc_address, protocol_binding=TransportProtocol.GRPC, protocol_version=v)
            for v in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)])
    card.capabilities.streaming = True
    card.capabilities.push_notifications = True
    if settings.jwt_secret:
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", bearer_format="JWT",
            description="Authorization: Bearer <JWT signed with the service's secret> (or an Authorization cookie)")))
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    if llm_configured(settings):
        if TEXT_MODE not in card.default_input_modes:
            card.default_input_modes.insert(0, TEXT_MODE)
    else:
        kept = [s for s in card.skills if LLM_TAG not in s.tags]
        del card.skills[:]
        card.skills.extend(kept)
        kept_modes = [m for m in card.default_input_modes if m != TEXT_MODE]
        del card.default_input_modes[:]
        card.default_input_modes.extend(kept_modes)
    return card


JWT = {"SERVICE_JWT_SECRET": "s" * 32}
LLMS = [{}, {"SERVICE_LLM_PROVIDER": "openai"}, {"OPENAI_API_KEY": "sk-test"},
        {"SERVICE_LLM_BASE_URL": "http://127.0.0.1:9/v1"}]
ADDRESSES = [{}, {"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": "8123"},
             {"SERVICE_PUBLIC_URL": "https://agents.example.com/taskgrove/"},
             {"SERVICE_API_HOST": "127.0.0.1", "SERVICE_API_PORT": "8123", "SERVICE_GRPC_PORT": "8124"},
             {"SERVICE_PUBLIC_URL": "https://agents.example.com/taskgrove/", "SERVICE_GRPC_PORT": "443"}]
VARIANTS = [{**jwt, **llm, **address} for jwt in ({}, JWT) for llm in LLMS for address in ADDRESSES]


def _variant_id(env: dict[str, str]) -> str:
    return ",".join(sorted(env)) or "defaults"


def _template_variants() -> list[dict[str, Any]]:
    """The shipped template, and the same with text input and stale run-time values in the file."""
    template = load_template()
    stale = json.loads(json.dumps(template))
    stale.update(url="http://stale.example", version="9.9", supportedInterfaces=[{"url": "http://stale.example"}],
                 unknownField={"x": 1})
    stale["defaultInputModes"] = [TEXT_MODE, *stale["defaultInputModes"]]
    return [template, stale]


@pytest.mark.parametrize("template", _template_variants(), ids=["template", "stale-template"])
@pytest.mark.parametrize("env", VARIANTS, ids=[_variant_id(v) for v in VARIANTS])
def test_card_bytes_are_the_sdk_rendering(env: dict[str, str], template: dict[str, Any]) -> None:
    settings = Settings.from_env(env)
    reference = sdk_card(settings, template)
    card = build_card(settings, template)
    modified = datetime(2026, 1, 1, tzinfo=timezone.utc)
    # A2A-Version: 1.x -> the 1.0 form; anything else -> the 0.3-compatible form.
    assert CachedCard(card, modified).content == CachedCard(MessageToDict(reference), modified).content
    assert CachedCard(card_json(card), modified).content == CachedCard(agent_card_to_dict(reference), modified).content
    # The SDK's request handler gets the same card as a message (agent.surfaces.a2a.routes.sdk_endpoints).
    assert ParseDict(card, AgentCard()) == reference


def test_variants_cover_each_branch() -> None:
    cards = [build_card(Settings.from_env(env)) for env in VARIANTS]
    assert any("securitySchemes" in c for c in cards) and any("securitySchemes" not in c for c in cards)
    assert any(TEXT_MODE in c["defaultInputModes"] for c in cards)
    assert any(TEXT_MODE not in c["defaultInputModes"] for c in cards)
    grpc = [c for c in cards if any(i["protocolBinding"] == "GRPC" for i in c["supportedInterfaces"])]
    assert grpc and len(grpc) < len(cards)
    assert all(card_json(c)["additionalInterfaces"][0]["transport"] == "GRPC" for c in grpc)
    assert {c["supportedInterfaces"][0]["url"] for c in cards} == {
        "http://localhost:8000", "http://127.0.0.1:8123", "https://agents.example.com/taskgrove"}


def test_rest_routes_are_the_sdks() -> None:
    """front.REST_ROUTES, registered before the SDK loads, are the routes of the SDK's factory."""
    sdk = [(r.path, set(r.methods or ())) for r in create_rest_routes(object(), path_prefix=REST_PREFIX)
           if isinstance(r, Route) and not isinstance(r, Mount)]
    assert [(path, set(methods)) for path, methods in REST_ROUTES] == sdk


STARTUP = textwrap.dedent("""
    import asyncio, json, sys
    from taskgrove.agent.app import build_app
    from taskgrove.agent.foundations.settings import Settings

    HEAVY = ("a2a", "google.protobuf", "pydantic", "httpx", "alembic", "rich", "mcp", "litellm", "strawberry")

    async def request(app, method, path, body=b"", headers=()):
        sent = []
        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}
        async def send(message):
            sent.append(message)
        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), *headers], "http_version": "1.1",
                 "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": ""}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def main():
        app = build_app(Settings.from_env({"SERVICE_DATABASE_URL": sys.argv[1]}))
        async with app.router.lifespan_context(app):
            status, card = await request(app, "GET", "/.well-known/agent-card.json")
            status10, card10 = await request(app, "GET", "/.well-known/agent-card.json", headers=[(b"a2a-version", b"1.0")])
            idle = sorted(m for m in HEAVY if m in sys.modules)
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}).encode()
            answer = await request(app, "POST", "/", body)
            print(json.dumps({"card": [status, json.loads(card)], "card10": [status10, json.loads(card10)],
                              "idle": idle, "a2a": [answer[0], json.loads(answer[1])],
                              "after": "a2a.server.request_handlers" in sys.modules}))

    asyncio.run(main())
""")


def _start(url: str, cwd: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", STARTUP, url], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_start_and_card_load_no_sdk_until_an_a2a_request(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    for start in ("new database", "restart"):
        seen = _start(url, str(tmp_path))
        # Nothing heavy at idle: the SDK, protobuf, pydantic, httpx (and rich through httpx._main),
        # Alembic (a new SQLite database gets the schema from storage/sqlite_schema.py, a current
        # one is only checked), the mcp SDK (MCP is on by default), litellm, strawberry.
        assert seen["idle"] == [], (start, seen["idle"])
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url})
        assert seen["card"] == [200, card_json(build_card(settings))]
        assert seen["card10"] == [200, build_card(settings)]
        # The first A2A request builds the SDK handler and is answered by it (0.3: task not found).
        assert seen["after"] is True
        status, answer = seen["a2a"]
        assert status == 200 and answer["id"] == 1 and answer["error"]["code"] == -32001, answer


def test_concurrent_first_requests_build_the_surface_once(tmp_path) -> None:
    import httpx

    from taskgrove.agent.app import build_app

    app = build_app(Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"}))
    hooks = app.state.services.shutdown_hooks
    get = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}}

    async def main() -> None:
        async with app.router.lifespan_context(app):
            before = len(hooks)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                answers = await asyncio.gather(
                    client.post("/", json=get),
                    client.post("/", json=get),
                    client.get("/a2a/tasks/x", headers={"A2A-Version": "1.0"}),
                )
                assert [a.status_code for a in answers] == [200, 200, 404]
                assert all(a.json()["error"]["code"] == -32001 for a in answers[:2])
                assert answers[2].json()["error"]["status"] == "NOT_FOUND"
                assert len(hooks) == before + 1  # one SDK handler, built by the first request

    asyncio.run(main())
