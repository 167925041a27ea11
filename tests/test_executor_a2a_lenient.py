"""a2a_agent_executor against agents that bend the A2A wire (issue 27, item 2).

A small fake A2A agent (Starlette on a loopback port) answers in the shapes seen in the wild:
pydantic-ai's fasta2a answers a send with `submitted` and stamps statuses without a UTC offset;
agents add fields and use states or roles this SDK does not know. The executor must follow such a
task to its end and return the remote answer; an agent that sends what cannot be read (a
timestamp that is no time, a status that is no object) fails the task with a message naming the
field, not a parser's text. Both wires: 1.0 JSON-RPC (ProtoJSON, parsed by protobuf) and 0.3
(parsed by the SDK's pydantic models).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import hypothesis.strategies as st
from hypothesis import given
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from taskgrove.executors.a2a_lenient import normalize, utc_timestamp
from tests.servers import serve

NAIVE = "2026-11-24T18:35:08.229795"  # fasta2a's datetime.now().isoformat()
ANSWER = "the report is ready"


class FakeAgent:
    """One remote agent; `wire` is "1.0" or "0.3"; `script` lists the task states tasks/get
    reports in turn (the last one repeats); `broken` replaces the final status with garbage."""

    def __init__(self, wire: str, script: list[str], *, streaming: bool = False,
                 broken: dict[str, Any] | None = None) -> None:
        self.wire, self.script, self.streaming, self.broken = wire, script, streaming, broken
        self.url = ""
        self.methods: list[str] = []
        self._gets = 0

    def card(self) -> dict[str, Any]:
        base = {"name": "fake", "description": "bends the wire", "version": "1.0.0",
                "capabilities": {"streaming": self.streaming, "somethingNew": True},
                "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
                "skills": [{"id": "s", "name": "s", "description": "s", "tags": ["t"]}], "vendorExtra": {"a": 1}}
        if self.wire == "1.0":
            return {**base, "supportedInterfaces": [
                {"protocolBinding": "JSONRPC", "url": self.url, "protocolVersion": "1.0"}]}
        return {**base, "url": self.url, "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC"}

    def task(self, state: str) -> dict[str, Any]:
        """The task in `state` (a 1.0 name without prefix, e.g. COMPLETED) in this wire's form."""
        done = state == "COMPLETED"
        if self.wire == "1.0":
            status: dict[str, Any] = {"state": f"TASK_STATE_{state}", "timestamp": NAIVE}
            task: dict[str, Any] = {"id": "remote-1", "contextId": "ctx-1", "status": status, "kind": "task",
                                    "surprise": {"nested": [1, 2]}}
            if done:
                status["message"] = {"messageId": "m2", "role": "ROLE_AGENT", "parts": [{"text": ANSWER}]}
                task["artifacts"] = [{"artifactId": "a1", "name": "answer", "parts": [{"text": ANSWER}]}]
        else:
            status = {"state": state.lower().replace("_", "-"), "timestamp": NAIVE}
            task = {"kind": "task", "id": "remote-1", "contextId": "ctx-1", "status": status, "surprise": 1}
            if done:
                status["message"] = {"kind": "message", "messageId": "m2", "role": "robot",
                                     "parts": [{"kind": "text", "text": ANSWER}]}
                task["artifacts"] = [{"artifactId": "a1", "name": "answer",
                                      "parts": [{"kind": "text", "text": ANSWER}]}]
        if done and self.broken is not None:
            task["status"] = self.broken
        return task

    def answer(self, method: str) -> dict[str, Any]:
        if method in ("SendMessage", "message/send", "SendStreamingMessage", "message/stream"):
            task = self.task("SUBMITTED")
        else:
            task = self.task(self.script[min(self._gets, len(self.script) - 1)])
            self._gets += 1
        return {"task": task} if method in ("SendMessage", "SendStreamingMessage") else task

    async def rpc(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.methods.append(body["method"])
        result = self.answer(body["method"])
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        if body["method"] in ("SendStreamingMessage", "message/stream"):
            # The stream carries the submitted task and ends: the client must follow the task.
            async def events() -> AsyncIterator[bytes]:
                yield f"data: {json.dumps(reply)}\r\n\r\n".encode()
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(reply)

    async def card_endpoint(self, request: Request) -> Response:
        return JSONResponse(self.card())

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/.well-known/agent-card.json", self.card_endpoint),
                                 Route("/", self.rpc, methods=["POST"])])


