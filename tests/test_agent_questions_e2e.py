"""Questions that cross the hop, between two real `taskgrove serve` processes (issue 45, item 4).

The local tree's a2a_agent_executor sends the remote one a refund tree whose approval is a
human_input_executor. The remote task waits for input; the local task does not fail: it waits
(`waiting.kind = agent_input`, the remote prompt and schema, the agent), holds no slot, and
`tasks.respond` on it answers the remote task; both trees complete. The same after a kill -9 of the
local service while it waits; a cancel of the local task cancels the remote tree; a second
question of the remote agent is a second wait.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deadlines import EVENT_WAIT
from tests.processes import Service

pytestmark = pytest.mark.xdist_group("test_agent_questions_e2e")

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("remote")
    service = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}"}, "remote").start()
    try:
        yield service
    finally:
        service.stop()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def refund_tree(questions: int = 1) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """root (aggregate) <- approve (human input) [<- confirm (human input, a second question)]."""
    ids = {"root": _id("refund"), "approve": _id("approve"), "confirm": _id("confirm")}
    tasks = [
        {"id": ids["root"], "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": ids["confirm" if questions > 1 else "approve"], "required": True}]},
        {"id": ids["approve"], "name": "approve", "parent_id": ids["root"],
         "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Approve the refund?", "schema": APPROVAL}},
    ]
    if questions > 1:
        tasks.append({"id": ids["confirm"], "name": "confirm", "parent_id": ids["root"],
                      "schemas": {"method": "human_input_executor"}, "inputs": {"prompt": "Which account?"},
                      "dependencies": [{"id": ids["approve"], "required": True}]})
    return tasks, ids


def ask_task(task_id: str, agent_url: str, tasks: list[dict[str, Any]], **inputs: Any) -> dict[str, Any]:
    return {"id": task_id, "name": "ask the remote agent", "schemas": {"method": "a2a_agent_executor"},
            "inputs": {"agent_url": agent_url, "data": {"tasks": tasks}, "poll_interval": 0.1, **inputs}}


def start_local(tmp: Path) -> Service:
    return Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'local.db'}",
                         "SERVICE_CREATE_WAIT_TIMEOUT": "0"}, "local").start()


async def waiting_of(service: Service, task_id: str, timeout: float = EVENT_WAIT, prompt: str | None = None) -> dict[str, Any]:
    """The task's wait, once it waits (for `prompt`, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        task = await service.task(task_id)
        assert task is not None
        wait = task.get("waiting")
        if wait and (prompt is None or prompt in (wait.get("prompt") or "")):
            return task
        assert task["status"] in ("pending", "in_progress"), task
        assert time.monotonic() < deadline, f"{task_id} never waited: {task}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("streaming", [True, False])
async def test_the_local_task_waits_and_its_answer_completes_both_trees(
        remote: Service, tmp_path: Path, streaming: bool) -> None:
    local = start_local(tmp_path)
    tasks, ids = refund_tree()
    ask = _id("ask")
    try:
        await local.rpc("tasks.create", [ask_task(ask, remote.url, tasks, streaming=streaming)])
        task = await waiting_of(local, ask)
        wait = task["waiting"]
        assert task["status"] == "in_progress"
        assert wait["kind"] == "agent_input"
        assert "Approve the refund?" in wait["prompt"]
        assert wait["schema"] == APPROVAL
        assert wait["agent"]["url"] == remote.url and wait["agent"]["name"]
        assert wait["agent"]["remote_context_id"] == ids["root"]
        assert (await remote.task(ids["approve"]))["waiting"]["kind"] == "input"
        # The schema is the remote's: a wrong answer is refused here, before it travels.
        refused = await local.call("tasks.respond", {"task_id": ask, "value": {"approved": "yes"}})
        assert refused["error"]["code"] == -32602
        answered = await local.rpc("tasks.respond", {"task_id": ask, "value": {"approved": True}})
        assert answered["status"] == "resumed"
        done = await local.wait_status(ask, ("completed", "failed"))
        assert done["status"] == "completed", done["error"]
        assert done["result"]["state"] == "completed"
        assert (await remote.task(ids["approve"]))["result"] == {"approved": True}
        assert (await remote.task(ids["root"]))["status"] == "completed"
    finally:
        local.stop()


