"""Quotas and admission (issue 26, item 4): the per-user request rate and the pending-task quota,
through every surface of the app (httpx against the ASGI app), plus the limiter and the settings.

Over quota every surface answers HTTP 429 with `Retry-After` and its own error, nothing is stored,
another user is not affected, and admins are exempt while SERVICE_QUOTA_EXEMPT_ADMINS is on."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from taskgrove.agent.services.admission import MAX_TRACKED_USERS, PENDING_RETRY_SECONDS, RequestRate, claimed_user
from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.errors import QUOTA_EXCEEDED, quota_retry_after
from taskgrove.agent.foundations.settings import Settings, SettingsError
from tests.conftest import Client
from tests.processes import Service
from tests.test_mcp import session as mcp_session
from tests.test_operations import sample

SECRET = "admission-test-secret-with-enough-bytes"
NOOP = {"method": "noop_executor"}


def bearer(client: Client, user: str, roles: tuple[str, ...] = ()) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(client.services.settings, user, roles)}"}


def rpc(method: str, params: Any, id_: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def v03_send(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    message = {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
               "parts": [{"kind": "data", "data": {"tasks": tasks}}]}
    return rpc("message/send", {"message": message}, "a2a-03")


def v10_message(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"message": {"role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"data": {"tasks": tasks}}]}}


def assert_refused(response: Any, reason: str) -> dict[str, Any]:
    """HTTP 429 with a whole-seconds Retry-After of at least 1; the JSON body."""
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1
    if reason == "pending":
        assert int(response.headers["retry-after"]) == PENDING_RETRY_SECONDS
    return response.json()


def assert_rpc_refusal(error: dict[str, Any], reason: str, setting: str) -> None:
    assert error["code"] == QUOTA_EXCEEDED
    assert setting in error["message"] and "retry after" in error["message"]
    assert error["data"]["reason"] == reason and error["data"]["setting"] == setting
    assert error["data"]["retry_after"] >= 1


async def refusal(client: Client, method: str, params: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The error of a call refused by the pending-task quota (HTTP 429)."""
    response = await client.http.post("/tasks", json=rpc(method, params), headers=headers or {})
    error = assert_refused(response, "pending")["error"]
    assert error["code"] == QUOTA_EXCEEDED
    return error


async def stored(client: Client, task_id: str) -> Any:
    return (await client.http.post("/tasks", json=rpc("tasks.get", {"task_id": task_id}),
                                   headers=bearer(client, "root", ("admin",)))).json()["result"]


# --- the pending-task quota on every surface ------------------------------------------------------

PENDING_ENV = {"SERVICE_JWT_SECRET": SECRET, "SERVICE_MAX_PENDING_PER_USER": "3", "SERVICE_API_PROTOCOL": "graphql"}


async def fill(client: Client, user: str) -> str:
    """Give `user` exactly 3 pending tasks (copies are stored, not run); the seed tree's id."""
    alice = bearer(client, user)
    seed = await client.result("tasks.create", [{"name": "seed", "schemas": NOOP}], headers=alice)
    assert seed["status"] == "completed"  # finished: not counted
    for _ in range(3):
        await client.result("tasks.copy", {"task_id": seed["id"]}, headers=alice)
    return seed["id"]


