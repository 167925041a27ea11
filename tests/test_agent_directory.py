"""The directory of agents (issue 45, items 1-3), through /tasks, with a second `taskgrove serve`.

A real remote taskgrove is added to the directory by its card URL; a tree delegates to it by name
and by skill and completes; a plan from the stand-in LLM (tests/fakellm.py) names it and runs;
an agent that fails N calls in a row (a proxy in front of the remote, broken on purpose) opens its
breaker: its tasks wait instead of failing, and run once it recovers. Credentials are never shown.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT
from tests.processes import Service
from tests.servers import serve

pytestmark = pytest.mark.xdist_group("test_agent_directory")
SECRET = "agent-directory-test-secret-of-forty-bytes!"


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("remote")
    service = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}"}, "remote").start()
    try:
        yield service
    finally:
        service.stop()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def remote_work(word: str = "alpha") -> dict[str, Any]:
    """The data part that makes the remote taskgrove run a one-task tree."""
    return {"tasks": [{"id": _id("r"), "name": "remote noop", "schemas": {"method": "noop_executor"},
                       "inputs": {"word": word}}]}


def delegated(task_id: str, **inputs: Any) -> dict[str, Any]:
    return {"id": task_id, "name": "delegate", "schemas": {"method": "a2a_agent_executor"},
            "inputs": {"streaming": False, "poll_interval": 0.1, **inputs}}


# --- the directory ----------------------------------------------------------------------------

async def test_add_get_list_refresh_remove(remote: Service, app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_SECRET_KEY": SECRET}) as client:
        added = await client.result("agents.add", {"card_url": remote.url, "tags": ["remote", "tests"],
                                                   "headers": {"X-Api-Key": "very-secret-value"}})
        assert added["name"] == "taskgrove" and added["card_name"] == "taskgrove"
        assert "tasks.execute" in {s["id"] for s in added["skills"]}
        assert added["interfaces"] and added["fetched_at"] and added["has_credentials"] is True
        assert added["concurrency_key"] == "agent:taskgrove" and added["health"]["state"] == "unknown"
        named = await client.result("agents.add", {"card_url": f"{remote.url}/.well-known/agent-card.json",
                                                   "name": "second"})
        assert named["name"] == "second" and named["has_credentials"] is False
        taken = await client.error("agents.add", {"card_url": remote.url})
        assert taken["code"] == -32602 and "taskgrove" in taken["message"]

        got = await client.result("agents.get", {"name": "taskgrove"})
        assert got["agent_id"] == added["agent_id"]
        assert await client.result("agents.get", {"name": "nobody"}) is None
        listed = await client.result("agents.list", {"skill": "workflow"})
        assert [a["name"] for a in listed["agents"]] == ["taskgrove", "second"]
        assert (await client.result("agents.list", {"tag": "remote"}))["agents"][0]["name"] == "taskgrove"
        assert (await client.result("agents.list", {"skill": "no-such-skill"}))["agents"] == []
        first = await client.result("agents.list", {"limit": 1})
        assert [a["name"] for a in first["agents"]] == ["taskgrove"] and first["next_cursor"]
        rest = await client.result("agents.list", {"limit": 1, "cursor": first["next_cursor"]})
        assert [a["name"] for a in rest["agents"]] == ["second"] and rest["next_cursor"] is None
        refreshed = await client.result("agents.refresh", {"name": "taskgrove"})
        assert refreshed["fetched_at"] >= added["fetched_at"] and refreshed["changed"] is None

        everything = json.dumps([added, named, got, listed, refreshed])
        assert "very-secret-value" not in everything  # the credential never comes back
        assert (await client.result("agents.remove", {"name": "second"}))["success"] is True
        assert await client.result("agents.get", {"name": "second"}) is None
        bad = await client.error("agents.add", {"card_url": "http://127.0.0.1:9/nothing-here"})
        assert bad["code"] == -32602 and "card_url" in bad["message"]


async def test_a_credential_needs_the_secret_and_a_shared_agent_an_admin(remote: Service, app_factory: Any) -> None:
    from taskgrove.agent.foundations.auth import mint_token
    from taskgrove.agent.foundations.settings import Settings

    jwt = "agent-directory-jwt-secret-of-forty-bytes!!"
    async with app_factory() as client:  # no SERVICE_SECRET_KEY: nothing to encrypt with
        error = await client.error("agents.add", {"card_url": remote.url, "credential": "token-123"})
        assert "SERVICE_SECRET_KEY" in error["message"] and "token-123" not in json.dumps(error)
    async with app_factory(env={"SERVICE_JWT_SECRET": jwt}) as client:
        settings = Settings.from_env({"SERVICE_JWT_SECRET": jwt})
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice', [], 3600)}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob', [], 3600)}"}
        admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'], 3600)}"}
        refused = await client.error("agents.add", {"card_url": remote.url, "shared": True}, headers=alice)
        assert refused["code"] == -32001
        await client.result("agents.add", {"card_url": remote.url, "name": "alices"}, headers=alice)
        await client.result("agents.add", {"card_url": remote.url, "name": "everyones", "shared": True},
                            headers=admin)
        seen = await client.result("agents.list", {}, headers=bob)
        assert [a["name"] for a in seen["agents"]] == ["everyones"]
        assert (await client.error("agents.get", {"name": "alices"}, headers=bob))["code"] == -32001
        assert (await client.error("agents.remove", {"name": "everyones"}, headers=alice))["code"] == -32001
        mine = await client.result("agents.list", {}, headers=alice)
        assert sorted(a["name"] for a in mine["agents"]) == ["alices", "everyones"]


# --- delegation --------------------------------------------------------------------------------

async def test_a_tree_delegates_by_name_and_by_skill(remote: Service, app_factory: Any) -> None:
    async with app_factory() as client:
        await client.result("agents.add", {"card_url": remote.url, "name": "helper"})
        root, by_name, by_skill, nobody = _id("root"), _id("by-name"), _id("by-skill"), _id("nobody")
        tree = await client.result("tasks.create", [
            {"id": root, "name": "orchestrate", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": by_name, "required": True}, {"id": by_skill, "required": True}]},
            dict(delegated(by_name, agent="helper", data=remote_work("named")), parent_id=root),
            dict(delegated(by_skill, skill="orchestration", data=remote_work("skilled")), parent_id=root),
        ])
        assert tree["status"] == "completed", tree
        tasks = {t["id"]: t for t in await client.result("tasks.list", {"limit": 10})}
        assert tasks[by_name]["result"]["delegated"] == {"agent": "helper", "chosen_by": "agent", "skill": None}
        assert tasks[by_skill]["result"]["delegated"] == {"agent": "helper", "chosen_by": "skill",
                                                           "skill": "orchestration"}
        assert tasks[by_name]["concurrency"] == {"key": "agent:helper", "limit": 8}
        agent = await client.result("agents.get", {"name": "helper"})
        assert agent["health"]["successes"] == 2 and agent["health"]["p50_ms"] is not None
        failed = await client.result("tasks.create", [delegated(nobody, agent="ghost", message="hi")])
        assert failed["status"] == "failed" and "no agent named 'ghost'" in failed["error"]
        metrics = (await client.http.get("/metrics")).text
        assert 'taskgrove_agent_calls_total{agent="helper",outcome="ok"} 2.0' in metrics


async def test_a_plan_delegates_to_a_directory_agent_by_name(remote: Service, app_factory: Any, fake_llm: Any) -> None:
    plan = [{"id": "root", "name": "a2a_agent_executor", "parent_id": None, "dependencies": [],
             "inputs": {"agent": "helper", "data": remote_work("planned"),
                        "streaming": False, "poll_interval": 0.1}}]
    wrong = [dict(plan[0], inputs={**plan[0]["inputs"], "agent": "imaginary"})]
    fake_llm.script("[[delegate]]", [json.dumps(wrong), json.dumps(plan)])
    async with app_factory(llm_base_url=fake_llm.base_url, environ={"OPENAI_API_KEY": "sk-test"}) as client:
        await client.result("agents.add", {"card_url": remote.url, "name": "helper"})
        generated = await client.result("tasks.generate", {"requirement": "[[delegate]] ask an agent to count words",
                                                           "provider": "openai"})
        prompt = fake_llm.requests[0]["messages"][0]["content"]
        assert "- helper:" in prompt and "skill tasks.execute" in prompt  # the planner's prompt names it
        repair = fake_llm.requests[1]["messages"][-1]["content"]
        assert "agent 'imaginary' is not in the directory" in repair  # the repair round saw it
        (task,) = generated["tasks"]
        assert task["inputs"]["agent"] == "helper"
        tree = await client.result("tasks.create", generated["tasks"])
        assert tree["status"] == "completed", tree["error"]
        assert tree["result"]["delegated"]["agent"] == "helper"


# --- health and the breaker ----------------------------------------------------------------------

class Flaky:
    """A proxy in front of the remote agent: its card points here, and while `broken` every
    JSON-RPC call answers 503."""

    def __init__(self, remote_url: str) -> None:
        self.remote_url = remote_url
        self.url = ""
        self.broken = True
        self.calls = 0

    async def card(self, request: Request) -> Response:
        async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:  # never httpx's 5 s: a busy machine
            card = (await http.get(f"{self.remote_url}/.well-known/agent-card.json")).json()
        for interface in card.get("supportedInterfaces") or []:
            interface["url"] = interface["url"].replace(self.remote_url, self.url)
        if "url" in card:
            card["url"] = card["url"].replace(self.remote_url, self.url)
        return JSONResponse(card)

    async def rpc(self, request: Request) -> Response:
        self.calls += 1
        if self.broken:
            return Response("down for maintenance", status_code=503)
        async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
            answer = await http.post(f"{self.remote_url}{request.url.path}", content=await request.body(),
                                     headers={k: v for k, v in request.headers.items()
                                              if k.lower() not in ("host", "content-length")})
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"))


async def test_a_failing_agent_opens_its_breaker_and_its_tasks_wait_until_it_recovers(
        remote: Service, app_factory: Any) -> None:
    flaky = Flaky(remote.url)
    app = Starlette(routes=[Route("/.well-known/agent-card.json", flaky.card),
                            Route("/{path:path}", flaky.rpc, methods=["POST"])])
    retry = {"max_attempts": 20, "backoff": "fixed", "base_seconds": 0.2, "jitter": False}
    async with serve(app) as url, app_factory(env={"SERVICE_AGENT_BREAKER_FAILURES": "2",
                                                   "SERVICE_AGENT_BREAKER_COOLDOWN_SECONDS": "1",
                                                   "SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        flaky.url = url
        await client.result("agents.add", {"card_url": url, "name": "flaky"})
        root, ids = _id("root"), [_id("flaky") for _ in range(3)]
        await client.result("tasks.create", [
            {"id": root, "name": "fan out", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": i, "required": True} for i in ids]},
            *[dict(delegated(i, agent="flaky", data=remote_work(i)), retry=retry, parent_id=root) for i in ids],
        ])  # answered at once (SERVICE_CREATE_WAIT_TIMEOUT 0): the tree runs on
        waited = None
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while asyncio.get_running_loop().time() < deadline:  # the breaker opens after two failures; the tasks then wait
            agent = await client.result("agents.get", {"name": "flaky"})
            tasks = [await client.result("tasks.get", {"task_id": i}) for i in ids]
            parked = [t for t in tasks if (t.get("waiting") or {}).get("kind") == "timer"]
            if agent["breaker"] != "closed" and parked:
                waited = parked[0]["waiting"]
                break
            await asyncio.sleep(0.05)
        assert waited is not None and "breaker is open" in waited["prompt"], (agent, tasks)
        assert parked[0]["waiting_for"] == waited["prompt"]  # what it waits for, said where waits are said
        assert all(t["status"] != "failed" for t in tasks)
        assert agent["health"]["consecutive_failures"] >= 2 and agent["health"]["state"] == "open"
        flaky.broken = False  # it recovers: after the cool-down one probe goes through, then the rest
        for i in ids:
            done = await client.wait_status(i, ("completed", "failed"))
            assert done["status"] == "completed", done
            assert done["result"]["delegated"]["agent"] == "flaky"
        agent = await client.result("agents.get", {"name": "flaky"})
        assert agent["breaker"] == "closed" and agent["health"]["state"] == "healthy"
        assert agent["health"]["failures"] >= 2 and agent["health"]["successes"] == 3


# --- refresh: conditional requests, a moved card flagged, not followed --------------------------------

class CardServer:
    """A 0.3 card (`url`, `protocolVersion`) served with an ETag; answers 304 to a matching If-None-Match."""

    def __init__(self) -> None:
        self.interface = "http://127.0.0.1:1/a2a"
        self.seen: list[str | None] = []

    def card(self) -> dict[str, Any]:
        return {"name": "Card Agent", "description": "Answers questions about cards", "version": "1.0.0",
                "protocolVersion": "0.3.0", "url": self.interface, "preferredTransport": "JSONRPC",
                "capabilities": {}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
                "skills": [{"id": "cards", "name": "Cards", "description": "Reads cards", "tags": ["cards"],
                            "examples": ["What does this card say?"]}]}

    async def handle(self, request: Request) -> Response:
        etag = '"' + str(abs(hash(self.interface))) + '"'
        self.seen.append(request.headers.get("if-none-match"))
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        return JSONResponse(self.card(), headers={"ETag": etag})


async def test_a_refresh_asks_conditionally_and_flags_a_moved_card(app_factory: Any) -> None:
    cards = CardServer()
    app = Starlette(routes=[Route("/.well-known/agent-card.json", cards.handle)])
    async with serve(app) as url, app_factory() as client:
        added = await client.result("agents.add", {"card_url": url})
        assert added["name"] == "card-agent" and added["protocol_version"] == "0.3.0"
        assert added["skills"][0]["examples"] == ["What does this card say?"]
        assert added["interfaces"] == [{"url": cards.interface, "protocol_binding": "JSONRPC",
                                        "protocol_version": "0.3.0"}]
        parts = client.services.agents
        row = await parts.service.store.by_name("card-agent")
        await parts.service.refresh_row(row, conditional=True)  # as the background refresh asks
        assert cards.seen[-1] is not None  # If-None-Match sent, 304 answered, nothing changed
        cards.interface = "http://127.0.0.1:2/elsewhere"
        moved = await client.result("agents.refresh", {"name": "card-agent"})
        assert moved["changed"]["interfaces"]["after"][0]["url"] == cards.interface
        assert moved["interfaces"] == added["interfaces"]  # not followed
        task = await client.result("tasks.create", [delegated(_id("moved"), agent="card-agent", message="hi")])
        assert task["status"] == "failed" and "changed its card" in task["error"]
        accepted = await client.result("agents.refresh", {"name": "card-agent", "accept": True})
        assert accepted["changed"] is None and accepted["interfaces"][0]["url"] == cards.interface


# --- the other surfaces: MCP tools ------------------------------------------------------------------

async def test_the_mcp_tools_call_the_directory(remote: Service, tmp_path: Path) -> None:
    from tests.test_mcp import _value, session

    local = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}"}, "local").start()
    try:
        async with session(local.url) as client:
            added = await client.call_tool("agents_add", {"card_url": remote.url, "name": "via-mcp"})
            assert not added.is_error, added
            assert _value(added)["name"] == "via-mcp"
            listed = _value(await client.call_tool("agents_list", {"skill": "orchestration"}))
            assert [a["name"] for a in listed["agents"]] == ["via-mcp"]
            assert _value(await client.call_tool("agents_get", {"name": "via-mcp"}))["skills"]
            bad = await client.call_tool("agents_add", {"card_url": "ftp://nowhere"})
            assert bad.is_error and _value(bad)["error"]["code"] == -32602
            assert _value(await client.call_tool("agents_remove", {"name": "via-mcp"}))["success"] is True
    finally:
        local.stop()
