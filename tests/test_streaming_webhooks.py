"""SSE streaming of tasks.execute and webhook callbacks, against real local receivers."""

from __future__ import annotations

import json
from typing import Any

from taskgrove.agent.foundations.requests import NewTree
from tests.conftest import Client
from tests.servers import receiver
from tests.test_engine import FAIL, task


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


async def pending_tree(client: Client, *tasks: dict[str, Any]) -> None:
    """Create a tree that does not run yet: its root waits on a gate that fails at once."""
    await client.result("tasks.create", [
        task("root", deps=["gate"]), task("gate", "root", method=None, **FAIL), *tasks,
    ])
    await client.result("tasks.update", {"task_id": "root", "dependencies": []})


async def test_sse_event_sequence(client: Client) -> None:
    await client.result("tasks.create", [
        task("root", deps=["a"], method="aggregate_results_executor"),
        task("a", "root", method="sleep_executor", inputs={"seconds": 0.05}),
        task("bad", "root", method=None, **FAIL),
    ])
    for tid in ("root", "a"):
        await client.result("tasks.update", {"task_id": tid, "status": "pending"})
    body = {"jsonrpc": "2.0", "id": 7, "method": "tasks.execute", "params": {"task_id": "root", "use_streaming": True}}
    response = await client.http.post("/tasks", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    first = events[0]
    assert first["id"] == 7 and first["result"]["streaming"] is True and first["result"]["status"] == "started"
    kinds = [e["type"] for e in events[1:]]
    assert kinds[-2:] == ["final", "stream_end"]
    assert kinds.count("final") == 1
    by_task: dict[str, list[str]] = {}
    for event in events[1:-2]:
        by_task.setdefault(event["task_id"], []).append(event["type"])
    assert by_task["a"][0] == "task_start" and by_task["a"][-1] == "task_completed"
    assert "progress" in by_task["a"]
    # SPEC.md: the move to in_progress is also a `progress` event, right after `task_start`
    assert by_task["bad"] == ["task_start", "progress", "task_failed"]
    assert by_task["root"] == ["task_start", "progress", "task_completed"]
    final = events[-2]
    assert final["final"] is True and final["status"] == "failed"  # "bad" failed again
    assert final["result"]["root_task_id"] == "root" and final["result"]["task_count"] == 3
    completed = next(e for e in events[1:] if e["type"] == "task_completed" and e["task_id"] == "a")
    assert completed["result"] == {"slept": 0.05}
    assert client.services.bus.subscriber_count == 0, "nothing left behind"


async def test_webhook_delivery_and_payload(client: Client) -> None:
    async with receiver() as rec:
        await pending_tree(client, task("child", "root"))
        answer = await client.result("tasks.execute", {"task_id": "root", "webhook_config": {
            "url": rec.url + "/hook", "headers": {"X-Token": "abc"}, "method": "PUT"}})
        assert answer["streaming"] is True and answer["webhook_url"] == rec.url + "/hook"
        await rec.wait_for(lambda reqs: any(r["json"]["type"] == "final" for r in reqs))
    assert all(r["method"] == "PUT" and r["headers"]["x-token"] == "abc" for r in rec.requests)
    payloads = [r["json"] for r in rec.requests]
    assert payloads[-1]["type"] == "final" and payloads[-1]["final"] is True
    assert {p["type"] for p in payloads} >= {"task_start", "task_completed", "final"}
    for p in payloads:
        assert p["protocol"] == "jsonrpc" and p["root_task_id"] == "root"
        assert set(p["result"]) == {"status", "progress", "root_task_id", "task_count"}
        assert {"task_id", "status", "progress", "message", "timestamp"} <= set(p)


async def test_webhook_retries_5xx_with_backoff_not_4xx(client: Client) -> None:
    async with receiver() as rec:
        rec.script = [500, 503, 404]  # first event: 500, 503 then 404 (given up); later events fine
        await pending_tree(client)
        await client.result("tasks.execute", {"task_id": "root", "webhook_config": {
            "url": rec.url + "/hook", "max_retries": 3}})
        await rec.wait_for(lambda reqs: any(r["json"]["type"] == "final" for r in reqs))
    first_type = rec.requests[0]["json"]["type"]
    attempts = [r for r in rec.requests if r["json"]["type"] == first_type and r["json"]["task_id"] == rec.requests[0]["json"]["task_id"]]
    assert len(attempts) == 3, "500 and 503 retried, 404 not retried"
    gaps = [b["at"] - a["at"] for a, b in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, f"backoff 1 s then 2 s, saw {gaps}"
    assert rec.requests[-1]["json"]["type"] == "final", "a failed callback does not stop later ones"
    root = await client.result("tasks.get", {"task_id": "root"})
    assert root["status"] == "completed", "webhook failures never affect the task"


async def test_webhook_url_validation(app_factory: Any) -> None:
    async with app_factory({"SERVICE_ALLOW_PRIVATE_URLS": "false"}) as client:
        await client.result("tasks.create", [task("t")])
        error = await client.error("tasks.execute", {"task_id": "t", "webhook_config": {"url": "http://127.0.0.1:9/x"}})
        assert error["code"] == -32602 and "SERVICE_ALLOW_PRIVATE_URLS" in error["message"]
        error = await client.error("tasks.execute", {"task_id": "t", "webhook_config": {"headers": {}}})
        assert error["code"] == -32602 and "url" in error["message"]


async def test_a_run_of_two_system_info_tasks_shows_progress_on_sse(client: Client) -> None:
    """Issue 14: executors that report no progress of their own still show their start as `progress`."""
    from taskgrove.agent.foundations.auth import ANONYMOUS

    await client.services.tasks.create_tree(NewTree.from_params([  # stored, not run yet
        task("root", deps=["i1", "i2"], method=None),
        task("i1", "root", method="system_info_executor", inputs={"resource": "cpu"}),
        task("i2", "root", method="system_info_executor", inputs={"resource": "memory"})]), ANONYMOUS)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.execute", "params": {"task_id": "root", "use_streaming": True}}
    events = sse_events((await client.http.post("/tasks", json=body)).text)[1:]
    for tid in ("i1", "i2"):
        progress = [e for e in events if e["task_id"] == tid and e["type"] == "progress"]
        assert progress, [e for e in events if e["task_id"] == tid]
        assert {"task_id", "status", "progress", "message", "timestamp"} <= set(progress[0])
        assert progress[0]["status"] == "in_progress"