@asynccontextmanager
async def running(agent: FakeAgent) -> AsyncIterator[FakeAgent]:
    async with serve(agent.app()) as url:
        agent.url = url + "/"
        yield agent


async def delegate(app_factory: Any, agent: FakeAgent, **inputs: Any) -> dict[str, Any]:
    task = {"id": f"ask-{uuid.uuid4().hex[:8]}", "name": "ask", "schemas": {"method": "a2a_agent_executor"},
            "inputs": {"agent_url": agent.url, "message": "write the report", "poll_interval": 0.05,
                       "timeout": 30, **inputs}}
    async with app_factory() as client:
        return await client.result("tasks.create", [task])


async def test_fasta2a_shapes_on_1_0_are_followed_to_the_answer(app_factory: Any) -> None:
    """Submitted first, naive timestamps, an unknown state and extra fields, then completed."""
    async with running(FakeAgent("1.0", ["SUBMITTED", "PAUSED_FOR_COFFEE", "WORKING", "COMPLETED"])) as agent:
        done = await delegate(app_factory, agent)
    assert done["status"] == "completed", done.get("error")
    result = done["result"]
    assert result["state"] == "completed" and result["message"] == ANSWER
    assert result["artifacts"][0]["parts"] == [{"kind": "text", "text": ANSWER}]
    assert agent.methods[0] == "SendMessage" and agent.methods.count("GetTask") >= 4


async def test_a_stream_that_ends_at_submitted_is_followed_by_polling(app_factory: Any) -> None:
    async with running(FakeAgent("1.0", ["WORKING", "COMPLETED"], streaming=True)) as agent:
        done = await delegate(app_factory, agent)
    assert done["status"] == "completed", done.get("error")
    assert done["result"]["message"] == ANSWER
    assert agent.methods[0] == "SendStreamingMessage" and "GetTask" in agent.methods


async def test_0_3_unknown_state_and_role_and_naive_timestamps_are_tolerated(app_factory: Any) -> None:
    async with running(FakeAgent("0.3", ["SUBMITTED", "PAUSED", "COMPLETED"])) as agent:
        done = await delegate(app_factory, agent)
    assert done["status"] == "completed", done.get("error")
    assert done["result"]["message"] == ANSWER
    assert agent.methods[0] == "message/send" and "tasks/get" in agent.methods


async def test_a_timestamp_that_is_no_time_fails_the_task_naming_the_field(app_factory: Any) -> None:
    broken = {"state": "TASK_STATE_COMPLETED", "timestamp": "yesterday at noon"}
    async with running(FakeAgent("1.0", ["COMPLETED"], broken=broken)) as agent:
        done = await delegate(app_factory, agent)
    assert done["status"] == "failed"
    assert done["error"].startswith(f"the A2A agent at {agent.url} broke the protocol: status.timestamp: "), \
        done["error"]
    assert "Failed to parse" not in done["error"] and "Traceback" not in done["error"]


async def test_a_status_that_is_no_object_fails_the_task_naming_the_field(app_factory: Any) -> None:
    async with running(FakeAgent("0.3", ["COMPLETED"], broken="done")) as agent:  # type: ignore[arg-type]
        done = await delegate(app_factory, agent)
    assert done["status"] == "failed"
    assert done["error"].startswith(f"the A2A agent at {agent.url} broke the protocol: status: "), done["error"]


# --- normalize, on any JSON ---------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["state", "role", "timestamp", "status", "data", "parts", "x"]), children, max_size=4),
    max_leaves=20)


@given(json_values)
def test_normalize_keeps_the_shape_and_is_idempotent(value: Any) -> None:
    once = normalize(value)
    assert normalize(once) == once
    assert type(once) is type(value)
    if isinstance(value, dict):
        assert once.keys() == value.keys()
        for key in ("data", "metadata"):  # the agent's own content passes untouched
            if key in value:
                assert once[key] == value[key]


def test_utc_timestamp_reads_a_naive_time_as_utc_and_leaves_the_rest() -> None:
    assert utc_timestamp(NAIVE) == NAIVE + "Z"
    assert utc_timestamp("2026-11-24T18:35:08+02:00") == "2026-11-24T18:35:08+02:00"
    assert utc_timestamp("2026-11-24T18:35:08Z") == "2026-11-24T18:35:08Z"
    assert utc_timestamp("yesterday") == "yesterday"
