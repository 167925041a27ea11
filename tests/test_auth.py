"""JWT authentication and permission rules, through the real HTTP surfaces (/tasks, /system).

Every test drives the ASGI app over httpx; tokens are minted with PyJWT (or the `taskgrove token`
command) and sent the way clients send them: an Authorization header or an Authorization cookie.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.auth import AuthConfigError
from taskgrove.agent.foundations.settings import Settings
from tests.conftest import Client
from tests.deadlines import EVENT_WAIT

SECRET = "test-jwt-secret-" + "0123456789abcdef" * 4
OTHER_SECRET = "another-secret-0123456789abcdef0123456789abcdef"
JWT_ENV = {"SERVICE_JWT_SECRET": SECRET}
PERMISSION_DENIED = -32001


def token(user: str | None = None, *, roles: Any = (), secret: str = SECRET, exp_in: float | None = 86_400,
          alg: str = "HS256", **claims: Any) -> str:
    """A token signed with `secret`. Valid for a day by default: several are made when the tests
    are collected, and a suite on a loaded machine can run longer than an hour."""
    payload: dict[str, Any] = dict(claims)
    if user is not None:
        payload["user_id"] = user
    if roles:
        payload["roles"] = roles
    if exp_in is not None:
        payload["exp"] = int(time.time() + exp_in)
    return jwt.encode(payload, secret, algorithm=alg)


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


ALICE = bearer(token("alice"))
BOB = bearer(token("bob"))
ADMIN = bearer(token("root", roles=["admin"]))


async def post(client: Client, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.http.post(path, json=body, headers=headers or {})


def rpc(method: str, params: Any = None, id_: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": id_}


@pytest.fixture
async def jwt_client(app_factory: Callable[..., Any]) -> AsyncIterator[Client]:
    async with app_factory(env=JWT_ENV) as client:
        yield client


async def create(client: Client, headers: dict[str, str], **task: Any) -> dict[str, Any]:
    """A one-task tree without an executor (it completes at once); returns the stored task."""
    return await client.result("tasks.create", {"tasks": [{"name": "t", **task}]}, headers=headers)


async def pending_copy(client: Client, task_id: str, headers: dict[str, str]) -> str:
    """A pending task (copies are not executed), e.g. for tasks.delete."""
    return (await client.result("tasks.copy", {"task_id": task_id}, headers=headers))["id"]


# --- refusals ------------------------------------------------------------------------------

EXPIRED = token("alice", exp_in=-120)
BAD_SIGNATURE = token("alice", secret=OTHER_SECRET)
ALG_NONE = jwt.encode({"user_id": "alice"}, None, algorithm="none")
REFUSALS = [
    pytest.param({}, "Missing token", None, id="missing"),
    pytest.param({"Authorization": "Basic YWxpY2U6cHc="}, "Malformed Authorization header", "YWxpY2U6cHc=",
                 id="malformed-header"),
    pytest.param({"Authorization": "Bearer"}, "Malformed Authorization header", None, id="bearer-without-token"),
    pytest.param(bearer("not-a.valid.jwt-token"), "Malformed token", "not-a.valid.jwt-token", id="malformed-token"),
    pytest.param(bearer(BAD_SIGNATURE), "Invalid token signature", BAD_SIGNATURE, id="bad-signature"),
    pytest.param(bearer(ALG_NONE), "algorithm not allowed", ALG_NONE, id="alg-none"),
    pytest.param(bearer(EXPIRED), "Token expired", EXPIRED, id="expired"),
    pytest.param({"Cookie": f"Authorization={EXPIRED}"}, "Token expired", EXPIRED, id="expired-cookie"),
    # Made at collection: a day ahead, so it is still not valid however long the suite runs before
    # these tests (ten minutes ahead was valid again in a 35-minute suite on a loaded machine).
    pytest.param(bearer(token("alice", nbf=int(time.time()) + 86_400, exp_in=2 * 86_400)), "not yet valid", None,
                 id="not-yet-valid"),
]


@pytest.mark.parametrize("path, method", [("/tasks", "tasks.list"), ("/tasks", "tasks.create"),
                                          ("/system", "config.llm_key.get"), ("/system", "examples.status")])
@pytest.mark.parametrize("headers, reason, secret", REFUSALS)
async def test_refused_with_401_and_reason(jwt_client: Client, caplog: pytest.LogCaptureFixture, path: str,
                                           method: str, headers: dict[str, str], reason: str,
                                           secret: str | None) -> None:
    caplog.set_level(logging.DEBUG)
    response = await post(jwt_client, path, rpc(method, {"tasks": [{"name": "x"}]}), headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == PERMISSION_DENIED
    assert reason in error["message"]
    if secret is not None:
        assert secret not in response.text
        assert secret not in caplog.text
    assert await jwt_client.services.repo.list() == []  # nothing was created


async def test_batch_with_one_private_call_is_refused(jwt_client: Client) -> None:
    body = [rpc("system.health", id_=1), rpc("config.llm_key.get", id_=2)]
    response = await post(jwt_client, "/system", body)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == PERMISSION_DENIED


async def test_public_methods_need_no_token(jwt_client: Client) -> None:
    for headers in ({}, bearer(EXPIRED), {"Authorization": "Basic x"}):
        health = await jwt_client.result("system.health", path="/system", headers=headers)
        assert health["status"] == "healthy"
        executors = await jwt_client.result("system.executors", path="/system", headers=headers)
        assert executors["count"] == len(executors["executors"])
    response = await post(jwt_client, "/system", [rpc("system.health", id_=1), rpc("system.executors", id_=2)])
    assert response.status_code == 200
    assert [a["id"] for a in response.json()] == [1, 2]


async def test_jwt_off_needs_no_token(client: Client) -> None:
    made = await create(client, {}, user_id="alice")
    other = await create(client, {}, user_id="bob")
    listed = await client.result("tasks.list")
    assert {t["id"] for t in listed} == {made["id"], other["id"]}  # JWT off: every user's tasks
    assert (await client.result("tasks.get", {"task_id": made["id"]}))["user_id"] == "alice"
    # A token is not even looked at: a garbage header changes nothing.
    assert await client.result("tasks.get", {"task_id": made["id"]}, headers={"Authorization": "junk"})


# --- token sources and claims ----------------------------------------------------------------

async def test_cookie_fallback_and_header_priority(jwt_client: Client) -> None:
    alice, bob = token("alice"), token("bob")
    by_cookie = await create(jwt_client, {"Cookie": f"Authorization={alice}"})
    assert by_cookie["user_id"] == "alice"
    by_bearer_cookie = await create(jwt_client, {"Cookie": f"Authorization=Bearer%20{bob}"})
    assert by_bearer_cookie["user_id"] == "bob"
    both = await create(jwt_client, {**bearer(alice), "Cookie": f"Authorization={bob}"})
    assert both["user_id"] == "alice"  # the header wins over the cookie
    # A valid cookie does not rescue a malformed header: the header is what the client meant.
    response = await post(jwt_client, "/tasks", rpc("tasks.list"),
                          {"Authorization": "Token abc", "Cookie": f"Authorization={alice}"})
    assert response.status_code == 401


async def test_sub_claim_string_role_and_userless_token(jwt_client: Client) -> None:
    owned = await create(jwt_client, ALICE)
    by_sub = await create(jwt_client, bearer(token(sub="carol")))
    assert by_sub["user_id"] == "carol"
    # user_id wins over sub.
    assert (await create(jwt_client, bearer(token("dave", sub="ignored"))))["user_id"] == "dave"
    # roles must be an array of strings (issue 18): one string is an invalid token, not admin.
    string_admin = bearer(token("erin", roles="admin"))
    response = await jwt_client.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.get",
                                                          "params": {"task_id": owned["id"]}}, headers=string_admin)
    assert response.status_code == 401
    assert response.json()["error"]["data"] == "invalid token: the roles claim must be an array of strings"
    # A token naming no user skips permission checks (SPEC.md, Authentication 4).
    service = bearer(token(None, roles=["reader"]))
    assert (await jwt_client.result("tasks.get", {"task_id": owned["id"]}, headers=service))["id"] == owned["id"]
    assert len(await jwt_client.result("tasks.list", headers=service)) == 3
    # A role that is not admin grants nothing.
    other = bearer(token("frank", roles=["reader"]))
    assert (await jwt_client.error("tasks.get", {"task_id": owned["id"]}, headers=other))["code"] == PERMISSION_DENIED


async def test_algorithm_list_setting(app_factory: Callable[..., Any]) -> None:
    async with app_factory(env={**JWT_ENV, "SERVICE_JWT_ALGORITHMS": "HS512"}) as client:
        ok = bearer(token("alice", alg="HS512"))
        assert await client.result("tasks.list", headers=ok) == []
        response = await post(client, "/tasks", rpc("tasks.list"), bearer(token("alice", alg="HS256")))
        assert response.status_code == 401
        assert "algorithm not allowed" in response.json()["error"]["message"]


def test_unusable_algorithm_setting_fails_at_start(make_settings: Callable[..., Settings]) -> None:
    for algorithms in ("RS256", "none", "HS256,ES256"):
        with pytest.raises(AuthConfigError, match="SERVICE_JWT_ALGORITHMS"):
            build_app(make_settings({**JWT_ENV, "SERVICE_JWT_ALGORITHMS": algorithms}))


async def test_token_without_exp_is_accepted_and_exp_is_enforced(jwt_client: Client) -> None:
    assert await jwt_client.result("tasks.list", headers=bearer(token("alice", exp_in=None))) == []
    assert await jwt_client.result("tasks.list", headers=bearer(token("alice", exp_in=30))) == []
    response = await post(jwt_client, "/tasks", rpc("tasks.list"), bearer(token("alice", exp_in=-1)))
    assert response.status_code == 401


# --- owner, other user, admin ----------------------------------------------------------------

async def test_owner_other_user_and_admin(jwt_client: Client) -> None:
    c = jwt_client
    task = await create(c, ALICE)
    tid = task["id"]
    assert task["user_id"] == "alice" and task["status"] == "completed"

    for method, params in [
        ("tasks.get", {"task_id": tid}),
        ("tasks.detail", {"task_id": tid}),
        ("tasks.update", {"task_id": tid, "name": "stolen"}),
        ("tasks.execute", {"task_id": tid}),
        ("tasks.copy", {"task_id": tid}),
        ("tasks.clone", {"task_id": tid}),
        ("tasks.tree", {"task_id": tid}),
        ("tasks.delete", {"task_id": tid}),
    ]:
        error = await c.error(method, params, headers=BOB)
        assert error["code"] == PERMISSION_DENIED, method
    cancelled = await c.result("tasks.cancel", {"task_ids": [tid]}, headers=BOB)
    assert cancelled[0]["status"] == "failed" and cancelled[0]["error"] == "permission_denied"
    status = await c.result("tasks.running.status", {"task_ids": [tid]}, headers=BOB)
    assert status[0]["status"] == "permission_denied"
    assert (await c.result("tasks.get", {"task_id": tid}, headers=ALICE))["name"] == "t"  # unchanged

    for who in (ALICE, ADMIN):
        assert (await c.result("tasks.get", {"task_id": tid}, headers=who))["id"] == tid
        updated = await c.result("tasks.update", {"task_id": tid, "priority": 2}, headers=who)
        assert updated["priority"] == 2
        started = await c.result("tasks.execute", {"task_id": tid}, headers=who)
        assert started["root_task_id"] == tid
        answer = (await c.result("tasks.cancel", {"task_ids": [tid]}, headers=who))[0]
        assert answer.get("error") != "permission_denied" and "already completed" in answer["message"]
        assert (await c.result("tasks.running.status", {"task_ids": [tid]}, headers=who))[0]["status"] == "completed"
        assert (await c.result("tasks.tree", {"task_id": tid}, headers=who))["id"] == tid
        copy_id = await pending_copy(c, tid, who)
        assert (await c.result("tasks.get", {"task_id": copy_id}, headers=who))["user_id"] == "alice"
        assert (await c.error("tasks.delete", {"task_id": copy_id}, headers=BOB))["code"] == PERMISSION_DENIED
        deleted = await c.result("tasks.delete", {"task_id": copy_id}, headers=who)
        assert deleted["success"] and deleted["deleted_count"] == 1

    # Cancelling a pending task: the owner can, another user cannot.
    copy_id = await pending_copy(c, tid, ALICE)
    assert (await c.result("tasks.cancel", {"task_ids": [copy_id]}, headers=BOB))[0]["error"] == "permission_denied"
    assert (await c.result("tasks.cancel", {"task_ids": [copy_id]}, headers=ALICE))[0]["status"] == "cancelled"


async def test_create_for_someone_else_needs_admin(jwt_client: Client) -> None:
    c = jwt_client
    assert (await create(c, ALICE))["user_id"] == "alice"  # the caller's user by default
    assert (await create(c, ALICE, user_id="alice"))["user_id"] == "alice"
    error = await c.error("tasks.create", {"tasks": [{"name": "x", "user_id": "bob"}]}, headers=ALICE)
    assert error["code"] == PERMISSION_DENIED
    assert (await create(c, ADMIN, user_id="bob"))["user_id"] == "bob"
    assert [t["user_id"] for t in await c.result("tasks.list", headers=BOB)] == ["bob"]


async def test_list_and_children_filter(jwt_client: Client) -> None:
    c = jwt_client
    tree = await c.result("tasks.create", {"tasks": [
        {"id": "a-root", "name": "root"}, {"id": "a-child", "name": "child", "parent_id": "a-root"},
    ]}, headers=ALICE)
    assert [ch["id"] for ch in tree["children"]] == ["a-child"]
    await create(c, BOB)

    alice_list = await c.result("tasks.list", headers=ALICE)  # defaults to the caller's tasks
    assert {t["id"] for t in alice_list} == {"a-root", "a-child"}
    assert await c.result("tasks.list", {"user_id": "bob"}, headers=ALICE) == []  # filtered, no error
    assert [t["user_id"] for t in await c.result("tasks.list", headers=BOB)] == ["bob"]
    assert len(await c.result("tasks.list", headers=ADMIN)) == 3
    assert len(await c.result("tasks.list", {"user_id": "alice"}, headers=ADMIN)) == 2
    assert len(await c.result("tasks.list", {"status": "completed", "limit": 1}, headers=ALICE)) == 1

    assert [t["id"] for t in await c.result("tasks.children", {"parent_id": "a-root"}, headers=ALICE)] == ["a-child"]
    assert await c.result("tasks.children", {"parent_id": "a-root"}, headers=BOB) == []
    assert len(await c.result("tasks.children", {"parent_id": "a-root"}, headers=ADMIN)) == 1
    assert (await c.error("tasks.children", {"parent_id": "nope"}, headers=ALICE))["code"] == -32602


async def test_running_count_list_and_cancel(app_factory: Callable[..., Any]) -> None:
    async with app_factory(env={**JWT_ENV, "SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as c:
        sleep = {"name": "nap", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 30}}
        mine = await c.result("tasks.create", {"tasks": [sleep]}, headers=ALICE)
        theirs = await c.result("tasks.create", {"tasks": [sleep]}, headers=BOB)
        deadline = time.monotonic() + EVENT_WAIT
        while len(c.services.engine.running) < 2:
            assert time.monotonic() < deadline, "sleep tasks did not start"
            await asyncio.sleep(0.01)

        assert await c.result("tasks.running.count", headers=ALICE) == {"count": 1}
        assert await c.result("tasks.running.count", {"user_id": "alice"}, headers=ALICE) == \
            {"count": 1, "user_id": "alice"}
        error = await c.error("tasks.running.count", {"user_id": "bob"}, headers=ALICE)
        assert error["code"] == PERMISSION_DENIED
        assert await c.result("tasks.running.count", {"user_id": "bob"}, headers=ADMIN) == \
            {"count": 1, "user_id": "bob"}
        assert (await c.result("tasks.running.count", headers=ADMIN))["count"] == 2

        assert [t["id"] for t in await c.result("tasks.running.list", headers=ALICE)] == [mine["id"]]
        assert await c.result("tasks.running.list", {"user_id": "bob"}, headers=ALICE) == []
        assert len(await c.result("tasks.running.list", headers=ADMIN)) == 2

        refused = await c.result("tasks.running.cancel", {"task_ids": [theirs["id"]]}, headers=ALICE)
        assert refused[0]["error"] == "permission_denied"
        assert (await c.result("tasks.cancel", {"task_ids": [mine["id"]]}, headers=ALICE))[0]["status"] == "cancelled"
        assert (await c.result("tasks.cancel", {"task_ids": [theirs["id"]]}, headers=ADMIN))[0]["status"] == "cancelled"


# --- the `taskgrove token` command -------------------------------------------------------------

def _cli(*args: str, secret: str | None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("taskgrove")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "taskgrove.agent.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    if secret is not None:
        env["SERVICE_JWT_SECRET"] = secret
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=60)


async def test_cli_token(jwt_client: Client) -> None:
    admin_run, user_run, unset_run = await asyncio.gather(
        asyncio.to_thread(_cli, "token", "ops", "--role", "admin", secret=SECRET),
        asyncio.to_thread(_cli, "token", "gina", "--expires-in", "60", secret=SECRET),
        asyncio.to_thread(_cli, "token", "gina", secret=None),
    )
    assert admin_run.returncode == 0, admin_run.stderr
    admin_token = admin_run.stdout.strip()
    claims = jwt.decode(admin_token, SECRET, algorithms=["HS256"])
    assert claims["user_id"] == "ops" and claims["roles"] == ["admin"] and claims["exp"] > time.time()

    gina = bearer(user_run.stdout.strip())
    assert (await create(jwt_client, gina))["user_id"] == "gina"
    error = await jwt_client.error("tasks.create", {"tasks": [{"name": "x", "user_id": "hal"}]}, headers=gina)
    assert error["code"] == PERMISSION_DENIED
    assert (await create(jwt_client, bearer(admin_token), user_id="hal"))["user_id"] == "hal"

    assert unset_run.returncode != 0
    assert "SERVICE_JWT_SECRET" in unset_run.stderr


async def test_llm_key_header_is_checked(jwt_client: Client) -> None:
    """An X-LLM-API-KEY that holds no key is refused (-32602), without echoing the header."""
    answer = await jwt_client.call("tasks.list", headers={**ALICE, "X-LLM-API-KEY": "openai:"})
    assert answer["error"]["code"] == -32602
    assert "X-LLM-API-KEY" in answer["error"]["message"]


# --- the other surfaces: /graphql and /ws use the same rules ---------------------------------

async def graphql(client: Client, query: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.http.post("/graphql", json={"query": query}, headers=headers or {})


async def test_graphql_refusals_and_isolation(app_factory: Callable[..., Any]) -> None:
    async with app_factory(env={**JWT_ENV, "SERVICE_API_PROTOCOL": "graphql"}) as c:
        for headers, reason in [({}, "Missing token"), (bearer(EXPIRED), "Token expired"),
                                (bearer(BAD_SIGNATURE), "Invalid token signature"),
                                ({"Authorization": "Basic x"}, "Malformed Authorization header")]:
            response = await graphql(c, "{ tasks { id } }", headers)
            assert response.status_code == 401
            error = response.json()["errors"][0]
            assert error["extensions"]["code"] == PERMISSION_DENIED and reason in error["message"]
            assert EXPIRED not in response.text and BAD_SIGNATURE not in response.text

        mine = await create(c, ALICE)
        await create(c, BOB)
        query = '{ task(taskId: "%s") { id } }' % mine["id"]
        assert (await graphql(c, query, ALICE)).json()["data"]["task"]["id"] == mine["id"]
        assert (await graphql(c, query, {"Cookie": f"Authorization={token('alice')}"})).json()["data"]["task"]
        refused = (await graphql(c, query, BOB)).json()
        assert refused["errors"][0]["extensions"]["code"] == PERMISSION_DENIED
        assert (await graphql(c, query, ADMIN)).json()["data"]["task"]["id"] == mine["id"]
        listed = (await graphql(c, "{ tasks { id } }", ALICE)).json()["data"]["tasks"]
        assert [t["id"] for t in listed] == [mine["id"]]
        assert len((await graphql(c, "{ tasks { id } }", ADMIN)).json()["data"]["tasks"]) == 2
        children = '{ taskChildren(parentId: "%s") { id } }' % mine["id"]
        assert (await graphql(c, children, BOB)).json()["data"]["taskChildren"] == []
        mutation = 'mutation { deleteTask(taskId: "%s") }' % mine["id"]
        assert (await graphql(c, mutation, BOB)).json()["errors"][0]["extensions"]["code"] == PERMISSION_DENIED


async def test_websocket_handshake_uses_the_same_rules(make_settings: Callable[..., Settings]) -> None:
    import json

    import websockets
    from websockets.exceptions import InvalidStatus

    from tests.test_ws import live_server

    async with live_server(make_settings(JWT_ENV)) as server:
        url = f"ws://127.0.0.1:{server.port}/ws"
        for headers, reason in [(bearer(EXPIRED), "Token expired"), (bearer(BAD_SIGNATURE), "Invalid token signature"),
                                ({"Cookie": f"Authorization={EXPIRED}"}, "Token expired")]:
            with pytest.raises(InvalidStatus) as refused:
                async with websockets.connect(url, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401
            body = refused.value.response.body.decode()
            assert reason in json.loads(body)["error"]["message"]
            assert EXPIRED not in body and BAD_SIGNATURE not in body
        # The cookie is a fallback for the handshake too.
        async with websockets.connect(url, additional_headers={"Cookie": f"Authorization={token('alice')}"}) as ws:
            await ws.send(json.dumps({"action": "ping"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "pong"


# --- the agent surface (POST /) ----------------------------------------------------------------

async def a2a_client(client: Client, headers: dict[str, str]) -> tuple[Any, httpx.AsyncClient]:
    """The official a2a-sdk client over the ASGI app (card fetched from the public well-known path),
    sending `headers` on every request."""
    from a2a.client import ClientConfig, ClientFactory

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://testserver",
                             headers=headers, timeout=30)
    factory = ClientFactory(ClientConfig(httpx_client=http, streaming=False))
    return await factory.create_from_url("http://testserver"), http


async def test_a2a_tasks_are_isolated_between_users(jwt_client: Client) -> None:
    from a2a.client import A2AClientError
    from a2a.helpers.proto_helpers import new_data_message
    from a2a.types.a2a_pb2 import GetTaskRequest, ListTasksRequest, Role, SendMessageRequest
    from a2a.utils.errors import TaskNotFoundError

    alice, alice_http = await a2a_client(jwt_client, ALICE)
    bob, bob_http = await a2a_client(jwt_client, BOB)
    nobody, nobody_http = await a2a_client(jwt_client, {})  # the card is public
    try:
        request = SendMessageRequest(message=new_data_message({"tasks": [{"name": "agent-task"}]}, role=Role.ROLE_USER))
        answers = [answer async for answer in alice.send_message(request)]
        agent_task = answers[-1].task
        root_id = agent_task.metadata["root_task_id"]
        assert agent_task.metadata["user_id"] == "alice"

        assert (await alice.get_task(GetTaskRequest(id=agent_task.id))).id == agent_task.id
        with pytest.raises(TaskNotFoundError):  # the SDK's task store is scoped to the caller
            await bob.get_task(GetTaskRequest(id=agent_task.id))
        assert agent_task.id not in [t.id for t in (await bob.list_tasks(ListTasksRequest())).tasks]
        assert agent_task.id in [t.id for t in (await alice.list_tasks(ListTasksRequest())).tasks]
        with pytest.raises(A2AClientError, match="401"):
            [answer async for answer in nobody.send_message(request)]
    finally:
        for http in (alice_http, bob_http, nobody_http):
            await http.aclose()

    # The task tree behind it is alice's on every surface; tasks.* on / follow the same rules.
    assert (await jwt_client.result("tasks.get", {"task_id": root_id}, path="/", headers=ALICE))["user_id"] == "alice"
    assert (await jwt_client.error("tasks.get", {"task_id": root_id}, path="/", headers=BOB))["code"] == PERMISSION_DENIED
    response = await post(jwt_client, "/", rpc("tasks.list"), bearer(EXPIRED))
    assert response.status_code == 401 and "Token expired" in response.json()["error"]["message"]
    answer = await jwt_client.call("tasks.list", path="/", headers={**ALICE, "X-LLM-API-KEY": "openai:"})
    assert answer["error"]["code"] == -32602