async def test_pending_quota_refuses_on_every_surface_with_nothing_stored(app_factory: Any) -> None:
    async with app_factory(env=PENDING_ENV) as client:
        seed = await fill(client, "alice")
        alice = bearer(client, "alice")
        http = client.http

        # /tasks: tasks.create, tasks.copy, tasks.clone; -32029 naming the setting, retry_after in data
        created = await http.post("/tasks", json=rpc("tasks.create", [{"id": "over-1", "name": "x", "schemas": NOOP}]),
                                  headers=alice)
        assert_rpc_refusal(assert_refused(created, "pending")["error"], "pending", "SERVICE_MAX_PENDING_PER_USER")
        for method, params in (("tasks.copy", {"task_id": seed}), ("tasks.clone", {"task_id": seed})):
            answer = assert_refused(await http.post("/tasks", json=rpc(method, params), headers=alice), "pending")
            assert answer["error"]["code"] == QUOTA_EXCEEDED, method

        # / (A2A JSON-RPC 0.3 and 1.0): the message's tree is refused before the SDK makes a task
        answer = assert_refused(await http.post("/", json=v03_send([{"id": "over-2", "name": "x", "schemas": NOOP}]),
                                                headers=alice), "pending")
        assert answer["id"] == "a2a-03"
        assert_rpc_refusal(answer["error"], "pending", "SERVICE_MAX_PENDING_PER_USER")
        answer = assert_refused(await http.post(
            "/", json=rpc("SendMessage", v10_message([{"id": "over-3", "name": "x", "schemas": NOOP}]), 10),
            headers={**alice, "A2A-Version": "1.0"}), "pending")
        assert answer["id"] == 10 and answer["error"]["code"] == QUOTA_EXCEEDED
        info, retry = answer["error"]["data"]  # the 1.0 wire: google.rpc details
        assert info["reason"] == "QUOTA_EXCEEDED" and info["metadata"]["setting"] == "SERVICE_MAX_PENDING_PER_USER"
        assert retry == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{PENDING_RETRY_SECONDS}s"}

        # /a2a (HTTP+JSON): google.rpc.Status RESOURCE_EXHAUSTED
        rest = await http.post("/a2a/message:send", json=v10_message([{"id": "over-4", "name": "x", "schemas": NOOP}]),
                               headers={**alice, "A2A-Version": "1.0"})
        error = assert_refused(rest, "pending")["error"]
        assert error["code"] == 429 and error["status"] == "RESOURCE_EXHAUSTED"
        assert "SERVICE_MAX_PENDING_PER_USER" in error["message"]
        assert error["details"][1]["retryDelay"] == f"{PENDING_RETRY_SECONDS}s"

        # GraphQL: an error with our code in its extensions, data null
        mutation = "mutation($i: CreateTaskInput) { createTask(taskInput: $i) { id } }"
        graphql = await http.post("/graphql", json={"query": mutation, "variables": {"i": {"name": "over-5"}}},
                                  headers=alice)
        body = assert_refused(graphql, "pending")
        assert body["data"] == {"createTask": None}
        (gql_error,) = body["errors"]
        assert gql_error["extensions"]["code"] == QUOTA_EXCEEDED
        assert gql_error["extensions"]["codeName"] == "QUOTA_EXCEEDED"
        assert gql_error["extensions"]["retryAfter"] == PENDING_RETRY_SECONDS

        # nothing of it was stored: alice still has her seed and three copies, no agent task either
        for task_id in ("over-1", "over-2", "over-3", "over-4"):
            assert await stored(client, task_id) is None, task_id
        mine = await client.result("tasks.list", {"limit": 100}, headers=alice)
        assert len(mine) == 4 and all(t["name"] == "seed" for t in mine)
        listed = await http.post("/", json=rpc("ListTasks", {}), headers={**alice, "A2A-Version": "1.0"})
        assert listed.json()["result"].get("tasks", []) == []

        # refusals are counted by reason, without user names
        metrics = (await http.get("/metrics", headers=alice)).text
        assert sample(metrics, "taskgrove_admission_refusals_total", reason="pending") == 7
        assert sample(metrics, "taskgrove_admission_refusals_total", reason="rate") == 0
        assert "alice" not in "".join(line for line in metrics.splitlines() if "refusals" in line)


async def test_a2a_streams_resends_and_batches_are_refused_before_any_event(app_factory: Any) -> None:
    """Streaming sends (the 0.3 adapter builds the tree only when its stream is read), a send with
    an Idempotency-Key, and a batch: the same 429, never a 200 stream carrying the refusal."""
    async with app_factory(env=PENDING_ENV) as client:
        await fill(client, "alice")
        alice, http = bearer(client, "alice"), client.http
        v10 = {**alice, "A2A-Version": "1.0"}
        sends = (
            ("/", {**v03_send([{"id": "s-1", "name": "x"}]), "method": "message/stream"}, alice),
            ("/", rpc("SendStreamingMessage", v10_message([{"id": "s-2", "name": "x"}])), v10),
            ("/a2a/message:stream", v10_message([{"id": "s-3", "name": "x"}]), v10),
            ("/", v03_send([{"id": "s-4", "name": "x"}]), {**alice, "Idempotency-Key": "once"}),
            ("/", [v03_send([{"id": "s-5", "name": "x"}])], alice),
        )
        for path, body, headers in sends:
            response = await http.post(path, json=body, headers=headers)
            assert response.headers["content-type"].startswith("application/json"), path
            answer = assert_refused(response, "pending")
            error = (answer[0] if isinstance(answer, list) else answer)["error"]
            assert error["code"] in (QUOTA_EXCEEDED, 429) and "SERVICE_MAX_PENDING_PER_USER" in error["message"]
        mixed = await http.post("/", json=[v03_send([{"id": "s-6", "name": "x"}]), rpc("tasks.list", {}, 2)],
                                headers=alice)
        assert mixed.status_code == 200 and mixed.json()[0]["error"]["code"] == QUOTA_EXCEEDED
        for n in range(1, 7):
            assert await stored(client, f"s-{n}") is None


