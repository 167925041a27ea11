"""LLM keys: `config.llm_key.*` on /system, encryption at rest, and the X-LLM-API-KEY header.

The rule under test everywhere: a key value goes in, and never comes out again, not in a
response, an error, a log line, or a task row. Keys reach executors only: the per-request header
key through the run's context, stored keys through the `llm_key_lookup` service.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from sqlalchemy import text

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.llm.client import LLMError, LLMClient
from taskgrove.storage.keys import KeyStore, KeyStoreError, derive_fernet_key
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT

SERVER_SECRET = "server-secret-for-tests-" + "9f8e7d6c5b4a3210" * 2
JWT_SECRET = "test-jwt-secret-" + "0123456789abcdef" * 4
KEYS_ENV = {"SERVICE_SECRET_KEY": SERVER_SECRET}
KEY = "sk-test-SECRETVALUE-1111111111"
KEY2 = "sk-test-OTHERVALUE-2222222222"
ENV_KEY = "env-openai-key-3333333333"


def bearer(user: str | None, roles: list[str] | None = None) -> dict[str, str]:
    claims: dict[str, Any] = {"user_id": user} if user else {}
    if roles:
        claims["roles"] = roles
    return {"Authorization": "Bearer " + jwt.encode(claims, JWT_SECRET, algorithm="HS256")}


class Wire:
    """Calls /system and keeps every response body, to check no key ever comes back."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.bodies: list[str] = []

    async def call(self, method: str, params: dict[str, Any] | None = None, *, path: str = "/system",
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": 1}
        response = await self.client.http.post(path, json=body, headers=headers or {})
        self.bodies.append(response.text)
        assert response.status_code == 200, response.text
        return response.json()

    async def result(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        answer = await self.call(method, params, **kw)
        assert "error" not in answer, answer
        return answer["result"]

    async def error(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        answer = await self.call(method, params, **kw)
        assert "error" in answer, answer
        return answer["error"]

    def assert_never_shown(self, *keys: str) -> None:
        for key in keys:
            assert all(key not in body for body in self.bodies)


@pytest.fixture
async def keys_client(app_factory: Callable[..., Any]) -> AsyncIterator[Client]:
    async with app_factory(env=KEYS_ENV) as client:
        yield client


async def raw_rows(client: Client, table: str) -> list[dict[str, Any]]:
    async with client.services.repo.engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(f"SELECT * FROM {table}"))]


def database_files(settings: Settings) -> list[Path]:
    """The SQLite database file and its journals (empty for PostgreSQL)."""
    if not settings.database_url.startswith("sqlite"):
        return []
    path = Path(settings.database_url.split("///", 1)[1])
    return sorted(path.parent.glob(path.name + "*"))


# --- config.llm_key.* ------------------------------------------------------------------------

async def test_round_trip_never_shows_a_key(keys_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    w = Wire(keys_client)
    assert await w.result("config.llm_key.set", {"user_id": "u1", "api_key": KEY}) == \
        {"success": True, "user_id": "u1", "provider": "default"}
    assert await w.result("config.llm_key.set", {"user_id": "u1", "api_key": KEY2, "provider": "Claude"}) == \
        {"success": True, "user_id": "u1", "provider": "anthropic"}  # alias resolved, name normalised

    assert await w.result("config.llm_key.get", {"user_id": "u1"}) == {
        "has_key": True, "user_id": "u1", "provider": None, "providers": {"anthropic": True, "default": True}}
    assert await w.result("config.llm_key.get", {"user_id": "u1", "provider": "openai"}) == {
        "has_key": False, "user_id": "u1", "provider": "openai",
        "providers": {"anthropic": True, "default": True, "openai": False}}
    assert (await w.result("config.llm_key.get", {"user_id": "u1", "provider": "anthropic"}))["has_key"] is True
    assert (await w.result("config.llm_key.get", {"user_id": "u2"}))["has_key"] is False

    assert await keys_client.services.keys.lookup("u1", "anthropic") == KEY2  # what the LLM client sees
    assert await keys_client.services.keys.lookup("u1", "default") == KEY

    assert await w.result("config.llm_key.delete", {"user_id": "u1", "provider": "anthropic"}) == \
        {"success": True, "user_id": "u1", "deleted": True, "provider": "anthropic"}
    assert (await w.result("config.llm_key.delete", {"user_id": "u1", "provider": "anthropic"}))["deleted"] is False
    await w.result("config.llm_key.set", {"user_id": "u1", "api_key": KEY2, "provider": "openai"})
    assert await w.result("config.llm_key.delete", {"user_id": "u1"}) == \
        {"success": True, "user_id": "u1", "deleted": True, "provider": "all"}
    assert await w.result("config.llm_key.get", {"user_id": "u1"}) == \
        {"has_key": False, "user_id": "u1", "provider": None, "providers": {}}
    assert (await w.result("config.llm_key.delete", {"user_id": "u1", "provider": "all"}))["deleted"] is False

    w.assert_never_shown(KEY, KEY2)
    assert "stored LLM key for user u1" in caplog.text  # the operations are logged ...
    assert KEY not in caplog.text and KEY2 not in caplog.text  # ... without the keys


async def test_provider_detection(keys_client: Client) -> None:
    w = Wire(keys_client)
    for api_key, provider in [("openai:" + KEY, "openai"), ("sk-ant-api03-abcdefgh", "anthropic"),
                              ("AIzaSyabcdefghijkl", "gemini"), ("gsk_abcdefghijkl", "groq"), (KEY, "default")]:
        assert (await w.result("config.llm_key.set", {"user_id": "u", "api_key": api_key}))["provider"] == provider
    assert await keys_client.services.keys.lookup("u", "openai") == KEY  # the provider prefix is not stored
    error = await w.error("config.llm_key.set", {"user_id": "u", "api_key": "openai:" + KEY, "provider": "groq"})
    assert error["code"] == -32602 and "names provider 'openai'" in error["data"]
    w.assert_never_shown(KEY)


async def test_parameter_errors(keys_client: Client) -> None:
    w = Wire(keys_client)
    cases = [
        ({"api_key": KEY}, "user_id is required"),  # JWT off: no caller to default to
        ({"user_id": "u"}, "api_key is required"),
        ({"user_id": "u", "api_key": ""}, "must not be empty"),
        ({"user_id": "u", "api_key": 987654321}, "api_key must be a string"),
        ({"user_id": "u", "api_key": "x\ny" + KEY}, "control characters"),
        ({"user_id": "u", "api_key": KEY, "provider": "nosuchvendor"}, "Unknown provider 'nosuchvendor'"),
        ({"user_id": "u", "api_key": KEY, "provider": "all"}, "only meaningful for config.llm_key.delete"),
    ]
    for params, message in cases:
        error = await w.error("config.llm_key.set", params)
        assert error["code"] == -32602 and message in error["message"], (params, error)
        assert "987654321" not in json.dumps(error)
    assert (await w.error("config.llm_key.delete", {}))["code"] == -32602
    assert (await w.error("config.llm_key.set", [KEY]))["code"] == -32602
    # JWT off, get without a user means the `default` user.
    assert (await w.result("config.llm_key.get"))["user_id"] == "default"
    w.assert_never_shown(KEY)
    assert await raw_rows(keys_client, "llm_keys") == []


async def test_refuses_to_store_without_server_secret(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    w = Wire(client)
    error = await w.error("config.llm_key.set", {"user_id": "u1", "api_key": KEY})
    assert error["code"] == -32000
    assert "SERVICE_SECRET_KEY is not set" in error["data"]
    assert await w.result("config.llm_key.get", {"user_id": "u1"}) == \
        {"has_key": False, "user_id": "u1", "provider": None, "providers": {}}
    assert (await w.result("config.llm_key.delete", {"user_id": "u1"}))["deleted"] is False
    assert await client.services.keys.lookup("u1", "openai") is None
    assert await raw_rows(client, "llm_keys") == []
    w.assert_never_shown(KEY)
    assert KEY not in caplog.text


async def test_keys_are_encrypted_at_rest(keys_client: Client) -> None:
    w = Wire(keys_client)
    await w.result("config.llm_key.set", {"user_id": "alice", "api_key": KEY, "provider": "openai"})
    (row,) = await raw_rows(keys_client, "llm_keys")
    assert (row["user_id"], row["provider"]) == ("alice", "openai")
    ciphertext = bytes(row["ciphertext"])
    assert KEY.encode() not in ciphertext and b"SECRETVALUE" not in ciphertext
    # It is Fernet under the key derived from SERVICE_SECRET_KEY, and decrypts to this row's key.
    from cryptography.fernet import Fernet

    payload = json.loads(Fernet(derive_fernet_key(SERVER_SECRET)).decrypt(ciphertext))
    assert payload == {"user_id": "alice", "provider": "openai", "key": KEY}
    for path in database_files(keys_client.services.settings):  # not even in the SQLite file
        assert b"SECRETVALUE" not in path.read_bytes()

    # A ciphertext copied into another user's row does not become that user's key.
    async with keys_client.services.repo.engine.begin() as conn:
        await conn.execute(text("INSERT INTO llm_keys (user_id, provider, ciphertext, created_at, updated_at) "
                                "VALUES ('mallory', 'openai', :c, 'x', 'x')"), {"c": ciphertext})
    with pytest.raises(LLMError, match="does not belong"):  # the lookup the LLM client calls
        await keys_client.services.keys.lookup("mallory", "openai")
    # Another server secret cannot read it, and says why.
    other = KeyStore(keys_client.services.repo.engine, "a-different-secret-" + "x" * 32)
    with pytest.raises(KeyStoreError, match="SERVICE_SECRET_KEY") as caught:
        await other.get("alice", "openai")
    assert KEY not in str(caught.value)


async def test_key_permissions_with_jwt(app_factory: Callable[..., Any]) -> None:
    async with app_factory(env={**KEYS_ENV, "SERVICE_JWT_SECRET": JWT_SECRET}) as client:
        w = Wire(client)
        alice, admin = bearer("alice"), bearer("root", ["admin"])
        assert await w.result("config.llm_key.set", {"api_key": KEY}, headers=alice) == \
            {"success": True, "user_id": "alice", "provider": "default"}  # the caller by default
        assert (await w.result("config.llm_key.get", headers=alice))["providers"] == {"default": True}
        for method, params in [("config.llm_key.set", {"user_id": "bob", "api_key": KEY2}),
                               ("config.llm_key.get", {"user_id": "bob"}),
                               ("config.llm_key.delete", {"user_id": "bob"})]:
            assert (await w.error(method, params, headers=alice))["code"] == -32001, method
        assert (await w.result("config.llm_key.set", {"user_id": "bob", "api_key": KEY2}, headers=admin))["user_id"] == "bob"
        assert (await w.result("config.llm_key.get", headers=bearer("bob")))["has_key"] is True
        assert (await w.result("config.llm_key.get", {"user_id": "alice"}, headers=admin))["has_key"] is True
        assert (await w.error("config.llm_key.get", {"user_id": "alice"}, headers=bearer("bob")))["code"] == -32001
        # A token that names no user must name the user whose keys it sets.
        assert (await w.error("config.llm_key.set", {"api_key": KEY}, headers=bearer(None)))["code"] == -32602
        # No token: 401 before anything else.
        response = await client.http.post("/system", json={"jsonrpc": "2.0", "id": 1, "method": "config.llm_key.set",
                                                           "params": {"user_id": "alice", "api_key": KEY2}})
        assert response.status_code == 401
        assert (await w.result("config.llm_key.delete", headers=alice))["deleted"] is True
        assert await client.services.keys.lookup("alice", "default") is None
        assert await client.services.keys.lookup("bob", "default") == KEY2
        w.assert_never_shown(KEY, KEY2)


# --- keys reaching executors -------------------------------------------------------------------

def digest(value: str | None) -> str | None:
    return hashlib.sha256(value.encode()).hexdigest() if value else None


def probe_registry(barrier: asyncio.Barrier | None = None) -> ExecutorRegistry:
    """A test executor that reports (hashes of) the keys it was given, never the keys themselves."""

    class KeyProbe(Executor):
        id = "key_probe_executor"
        name = "Key probe"
        extension = "test"
        description = "Reports hashes of the LLM keys its context resolves to."

        async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
            if barrier is not None:  # both requests are in flight at the same time
                await asyncio.wait_for(barrier.wait(), EVENT_WAIT)
            client = LLMClient(context.settings, key_lookup=context.services.get("llm_key_lookup"))
            resolved = await client.resolve_key(inputs.get("provider", "openai"), context.llm_api_key,
                                                context.user_id)
            return {"header": digest(context.llm_api_key), "header_provider": context.llm_provider,
                    "resolved": digest(resolved), "repr_hides_key": context.llm_api_key is None
                    or context.llm_api_key not in repr(context)}

    return ExecutorRegistry([KeyProbe])


PROBE = {"name": "probe", "schemas": {"method": "key_probe_executor"}}


async def probe(client: Client, headers: dict[str, str], **inputs: Any) -> dict[str, Any]:
    tree = await client.result("tasks.create", {"tasks": [{**PROBE, "inputs": inputs}]}, headers=headers)
    assert tree["status"] == "completed", tree
    return tree["result"]


async def test_concurrent_requests_see_their_own_header_key(
        make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = make_settings({**KEYS_ENV, "OPENAI_API_KEY": ENV_KEY})
    async with running_app(settings, registry=probe_registry(asyncio.Barrier(2))) as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.create", "params": {"tasks": [PROBE]}}

        async def send(header: str) -> httpx.Response:
            return await client.http.post("/tasks", json=body, headers={"X-LLM-API-KEY": header})

        first, second = await asyncio.gather(send(KEY), send("anthropic:" + KEY2))
        one, two = first.json()["result"]["result"], second.json()["result"]["result"]
        assert one == {"header": digest(KEY), "header_provider": None, "resolved": digest(KEY),
                       "repr_hides_key": True}
        assert two == {"header": digest(KEY2), "header_provider": "anthropic", "resolved": digest(KEY2),
                       "repr_hides_key": True}

        # Held only for the request: not in a response, a log line, a task row, or the engine after.
        for response in (first, second):
            assert KEY not in response.text and KEY2 not in response.text
        assert KEY not in caplog.text and KEY2 not in caplog.text
        rows = json.dumps(await raw_rows(client, "tasks"), default=str)
        assert KEY not in rows and KEY2 not in rows
        assert await raw_rows(client, "llm_keys") == []  # header keys are never stored
        assert not any(run.call.get("llm_api_key") for run in client.services.engine.runs.values())


async def test_key_precedence_header_stored_env(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings({**KEYS_ENV, "SERVICE_JWT_SECRET": JWT_SECRET, "OPENAI_API_KEY": ENV_KEY})
    async with running_app(settings, registry=probe_registry()) as client:
        alice, bob = bearer("alice"), bearer("bob")
        assert (await probe(client, alice))["resolved"] == digest(ENV_KEY)  # nothing stored: environment
        await client.result("config.llm_key.set", {"api_key": KEY, "provider": "default"}, path="/system",
                            headers=alice)
        assert (await probe(client, alice))["resolved"] == digest(KEY)  # a `default` key serves any provider
        await client.result("config.llm_key.set", {"api_key": KEY2, "provider": "openai"}, path="/system",
                            headers=alice)
        assert (await probe(client, alice))["resolved"] == digest(KEY2)  # the provider's own key first
        assert (await probe(client, alice, provider="anthropic"))["resolved"] == digest(KEY)
        assert (await probe(client, bob))["resolved"] == digest(ENV_KEY)  # alice's keys are alice's only
        header_key = "sk-header-key-4444444444"
        result = await probe(client, {**alice, "X-LLM-API-KEY": header_key})
        assert result["resolved"] == digest(header_key)  # the request header beats everything


async def test_jwt_off_tasks_use_the_default_users_keys(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings(KEYS_ENV), registry=probe_registry()) as client:
        await client.result("config.llm_key.set", {"user_id": "default", "api_key": KEY}, path="/system")
        assert (await probe(client, {}))["resolved"] == digest(KEY)
