"""The JSON-RPC 2.0 envelope of POST /tasks and /system (SPEC.md, Endpoints and Errors).

Every failure is an HTTP 200 with a JSON-RPC error object; bad envelopes never reach a method
and never change the database.
"""

from __future__ import annotations

import json
from typing import Any

import pytest


async def post(client: Any, body: Any, path: str = "/tasks") -> Any:
    """POST raw bytes (or JSON-encoded data); the HTTP status must be 200; the decoded body."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def rpc(method: str, params: Any = None, id_: Any = 1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id_, **extra}
    if params is not None:
        body["params"] = params
    return body


async def count(client: Any) -> int:
    return len(await client.result("tasks.list", {"limit": 1000}))


# --- ids, versions, methods -------------------------------------------------------------------

@pytest.mark.parametrize("id_", ["abc", "", 7, 0, -3, 2.5, 12345678901234])
async def test_id_is_echoed_with_its_type(client, id_):
    answer = await post(client, rpc("tasks.list", {}, id_))
    assert answer == {"jsonrpc": "2.0", "id": id_, "result": []}
    assert type(answer["id"]) is type(id_)


async def test_id_is_echoed_on_errors_too(client):
    answer = await post(client, rpc("tasks.get", {}, "req-9"))
    assert answer["id"] == "req-9" and answer["error"]["code"] == -32602


async def test_null_id_is_echoed_as_null(client):
    assert await post(client, rpc("tasks.list", {}, None)) == {"jsonrpc": "2.0", "id": None, "result": []}


@pytest.mark.parametrize("id_", [True, {"a": 1}, [1]])
async def test_id_of_another_type_is_an_invalid_request(client, id_):
    answer = await post(client, rpc("tasks.list", {}, id_))
    assert answer["id"] is None
    assert answer["error"] == {"code": -32600, "message": "Invalid Request",
                               "data": "id must be a string, a finite number or null"}


@pytest.mark.parametrize("version", ["1.0", "2", 2.0, None, "2.0 "])
async def test_jsonrpc_must_be_exactly_2_0(client, version):
    body = {"jsonrpc": version, "method": "tasks.create", "params": {"name": "x"}, "id": 5}
    answer = await post(client, body)
    assert answer == {"jsonrpc": "2.0", "id": 5, "error": {
        "code": -32600, "message": "Invalid Request", "data": 'jsonrpc must be exactly "2.0"'}}
    assert await count(client) == 0


async def test_missing_jsonrpc_member_is_an_invalid_request(client):
    answer = await post(client, {"method": "tasks.list", "id": 1})
    assert answer["error"]["code"] == -32600


@pytest.mark.parametrize("method", [None, 5, "", ["tasks.list"]])
async def test_method_must_be_a_non_empty_string(client, method):
    body = {"jsonrpc": "2.0", "id": 1}
    if method is not None:
        body["method"] = method
    answer = await post(client, body)
    assert answer["error"] == {"code": -32600, "message": "Invalid Request", "data": "method must be a non-empty string"}


@pytest.mark.parametrize("method", ["tasks.nope", "tasks", "system.health", "TASKS.LIST"])
async def test_unknown_method_is_32601_with_data_naming_it(client, method):
    answer = await post(client, rpc(method, {}, 3))
    assert answer == {"jsonrpc": "2.0", "id": 3, "error": {
        "code": -32601, "message": "Method not found", "data": f"Method '{method}' not found"}}


async def test_unknown_method_on_system_endpoint(client):
    answer = await post(client, rpc("system.nope", {}, 4), path="/system")
    assert answer["error"] == {"code": -32601, "message": "Method not found", "data": "Method 'system.nope' not found"}


# --- bodies and params --------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b"{bad json", b"", b"   ", b'{"jsonrpc": "2.0", "method": "tasks.list", "id": 1',
    b"\xff\xfe\x00", b"{'jsonrpc': '2.0'}",
])
async def test_unparsable_body_is_32700(client, body):
    answer = await post(client, body)
    assert answer["id"] is None
    assert answer["error"]["code"] == -32700 and answer["error"]["message"] == "Parse error"
    assert answer["error"]["data"].startswith("body is not valid JSON: ")


async def test_oversized_body_is_refused_unread(client):
    body = b'{"jsonrpc": "2.0", "method": "tasks.create", "id": 1, "params": {"name": "' \
        + b"x" * (16 * 1024 * 1024) + b'"}}'
    response = await client.http.post("/tasks", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == -32600
    assert response.json()["error"]["data"].startswith("request body larger than 16777216 bytes")
    assert await count(client) == 0


@pytest.mark.parametrize("path", ["/tasks", "/system", "/"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "",
                                          "multipart/form-data; boundary=x", "application/xml"])
async def test_a_body_declared_as_something_else_than_json_is_415_naming_application_json(
        client, path, content_type):
    create = rpc("tasks.create", {"id": "t", "name": "t"}, "call-7")
    # Our methods: -32600. On `/` a body that cannot be read may be an A2A call: there the A2A code,
    # ContentTypeNotSupportedError (-32005), as the A2A TCK wants (JSONRPC-SSE-002).
    unreadable = -32005 if path == "/" else -32600
    for body, ids, code in ((json.dumps(create), ["call-7"], -32600),
                            (json.dumps([create, rpc("tasks.list", {}, 8)]), ["call-7", 8], -32600),
                            ("name=t&id=t", [None], unreadable)):
        response = await client.http.post(path, content=body.encode(), headers={"Content-Type": content_type})
        assert response.status_code == 415, response.text
        answer = response.json()
        answers = answer if isinstance(answer, list) else [answer]
        assert [a["id"] for a in answers] == ids  # echoed whenever the body parses
        for error in (a["error"] for a in answers):
            assert error["code"] == code and "application/json" in error["message"], error
            assert (content_type.split(";")[0] or "(empty)") in error["message"]
    assert await count(client) == 0


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "application/json-rpc", "application/vnd.taskgrove+json"])
async def test_json_content_types_and_a_missing_header_are_accepted(client, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/tasks", "/"):
        response = await client.http.post(path, content=json.dumps(rpc("tasks.list", {}, 3)).encode(), headers=headers)
        assert response.status_code == 200 and response.json()["result"] == [], response.text


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity"])
async def test_non_json_numbers_are_refused_and_nothing_is_stored(client, value):
    body = b'{"jsonrpc": "2.0", "method": "tasks.create", "id": 1, "params": {"name": "n", "inputs": {"x": ' \
        + value + b"}}}"
    answer = await post(client, body)
    assert answer["error"]["code"] == -32700
    assert answer["error"]["data"].startswith(f"body is not valid JSON: {value.decode()} is not a JSON value")
    assert await count(client) == 0  # and later reads still answer


async def test_lone_surrogate_escape_is_refused_naming_the_field_and_nothing_is_stored(client):
    for field, path in ((b'"name": "\\ud800"', "params.name"),
                        (b'"name": "n", "inputs": {"k": "a\\udc00b"}', "params.inputs.k")):
        body = b'{"jsonrpc": "2.0", "method": "tasks.create", "id": 1, "params": {' + field + b"}}"
        answer = await post(client, body)
        assert answer["id"] is None and answer["error"]["code"] == -32700
        assert answer["error"]["data"] == \
            f"body is not valid JSON: {path} is not valid Unicode text (it holds a lone surrogate such as \\ud800)"
    assert await count(client) == 0
    # a proper surrogate pair is fine
    body = b'{"jsonrpc": "2.0", "method": "tasks.create", "id": 1, "params": {"name": "\\ud83d\\ude00"}}'
    answer = await post(client, body)
    assert answer["result"]["name"] == "\U0001F600"


@pytest.mark.parametrize("body", [b'"tasks.list"', b"5", b"null", b"true"])
async def test_non_object_request_is_32600(client, body):
    answer = await post(client, body)
    assert answer == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": "Invalid Request", "data": "request must be a JSON object"}}


@pytest.mark.parametrize("params", ["x", 5, True])
async def test_params_of_a_bad_type_is_32600(client, params):
    answer = await post(client, rpc("tasks.create", params, 8))
    assert answer == {"jsonrpc": "2.0", "id": 8, "error": {
        "code": -32600, "message": "Invalid Request", "data": "params must be an object or an array"}}
    assert await count(client) == 0


@pytest.mark.parametrize("method", ["tasks.get", "tasks.detail", "tasks.update", "tasks.delete", "tasks.copy",
                                    "tasks.clone", "tasks.list", "tasks.children", "tasks.tree"])
async def test_array_params_where_an_object_is_needed_is_32602(client, method):
    answer = await post(client, rpc(method, ["some-id"], 2))
    assert answer["error"] == {"code": -32602, "message": "params must be an object", "data": "params must be an object"}


async def test_params_null_or_omitted_mean_no_params(client):
    assert (await post(client, rpc("tasks.list", None, 1)))["result"] == []
    body = {"jsonrpc": "2.0", "method": "tasks.list", "params": None, "id": 1}
    assert (await post(client, body))["result"] == []


async def test_errors_are_http_200(client):
    for body in (b"{", b"[]", b"7", json.dumps(rpc("tasks.nope")).encode(), json.dumps(rpc("tasks.get", {})).encode()):
        response = await client.http.post("/tasks", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        assert "error" in response.json() or "error" in response.json()[0]


# --- batches ------------------------------------------------------------------------------------

async def test_batch_is_answered_as_an_array_in_order(client):
    answer = await post(client, [
        rpc("tasks.create", {"id": "r", "name": "r"}, "a"),
        rpc("tasks.get", {"task_id": "r"}, "b"),
        rpc("tasks.nope", {}, "c"),
        {"jsonrpc": "1.0", "method": "tasks.list", "id": "d"},
        5,
        rpc("tasks.get", {"task_id": "missing"}, 6),
    ])
    assert isinstance(answer, list) and len(answer) == 6
    assert [a["id"] for a in answer] == ["a", "b", "c", "d", None, 6]
    assert answer[0]["result"]["id"] == "r"
    assert answer[1]["result"]["id"] == "r" and answer[1]["result"]["status"] == "completed"
    assert answer[2]["error"]["code"] == -32601 and answer[2]["error"]["data"] == "Method 'tasks.nope' not found"
    assert answer[3]["error"]["code"] == -32600
    assert answer[4]["error"] == {"code": -32600, "message": "Invalid Request", "data": "request must be a JSON object"}
    assert answer[5] == {"jsonrpc": "2.0", "id": 6, "result": None}


async def test_batch_of_one_is_still_an_array(client):
    answer = await post(client, [rpc("tasks.list", {}, 1)])
    assert answer == [{"jsonrpc": "2.0", "id": 1, "result": []}]


async def test_empty_batch_is_one_invalid_request(client):
    answer = await post(client, b"[]")
    assert answer == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": "Invalid Request", "data": "empty batch"}}


async def test_batch_on_system_endpoint(client):
    answer = await post(client, [rpc("system.health", None, 1), rpc("system.nope", None, 2)], path="/system")
    assert answer[0]["result"]["status"] == "healthy"
    assert answer[1]["error"]["code"] == -32601


# --- internal errors ----------------------------------------------------------------------------

async def test_internal_error_is_32603_without_a_traceback(client, monkeypatch):
    async def broken(**_kw: Any) -> Any:
        raise RuntimeError("connection to db-secret-host:5432 refused")

    monkeypatch.setattr(client.services.repo, "list", broken)
    response = await client.http.post("/tasks", json=rpc("tasks.list", {}, 11))
    assert response.status_code == 200
    assert response.json() == {"jsonrpc": "2.0", "id": 11, "error": {
        "code": -32603, "message": "Internal error", "data": "tasks.list failed on the server; see the service log"}}
    for leak in ("Traceback", "RuntimeError", "db-secret-host", "File \""):
        assert leak not in response.text


async def test_internal_error_inside_a_batch_does_not_spoil_the_others(client, monkeypatch):
    async def broken(*_a: Any, **_kw: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(client.services.repo, "children", broken)
    await client.result("tasks.create", {"id": "r", "name": "r"})
    answer = await post(client, [rpc("tasks.children", {"parent_id": "r"}, 1), rpc("tasks.get", {"id": "r"}, 2)])
    assert answer[0]["error"]["code"] == -32603 and "boom" not in json.dumps(answer)
    assert answer[1]["result"]["id"] == "r"


# --- the result marker --------------------------------------------------------------------------

async def test_responses_carry_jsonrpc_2_0_and_no_extra_members(client):
    ok = await post(client, rpc("tasks.list", {}, 1))
    assert set(ok) == {"jsonrpc", "id", "result"}
    bad = await post(client, rpc("tasks.get", {}, 1))
    assert set(bad) == {"jsonrpc", "id", "error"} and set(bad["error"]) == {"code", "message", "data"}
    assert isinstance(bad["error"]["data"], str)
