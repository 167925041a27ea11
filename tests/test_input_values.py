"""One gate for JSON values (issue 18, item 1): non-finite numbers and lone surrogates are refused
on every way in, with the field named, and nothing is stored; a bad value that is in the
database anyway (written by hand) never fails a read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from tests.conftest import Client

NOT_FINITE = "is not a finite number"
NOT_UNICODE = "is not valid Unicode text"


async def post(client: Client, body: bytes, path: str = "/tasks") -> dict[str, Any]:
    response = await client.http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return response.json()


def create_body(task_json: str) -> bytes:
    return ('{"jsonrpc": "2.0", "id": 1, "method": "tasks.create", "params": {"tasks": [' + task_json + "]}}").encode()


async def stored_ids(client: Client) -> set[str]:
    return {t["id"] for t in await client.result("tasks.list", {"limit": 1000})}


@pytest.mark.parametrize("task_json, path, phrase, code", [
    ('{"id": "p", "name": "p", "inputs": {"v": 1e400}}', "params.tasks[0].inputs.v", NOT_FINITE, -32602),
    ('{"id": "p", "name": "p", "inputs": {"v": [1, -1E999]}}', "params.tasks[0].inputs.v[1]", NOT_FINITE, -32602),
    ('{"id": "p", "name": "p", "custom": -1e400}', "params.tasks[0].custom", NOT_FINITE, -32602),
    ('{"id": "p", "name": "p", "result": {"r": 1e309}}', "params.tasks[0].result.r", NOT_FINITE, -32602),
    # A lone surrogate escape names no character: the JSON text is at fault (-32700), the place named.
    ('{"id": "p", "name": "\\ud800"}', "body is not valid JSON: params.tasks[0].name", NOT_UNICODE, -32700),
    ('{"id": "p", "name": "p", "inputs": {"k\\udfff": 1}}', "body is not valid JSON: params.tasks[0].inputs",
     NOT_UNICODE, -32700),
])
async def test_create_refuses_bad_values_naming_the_field_and_stores_nothing(client: Client, task_json: str,
                                                                             path: str, phrase: str,
                                                                             code: int) -> None:
    answer = await post(client, create_body(task_json))
    assert answer["id"] == (1 if code == -32602 else None) and answer["error"]["code"] == code
    assert answer["error"]["data"].startswith(path) and phrase in answer["error"]["data"]
    assert await stored_ids(client) == set()


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity"])
async def test_nan_tokens_are_a_parse_error(client: Client, token: bytes) -> None:
    answer = await post(client, create_body('{"id": "p", "name": "p", "inputs": {"v": ' + token.decode() + "}}"))
    assert answer["error"]["code"] == -32700 and answer["id"] is None
    assert f"{token.decode()} is not a JSON value" in answer["error"]["data"]
    assert await stored_ids(client) == set()


async def test_update_and_clone_refuse_bad_values(client: Client) -> None:
    await client.result("tasks.create", {"tasks": [{"id": "p", "name": "p"}]})
    before = await client.result("tasks.get", {"task_id": "p"})
    for params in ({"task_id": "p", "result": {"x": 1e400}}, {"task_id": "p", "progress": 10**400},
                   {"task_id": "p", "inputs": {"v": float("-inf")}}):
        body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tasks.update", "params": params}).encode()
        answer = await post(client, body.replace(b"-Infinity", b"-1e999").replace(b"Infinity", b"1e999"))
        assert answer["error"]["code"] == -32602, answer
    # progress 10**400 is a finite integer: refused by the progress rule, not by a crash
    answer = await client.error("tasks.update", {"task_id": "p", "progress": 10**400})
    assert "progress must be a number from 0.0 to 1.0" in answer["data"]
    assert await client.result("tasks.get", {"task_id": "p"}) == before
    for reset in ({"inputs": {"v": 1e400}}, [[1]], [{}], ["status", 5]):
        body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tasks.clone",
                           "params": {"task_id": "p", "reset_fields": reset}}).encode()
        answer = await post(client, body.replace(b"Infinity", b"1e999"))
        assert answer["error"]["code"] == -32602, answer
        assert "reset_fields" in answer["error"]["data"]
    assert await stored_ids(client) == {"p"}


async def test_ids_that_are_not_unicode_are_refused(client: Client) -> None:
    for method, key in (("tasks.get", "task_id"), ("tasks.tree", "task_id"), ("tasks.delete", "task_id"),
                        ("tasks.children", "parent_id"), ("tasks.copy", "task_id")):
        body = ('{"jsonrpc": "2.0", "id": 1, "method": "' + method + '", "params": {"' + key + '": "\\ud800"}}')
        answer = await post(client, body.encode())
        assert answer["error"]["code"] == -32700 and f"params.{key} {NOT_UNICODE}" in answer["error"]["data"], answer


# --- a bad value that is stored anyway ---------------------------------------------------------

# Values both backends store (PostgreSQL's json type takes overflowing numbers, lone surrogate
# escapes and deep nesting), then what only SQLite stores (text that is not JSON at all, NaN).
BAD_STORED = {
    "inputs": '{"v": [1, -1e999]}',
    "result": '{"x": 1e999}',
    "params": '["\\ud800"]',
    "extra": "[" * 3000 + "]" * 3000,
    "schemas": '{"k": "\\udfff"}',
}
SQLITE_ONLY = {"inputs": '{"v": NaN}', "schemas": "{not json"}


async def store_bad_row(client: Client, task_id: str, backend: str) -> None:
    """What no request can do: write values that cannot be read back, with raw SQL."""
    values = {**BAD_STORED, **(SQLITE_ONLY if backend == "sqlite" else {})}
    async with client.services.repo.engine.begin() as conn:
        for column, value in values.items():
            await conn.execute(text(f"UPDATE tasks SET {column} = :v WHERE id = :id"), {"v": value, "id": task_id})
        await conn.execute(text("UPDATE tasks SET progress = :p, timeout_seconds = :p, retry = :r WHERE id = :id"),
                           {"p": float("inf"), "r": '{"max_attempts": 1e999}', "id": task_id})


async def test_reads_never_fail_on_a_bad_stored_row(client: Client, backend: str) -> None:
    await client.result("tasks.create", {"tasks": [{"id": "root", "name": "root"},
                                                   {"id": "bad", "name": "bad", "parent_id": "root"}]})
    await client.result("tasks.create", {"tasks": [{"id": "other", "name": "other", "inputs": {"ok": 1}}]})
    await client.wait_status("bad", ("completed",))
    await store_bad_row(client, "bad", backend)

    task = await client.result("tasks.get", {"task_id": "bad"})
    assert task["name"] == "bad"
    assert set(task["unreadable_fields"]) == {"inputs", "result", "params", "extra", "schemas", "progress",
                                              "timeout_seconds", "retry"}
    assert all(reason.startswith("cannot be read back") for reason in task["unreadable_fields"].values())
    assert task["inputs"] is None and task["result"] is None and task["progress"] is None
    listed = {t["id"]: t for t in await client.result("tasks.list")}
    assert set(listed) == {"root", "bad", "other"} and listed["other"]["inputs"] == {"ok": 1}
    assert "unreadable_fields" not in listed["other"]
    tree = await client.result("tasks.tree", {"task_id": "bad"})
    assert tree["id"] == "root" and tree["children"][0]["unreadable_fields"]["inputs"]
    children = await client.result("tasks.children", {"parent_id": "root"})
    assert children[0]["id"] == "bad"
    status = await client.result("tasks.running.status", {"task_ids": ["bad"]})
    assert status[0]["task_id"] == "bad"
    # the row can still be repaired through the API
    fixed = await client.result("tasks.update", {"task_id": "bad", "inputs": {"v": 1}, "progress": 0.5})
    assert fixed["inputs"] == {"v": 1} and fixed["progress"] == 0.5


async def test_a_nul_inside_a_json_value_is_stored_and_read_back(client: Client) -> None:
    """JSON allows "\\u0000" in a string, and every backend stores it inside a JSON value: given in
    the inputs of a new tree (the insert) and echoed in the executor's result (the engine's
    pass). PostgreSQL's text columns cannot hold NUL, so the JSON columns must not pass through
    text on the way in (this answered -32603 on PostgreSQL before)."""
    inputs = {"k": "a\u0000b", "nested": ["\u0000", {"\u0000key": 1}]}
    tree = await client.result("tasks.create", [{"id": "nul", "name": "nul", "inputs": inputs,
                                                 "schemas": {"method": "noop_executor"}}])
    assert tree["status"] == "completed", tree
    assert tree["inputs"] == inputs and tree["result"]["inputs"] == inputs
    again = await client.result("tasks.get", {"task_id": "nul"})
    assert again["inputs"] == inputs and again["result"]["inputs"] == inputs


async def test_an_error_naming_a_nul_is_stored_with_the_nul_replaced(client: Client) -> None:
    """An executor's error may quote input that holds NUL (here the path of the input that failed
    validation). The failure is stored on every backend, its NUL shown as U+FFFD, rather than
    "the outcome could not be stored" on PostgreSQL."""
    schemas = {"method": "noop_executor",
               "input_schema": {"type": "object", "properties": {"a\u0000b": {"type": "integer"}}}}
    await client.result("tasks.create", [{"id": "bad", "name": "bad", "inputs": {"a\u0000b": "x"},
                                          "schemas": schemas}])
    task = await client.wait_status("bad", ("failed",))
    assert task["error"] == "Input validation failed at 'a\ufffdb': 'x' is not of type 'integer'", task