async def test_another_user_and_admins_are_not_held_back(app_factory: Any) -> None:
    async with app_factory(env=PENDING_ENV) as client:
        await fill(client, "alice")
        alice, bob = bearer(client, "alice"), bearer(client, "bob")
        admin = bearer(client, "root", ("admin",))
        await refusal(client, "tasks.create", [{"name": "x", "schemas": NOOP}], alice)
        # bob is under his quota: alice's refusal is hers alone
        done = await client.result("tasks.create", [{"name": "bob's", "schemas": NOOP}], headers=bob)
        assert done["status"] == "completed" and done["user_id"] == "bob"
        # an admin is exempt, even storing tasks for alice
        for_alice = await client.result("tasks.create", [{"name": "x", "user_id": "alice", "schemas": NOOP}],
                                        headers=admin)
        assert for_alice["user_id"] == "alice" and for_alice["status"] == "completed"
    async with app_factory(env={**PENDING_ENV, "SERVICE_QUOTA_EXEMPT_ADMINS": "false"}) as client:  # same database
        await fill(client, "dave")
        admin = bearer(client, "root", ("admin",))
        error = await refusal(client, "tasks.create", [{"name": "x", "user_id": "dave", "schemas": NOOP}], admin)
        assert "user 'dave'" in error["message"]


async def test_a_retry_with_the_same_idempotency_key_goes_through_once_there_is_room(app_factory: Any) -> None:
    async with app_factory(env=PENDING_ENV) as client:
        await fill(client, "alice")
        alice = {**bearer(client, "alice"), "Idempotency-Key": "k-1"}
        body = rpc("tasks.create", [{"id": "later", "name": "later", "schemas": NOOP}])
        assert_refused(await client.http.post("/tasks", json=body, headers=alice), "pending")
        pending = await client.result("tasks.list", {"status": "pending"}, headers=alice)
        await client.result("tasks.delete", {"task_id": pending[0]["id"]}, headers=alice)  # room for one
        again = await client.http.post("/tasks", json=body, headers=alice)
        assert again.status_code == 200 and again.json()["result"]["status"] == "completed"
        resent = await client.http.post("/tasks", json=body, headers=alice)  # the first answer, nothing new
        assert resent.json()["result"]["id"] == "later"


