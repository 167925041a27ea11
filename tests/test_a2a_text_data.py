"""Text that is really data (issue 27, item 3): without an LLM, a text part whose whole text is a
JSON object with `tasks` is read as the data part; any other text is still -32005 naming what is
accepted, and nothing is stored. LLM-driven agents and text-only frameworks (ADK) send trees so.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Client
from tests.test_a2a_wire import tree

ACCEPTED_AS_TEXT = "or a text part whose whole text is that JSON object"


def text_send(*texts: str, method: str = "message/send") -> dict[str, Any]:
    parts = [{"kind": "text", "text": t} for t in texts]
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": {
        "kind": "message", "role": "user", "messageId": uuid.uuid4().hex, "parts": parts}}}


async def test_a_tree_sent_as_json_text_runs_like_a_data_part(client: Client) -> None:
    tasks = tree()
    answer = (await client.http.post("/", json=text_send(f"\n  {json.dumps({'tasks': tasks})}  \n"))).json()
    task = answer["result"]
    assert task["status"]["state"] == "completed", answer
    assert task["context_id"] == tasks[0]["id"]
    (artifact,) = task["artifacts"]
    assert artifact["parts"][0]["data"]["task_count"] == 3
    stored = await client.result("tasks.get", {"task_id": tasks[1]["id"]})
    assert stored["status"] == "completed" and stored["inputs"] == {"n": 1}


async def test_the_1_0_wire_reads_json_text_too(client: Client) -> None:
    tasks = tree()
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"text": json.dumps({"tasks": tasks})}]}}}
    answer = (await client.http.post("/", json=body, headers={"A2A-Version": "1.0"})).json()
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer


async def test_other_text_is_refused_naming_what_is_accepted(client: Client) -> None:
    for text in ("hello", '{"foo": 1}', '{"tasks": [', "[1, 2]", '{"tasks": [], "x": NaN}',
                 f"```json\n{json.dumps({'tasks': tree()})}\n```"):
        error = (await client.http.post("/", json=text_send(text))).json()["error"]
        assert error["code"] == -32005, (text, error)
        assert 'a data part {"tasks": [task objects]}' in error["message"] and ACCEPTED_AS_TEXT in error["message"]
        assert "LLM" in error["message"]


async def test_a_second_text_beside_the_json_text_is_refused_and_nothing_is_stored(client: Client) -> None:
    tasks = tree()
    error = (await client.http.post("/", json=text_send(json.dumps({"tasks": tasks}), "and hurry"))).json()["error"]
    assert error["code"] == -32005 and error["message"].startswith("message.parts[1] is a text part")
    assert await client.result("tasks.get", {"task_id": tasks[0]["id"]}) is None


async def test_a_bad_tree_or_number_in_json_text_is_invalid_params(client: Client) -> None:
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    cyclic = [{"id": a, "name": "a", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": b}]},
              {"id": b, "name": "b", "parent_id": a, "schemas": {"method": "noop_executor"},
               "dependencies": [{"id": a}]}]
    error = (await client.http.post("/", json=text_send(json.dumps({"tasks": cyclic})))).json()["error"]
    assert error["code"] == -32602 and "ircular" in error["message"], error
    huge = json.dumps({"tasks": tree()}).replace('"n": 1', '"n": 1e400')
    error = (await client.http.post("/", json=text_send(huge))).json()["error"]
    assert error["code"] == -32602 and "message.parts[0].text" in error["message"], error
    assert await client.result("tasks.get", {"task_id": a}) is None


async def test_the_card_says_json_text_is_read_as_data(client: Client) -> None:
    card = (await client.http.get("/.well-known/agent-card.json")).json()
    (skill,) = [s for s in card["skills"] if s["id"] == "tasks.execute"]
    assert "text/plain" in skill["inputModes"]
    assert any(example.startswith("As text:") for example in skill["examples"])
    assert "text part" in skill["description"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=60), st.builds(lambda v: json.dumps({"tasks": v}), st.one_of(
    st.none(), st.integers(), st.text(max_size=10), st.lists(st.dictionaries(st.text(max_size=5), st.integers(),
                                                                                max_size=3), max_size=3)))))
async def test_any_text_gets_a_clear_answer(client: Client, text: str) -> None:
    response = await client.http.post("/", json=text_send(text))
    assert response.status_code == 200
    answer = response.json()
    if "error" in answer:
        assert answer["error"]["code"] in (-32005, -32602), answer
    else:
        assert answer["result"]["kind"] == "task"
