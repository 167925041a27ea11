"""Plain-language A2A requests: the official a2a-sdk client on both wires against a real server whose
LLM is the local fake (tests/fakellm.py): text -> plan -> run, and plan-only -> a stored tree parked
on its approval gate (a wait for input) -> approve / refine / replace. Without an LLM, text is refused with -32005 and the card offers JSON only.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict

from tests.deadlines import HEAVY_WORK_TIMEOUT
from tests.test_a2a_client import a2a_client, agent_server, collect
from tests.test_a2a_wire import tree

TREE_MARKER = "[[tree:valid]]"  # the fake LLM answers this with a valid three-task tree


def llm_env(fake: Any) -> dict[str, str]:
    return {"SERVICE_LLM_BASE_URL": fake.base_url, "SERVICE_LLM_MAX_RETRIES": "0"}


def text_request(text: str, *, task_id: str | None = None, metadata: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None) -> SendMessageRequest:
    part = Part(text=text) if data is None else Part()
    if data is not None:
        part.data.struct_value.update(data)
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[part])
    if task_id:
        message.task_id = task_id
    if metadata:
        message.metadata.update(metadata)
    return SendMessageRequest(message=message)


def artifacts(task: Any) -> dict[str, Any]:
    return {a.name: MessageToDict(a.parts[0].data) for a in task.artifacts}


async def zero_three_card(url: str) -> Any:
    async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
    legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(legacy)
    return card


async def test_a_text_request_is_planned_run_and_answered_with_its_artifacts(make_settings: Any, fake_llm: Any) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, _app):
        for card in (None, await zero_three_card(url)):  # 1.0 wire, then 0.3 through the compat client
            async with a2a_client(url, streaming=False, card=card) as client:
                (response,) = await collect(client, text_request(f"Summarise topics A and B {TREE_MARKER}"))
            task = response.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
            found = artifacts(task)
            assert [t["name"] for t in found["plan"]["tasks"]] == \
                ["aggregate_results_executor", "llm_executor", "llm_executor"]
            outcome = found["task_results"]
            assert outcome["status"] == "completed" and outcome["root_task_id"] == task.context_id
            assert {t["status"] for t in outcome["tasks"]} == {"completed"}
            assert outcome["result"] is not None
    generation = [r for r in fake_llm.requests if TREE_MARKER in str(r["messages"])]
    assert len(generation) == 2


@pytest.mark.parametrize("wire", ["1.0", "0.3"])
async def test_plan_only_then_refine_then_approve(make_settings: Any, fake_llm: Any, wire: str) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, app):
        card = await zero_three_card(url) if wire == "0.3" else None
        async with a2a_client(url, streaming=False, card=card) as client:
            (first,) = await collect(client, text_request(f"Plan the summaries {TREE_MARKER}",
                                                          metadata={"plan_only": True}))
            waiting = first.task
            assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            shown = MessageToDict(waiting.status.message.parts[0].data)
            root = waiting.context_id
            gate = f"{root}-approval"
            assert shown["task_id"] == gate and shown["prompt"].endswith("Run this plan?")
            assert "approve" in shown["next"] and "Plan the summaries" in shown["requirement"]
            planned = shown["plan"]["tasks"]
            assert len(planned) == 4 and planned[0]["id"] == root and planned[-1]["id"] == gate
            # the plan awaiting approval is a stored tree, parked on its gate: nothing else ran
            repo = app.state.services.repo
            rows = {r["id"]: r for r in await repo.tree(root)}
            assert rows[gate]["status"] == "in_progress" and rows[gate]["waiting"] is not None
            assert {r["status"] for i, r in rows.items() if i != gate} == {"pending"}

            (refined,) = await collect(client, text_request(f"also in French {TREE_MARKER}", task_id=waiting.id))
            assert refined.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            again = MessageToDict(refined.task.status.message.parts[0].data)
            assert "also in French" in again["requirement"] and again["plan"]["tasks"][0]["id"] == root
            assert "also in French" in again["prompt"] and again["task_id"] == gate
            assert not (set(rows) - {root, gate}) & {r["id"] for r in await repo.tree(root)}, \
                "the first plan's tasks are deleted"

            (done,) = await collect(client, text_request("approve", task_id=waiting.id))
        task = done.task
        assert task.id == waiting.id and task.status.state == TaskState.TASK_STATE_COMPLETED
        assert artifacts(task)["task_results"]["root_task_id"] == root
        assert (await repo.get(root))["status"] == "completed"
        assert (await repo.get(gate))["result"] == "approve"
        assert len(task.history) >= 3  # the request, the refinement and the approval


async def test_plan_only_then_replace_with_a_tree_on_the_03_wire(make_settings: Any, fake_llm: Any) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, _app):
        card = await zero_three_card(url)
        async with a2a_client(url, streaming=False, card=card) as client:
            (first,) = await collect(client, text_request(f"Plan it {TREE_MARKER}", metadata={"skill": "plan"}))
            assert first.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            root = first.task.context_id
            own = tree()
            (done,) = await collect(client, text_request("", task_id=first.task.id, data={"tasks": own}))
            assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
            outcome = artifacts(done.task)["task_results"]
            # the own tree takes the plan's place: its root gets the plan's root id (the context)
            assert outcome["root_task_id"] == root and done.task.context_id == root
            assert {t["id"] for t in outcome["tasks"]} == {root} | {t["id"] for t in own[1:]}
            assert {t["name"] for t in outcome["tasks"]} == {t["name"] for t in own}
            # the task is finished: another message is an unsupported operation (-32004)
            try:
                await collect(client, text_request("approve", task_id=first.task.id))
            except Exception as exc:  # the client raises the JSON-RPC error
                assert "-32004" in repr(exc) or "terminal" in str(exc) or "takes no further" in str(exc), exc
            else:
                raise AssertionError("a message to a finished task must be refused")


async def test_a_plan_the_llm_gets_wrong_is_invalid_params_and_nothing_runs(make_settings: Any,
                                                                             fake_llm: Any) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": "m1",
            "parts": [{"kind": "text", "text": "two roots please [[tree:invalid]]"}]}}}
        error = (await http.post(url + "/", json=body)).json()["error"]
    assert error["code"] == -32602 and "multiple root tasks" in error["message"]


async def test_without_an_llm_text_is_refused_and_the_card_says_json_only(make_settings: Any) -> None:
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        card = (await http.get(url + "/.well-known/agent-card.json")).json()
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hello"}]}}}
        error = (await http.post(url + "/", json=body)).json()["error"]
    assert card["defaultInputModes"] == ["application/json"]
    assert [s["id"] for s in card["skills"]] == ["tasks.execute"]
    assert error["code"] == -32005
    assert "application/json" in error["message"] and "LLM" in error["message"]


async def test_with_an_llm_the_card_offers_text_and_the_plan_skill(make_settings: Any, fake_llm: Any) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        card = (await http.get(url + "/.well-known/agent-card.json")).json()
    assert "text/plain" in card["defaultInputModes"]
    assert {s["id"] for s in card["skills"]} == {"tasks.execute", "plan"}


async def test_data_beside_text_reaches_the_planner_and_text_beside_a_tree_is_refused(make_settings: Any,
                                                                                     fake_llm: Any) -> None:
    async with agent_server(make_settings(env=llm_env(fake_llm))) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        parts = [{"kind": "text", "text": f"merge these {TREE_MARKER}"}, {"kind": "data", "data": {"region": "eu"}}]
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": "m1", "parts": parts}}}
        done = (await http.post(url + "/", json=body)).json()["result"]
        assert done["status"]["state"] == "completed"
        prompt = json.dumps(fake_llm.requests[0]["messages"])
        assert "region" in prompt and "eu" in prompt

        parts = [{"kind": "data", "data": {"tasks": tree()}}, {"kind": "text", "text": "and this"}]
        body["params"]["message"] = {"kind": "message", "role": "user", "messageId": "m2", "parts": parts}
        error = (await http.post(url + "/", json=body)).json()["error"]
    assert error["code"] == -32005 and "send one or the other" in error["message"]


async def test_only_the_owner_can_answer_a_plan(app_factory: Any, fake_llm: Any) -> None:
    from taskgrove.agent.foundations.auth import mint_token
    from tests.test_a2a_wire import SECRET

    async with app_factory(env={**llm_env(fake_llm), "SERVICE_JWT_SECRET": SECRET}) as client:
        settings = client.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}

        def send(text: str, task_id: str | None = None, **metadata: Any) -> dict[str, Any]:
            message: dict[str, Any] = {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                                       "parts": [{"kind": "text", "text": text}]}
            if task_id:
                message["taskId"] = task_id
            params: dict[str, Any] = {"message": message}
            if metadata:
                params["metadata"] = metadata
            return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": params}

        waiting = (await client.http.post("/", json=send(f"plan {TREE_MARKER}", plan_only=True),
                                          headers=alice)).json()["result"]
        assert waiting["status"]["state"] == "input-required"
        refused = (await client.http.post("/", json=send("approve", waiting["id"]), headers=bob)).json()
        assert refused["error"]["code"] == -32001
        done = (await client.http.post("/", json=send("approve", waiting["id"]), headers=alice)).json()["result"]
        assert done["status"]["state"] == "completed"
        root = done["context_id"]
        assert (await client.result("tasks.get", {"task_id": root}, headers=alice))["user_id"] == "alice"


async def test_no_decision_or_a_failed_refinement_leaves_the_plan_waiting(app_factory: Any, fake_llm: Any) -> None:
    async with app_factory(env=llm_env(fake_llm)) as client:
        def send(part: dict[str, Any], task_id: str | None = None, **metadata: Any) -> dict[str, Any]:
            message: dict[str, Any] = {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                                       "parts": [part]}
            if task_id:
                message["taskId"] = task_id
            return {"jsonrpc": "2.0", "id": 1, "method": "message/send",
                    "params": {"message": message, **({"metadata": metadata} if metadata else {})}}

        waiting = (await client.http.post("/", json=send({"kind": "text", "text": f"plan {TREE_MARKER}"},
                                                         plan_only=True))).json()["result"]
        root = waiting["contextId"]
        # the stored plan is listed like any tree, its gate waiting
        listed = {t["id"]: t for t in await client.result("tasks.list", {})}
        assert listed[root]["status"] == "pending" and listed[f"{root}-approval"]["status"] == "in_progress"

        # a message that decides nothing: still input-required, saying why (no error, nothing changed)
        again = (await client.http.post("/", json=send({"kind": "data", "data": {"maybe": 1}},
                                                       waiting["id"]))).json()["result"]
        assert again["status"]["state"] == "input-required"
        assert "waiting for a decision" in again["status"]["message"]["parts"][0]["data"]["problem"]

        # a refinement the LLM cannot plan: -32602, and the shown plan stays stored and waiting
        error = (await client.http.post("/", json=send({"kind": "text", "text": "two roots [[tree:invalid]]"},
                                                       waiting["id"]))).json()["error"]
        assert error["code"] == -32602
        rows = {r["id"]: r for r in await client.services.repo.tree(root)}
        assert set(rows) == set(listed) and rows[f"{root}-approval"]["status"] == "in_progress"

        # approving through the gate's value works as any answer to a wait does
        done = (await client.http.post("/", json=send({"kind": "data", "data": {"value": "approve"}},
                                                      waiting["id"]))).json()["result"]
        assert done["status"]["state"] == "completed"