async def test_a_create_resent_at_the_quota_answers_the_stored_tree(app_factory: Any) -> None:
    """A client whose create was cut off sends it again: it adds nothing, so it is answered as the
    first one would be, even with its owner at the quota; a different tree is still refused."""
    async with app_factory(env={**PENDING_ENV, "SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        alice = bearer(client, "alice")
        naps = [{"id": "held", "name": "held", "schemas": NOOP, "dependencies": [{"id": "n1"}, {"id": "n2"}]},
                *({"id": f"n{i}", "name": "nap", "parent_id": "held", "schemas": {"method": "sleep_executor"},
                   "inputs": {"seconds": 600}} for i in (1, 2))]
        first = await client.result("tasks.create", naps, headers=alice)  # 3 unfinished: the quota
        again = await client.http.post("/tasks", json=rpc("tasks.create", naps), headers=alice)
        assert again.status_code == 200 and again.json()["result"]["id"] == first["id"] == "held", again.text
        other = [{**naps[0], "name": "changed"}, *naps[1:]]  # the same ids, other content: not a resend,
        taken = (await client.http.post("/tasks", json=rpc("tasks.create", other), headers=alice)).json()
        assert taken["error"]["code"] == -32602 and "id 'held' already exists" in taken["error"]["message"]  # no 429
        await refusal(client, "tasks.create", [{"id": "new", "name": "new", "schemas": NOOP}], alice)
        assert await stored(client, "new") is None
        await client.result("tasks.cancel", {"task_id": "held"}, headers=alice)


async def test_a_tree_larger_than_the_quota_is_invalid_params_not_429(app_factory: Any) -> None:
    async with app_factory(env=PENDING_ENV) as client:
        tasks = [{"id": "r", "name": "r"}] + [{"id": f"c{i}", "name": "c", "parent_id": "r"} for i in range(3)]
        response = await client.http.post("/tasks", json=rpc("tasks.create", tasks), headers=bearer(client, "alice"))
        assert response.status_code == 200
        error = response.json()["error"]
        assert error["code"] == -32602 and "SERVICE_MAX_PENDING_PER_USER" in error["message"]


async def test_the_quota_counts_tasks_without_a_user_as_one_owner_with_jwt_off(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_MAX_PENDING_PER_USER": "2"}) as client:
        seed = await client.result("tasks.create", [{"name": "seed", "schemas": NOOP}])
        for _ in range(2):
            await client.result("tasks.copy", {"task_id": seed["id"]})
        await refusal(client, "tasks.copy", {"task_id": seed["id"]})
        named = await client.result("tasks.create", [{"name": "carol's", "user_id": "carol", "schemas": NOOP}])
        assert named["status"] == "completed"


async def test_a_batch_answers_429_only_when_every_call_was_refused(app_factory: Any) -> None:
    async with app_factory(env=PENDING_ENV) as client:
        await fill(client, "alice")
        alice = bearer(client, "alice")
        create = rpc("tasks.create", [{"name": "x", "schemas": NOOP}], 1)
        mixed = await client.http.post("/tasks", json=[create, rpc("tasks.list", {}, 2)], headers=alice)
        assert mixed.status_code == 200 and "retry-after" not in mixed.headers
        first, second = mixed.json()
        assert first["error"]["code"] == QUOTA_EXCEEDED and "result" in second
        refused = await client.http.post("/tasks", json=[create, {**create, "id": 3}], headers=alice)
        assert [a["error"]["code"] for a in assert_refused(refused, "pending")] == [QUOTA_EXCEEDED] * 2


# --- the request rate on every surface ------------------------------------------------------------

# Two requests at once, then one a hundred seconds: the third request of a test is always refused.
RATE_ENV = {"SERVICE_JWT_SECRET": SECRET, "SERVICE_RATE_LIMIT_PER_USER": "0.01", "SERVICE_RATE_LIMIT_BURST": "2",
            "SERVICE_API_PROTOCOL": "graphql"}


async def test_rate_refuses_on_every_surface_and_stores_nothing(app_factory: Any) -> None:
    async with app_factory(env=RATE_ENV) as client:
        alice, http = bearer(client, "alice"), client.http
        for _ in range(2):  # the burst
            assert (await http.post("/tasks", json=rpc("tasks.list", {}), headers=alice)).status_code == 200
        create = rpc("tasks.create", [{"id": "rated", "name": "x", "schemas": NOOP}])
        answer = assert_refused(await http.post("/tasks", json=create, headers=alice), "rate")
        assert_rpc_refusal(answer["error"], "rate", "SERVICE_RATE_LIMIT_PER_USER")
        assert "SERVICE_RATE_LIMIT_BURST" in answer["error"]["message"] and "user 'alice'" in answer["error"]["message"]
        assert int((await http.post("/tasks", json=create, headers=alice)).headers["retry-after"]) > 60
        batch = assert_refused(await http.post("/tasks", json=[create, {**create, "id": 2}], headers=alice), "rate")
        assert [a["id"] for a in batch] == [1, 2]
        assert_refused(await http.post("/system", json=rpc("system.health", {}), headers=alice), "rate")

        refused = assert_refused(await http.post("/", json=v03_send([{"name": "x"}]), headers=alice), "rate")
        assert refused["id"] == "a2a-03" and refused["error"]["data"]["reason"] == "rate"
        refused = assert_refused(await http.post("/", json=rpc("GetTask", {"id": "x"}, 5),
                                                 headers={**alice, "A2A-Version": "1.0"}), "rate")
        assert refused["error"]["data"][0]["metadata"]["reason"] == "rate"  # 1.0: google.rpc details
        rest = assert_refused(await http.get("/a2a/tasks/x", headers={**alice, "A2A-Version": "1.0"}), "rate")
        assert rest["error"]["status"] == "RESOURCE_EXHAUSTED"
        graphql = assert_refused(await http.post("/graphql", json={"query": "{ tasks { id } }"}, headers=alice), "rate")
        assert graphql["errors"][0]["extensions"]["code"] == QUOTA_EXCEEDED
        mcp = assert_refused(await http.post("/mcp", json=rpc("tools/list", {}), headers={
            **alice, "Accept": "application/json, text/event-stream"}), "rate")
        assert mcp["error"]["code"] == QUOTA_EXCEEDED

        # another user has a bucket of their own; an admin has none
        bob = bearer(client, "bob")
        assert (await http.post("/tasks", json=rpc("tasks.list", {}), headers=bob)).status_code == 200
        admin = bearer(client, "root", ("admin",))
        for _ in range(5):
            assert (await http.post("/tasks", json=rpc("tasks.list", {}), headers=admin)).status_code == 200
        assert await stored(client, "rated") is None
        metrics = (await http.get("/metrics", headers=admin)).text
        assert sample(metrics, "taskgrove_admission_refusals_total", reason="rate") == 9


async def test_rate_with_jwt_off_counts_the_user_a_request_names_else_its_address(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_RATE_LIMIT_PER_USER": "0.01", "SERVICE_RATE_LIMIT_BURST": "1"}) as client:
        http = client.http
        alice = rpc("tasks.list", {"user_id": "alice"})
        assert (await http.post("/tasks", json=alice)).status_code == 200
        answer = assert_refused(await http.post("/tasks", json=alice), "rate")
        assert "user 'alice'" in answer["error"]["message"]
        # carol names herself in her tasks: her own bucket
        carol = rpc("tasks.create", [{"name": "c", "user_id": "carol", "schemas": NOOP}])
        assert (await http.post("/tasks", json=carol)).status_code == 200
        # no user named: the client's address is the bucket
        assert (await http.post("/tasks", json=rpc("tasks.list", {}))).status_code == 200
        anonymous = assert_refused(await http.post("/tasks", json=rpc("tasks.list", {})), "rate")
        assert "client 127.0.0.1" in anonymous["error"]["message"]


async def test_rate_with_jwt_on_counts_the_token_never_a_name_in_the_body(app_factory: Any) -> None:
    env = {"SERVICE_JWT_SECRET": SECRET, "SERVICE_RATE_LIMIT_PER_USER": "0.01", "SERVICE_RATE_LIMIT_BURST": "1"}
    async with app_factory(env=env) as client:
        http, alice = client.http, bearer(client, "alice")
        spend_bob = rpc("tasks.list", {"user_id": "bob"})
        assert (await http.post("/tasks", json=spend_bob, headers=alice)).status_code == 200
        assert "user 'alice'" in assert_refused(await http.post("/tasks", json=spend_bob, headers=alice),
                                                "rate")["error"]["message"]
        assert (await http.post("/tasks", json=rpc("tasks.list", {}), headers=bearer(client, "bob"))).status_code == 200
        service_token = jwt.encode({"roles": []}, SECRET, algorithm="HS256")  # a service token: names no user
        service = {"Authorization": f"Bearer {service_token}"}
        assert (await http.post("/tasks", json=spend_bob, headers=service)).status_code == 200
        anonymous = assert_refused(await http.post("/tasks", json=spend_bob, headers=service), "rate")
        assert "client 127.0.0.1" in anonymous["error"]["message"]


async def test_default_limits_leave_ordinary_use_alone(app_factory: Any) -> None:
    """The defaults (200 requests/s in bursts of 400, 20,000 unfinished tasks) with JWT on."""
    async with app_factory(env={"SERVICE_JWT_SECRET": SECRET, "SERVICE_RATE_LIMIT_PER_USER": "200"}) as client:
        assert client.services.settings.rate_limit_burst == 400
        assert client.services.settings.max_pending_per_user == 20_000
        alice = bearer(client, "alice")
        for i in range(50):
            assert (await client.http.post("/tasks", json=rpc("tasks.get", {"task_id": str(i)}),
                                           headers=alice)).status_code == 200
        tree = [{"id": "big", "name": "big"}] + [{"id": f"big-{i}", "name": "c", "parent_id": "big",
                                                  "schemas": NOOP} for i in range(500)]
        assert (await client.result("tasks.create", tree, headers=alice))["status"] == "completed"


# --- the limiter ----------------------------------------------------------------------------------

def test_request_rate_allows_the_burst_then_the_rate() -> None:
    rate = RequestRate(per_second=2.0, burst=3)
    assert [rate.take("a", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("a", 100.0) == pytest.approx(0.5)  # one more in half a second
    assert rate.take("b", 100.0) == 0.0  # another key is not affected
    assert rate.take("a", 100.5) == 0.0
    assert rate.take("a", 100.5) > 0
    assert rate.take("a", 110.0) == 0.0  # idle: a full bucket again
    assert [rate.take("a", 110.0) for _ in range(2)] == [0.0, 0.0]


@hsettings(max_examples=300, deadline=None)
@given(now=st.floats(min_value=0.0, max_value=1e9, allow_nan=False), per_second=st.sampled_from([0.01, 0.3, 1.0, 7.0, 200.0]))
def test_a_new_key_with_a_burst_of_one_is_never_refused_by_rounding(now: float, per_second: float) -> None:
    """The first request of a key is allowed whatever the clock reads (found when `now + 100 - now`
    came out above 100 and a fresh user's first request was a 429)."""
    rate = RequestRate(per_second, 1)
    assert rate.take("fresh", now) == 0.0
    assert rate.take("fresh", now) > 0.0  # and the burst of one is spent


def test_request_rate_memory_is_bounded_and_idle_keys_go_first() -> None:
    rate = RequestRate(per_second=1.0, burst=1, max_keys=100)
    for i in range(100):
        rate.take(f"idle-{i}", 0.0)
    for i in range(1000):
        rate.take(f"busy-{i}", 50.0)
        assert len(rate) <= 100
    assert rate.take("busy-999", 50.0) > 0  # the newest throttled key is still remembered
    assert MAX_TRACKED_USERS >= 1000


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 0.2)), max_size=60),
       st.floats(0.5, 50), st.integers(1, 10))
def test_request_rate_never_allows_more_than_burst_plus_rate(steps: list[tuple[str, float]], per_second: float,
                                                             burst: int) -> None:
    rate, now, allowed = RequestRate(per_second, burst), 0.0, {"a": 0, "b": 0, "c": 0}
    for key, pause in steps:
        now += pause
        wait = rate.take(key, now)
        assert wait >= 0
        allowed[key] += wait == 0
    for count in allowed.values():
        assert count <= burst + now * per_second + 1e-6


# --- parsing: settings, claimed users, answers ------------------------------------------------------

QUOTA_SETTINGS = {
    "SERVICE_MAX_PENDING_PER_USER": ("max_pending_per_user", int, 0, 100_000_000),
    "SERVICE_RATE_LIMIT_PER_USER": ("rate_limit_per_user", float, 0.0, 1_000_000.0),
    "SERVICE_RATE_LIMIT_BURST": ("rate_limit_burst", int, 1, 10_000_000),
}


@hsettings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(QUOTA_SETTINGS)),
       st.one_of(st.text(max_size=12), st.integers(-10, 10**9).map(str), st.floats(allow_nan=True).map(str)))
