"""JSON-RPC and A2A protocol rules on POST `/`, per wire version (issue 20 and the A2A items of 18).

Raw HTTP against the ASGI app: ids, batches, non-finite numbers, malformed params (-32602 in our
words, never a pydantic or protobuf dump), result null on delete, push-config get without its id,
content types (415, -32600), messages to a finished task (-32004), ListTasks with an unknown status.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.conftest import Client
from tests.test_a2a_wire import send_body, tree

V1 = {"A2A-Version": "1.0"}
DUMP_MARKERS = ("pydantic", "validation error", "Traceback", "Failed to parse", "codec", "surrogates",
                "Fail to serialize", "object is not")


def assert_our_words(error: dict[str, Any]) -> None:
    text = json.dumps(error)
    for marker in DUMP_MARKERS:
        assert marker not in text, f"library text {marker!r} in {text}"


async def raw(client: Client, body: Any, headers: dict[str, str] | None = None) -> Any:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    response = await client.http.post("/", content=content,
                                      headers={"Content-Type": "application/json", **(headers or {})})
    assert response.status_code == 200, response.text
    return response.json()


def v1_send(tasks: list[dict[str, Any]], **configuration: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"message": {"role": "ROLE_USER", "messageId": uuid.uuid4().hex,
                                          "parts": [{"data": {"tasks": tasks}}]}}
    if configuration:
        params["configuration"] = configuration
    return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": params}


# --- envelope ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad_id", ["1e400", "-1E999", "true", "[1]", "{}"])
async def test_invalid_ids_get_invalid_request_with_id_null(client: Client, bad_id: str) -> None:
    for method in ("message/send", "tasks/get", "GetTask", "tasks.get"):
        body = f'{{"jsonrpc": "2.0", "id": {bad_id}, "method": "{method}", "params": {{"id": "x"}}}}'
        answer = await raw(client, body)
        assert answer["id"] is None, answer
        assert answer["error"]["code"] == -32600, answer


async def test_nan_id_is_a_parse_error(client: Client) -> None:
    answer = await raw(client, '{"jsonrpc": "2.0", "id": NaN, "method": "tasks/get", "params": {"id": "x"}}')
    assert answer["id"] is None and answer["error"]["code"] == -32700
    assert_our_words(answer["error"])


async def test_fractional_id_is_echoed_by_sdk_methods(client: Client) -> None:
    answer = await raw(client, {"jsonrpc": "2.0", "id": 1.5, "method": "tasks/get", "params": {"id": "missing"}})
    assert answer["id"] == 1.5 and answer["error"]["code"] == -32001
    answer = await raw(client, {"jsonrpc": "2.0", "id": 2.5, "method": "GetTask", "params": {"id": "missing"}}, V1)
    assert answer["id"] == 2.5 and answer["error"]["code"] == -32001


async def test_non_finite_numbers_and_surrogates_in_params_are_refused_clearly(client: Client) -> None:
    tasks = [{"id": f"r-{uuid.uuid4().hex[:6]}", "name": "r", "schemas": {"method": "noop_executor"},
              "inputs": {"v": 1}}]
    body = json.dumps(send_body(tasks)).replace('{"v": 1}', '{"v": 1e400}')
    answer = await raw(client, body)
    assert answer["error"]["code"] == -32602 and answer["id"] == "req-1"
    assert "params.message.parts[0].data.tasks[0].inputs.v" in answer["error"]["message"]
    assert await client.result("tasks.get", {"task_id": tasks[0]["id"]}) is None

    v1 = json.dumps(v1_send(tasks)).replace('{"v": 1}', '{"v": 1e400}')
    answer = await raw(client, v1, V1)
    assert answer["error"]["code"] == -32602 and answer["id"] == 7
    assert_our_words(answer["error"])

    for bad in ('{"v": NaN}', '{"v": "\\ud800"}'):
        answer = await raw(client, json.dumps(send_body(tasks)).replace('{"v": 1}', bad))
        assert answer["error"]["code"] == -32700 and answer["id"] is None
        assert_our_words(answer["error"])
    assert await client.result("tasks.get", {"task_id": tasks[0]["id"]}) is None


async def test_a_body_that_is_not_json_content_is_415_content_type_not_supported_in_the_wire_form(
        client: Client) -> None:
    """An A2A call (or an unreadable body) declared as anything but JSON: HTTP 415 and the A2A
    code for it, ContentTypeNotSupportedError -32005 (the A2A TCK, JSONRPC-SSE-002), naming the type."""
    for body, id_ in ((b"{'jsonrpc': '2.0'}", None), (json.dumps(v1_send(tree())).encode(), 7)):
        response = await client.http.post("/", content=body, headers={"Content-Type": "text/plain", **V1})
        assert response.status_code == 415
        answer = response.json()
        assert answer["id"] == id_ and answer["error"]["code"] == -32005
        assert "application/json" in answer["error"]["message"]
        assert answer["error"]["data"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"  # the 1.0 form (ErrorInfo)


# --- batches -----------------------------------------------------------------------------------

async def test_every_method_of_the_surface_works_inside_a_batch(client: Client) -> None:
    tasks = tree()
    batch = [
        send_body(tasks) | {"id": "send"},
        {"jsonrpc": "2.0", "id": "ours", "method": "tasks.get", "params": {"task_id": tasks[0]["id"]}},
        {"jsonrpc": "2.0", "id": "v1", "method": "GetTask", "params": {"id": "nope"}},
        {"jsonrpc": "2.0", "id": "INF", "method": "tasks/get", "params": {"id": "x"}},
        {"jsonrpc": "2.0", "id": "unknown", "method": "no/such", "params": {}},
    ]
    body = json.dumps(batch).replace('"id": "INF"', '"id": 1e400')
    response = await client.http.post("/", content=body, headers={"Content-Type": "application/json"})
    answers = response.json()
    assert [a["id"] for a in answers] == ["send", "ours", "v1", None, "unknown"]
    assert answers[0]["result"]["kind"] == "task"
    assert answers[0]["result"]["context_id"] == tasks[0]["id"]
    assert answers[1]["result"]["id"] == tasks[0]["id"]
    # GetTask without A2A-Version: 1.0 is refused by version (the 1.0 wire needs the header)
    assert answers[2]["error"]["code"] in (-32001, -32009)
    assert answers[3]["error"]["code"] == -32600
    assert answers[4]["error"]["code"] == -32601

    task_id = answers[0]["result"]["id"]
    again = await raw(client, [{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task_id}}])
    assert again[0]["result"]["id"] == task_id


# --- params --------------------------------------------------------------------------------------

async def test_malformed_params_on_the_03_wire_are_invalid_params_in_our_words(client: Client) -> None:
    for params in ({"message": {"kind": "message"}}, {"invalid": "structure"},
                   {"message": {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": "x"}]}}):
        answer = await raw(client, {"jsonrpc": "2.0", "id": "m", "method": "message/send", "params": params})
        error = answer["error"]
        assert error["code"] == -32602, answer
        assert_our_words(error)
        assert "params.message" in error["message"]
    answer = await raw(client, {"jsonrpc": "2.0", "id": "m", "method": "message/send",
                                "params": {"message": {"kind": "message", "role": "user", "parts": []}}})
    assert "params.message.messageId is required" in answer["error"]["message"]


async def test_malformed_params_on_the_10_wire_are_invalid_params_in_our_words(client: Client) -> None:
    answer = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                "params": {"message": {"parts": "x"}}}, V1)
    assert answer["error"]["code"] == -32602
    assert "params.message.parts" in answer["error"]["message"]
    assert_our_words(answer["error"])
    answer = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                "params": {"message": {"role": "BAD", "messageId": "m", "parts": []}}}, V1)
    assert answer["error"]["code"] == -32602 and "ROLE_USER" in answer["error"]["message"]


async def test_list_tasks_with_an_unknown_status_is_invalid_params(client: Client) -> None:
    answer = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"status": "NOPE"}}, V1)
    assert answer["error"]["code"] == -32602 and "TASK_STATE_COMPLETED" in answer["error"]["message"]
    answer = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "ListTasks",
                                "params": {"status": "TASK_STATE_COMPLETED"}}, V1)
    assert "tasks" in answer["result"]


async def test_unsupported_parts_are_content_type_not_supported(client: Client) -> None:
    tasks = tree()
    for extra in ({"kind": "file", "file": {"uri": "https://example.com/a.txt", "mimeType": "text/plain"}},
                  {"kind": "text", "text": "and also this"}):
        body = send_body(tasks)
        body["params"]["message"]["parts"].append(extra)
        error = (await raw(client, body))["error"]
        assert error["code"] == -32005, error
        assert "parts[1]" in error["message"] and 'data part {"tasks": [task objects]}' in error["message"]
    assert await client.result("tasks.get", {"task_id": tasks[0]["id"]}) is None
    v1 = v1_send(tasks)
    v1["params"]["message"]["parts"] = [{"url": "https://example.com/a.pdf", "mediaType": "application/pdf"}]
    error = (await raw(client, v1, V1))["error"]
    assert error["code"] == -32005 and "application/pdf" in error["message"]


async def test_a_message_to_a_finished_task_is_unsupported_operation(client: Client) -> None:
    done = (await raw(client, send_body(tree())))["result"]
    assert done["status"]["state"] == "completed"
    follow = send_body(tree())
    follow["params"]["message"]["taskId"] = done["id"]
    error = (await raw(client, follow))["error"]
    assert error["code"] == -32004, error
    v1 = v1_send(tree())
    v1["params"]["message"]["taskId"] = done["id"]
    error = (await raw(client, v1, V1))["error"]
    assert error["code"] == -32004, error


# --- push configs on the 0.3 wire ----------------------------------------------------------------

async def test_push_config_delete_answers_result_null_and_get_works_without_config_id(client: Client) -> None:
    task = (await raw(client, send_body(tree())))["result"]
    config = {"url": "https://example.com/hook", "id": "cfg-1"}
    set_answer = await raw(client, {"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/set",
                                    "params": {"taskId": task["id"], "pushNotificationConfig": config}})
    assert set_answer["result"]["pushNotificationConfig"]["id"] == "cfg-1", set_answer
    got = await raw(client, {"jsonrpc": "2.0", "id": 2, "method": "tasks/pushNotificationConfig/get",
                             "params": {"id": task["id"]}})
    assert got["result"]["pushNotificationConfig"]["url"] == "https://example.com/hook", got
    deleted = await raw(client, {"jsonrpc": "2.0", "id": 3, "method": "tasks/pushNotificationConfig/delete",
                                 "params": {"id": task["id"], "pushNotificationConfigId": "cfg-1"}})
    assert "result" in deleted and deleted["result"] is None and "error" not in deleted, deleted
    missing = await raw(client, {"jsonrpc": "2.0", "id": 4, "method": "tasks/pushNotificationConfig/get",
                                 "params": {"id": task["id"]}})
    assert missing["error"]["code"] == -32602 and "no push notification config" in missing["error"]["message"]


async def test_invalid_ids_are_not_echoed_on_the_push_config_error_path(client: Client) -> None:
    for bad in ("true", "[1]"):
        body = ('{"jsonrpc": "2.0", "id": ' + bad + ', "method": "tasks/pushNotificationConfig/set", '
                '"params": {"taskId": "t", "pushNotificationConfig": {"url": "ftp://x", "method": "DELETE"}}}')
        answer = await raw(client, body)
        assert answer["id"] is None and answer["error"]["code"] == -32600


# --- blocking with a push config ------------------------------------------------------------------

async def test_explicit_blocking_waits_for_the_end_even_with_a_push_config(client: Client) -> None:
    from tests.servers import receiver

    async with receiver() as rec:
        push = {"url": f"{rec.url}/hook"}
        answer = (await raw(client, send_body(tree(seconds=0.3), configuration={
            "blocking": True, "pushNotificationConfig": push})))["result"]
        assert answer["status"]["state"] == "completed"
        (artifact,) = answer["artifacts"]
        outcome = artifact["parts"][0]["data"]
        assert outcome["status"] == "completed" and outcome["root_task_id"] == answer["context_id"]
        assert "result" in outcome and len(outcome["tasks"]) == 3

        # SPEC.md's rule stays when the request does not say to wait
        answer = (await raw(client, send_body(tree(seconds=0.3), configuration={"pushNotificationConfig": push})))
        assert answer["result"]["status"]["state"] == "working"

        v1 = v1_send(tree(seconds=0.3), returnImmediately=False,
                     taskPushNotificationConfig={"url": f"{rec.url}/hook"})
        answer = (await raw(client, v1, V1))["result"]["task"]
        assert answer["status"]["state"] == "TASK_STATE_COMPLETED"
        v1 = v1_send(tree(seconds=0.3), taskPushNotificationConfig={"url": f"{rec.url}/hook"})
        answer = (await raw(client, v1, V1))["result"]["task"]
        assert answer["status"]["state"] == "TASK_STATE_WORKING"


# --- the agent card --------------------------------------------------------------------------------

async def test_card_has_cache_headers_and_answers_conditional_gets(client: Client) -> None:
    first = await client.http.get("/.well-known/agent-card.json")
    assert first.status_code == 200
    assert "max-age=" in first.headers["cache-control"]
    etag = first.headers["etag"]
    assert etag and first.headers["last-modified"] and "A2A-Version" in first.headers["vary"]
    again = await client.http.get("/.well-known/agent-card.json", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    other = await client.http.get("/.well-known/agent-card.json", headers={"If-None-Match": '"stale"'})
    assert other.status_code == 200 and other.json() == first.json()


async def test_card_forms_for_10_and_03_clients(client: Client) -> None:
    from a2a.client.card_resolver import parse_agent_card
    from a2a.compat.v0_3.types import AgentCard as AgentCard03
    from a2a.types.a2a_pb2 import AgentCard

    v10 = await client.http.get("/.well-known/agent-card.json", headers=V1)
    card = v10.json()
    # nothing outside the 1.0 AgentCard message (the 1.0 card schema allows no other field)
    assert set(card) <= {f.json_name for f in AgentCard.DESCRIPTOR.fields}, set(card)
    assert {"name", "description", "version", "supportedInterfaces", "capabilities", "skills"} <= set(card)
    assert parse_agent_card(dict(card)).supported_interfaces[0].protocol_version == "1.0"

    default = (await client.http.get("/.well-known/agent-card.json")).json()
    legacy = (await client.http.get("/.well-known/agent.json")).json()
    assert default == legacy
    # a 0.3 client finds its url, protocol version and transport
    parsed = AgentCard03.model_validate(default)
    assert parsed.url and parsed.protocol_version.startswith("0.3") and parsed.preferred_transport == "JSONRPC"
    # and a 1.0 client reads the same document as a 1.0 card
    assert {i.protocol_version for i in parse_agent_card(dict(default)).supported_interfaces} == {"1.0", "0.3"}
    v10_etag = v10.headers["etag"]
    assert v10_etag != (await client.http.get("/.well-known/agent-card.json")).headers["etag"]


async def test_parse_errors_are_said_in_our_words(client: Client) -> None:
    for body in (b'\xff\xfe{"jsonrpc": "2.0"}', b'{"jsonrpc": "2.0", "id": 1, "method": ', b'[Infinity]'):
        response = await client.http.post("/", content=body, headers={"Content-Type": "application/json"})
        answer = response.json()
        assert answer["error"]["code"] == -32700 and answer["id"] is None
        assert_our_words(answer["error"])
    answer = (await client.http.post("/", content=b'{"jsonrpc": "2.0", "id": 1, "method": ',
                                     headers={"Content-Type": "application/json"})).json()
    assert "at line 1 column 39" in answer["error"]["data"]


@pytest.mark.parametrize("body, code, words", [
    (b'\xff\xfe{"jsonrpc": "2.0"}', -32700, "body is not valid JSON: it is not UTF-8 text (bad byte at offset 0)"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": ', -32700, "a value is missing or not JSON at line 1 column 39"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": NaN}}', -32700,
     "body is not valid JSON: NaN is not a JSON value (write numbers as finite decimals, or send a string)"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": "\\ud800"}}', -32700,
     "body is not valid JSON: params.task_id is not valid Unicode text"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": "x", "v": [1e400]}}', -32602,
     "params.v[0] is not a finite number (NaN, Infinity and numbers beyond about 1.8e308 cannot be stored)"),
])
async def test_root_and_tasks_word_each_mistake_alike(client: Client, body: bytes, code: int, words: str) -> None:
    """One gate for JSON values (storage.jsonvalues): `/` says what `/tasks` says."""
    said = []
    for path in ("/", "/tasks"):
        response = await client.http.post(path, content=body, headers={"Content-Type": "application/json"})
        error = response.json()["error"]
        assert error["code"] == code, (path, error)
        said.append(error["data"] if code == -32700 else error["message"])
    assert said[0] == said[1] and words in said[0], said


async def test_an_a2a_notification_is_executed_and_not_answered(client: Client) -> None:
    tasks = tree()
    body = send_body(tasks)
    del body["id"]
    response = await client.http.post("/", json=body)
    assert response.status_code == 204 and response.content == b""
    assert (await client.wait_status(tasks[0]["id"], ("completed",)))["status"] == "completed"


async def test_nesting_and_version_mismatches_are_clear_errors(client: Client) -> None:
    def send_nested(levels: int) -> str:
        deep = "[" * levels + "]" * levels
        return ('{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"kind": "message", '
                '"role": "user", "messageId": "m", "parts": [{"kind": "data", "data": {"v": ' + deep + '}}]}}}')

    # Within the body limit (SERVICE_MAX_JSON_DEPTH, 100) but past what a protobuf Struct takes.
    answer = await raw(client, send_nested(92))
    assert answer["error"]["code"] == -32602 and "deeper than" in answer["error"]["message"]
    # Past the body limit: refused before any surface parses it (issue 11, item 7: -32700).
    for body in (send_nested(200), "[" * 50_000 + "]" * 50_000):
        answer = await raw(client, body)
        assert answer["error"]["code"] == -32700 and answer["id"] is None
        assert "nested deeper than 100 levels" in answer["error"]["data"]
    answer = await raw(client, {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": "x"}}, V1)
    assert answer["error"]["code"] == -32009 and "use GetTask" in answer["error"]["message"]


async def test_an_unusable_llm_key_header_never_echoes_a_bad_id(client: Client) -> None:
    headers = {"Content-Type": "application/json", "X-LLM-API-KEY": "openai:"}
    for body, expected_id in (('{"jsonrpc": "2.0", "id": 1e400, "method": "message/send", "params": {}}', None),
                              ('{"jsonrpc": "2.0", "id": NaN, "method": "tasks/get"}', None),
                              ('{"jsonrpc": "2.0", "id": 5, "method": "tasks/get"}', 5)):
        response = await client.http.post("/", content=body, headers=headers)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["id"] == expected_id and answer["error"]["code"] == -32602
    response = await client.http.post("/", content='[{"jsonrpc": "2.0", "id": 1e400, "method": "tasks.get"}]',
                                      headers=headers)
    assert response.json()[0]["id"] is None


async def test_a_null_id_is_a_valid_id_on_both_wires(client: Client) -> None:
    answer = await raw(client, {"jsonrpc": "2.0", "id": None, "method": "tasks/get", "params": {"id": "nope"}})
    assert answer["id"] is None and answer["error"]["code"] == -32001  # not -32600
    answer = await raw(client, {"jsonrpc": "2.0", "id": None, "method": "ListTasks", "params": None}, V1)
    assert answer["id"] is None and "tasks" in answer["result"]


async def test_with_jwt_on_the_card_declares_the_bearer_scheme(app_factory: Any) -> None:
    from a2a.client.card_resolver import parse_agent_card
    from a2a.compat.v0_3.types import AgentCard as AgentCard03

    async with app_factory(env={"SERVICE_JWT_SECRET": "a2a-test-secret-of-at-least-32-bytes!"}) as client:
        response = await client.http.get("/.well-known/agent-card.json")  # public, no token
        v10 = (await client.http.get("/.well-known/agent-card.json", headers=V1)).json()
    assert response.status_code == 200
    card = response.json()
    parsed = parse_agent_card(dict(v10))
    assert parsed.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(parsed.security_requirements[0].schemes) == ["bearer"]
    legacy = AgentCard03.model_validate(card)
    assert legacy.security_schemes is not None and "bearer" in legacy.security_schemes
    async with app_factory() as client:
        plain = (await client.http.get("/.well-known/agent-card.json", headers=V1)).json()
    assert "securitySchemes" not in plain


@pytest.mark.parametrize(("method", "params", "where"), [
    ("tasks/get", {"id": "a\u0000b"}, "params.id"),
    ("GetTask", {"id": "\u0000"}, "params.id"),
    ("tasks/cancel", {"id": "\u0000"}, "params.id"),
    ("CancelTask", {"id": "\u0000"}, "params.id"),
    ("ListTasks", {"contextId": "\u0000"}, "params.contextId"),
    ("tasks/pushNotificationConfig/list", {"id": "\u0000"}, "params.id"),
    ("message/send", {"message": {"kind": "message", "role": "user", "messageId": "m", "taskId": "\u0000",
                                  "parts": [{"kind": "text", "text": "hi"}]}}, "params.message.taskId"),
    ("SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m", "contextId": "\u0000",
                                 "parts": [{"text": "hi"}]}}, "params.message.contextId"),
    ("tasks/get", {"id": "x", "historyLength": 2**31}, "params.historyLength"),
    ("message/send", {"message": {"kind": "message", "role": "user", "messageId": "m",
                                  "parts": [{"kind": "text", "text": "hi"}]},
                      "configuration": {"historyLength": 10**40}}, "params.configuration.historyLength"),
])
async def test_ids_with_nul_and_numbers_past_int32_are_invalid_params_naming_the_field(
        client: Client, method: str, params: dict[str, Any], where: str) -> None:
    """Both answered -32603 before (PostgreSQL refused the NUL; the 0.3 adapter the int32 overflow)."""
    headers = V1 if method[:1].isupper() else {}
    answer = await raw(client, {"jsonrpc": "2.0", "id": 5, "method": method, "params": params}, headers)
    assert answer["id"] == 5 and answer["error"]["code"] == -32602, answer
    assert answer["error"]["message"].startswith(f"{method}: {where} "), answer


async def test_our_cancel_refuses_a_nul_task_id(client: Client) -> None:
    for body in ({"params": {"task_id": "\u0000"}}, {"metadata": {"task_id": "x\u0000"}}):
        answer = await raw(client, {"jsonrpc": "2.0", "id": 6, "method": "cancel", **body})
        assert answer["error"] == {"code": -32602, "message": "task_id must not contain NUL characters",
                                   "data": "task_id must not contain NUL characters"}, answer


async def test_rest_bodies_pass_the_same_gate(client: Client) -> None:
    """The A2A REST routes parse and check bodies with storage.jsonvalues too: 400 in its words."""
    def message(data: str) -> str:
        return '{"message": {"role": "ROLE_USER", "messageId": "m", "parts": [{"data": {"v": ' + data + '}}]}}'

    for data, words in (("NaN", "body is not valid JSON: NaN is not a JSON value"),
                        ("[1e400]", "body.message.parts[0].data.v[0] is not a finite number"),
                        ("[" * 90 + "]" * 90, "is nested deeper than 90 levels")):
        response = await client.http.post("/a2a/message:send", content=message(data),
                                          headers={"Content-Type": "application/json", **V1})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT" and words in error["message"], error
