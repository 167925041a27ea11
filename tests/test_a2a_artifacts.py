"""What every A2A client keeps (issue 27, item 1), on the 0.3 and 1.0 wires and on HTTP+JSON.

A complete artifact is one chunk and says so (`lastChunk: true`): clients that assemble chunks
(Google ADK's RemoteA2aAgent) drop an artifact whose last chunk never came. Status messages name
their agent task. Whole numbers are integers in what we send (`task_count: 3`, not `3.0`), while
progress values stay fractions.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.conftest import Client
from tests.test_a2a_wire import send_body, tree


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def v1_body(method: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": {
        "role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"data": {"tasks": tree()}}]}}}


async def test_0_3_stream_sends_the_outcome_as_the_last_chunk_with_integers(client: Client) -> None:
    response = await client.http.post("/", json=send_body(tree(), method="message/stream"))
    events = [e["result"] for e in sse(response.text)]
    task_id = events[0]["id"]
    (artifact,) = [e for e in events if e["kind"] == "artifact-update"]
    assert artifact["lastChunk"] is True and artifact["artifact"]["name"] == "task_results"
    outcome = artifact["artifact"]["parts"][0]["data"]
    assert outcome["task_count"] == 3 and isinstance(outcome["task_count"], int)
    assert all(isinstance(t["progress"], float) for t in outcome["tasks"])
    assert outcome["tasks"][1]["result"]["inputs"]["n"] in (1, 2) and \
        isinstance(outcome["tasks"][1]["result"]["inputs"]["n"], int)
    statuses = [e for e in events if e["kind"] == "status-update"]
    assert statuses[-1]["final"] is True
    for event in statuses:
        message = event["status"]["message"]
        assert message["taskId"] == task_id and message["contextId"] == event["contextId"]
        data = message["parts"][0]["data"]
        assert isinstance(data["task_count"], int) and isinstance(data["progress"], float)
        if "task_progress" in data:
            assert isinstance(data["task_progress"], float)


async def test_1_0_stream_sends_last_chunk_and_complete_status_messages(client: Client) -> None:
    response = await client.http.post("/", json=v1_body("SendStreamingMessage"), headers={"A2A-Version": "1.0"})
    events = [e["result"] for e in sse(response.text)]
    task_id = events[0]["task"]["id"]
    (artifact,) = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert artifact["lastChunk"] is True
    assert artifact["artifact"]["parts"][0]["data"]["task_count"] == 3
    assert isinstance(artifact["artifact"]["parts"][0]["data"]["task_count"], int)
    final = [e["statusUpdate"] for e in events if "statusUpdate" in e][-1]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    assert final["status"]["message"]["taskId"] == task_id
    assert final["status"]["message"]["role"] == "ROLE_AGENT" and final["status"]["message"]["messageId"]


async def test_1_0_blocking_send_answers_integers_on_json_rpc_and_http_json(client: Client) -> None:
    jsonrpc = await client.http.post("/", json=v1_body("SendMessage"), headers={"A2A-Version": "1.0"})
    rest = await client.http.post("/a2a/message:send", json=v1_body("SendMessage")["params"],
                                  headers={"A2A-Version": "1.0"})
    for task in (jsonrpc.json()["result"]["task"], rest.json()["task"]):
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert task["status"]["message"]["taskId"] == task["id"]
        summary = task["status"]["message"]["parts"][0]["data"]
        assert summary["task_count"] == 3 and isinstance(summary["task_count"], int)
        assert summary["progress"] == 1.0 and isinstance(summary["progress"], float)


async def test_http_json_stream_sends_last_chunk_with_integers(client: Client) -> None:
    response = await client.http.post("/a2a/message:stream", json=v1_body("SendMessage")["params"],
                                      headers={"A2A-Version": "1.0"})
    (artifact,) = [e["artifactUpdate"] for e in sse(response.text) if "artifactUpdate" in e]
    assert artifact["lastChunk"] is True
    assert isinstance(artifact["artifact"]["parts"][0]["data"]["task_count"], int)