def test_quota_settings_parse_or_name_the_variable(name: str, raw: str) -> None:
    field, kind, low, high = QUOTA_SETTINGS[name]
    try:
        value = getattr(Settings.from_env({name: raw}), field)
    except SettingsError as exc:
        assert name in str(exc)
        return
    assert isinstance(value, kind) and low <= value <= high


@hsettings(max_examples=100, deadline=None)
@given(st.text(max_size=8))
def test_exempt_admins_is_a_boolean_or_names_the_variable(raw: str) -> None:
    try:
        value = Settings.from_env({"SERVICE_QUOTA_EXEMPT_ADMINS": raw}).quota_exempt_admins
    except SettingsError as exc:
        assert "SERVICE_QUOTA_EXEMPT_ADMINS" in str(exc)
        return
    assert value is (raw.strip().lower() not in ("0", "false", "no", "off", ""))


def test_quota_defaults() -> None:
    settings = Settings.from_env({})
    assert (settings.max_pending_per_user, settings.rate_limit_per_user, settings.rate_limit_burst,
            settings.quota_exempt_admins) == (20_000, 200.0, 400, True)


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["user_id", "userId", "x"]), inner,
                                                                max_size=4), max_leaves=12).map(
    lambda v: json.dumps(v).encode())))
def test_claimed_user_reads_any_body(body: bytes) -> None:
    found = claimed_user(body)
    assert found is None or 1 <= len(found) <= 2 * 255  # 255 characters, each at most an escape pair


