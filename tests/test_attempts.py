"""The attempt history (issue 30, item 3; docs/observability.md "Timeline") through the API, on
SQLite and PostgreSQL: tasks.attempts after retries and a durable wait, its permissions, its
params, and the rows leaving with their task."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from taskgrove.storage.models import task_attempts_table
from tests.conftest import Client
from tests.test_auth import ALICE, BOB, JWT_ENV, PERMISSION_DENIED
from tests.test_retries import ALLOW, flaky, policy
from tests.test_waits import approval_tree, parked


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def check_durations(attempt: dict[str, Any]) -> None:
    """queued_ms and ran_ms are the differences of the stored times, never negative."""
    assert attempt["ran_ms"] == pytest.approx(
        (at(attempt["ended_at"]) - at(attempt["started_at"])).total_seconds() * 1000, abs=0.01)
    assert attempt["queued_ms"] == pytest.approx(
        max(0.0, (at(attempt["started_at"]) - at(attempt["queued_at"])).total_seconds() * 1000), abs=0.01)
    assert attempt["ran_ms"] >= 0 and attempt["queued_ms"] >= 0


async def test_a_retried_task_keeps_every_attempt(app_factory: Any, tmp_path: Path) -> None:
    log = tmp_path / "attempts.log"
    async with app_factory(env=ALLOW) as client:
        await client.result("tasks.create", [{"id": "root", "name": "root"},
                                             flaky("f", log, succeed_on=3, retry=policy(3, base=0.2))])
        done = await client.wait_status("f", ("completed", "failed"))
        assert done["status"] == "completed" and done["attempt"] == 3
        attempts = await client.result("tasks.attempts", {"task_id": "f"})
    assert [(a["task_id"], a["attempt"], a["outcome"]) for a in attempts] == [
        ("f", 1, "retry"), ("f", 2, "retry"), ("f", 3, "completed")]
    assert "boom 1" in attempts[0]["error"] and "boom 2" in attempts[1]["error"] and attempts[2]["error"] is None
    for attempt in attempts:
        check_durations(attempt)
    for before, after in zip(attempts, attempts[1:]):
        # the next attempt became runnable when its retry was due (0.2 s after the failure)
        assert at(after["queued_at"]) >= at(before["ended_at"])
        assert (at(after["queued_at"]) - at(before["ended_at"])).total_seconds() >= 0.19
        assert at(after["started_at"]) >= at(after["queued_at"])


async def test_a_wait_shows_as_a_waiting_attempt_then_the_resumed_one(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", approval_tree("w"))
        await parked(client, "w-approve")
        waiting = await client.result("tasks.attempts", {"task_id": "w-approve"})
        assert [(a["attempt"], a["outcome"]) for a in waiting] == [(1, "waiting")]
        assert waiting[0]["ended_at"] is not None
        await client.result("tasks.respond", {"task_id": "w-approve", "value": {"approved": True}})
        assert (await client.wait_status("w", ("completed", "failed")))["status"] == "completed"
        approve = await client.result("tasks.attempts", {"id": "w-approve"})
        tree = await client.result("tasks.attempts", {"task_id": "w-ship", "tree": True})
    assert [(a["attempt"], a["outcome"]) for a in approve] == [(1, "waiting"), (1, "completed")]
    parked_at, answered = approve
    assert at(answered["queued_at"]) >= at(parked_at["ended_at"])  # runnable again when answered
    by_task = {a["task_id"]: a for a in tree}
    assert sorted(by_task) == ["w", "w-approve", "w-prep", "w-ship"] and len(tree) == 5
    assert all(a["outcome"] == "completed" for a in by_task.values())
    # a dependent became runnable when its dependency ended
    assert at(by_task["w-ship"]["queued_at"]) >= at(by_task["w-approve"]["ended_at"])
    assert at(by_task["w-approve"]["queued_at"]) <= at(by_task["w-approve"]["started_at"])
    for attempt in tree:
        check_durations(attempt)


async def test_an_attempt_in_progress_is_shown_running(client: Client) -> None:
    asyncio.get_running_loop().create_task(client.call("tasks.create", [
        {"id": "s", "name": "s", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 30}}]))
    await client.wait_status("s", ("in_progress",))
    shown = await client.result("tasks.attempts", {"task_id": "s"})
    assert [(a["attempt"], a["outcome"], a["ended_at"], a["ran_ms"]) for a in shown] == [(1, "running", None, None)]
    await client.result("tasks.cancel", {"task_ids": ["s"]})
    cancelled = await client.result("tasks.attempts", {"task_id": "s"})
    assert [(a["attempt"], a["outcome"], a["error"]) for a in cancelled] == [(1, "cancelled", "Cancelled by user")]
    assert cancelled[0]["ran_ms"] >= 0


async def test_unknown_task_and_another_users_task(app_factory: Any) -> None:
    async with app_factory(env=JWT_ENV) as client:
        await client.result("tasks.create", [{"id": "mine", "name": "mine"}], headers=ALICE)
        assert len(await client.result("tasks.attempts", {"task_id": "mine"}, headers=ALICE)) == 1
        refused = await client.error("tasks.attempts", {"task_id": "mine"}, headers=BOB)
        assert refused["code"] == PERMISSION_DENIED
        assert refused == await client.error("tasks.tree", {"task_id": "mine"}, headers=BOB) | {
            "data": refused["data"]} and "mine" in refused["data"]
        missing = await client.error("tasks.attempts", {"task_id": "nope"}, headers=ALICE)
        assert missing == await client.error("tasks.tree", {"task_id": "nope"}, headers=ALICE)
        assert missing["code"] == -32602 and "nope" in str(missing)
        # served on the agent route too, as the other tasks.* methods
        assert len(await client.result("tasks.attempts", {"task_id": "mine"}, path="/", headers=ALICE)) == 1


async def test_the_history_goes_with_its_task(client: Client) -> None:
    await client.result("tasks.create", [{"id": "gone", "name": "gone"}])
    await client.wait_status("gone", ("completed",))

    async def stored() -> int:
        async with client.services.repo.engine.connect() as conn:
            query = select(func.count()).select_from(task_attempts_table).where(task_attempts_table.c.task_id == "gone")
            return int((await conn.execute(query)).scalar_one())

    assert await stored() == 1
    await client.result("tasks.update", {"task_id": "gone", "status": "pending"})
    assert (await client.result("tasks.delete", {"task_id": "gone"}))
    assert await stored() == 0


def test_attempts_params_property(tmp_path: Path) -> None:
    """Whatever the params, tasks.attempts answers HTTP 200 with a list or a -32602 naming the
    problem (-32700 for a body that is not JSON: NaN, Infinity); never a 500."""
    import json as jsonlib

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from taskgrove.agent.foundations.settings import Settings
    from tests.conftest import running_app

    config = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
                                "SERVICE_RATE_LIMIT_PER_USER": "0"})
    runner = asyncio.Runner()
    context = running_app(config)
    client: Client = runner.run(context.__aenter__())
    try:
        runner.run(client.result("tasks.create", [{"id": "t0", "name": "t0"}]))
        text = st.text(max_size=8)
        values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text),
                              lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(text, inner, max_size=3)), max_leaves=8)
        ids = st.one_of(st.sampled_from(["t0", "missing", ""]), values)
        params = st.one_of(values, st.fixed_dictionaries({"task_id": ids}, optional={"tree": values, "id": ids}))

        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(params=params)
        def check(params: Any) -> None:
            body = jsonlib.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks.attempts", "params": params},
                                 allow_nan=True)
            response = runner.run(client.http.post("/tasks", content=body,
                                                   headers={"content-type": "application/json"}))
            assert response.status_code == 200, response.text
            answer = response.json()
            try:
                jsonlib.dumps(params, allow_nan=False)
                codes: tuple[int, ...] = (-32602, -32600)
            except ValueError:  # NaN or Infinity: not JSON, a parse error (docs/limits.md)
                codes = (-32700,)
            if "error" in answer:
                assert answer["error"]["code"] in codes, answer
            else:
                assert isinstance(params, dict) and [a["task_id"] for a in answer["result"]] == ["t0"]

        check()
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()


async def test_a_schedules_past_runs_with_their_durations(client: Client) -> None:
    from tests.test_schedules import template

    tpl = await template(client, "runs-tpl")
    schedule = await client.result("schedules.create", {"task_id": tpl, "cron": "0 0 1 1 *"})
    other = await client.result("schedules.create", {"task_id": tpl, "cron": "0 0 2 1 *"})
    first = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
    await client.wait_status(first["root_task_id"], ("completed",))
    second = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
    await client.wait_status(second["root_task_id"], ("completed",))
    await client.result("schedules.trigger", {"schedule_id": other["id"]})  # another schedule's run
    assert await client.runs_ended()
    runs = await client.result("schedules.runs", {"schedule_id": schedule["id"]})
    assert [r["root_task_id"] for r in runs] == [second["root_task_id"], first["root_task_id"]]
    for run in runs:
        assert run["status"] == "completed" and run["final_status"] == "completed" and run["name"] == "template"
        assert run["duration_ms"] == pytest.approx(
            (at(run["ended_at"]) - at(run["started_at"])).total_seconds() * 1000, abs=0.01)
        assert run["slot"] is None  # triggered by hand, not for a slot
    assert len(await client.result("schedules.runs", {"id": schedule["id"], "limit": 1})) == 1
    assert await client.result("schedules.runs", {"schedule_id": "nope"}) is None  # as schedules.get
    bad = await client.error("schedules.runs", {"schedule_id": schedule["id"], "limit": 0})
    assert bad["code"] == -32602 and "limit" in bad["data"]


# --- /metrics: JSON-RPC calls per method, the queue wait ---------------------------------------

async def test_metrics_count_rpc_calls_per_known_method_and_the_queue_wait(client: Client) -> None:
    from tests.test_operations import sample

    before = (await client.http.get("/metrics")).text
    await client.result("tasks.create", [{"id": "m", "name": "m", "schemas": {"method": "noop_executor"}}])
    await client.result("tasks.get", {"task_id": "m"})
    await client.error("tasks.get", {"task_id": 5})  # bad params: an error outcome
    await client.error("no.such.method-x7", {})
    await client.error("tasks.get", {"task_id": "m"}, path="/system")  # not served there: `other`
    await client.result("system.health", {}, path="/system")
    batch = [{"jsonrpc": "2.0", "id": n, "method": "tasks.get", "params": {"task_id": "m"}} for n in range(3)]
    assert len((await client.http.post("/tasks", json=batch)).json()) == 3
    text = (await client.http.get("/metrics")).text

    def moved(name: str, **labels: str) -> float:
        return sample(text, name, **labels) - sample(before, name, **labels)

    calls = "taskgrove_rpc_request_duration_seconds_count"
    assert moved(calls, method="tasks.get", outcome="ok") == 4
    assert moved(calls, method="tasks.get", outcome="error") == 1
    assert moved(calls, method="tasks.create", outcome="ok") == 1
    assert moved(calls, method="other", outcome="error") == 2
    assert moved(calls, method="system.health", outcome="ok") == 1
    assert moved("taskgrove_rpc_request_duration_seconds_bucket", method="tasks.get", outcome="ok", le="10.0") == 4
    assert "no.such.method-x7" not in text  # the label set stays closed
    assert moved("taskgrove_queue_wait_seconds_count") >= 1
    assert sample(text, "taskgrove_queue_wait_seconds_sum") >= 0


async def test_an_attempt_cut_off_by_a_stop_is_interrupted_then_resumed(app_factory: Any) -> None:
    env = {"SERVICE_CREATE_WAIT_TIMEOUT": "0"}
    sleeper = {"id": "cut", "name": "cut", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 1.0}}
    async with app_factory(env=env) as first:
        await first.result("tasks.create", [sleeper])
        await first.wait_status("cut", ("in_progress",))
    async with app_factory(env=env) as second:  # the same database: the stop handed the attempt back
        assert (await second.wait_status("cut", ("completed", "failed")))["status"] == "completed"
        attempts = await second.result("tasks.attempts", {"task_id": "cut"})
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "interrupted"), (1, "completed")]
    assert "Interrupted" in attempts[0]["error"] and attempts[0]["ran_ms"] >= 0
    assert at(attempts[1]["started_at"]) >= at(attempts[0]["ended_at"])
