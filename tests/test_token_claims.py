"""Token claims (issue 18, item 5): a claim that is present but malformed is an invalid token
(401, -32001), never "no user"; SERVICE_JWT_REQUIRE_SUBJECT refuses tokens naming no user."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest

SECRET = "token-claims-secret-0123456789abcdef0123456789"


def bearer(**claims: Any) -> dict[str, str]:
    claims.setdefault("exp", int(time.time()) + 600)
    return {"Authorization": "Bearer " + jwt.encode(claims, SECRET, algorithm="HS256")}


async def get(client: Any, task_id: str, headers: dict[str, str]) -> Any:
    return await client.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.get",
                                                  "params": {"task_id": task_id}}, headers=headers)


@pytest.mark.parametrize("claims", [
    {"user_id": {}}, {"user_id": []}, {"user_id": True}, {"user_id": 1.5}, {"user_id": ""}, {"user_id": "   "},
    {"user_id": " bob"}, {"user_id": None}, {"sub": ""}, {"sub": 7}, {"user_id": "alice", "sub": " x "},
    {"user_id": "alice", "roles": "admin"}, {"user_id": "alice", "roles": [1]}, {"user_id": "alice", "roles": {}},
])
async def test_malformed_claims_are_an_invalid_token(app_factory: Callable[..., Any], claims: dict[str, Any]) -> None:
    async with app_factory({"SERVICE_JWT_SECRET": SECRET}) as client:
        await client.result("tasks.create", {"tasks": [{"id": "b1", "name": "b", "user_id": "bob"}]},
                            headers=bearer(user_id="bob"))
        response = await get(client, "b1", bearer(**claims))
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert error["code"] == -32001 and error["data"].startswith("invalid token: ")
        for path, body in (("/system", {"jsonrpc": "2.0", "id": 1, "method": "config.llm_key.get"}),
                           ("/", {"jsonrpc": "2.0", "id": 1, "method": "tasks.list"})):
            assert (await client.http.post(path, json=body, headers=bearer(**claims))).status_code == 401


async def test_roles_are_matched_exactly(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_JWT_SECRET": SECRET}) as client:
        await client.result("tasks.create", {"tasks": [{"id": "b1", "name": "b", "user_id": "bob"}]},
                            headers=bearer(user_id="bob"))
        spaced = await get(client, "b1", bearer(user_id="eve", roles=[" admin "]))
        assert spaced.status_code == 200 and spaced.json()["error"]["code"] == -32001
        admin = await get(client, "b1", bearer(user_id="eve", roles=["admin"]))
        assert admin.json()["result"]["user_id"] == "bob"


async def test_userless_tokens_skip_checks_unless_a_subject_is_required(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_JWT_SECRET": SECRET}) as client:
        await client.result("tasks.create", {"tasks": [{"id": "b1", "name": "b", "user_id": "bob"}]},
                            headers=bearer(user_id="bob"))
        assert (await get(client, "b1", bearer(roles=["service"]))).json()["result"]["id"] == "b1"
    async with app_factory({"SERVICE_JWT_SECRET": SECRET, "SERVICE_JWT_REQUIRE_SUBJECT": "true"}) as client:
        refused = await get(client, "b1", bearer(roles=["service"]))
        assert refused.status_code == 401 and "SERVICE_JWT_REQUIRE_SUBJECT" in refused.json()["error"]["data"]
        assert (await get(client, "b1", bearer(sub="bob"))).json()["result"]["user_id"] == "bob"
