"""The A2A 1.0 HTTP+JSON transport (`/a2a/...`), driven by the official a2a-sdk client restricted to
HTTP+JSON, and raw HTTP for the edge rules: authentication, non-finite values, no route swallowed.
"""

from __future__ import annotations

from typing import Any

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import GetTaskRequest, TaskState
from google.protobuf.json_format import MessageToDict

from taskgrove.agent.foundations.auth import mint_token
from tests.test_a2a_client import agent_server, collect, send_request
from tests.test_a2a_wire import SECRET, tree


async def rest_client(url: str, http: httpx.AsyncClient, streaming: bool) -> Any:
    factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http,
                                         supported_protocol_bindings=["HTTP+JSON"]))
    return await factory.create_from_url(url)


async def test_the_official_client_over_http_json(make_settings: Any) -> None:
    tasks = tree(seconds=0.2)
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=30) as http:
        client = await rest_client(url, http, streaming=False)
        (response,) = await collect(client, send_request(tasks))
        task = response.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED and task.context_id == tasks[0]["id"]
        outcome = MessageToDict(task.artifacts[-1].parts[0].data)
        assert outcome["status"] == "completed" and len(outcome["tasks"]) == 3
        again = await client.get_task(GetTaskRequest(id=task.id))
        assert again.status.state == TaskState.TASK_STATE_COMPLETED
        await client.close()

        client = await rest_client(url, http, streaming=True)
        events = await collect(client, send_request(tree(seconds=0.2)))
        await client.close()
    assert events[0].HasField("task")
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_http_json_applies_the_same_auth_and_value_rules(make_settings: Any) -> None:
    async with agent_server(make_settings(env={"SERVICE_JWT_SECRET": SECRET})) as (url, app), \
            httpx.AsyncClient(timeout=30) as http:
        settings = app.state.services.settings
        body = {"message": {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"data": {"tasks": tree()}}]}}
        denied = await http.post(f"{url}/a2a/message:send", json=body, headers={"A2A-Version": "1.0"})
        assert denied.status_code == 401 and denied.json()["error"]["status"] == "UNAUTHENTICATED"

        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}", "A2A-Version": "1.0"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}", "A2A-Version": "1.0"}
        sent = await http.post(f"{url}/a2a/message:send", json=body, headers=alice)
        assert sent.status_code == 200, sent.text
        assert sent.headers["content-type"] == "application/json"  # the binding's media type (11.1)
        task_id = sent.json()["task"]["id"]
        assert (await http.get(f"{url}/a2a/tasks/{task_id}", headers=alice)).status_code == 200
        assert (await http.get(f"{url}/a2a/tasks/{task_id}", headers=bob)).status_code == 404

        text = '{"message": {"role": "ROLE_USER", "messageId": "m-2", "parts": [{"data": {"v": 1e400}}]}}'
        bad = await http.post(f"{url}/a2a/message:send", content=text,
                              headers={**alice, "Content-Type": "application/json"})
        assert bad.status_code == 400
        assert "body.message.parts[0].data.v" in bad.json()["error"]["message"]

        # the SDK's unprefixed /{tenant} mount is not installed: two-segment paths stay ours
        card = await http.get(f"{url}/.well-known/agent-card.json")
        assert card.status_code == 200 and card.json()["name"]


async def test_http_json_refuses_a_body_that_is_not_json_with_415(make_settings: Any) -> None:
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/a2a/message:send", content=b'{"message": {}}',
                                   headers={"Content-Type": "text/plain", "A2A-Version": "1.0"})
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == 415 and error["status"] == "INVALID_ARGUMENT" and "application/json" in error["message"]
    assert error["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"


async def test_a_push_config_sent_over_http_json_gets_10_bodies(make_settings: Any) -> None:
    from tests.servers import receiver

    async with receiver() as rec, agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=30) as http:
        body = {"message": {"role": "ROLE_USER", "messageId": "m-push", "parts": [{"data": {"tasks": tree()}}]},
                "configuration": {"taskPushNotificationConfig": {"url": f"{rec.url}/hook", "token": "t-1"}}}
        sent = await http.post(f"{url}/a2a/message:send", json=body, headers={"A2A-Version": "1.0"})
        assert sent.json()["task"]["status"]["state"] == "TASK_STATE_WORKING"
        await rec.wait_for(lambda reqs: any(
            r["json"].get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED" for r in reqs))
    assert all(r["headers"]["x-a2a-notification-token"] == "t-1" for r in rec.requests)
    assert {next(iter(r["json"])) for r in rec.requests} <= {"task", "statusUpdate", "artifactUpdate"}
    (artifact,) = [r["json"]["artifactUpdate"] for r in rec.requests if "artifactUpdate" in r["json"]]
    assert artifact["lastChunk"] is True
    count = artifact["artifact"]["parts"][0]["data"]["task_count"]
    assert count == 3 and isinstance(count, int)  # whole numbers stay integers in 1.0 bodies too


async def test_http_json_list_with_an_unknown_status_is_refused(make_settings: Any) -> None:
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=30) as http:
        bad = await http.get(f"{url}/a2a/tasks", params={"status": "NOPE"}, headers={"A2A-Version": "1.0"})
        good = await http.get(f"{url}/a2a/tasks", params={"status": "TASK_STATE_COMPLETED"},
                              headers={"A2A-Version": "1.0"})
    assert bad.status_code == 400 and "TASK_STATE_COMPLETED" in bad.json()["error"]["message"]
    assert good.status_code == 200 and "tasks" in good.json()


async def test_http_json_refuses_a_nul_character_in_an_id_naming_where(make_settings: Any) -> None:
    """PostgreSQL's text has no NUL: an id holding one is the client's mistake (400), on either
    backend, not an internal error."""
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=30) as http:
        v1 = {"A2A-Version": "1.0"}
        answers = {
            "path.id": [await http.get(f"{url}/a2a/tasks/a%00b", headers=v1),
                        await http.post(f"{url}/a2a/tasks/%00:cancel", json={}, headers=v1),
                        await http.get(f"{url}/a2a/tasks/%00/pushNotificationConfigs", headers=v1)],
            "query.contextId": [await http.get(f"{url}/a2a/tasks", params={"contextId": "\x00"}, headers=v1)],
            "body.message.taskId": [await http.post(f"{url}/a2a/message:send", headers=v1, json={"message": {
                "role": "ROLE_USER", "messageId": "m", "taskId": "\x00", "parts": [{"data": {"tasks": tree()}}]}})],
        }
    for where, responses in answers.items():
        for response in responses:
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"] == f"{where} must not contain NUL characters"