def test_claimed_user_is_the_first_user_id_member() -> None:
    assert claimed_user(b'{"params": {"tasks": [{"name": "x", "user_id": "alice"}, {"user_id": "bob"}]}}') == "alice"
    assert claimed_user(b'{"variables": {"userId" : "carol"}}') == "carol"
    assert claimed_user(b'{"user_id": 5}') is None and claimed_user(None) is None


@hsettings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["error", "code", "data", "retry_after", "retryDelay", "id"]), inner,
                        max_size=4), max_leaves=15))
def test_quota_retry_after_reads_any_answer(answer: Any) -> None:
    found = quota_retry_after(answer)
    assert found is None or (isinstance(found, int) and found >= 1)


# --- end to end: a real `taskgrove serve`, JWT on, two users --------------------------------------

async def test_two_users_on_a_real_service(tmp_path: Path) -> None:
    """`flood` fills its quota and outruns its rate; `quiet` is served all along. The MCP tool
    call over quota is an isError result (official MCP client)."""
    service = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}",
                                 "SERVICE_JWT_SECRET": SECRET, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                 "SERVICE_MAX_PENDING_PER_USER": "4", "SERVICE_RATE_LIMIT_PER_USER": "1",
                                 "SERVICE_RATE_LIMIT_BURST": "30"}).start()
    settings = Settings.from_env({"SERVICE_JWT_SECRET": SECRET})
    flood = {"Authorization": f"Bearer {mint_token(settings, 'flood')}"}
    quiet = {"Authorization": f"Bearer {mint_token(settings, 'quiet')}"}
    admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'])}"}
    nap = {"name": "nap", "inputs": {"seconds": 30}, "schemas": {"method": "sleep_executor"}}
    sleepy = [{"id": "f", **nap}] + [{"id": f"f{i}", "parent_id": "f", **nap} for i in range(3)]  # 4 unfinished
    try:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            assert (await http.post("/tasks", json=rpc("tasks.create", sleepy), headers=flood)).status_code == 200
            over = await http.post("/tasks", json=rpc("tasks.create", [{"id": "f-more", "name": "x", "schemas": NOOP}]),
                                   headers=flood)
            assert_rpc_refusal(assert_refused(over, "pending")["error"], "pending", "SERVICE_MAX_PENDING_PER_USER")
            served = await http.post("/tasks", json=rpc("tasks.create", [{"id": "q", "name": "q", "schemas": NOOP}]),
                                     headers=quiet)
            assert served.status_code == 200 and "error" not in served.json()

            async with mcp_session(service.url, flood["Authorization"].split()[1]) as mcp:
                result = await mcp.call_tool("tasks_create", {"tasks": [{"id": "f-mcp", "name": "x"}]})
                assert result.is_error, result.content[0].text
                assert json.loads(result.content[0].text)["error"]["code"] == QUOTA_EXCEEDED

            for _ in range(60):  # the rest of flood's burst, then its rate
                answer = await http.post("/tasks", json=rpc("tasks.list", {}), headers=flood)
                if answer.status_code == 429:
                    break
            assert_rpc_refusal(assert_refused(answer, "rate")["error"], "rate", "SERVICE_RATE_LIMIT_PER_USER")
            assert (await http.post("/tasks", json=rpc("tasks.get", {"task_id": "q"}), headers=quiet)).status_code == 200
            for task_id in ("f-more", "f-mcp"):
                got = await http.post("/tasks", json=rpc("tasks.get", {"task_id": task_id}), headers=admin)
                assert got.json()["result"] is None, task_id
            metrics = (await http.get("/metrics", headers=admin)).text
            assert sample(metrics, "taskgrove_admission_refusals_total", reason="pending") == 2
            assert sample(metrics, "taskgrove_admission_refusals_total", reason="rate") >= 1
    finally:
        service.stop()


