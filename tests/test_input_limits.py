"""Bounded input (issue 11, item 7), JSON-RPC 2.0 envelope rules (issue 18, item 3) and trees of
any allowed depth (issue 18, item 2), through the ASGI app with httpx."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.conftest import Client

SECRET = "input-limits-secret-0123456789abcdef0123"


def deep_json(body: bytes) -> Any:
    """Parse a reply nested deeper than Python's default recursion allows (a long chain's tree),
    in a thread with a large stack, as a client with a deep-capable parser would."""
    out: dict[str, Any] = {}
    limit = sys.getrecursionlimit()

    def parse() -> None:
        out["value"] = json.loads(body)

    old_stack = threading.stack_size(256 * 1024 * 1024)
    sys.setrecursionlimit(200_000)
    try:
        worker = threading.Thread(target=parse)
        worker.start()
        worker.join()
    finally:
        sys.setrecursionlimit(limit)
        threading.stack_size(old_stack)
    return out["value"]


async def raw(client: Client, body: bytes | Any, path: str = "/tasks", headers: dict[str, str] | None = None) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.http.post(path, content=content, headers={"Content-Type": "application/json", **(headers or {})})


async def count(client: Client) -> int:
    return len(await client.result("tasks.list", {"limit": 1000}))


# --- sizes and depth -----------------------------------------------------------------------------

async def test_body_over_the_limit_is_413_also_when_chunked(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_MAX_REQUEST_BYTES": "4096"}) as client:
        big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                          "params": {"name": "x", "inputs": {"pad": "y" * 5000}}}).encode()
        for path in ("/tasks", "/system", "/"):
            response = await raw(client, big, path)
            assert response.status_code == 413, (path, response.text)
            assert response.json()["error"]["code"] == -32600
            assert "SERVICE_MAX_REQUEST_BYTES" in response.json()["error"]["data"]

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked transfer
            for start in range(0, len(big), 1000):
                yield big[start:start + 1000]

        response = await client.http.post("/tasks", content=chunks(), headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["error"]["code"] == -32600
        assert await count(client) == 0
        small = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "tasks.create", "params": {"name": "ok"}})
        assert small.status_code == 200 and small.json()["result"]["name"] == "ok"


@pytest.mark.parametrize("path", ["/tasks", "/system", "/"])
async def test_json_deeper_than_the_limit_is_32700_saying_so(client: Client, path: str) -> None:
    for body in (b"[" * 5000, b'{"a":' * 101 + b"1" + b"}" * 101, b"[" * 100_000 + b"]" * 100_000):
        response = await raw(client, body, path)
        assert response.status_code == 200
        error = response.json()["error"]
        assert error["code"] == -32700 and "nested deeper than 100 levels" in error["data"], error
    # exactly at the limit is fine
    params = {"name": "deep", "inputs": {}}
    node = params["inputs"]
    for _ in range(90):
        node["d"] = {}
        node = node["d"]
    response = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "tasks.create", "params": params})
    assert "result" in response.json()


async def test_depth_limit_is_a_setting(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_MAX_JSON_DEPTH": "8"}) as client:
        params = {"name": "x", "inputs": {"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}}}  # 10 levels
        error = (await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "tasks.create", "params": params})).json()
        assert error["error"]["code"] == -32700 and "deeper than 8 levels" in error["error"]["data"]


async def test_batch_longer_than_the_limit_is_32600(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_MAX_BATCH": "5"}) as client:
        calls = [{"jsonrpc": "2.0", "id": i, "method": "tasks.create", "params": {"name": f"t{i}"}} for i in range(6)]
        for path in ("/tasks", "/"):  # the task methods on `/` share the envelope and its limits
            answer = (await raw(client, calls, path)).json()
            assert answer["id"] is None and answer["error"]["code"] == -32600
            assert "at most 5 calls" in answer["error"]["data"] and "SERVICE_MAX_BATCH" in answer["error"]["data"]
        assert await count(client) == 0
        answer = (await raw(client, calls[:5])).json()
        assert [a["id"] for a in answer] == [0, 1, 2, 3, 4]


async def test_more_tasks_than_the_limit_is_32602_naming_it(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_MAX_TREE_TASKS": "10"}) as client:
        tasks = [{"id": "r", "name": "r"}] + [{"id": f"c{i}", "name": f"c{i}", "parent_id": "r"} for i in range(10)]
        error = await client.error("tasks.create", {"tasks": tasks})
        assert error["code"] == -32602 and "at most 10 tasks" in error["data"] and "SERVICE_MAX_TREE_TASKS" in error["data"]
        nested: dict[str, Any] = {"name": "n0"}
        node = nested
        for i in range(1, 12):
            node["children"] = [{"name": f"n{i}"}]
            node = node["children"][0]
        assert (await client.error("tasks.create", {"tasks": [nested]}))["code"] == -32602
        assert await count(client) == 0
        await client.result("tasks.create", {"tasks": tasks[:7]})
        await client.result("tasks.update", {"task_id": "r", "status": "pending"})
        # a copy selects the subtree, a clone too: 7 tasks fit; over the limit when the limit shrinks
    async with app_factory({"SERVICE_MAX_TREE_TASKS": "6"}) as client:
        for method in ("tasks.copy", "tasks.clone"):
            error = await client.error(method, {"task_id": "r"})
            assert error["code"] == -32602 and "(this one has 7)" in error["data"]
        assert await count(client) == 7


# --- the envelope --------------------------------------------------------------------------------

@pytest.mark.parametrize("id_text", ["1e400", "1E999", "-1e400"])
async def test_an_id_that_is_not_a_finite_number_is_32600_with_id_null(client: Client, id_text: str) -> None:
    for path, method in (("/tasks", "tasks.list"), ("/system", "system.health"), ("/", "tasks.list")):
        body = ('{"jsonrpc": "2.0", "id": ' + id_text + ', "method": "' + method + '"}').encode()
        response = await raw(client, body, path)
        assert response.status_code == 200
        assert response.json() == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Invalid Request", "data": "id must be a string, a finite number or null"}}


async def test_nan_id_and_a_bad_llm_key_header_are_not_a_500(client: Client) -> None:
    body = b'{"jsonrpc": "2.0", "id": NaN, "method": "tasks.list"}'
    for path in ("/tasks", "/"):
        response = await raw(client, body, path, headers={"X-LLM-API-KEY": "openai:"})
        assert response.status_code == 200, response.text
        assert response.json()["id"] is None and response.json()["error"]["code"] in (-32602, -32700)


async def test_public_methods_with_jwt_on_and_a_bad_id(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_JWT_SECRET": SECRET}) as client:
        for id_text in ("1e400", "NaN", "[1]", "true"):
            body = ('{"jsonrpc": "2.0", "id": ' + id_text + ', "method": "system.health"}').encode()
            response = await raw(client, body, "/system")
            assert response.status_code in (200, 401), response.text
            assert response.json()["id"] is None


@pytest.mark.parametrize("method", [{}, [], 5, None])
async def test_method_that_is_not_a_string_is_32600(client: Client, method: Any) -> None:
    for path in ("/tasks", "/system"):  # `/` routes by method first (agent/surfaces/a2a/routes.py, the A2A surface)
        answer = (await raw(client, {"jsonrpc": "2.0", "id": 7, "method": method}, path)).json()
        assert answer["error"]["code"] == -32600 and answer["id"] == 7, (path, answer)


async def test_notifications_are_executed_without_a_reply(client: Client) -> None:
    response = await raw(client, {"jsonrpc": "2.0", "method": "tasks.create", "params": {"id": "n1", "name": "n1"}})
    assert response.status_code == 204 and response.content == b""
    assert (await client.result("tasks.get", {"task_id": "n1"}))["name"] == "n1"
    # an error of a notification is not answered either
    response = await raw(client, {"jsonrpc": "2.0", "method": "tasks.get", "params": {}})
    assert response.status_code == 204
    batch = [
        {"jsonrpc": "2.0", "method": "tasks.create", "params": {"id": "n2", "name": "n2"}},
        {"jsonrpc": "2.0", "id": "a", "method": "tasks.get", "params": {"task_id": "n2"}},
        {"jsonrpc": "2.0", "method": "tasks.nope"},
    ]
    answer = (await raw(client, batch)).json()
    assert [a["id"] for a in answer] == ["a"] and answer[0]["result"]["id"] == "n2"
    response = await raw(client, batch[:1] + batch[2:], "/tasks")
    assert response.status_code == 204
    # an invalid request is answered even without an id (JSON-RPC 2.0, section 5)
    answer = (await raw(client, {"jsonrpc": "2.0", "method": 1})).json()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    response = await raw(client, {"jsonrpc": "2.0", "method": "system.health"}, "/system")
    assert response.status_code == 204


# --- trees of any allowed depth --------------------------------------------------------------------

CHAIN = 1500  # deeper than Python's recursion limit (1000): any recursive walk would fail


async def test_a_chain_as_deep_as_the_limit_works_end_to_end(app_factory: Callable[..., Any]) -> None:
    async with app_factory({"SERVICE_MAX_TREE_TASKS": str(CHAIN)}) as client:
        chain = [{"id": "c0", "name": "c0"}] + [{"id": f"c{i}", "name": f"c{i}", "parent_id": f"c{i - 1}"}
                                               for i in range(1, CHAIN)]
        too_long = chain + [{"id": "extra", "name": "extra", "parent_id": f"c{CHAIN - 1}"}]
        error = await client.error("tasks.create", {"tasks": too_long})
        assert error["code"] == -32602 and await count(client) == 0

        def depth(node: dict[str, Any]) -> int:
            levels = 0
            while node:
                levels += 1
                node = node["children"][0] if node["children"] else None
            return levels

        async def call(method: str, params: dict[str, Any]) -> Any:
            response = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            assert response.status_code == 200
            answer = deep_json(response.content)
            assert "result" in answer, answer
            return answer["result"]

        created = await call("tasks.create", {"tasks": chain})
        assert depth(created) == CHAIN and created["status"] == "completed"
        assert depth(await call("tasks.tree", {"task_id": f"c{CHAIN - 1}"})) == CHAIN
        copied = await call("tasks.copy", {"task_id": "c0"})
        assert depth(copied) == CHAIN and copied["original_task_id"] == "c0"
        clone = await call("tasks.clone", {"task_id": "c0"})
        assert depth(clone) == CHAIN
        preview = await call("tasks.clone", {"task_id": "c10", "save": False})
        assert len(preview["tasks"]) == CHAIN - 10  # c10 and everything under it
        deleted = await call("tasks.delete", {"task_id": clone["id"]})
        assert deleted["deleted_count"] == CHAIN
        assert len(await call("tasks.cancel", {"task_ids": [copied["id"]]})) == 1
        assert (await call("tasks.get", {"task_id": f"c{CHAIN - 1}"}))["status"] == "completed"


async def test_deleting_a_large_subtree_still_finds_dependents_in_other_trees(client: Client) -> None:
    """More ids than one query chunk (500): the dependents of the subtree are found by one scan."""
    tasks = [{"id": "r", "name": "r"}, {"id": "a", "name": "a", "parent_id": "r"},
             {"id": "b", "name": "b", "parent_id": "r", "dependencies": [{"id": "a", "required": True}]}]
    tasks += [{"id": f"f{i}", "name": "f", "parent_id": "r"} for i in range(600)]
    await client.result("tasks.create", {"tasks": tasks})
    clone = await client.result("tasks.clone", {"task_id": "r"})  # pending: deletable
    ids = {node["name"]: node["id"] for node in clone["children"] if node["name"] in ("a", "b")}
    outside = await client.result("tasks.copy", {"task_id": ids["b"]})  # depends on the clone's `a`
    assert outside["original_task_id"] == ids["b"]
    error = await client.error("tasks.delete", {"task_id": clone["id"]})
    assert f"1 tasks depend on this task: [{outside['id']}]" in error["data"]
    await client.result("tasks.update", {"task_id": outside["id"], "dependencies": []})
    assert (await client.result("tasks.delete", {"task_id": clone["id"]}))["deleted_count"] == 603