async def test_kill_9_while_it_waits_then_the_answer_still_reaches_the_remote(remote: Service, tmp_path: Path) -> None:
    local = start_local(tmp_path)
    tasks, ids = refund_tree()
    ask = _id("ask")
    try:
        await local.rpc("tasks.create", [ask_task(ask, remote.url, tasks)])
        await waiting_of(local, ask)
        local.kill()
        local.start()
        task = await waiting_of(local, ask)  # still waiting, stored
        assert task["waiting"]["kind"] == "agent_input"
        await local.rpc("tasks.respond", {"task_id": ask, "value": {"approved": True}})
        done = await local.wait_status(ask, ("completed", "failed"))
        assert done["status"] == "completed", done["error"]
        assert (await remote.task(ids["approve"]))["result"] == {"approved": True}
        assert (await remote.task(ids["root"]))["status"] == "completed"
    finally:
        local.stop()


async def test_a_second_question_is_a_second_wait(remote: Service, tmp_path: Path) -> None:
    local = start_local(tmp_path)
    tasks, ids = refund_tree(questions=2)
    ask = _id("ask")
    try:
        await local.rpc("tasks.create", [ask_task(ask, remote.url, tasks)])
        await waiting_of(local, ask, prompt="Approve the refund?")
        await local.rpc("tasks.respond", {"task_id": ask, "value": {"approved": True}})
        second = await waiting_of(local, ask, prompt="Which account?")
        assert second["waiting"]["schema"] is None
        await local.rpc("tasks.respond", {"task_id": ask, "value": "DE89 3704"})
        done = await local.wait_status(ask, ("completed", "failed"))
        assert done["status"] == "completed", done["error"]
        assert done["attempt"] == 1  # one attempt, resumed twice: no retry used up
        assert (await remote.task(ids["confirm"]))["result"] == "DE89 3704"
        assert (await remote.task(ids["approve"]))["result"] == {"approved": True}
    finally:
        local.stop()


async def test_cancel_or_timeout_of_the_waiting_task_cancels_the_remote_task(remote: Service, tmp_path: Path) -> None:
    local = start_local(tmp_path)
    tasks, ids = refund_tree()
    timed, timed_ids = refund_tree()
    ask, late = _id("ask"), _id("late")
    try:
        await local.rpc("tasks.create", [ask_task(ask, remote.url, tasks)])
        await waiting_of(local, ask)
        await local.rpc("tasks.cancel", {"task_ids": [ask]})
        await remote.wait_status(ids["approve"], ("cancelled",))
        # The question's own deadline: the local task fails, the remote one is cancelled.
        await local.rpc("tasks.create", [ask_task(late, remote.url, timed, answer_timeout_seconds=1)])
        failed = await local.wait_status(late, ("failed", "completed"))
        assert failed["status"] == "failed" and "No answer within 1 s" in failed["error"]
        await remote.wait_status(timed_ids["approve"], ("cancelled",))
    finally:
        local.stop()


async def test_an_a2a_caller_gets_the_remote_question_as_our_input_required_and_its_answer_completes(
        remote: Service, tmp_path: Path) -> None:
    """Three agents in a chain: an a2a-sdk client drives taskgrove over A2A; taskgrove's tree asks
    the remote taskgrove, whose task asks for input. The caller sees our own input-required naming
    the remote agent, answers on its agent task, and gets the completed result."""
    from a2a.helpers.proto_helpers import new_data_part
    from a2a.types.a2a_pb2 import TaskState
    from tests.test_a2a_client import a2a_client, send_request
    from tests.test_a2a_input_required import follow_up, send, wait_data

    local = start_local(tmp_path)
    tasks, ids = refund_tree()
    ask = _id("ask")
    try:
        async with a2a_client(local.url, streaming=False) as client:
            asked = await send(client, send_request([ask_task(ask, remote.url, tasks)]))
            assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            shown = wait_data(asked)
            assert shown["task_id"] == ask
            assert shown["agent"]["url"] == remote.url
            assert shown["agent"]["remote_context_id"] == ids["root"]
            assert shown["schema"] == APPROVAL
            assert shown["text"].startswith(f"The agent {shown['agent']['name']} asks: ")
            assert "Approve the refund?" in shown["text"]
            done = await send(client, follow_up(asked, new_data_part({"value": {"approved": True}})))
        assert done.status.state == TaskState.TASK_STATE_COMPLETED, done.status
        assert (await local.task(ask))["status"] == "completed"
        assert (await remote.task(ids["approve"]))["result"] == {"approved": True}
    finally:
        local.stop()