async def test_the_pending_count_reads_one_index_and_never_the_table(client: Client, db_url: str) -> None:
    """The quota's count must stay bounded by the quota whatever a user's history. SQLite: two
    covering ranges of ix_tasks_user_status_created. PostgreSQL: the partial ix_tasks_unfinished_user, for
    the count alone and inside a create's insert, as generic plans (what asyncpg's prepared
    statements come to after five runs), with statistics and without (autovacuum off, or not yet
    run: without that index the planner read the user's whole history through ix_tasks_user_created)."""
    from taskgrove.storage import statements

    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            for statement, args in ((statements.UNFINISHED_OF_USER, ("u", 5)), (statements.UNFINISHED_OF_NOBODY, (5,))):
                plan = " | ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement.sqlite}", args))
                assert "USING COVERING INDEX ix_tasks_user_status_created" in plan, plan
        finally:
            conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await _pg_history(conn, finished=3_000)
            for analyzed in (False, True):
                if analyzed:
                    await conn.execute("ANALYZE tasks")
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                for owner in ("u", None):
                    statement, args = statements.unfinished_of(owner, 20_000)
                    plan = await _generic_plan(conn, statement.postgresql, args, analyze=True)
                    assert plan["count"] == 2, plan  # the two unfinished of `owner`, not the 3,000 finished
                    assert plan["buffers"] <= 10, plan  # the index's root and a leaf, and the two rows' pages
                    assert "ix_tasks_unfinished_user" in plan["text"], plan["text"]
                    sql, args = _insert_call(owner)
                    plan = await _generic_plan(conn, sql, args)
                    assert "ix_tasks_unfinished_user" in plan["text"] and "ix_tasks_user_created" not in plan["text"], \
                        plan["text"]
            raise _RolledBack
    except _RolledBack:
        pass
    finally:
        await conn.close()


STAMP = "2026-01-01T00:00:00.000000+00:00"


def _root_row(task_id: str, user: str | None, status: str) -> dict[str, Any]:
    """A stored root task's full row (every column)."""
    from taskgrove.storage.models import with_defaults

    return with_defaults({"id": task_id, "name": task_id, "task_tree_id": task_id, "user_id": user,
                          "dependencies": [], "inputs": {}, "params": {}, "schemas": {}, "status": status,
                          "created_at": STAMP, "updated_at": STAMP})


async def _pg_history(conn: Any, finished: int) -> None:
    """`finished` completed tasks of user "u" and as many without a user, and two pending of each."""
    rows = [_root_row(f"h-{who}-{n}", user, "completed" if n >= 2 else "pending")
            for who, user in (("u", "u"), ("nobody", None)) for n in range(finished + 2)]
    await conn.execute("INSERT INTO tasks SELECT * FROM json_populate_recordset(NULL::tasks, CAST($1 AS json))",
                       json.dumps(rows))


def _insert_call(owner: str | None) -> tuple[str, list[Any]]:
    """A create's insert of one task with `owner`'s quota: the statement and arguments the repository sends."""
    from taskgrove.storage import tree_insert
    from taskgrove.storage.tree_insert import Quota

    execution, rows = tree_insert.new_tree([_root_row("new", owner, "pending")], owner, "instance",
                                           "2999-01-01T00:00:00.000000+00:00", STAMP)
    return tree_insert.pg_insert_tree_call(rows, execution, Quota(owner, 20_000, 1))


async def _generic_plan(conn: Any, sql: str, args: Any, analyze: bool = False) -> dict[str, Any]:
    """The generic plan of `sql` (PREPARE, then EXPLAIN EXECUTE with `args`): its text and, with
    `analyze` (the statement runs), the first column of its answer and the buffers it touched."""
    name = f"plan_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"PREPARE {name} AS {sql}")
    # EXECUTE takes no parameters of the protocol: each argument as a quoted literal of its text
    marks = ", ".join([await conn.fetchval("SELECT quote_nullable(CAST($1 AS text))", None if a is None else str(a))
                       for a in args])
    options = "ANALYZE, BUFFERS, " if analyze else ""
    explained = json.loads(await conn.fetchval(f"EXPLAIN ({options}FORMAT JSON) EXECUTE {name}({marks})"))[0]
    found: dict[str, Any] = {"text": json.dumps(explained)}
    if analyze:
        top = explained["Plan"]
        found["buffers"] = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
        found["count"] = await conn.fetchval(f"EXECUTE {name}({marks})")
    await conn.execute(f"DEALLOCATE {name}")
    return found


class _RolledBack(Exception):
    """Leaves a transaction by rolling it back."""
