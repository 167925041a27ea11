"""Durable waits (issue 29, docs/waits.md) through the ASGI app, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.registry import ExecutorRegistry
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT

APPROVAL_SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}


def approval_tree(root: str, **extra_inputs: Any) -> list[dict[str, Any]]:
    """prepare -> approve (waits for input) -> ship, all under a root that aggregates them."""
    return [
        {"id": root, "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"{root}-ship", "required": True}]},
        {"id": f"{root}-prep", "name": "prepare", "parent_id": root, "schemas": {"method": "noop_executor"}},
        {"id": f"{root}-approve", "name": "approve", "parent_id": root,
         "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Approve the refund?", "schema": APPROVAL_SCHEMA, **extra_inputs},
         "dependencies": [{"id": f"{root}-prep", "required": True}]},
        {"id": f"{root}-ship", "name": "ship", "parent_id": root, "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"{root}-approve", "required": True}]},
    ]


async def parked(client: Client, task_id: str, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        task = await client.result("tasks.get", {"task_id": task_id})
        if task and task.get("waiting"):
            return task
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} never waited: {task}"
        await asyncio.sleep(0.02)


def node(tree: dict[str, Any], tid: str) -> dict[str, Any]:
    stack = [tree]
    while stack:
        found = stack.pop()
        if found["id"] == tid:
            return found
        stack.extend(found["children"])
    raise KeyError(tid)


# tasks.create answers once its tree rests on a wait, so well within SERVICE_CREATE_WAIT_TIMEOUT
# (30 s), which a create that waited for the whole tree would take; half of it leaves a busy
# machine its margin.
RESTS_WITHIN = 15.0


async def test_approval_in_the_middle_waits_then_completes(client: Client) -> None:
    # tasks.create answers once the tree rests on its wait (not after SERVICE_CREATE_WAIT_TIMEOUT)
    tree = await asyncio.wait_for(client.result("tasks.create", approval_tree("r1")), RESTS_WITHIN)
    assert node(tree, "r1-approve")["waiting"]["prompt"] == "Approve the refund?"
    assert node(tree, "r1-prep")["status"] == "completed" and node(tree, "r1-ship")["waiting"] is None
    task = await parked(client, "r1-approve")
    assert task["status"] == "in_progress"
    wait = task["waiting"]
    assert wait["kind"] == "input" and wait["prompt"] == "Approve the refund?"
    assert wait["schema"] == APPROVAL_SCHEMA and wait["since"] and wait["deadline"] is None
    assert (await client.result("tasks.get", {"task_id": "r1-ship"}))["status"] == "pending"
    assert "r1-approve" not in client.services.engine.running  # no slot held
    listed = await client.result("tasks.list", {"waiting": True})
    assert [t["id"] for t in listed] == ["r1-approve"]
    answer = await client.result("tasks.respond", {"task_id": "r1-approve", "value": {"approved": True}})
    assert answer["status"] == "resumed"
    done = await client.wait_status("r1", ("completed", "failed"))
    assert done["status"] == "completed"
    approve = await client.result("tasks.get", {"task_id": "r1-approve"})
    assert approve["result"] == {"approved": True} and approve["waiting"] is None and approve["attempt"] == 1
    ship = await client.result("tasks.get", {"task_id": "r1-ship"})
    assert ship["result"]["results"]["r1-approve"] == {"approved": True}
    again = await client.error("tasks.respond", {"task_id": "r1-approve", "value": {"approved": False}})
    assert again["code"] == -32602 and "not waiting for input" in again["message"]


def waiter(tid: str, **inputs: Any) -> dict[str, Any]:
    return {"id": tid, "name": tid, "schemas": {"method": "human_input_executor"},
            "inputs": {"prompt": f"answer {tid}", **inputs}}


async def test_schema_refusal_names_the_problem_and_keeps_the_wait(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", approval_tree("s1"))
        await parked(client, "s1-approve")
        error = await client.error("tasks.respond", {"task_id": "s1-approve", "value": {"approved": "yes"}})
        assert error["code"] == -32602 and "approved" in error["message"] and "boolean" in error["message"]
        error = await client.error("tasks.respond", {"task_id": "s1-approve"})
        assert error["code"] == -32602 and "value is required" in error["message"]
        error = await client.error("tasks.respond", {"task_id": "nope", "value": 1})
        assert error["code"] == -32602 and "not found" in error["message"]
        error = await client.error("tasks.respond", {"task_id": "s1-prep", "value": 1})
        assert error["code"] == -32602 and error["message"] == "task s1-prep is not waiting for input"
        assert (await client.result("tasks.get", {"task_id": "s1-approve"}))["waiting"]["kind"] == "input"


async def test_a_second_answer_is_refused_even_at_the_same_moment(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [waiter("d1")])
        await parked(client, "d1")
        answers = await asyncio.gather(*(client.call("tasks.respond", {"task_id": "d1", "value": n})
                                         for n in range(5)))
        won = [a for a in answers if "result" in a]
        assert len(won) == 1
        for lost in answers:
            if "error" in lost:
                assert lost["error"]["code"] == -32602
                assert "already answered" in lost["error"]["message"] or "not waiting" in lost["error"]["message"]
        done = await client.wait_status("d1", ("completed", "failed"))
        assert done["status"] == "completed" and done["result"] == answers.index(won[0])


async def test_only_the_owner_or_an_admin_may_answer(app_factory: Any) -> None:
    from tests.test_auth import JWT_ENV, bearer, token

    alice, bob, admin = bearer(token("alice")), bearer(token("bob")), bearer(token("root", roles=["admin"]))
    async with app_factory(env={**JWT_ENV, "SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [waiter("o1"), ], headers=alice)
        await client.result("tasks.create", [waiter("o2")], headers=alice)
        await client.result("tasks.get", {"task_id": "o1"}, headers=alice)
        while not (await client.result("tasks.get", {"task_id": "o2"}, headers=alice))["waiting"]:
            await asyncio.sleep(0.02)
        error = await client.error("tasks.respond", {"task_id": "o1", "value": 1}, headers=bob)
        assert error["code"] == -32001
        assert (await client.result("tasks.respond", {"task_id": "o1", "value": 1}, headers=alice))["status"] == "resumed"
        assert (await client.result("tasks.respond", {"task_id": "o2", "value": 2}, headers=admin))["status"] == "resumed"
        # events: a user emits for itself; naming another user is for admins only
        error = await client.error("events.emit", {"name": "x", "user_id": "alice"}, headers=bob)
        assert error["code"] == -32001
        assert (await client.result("events.emit", {"name": "x", "user_id": "alice"}, headers=admin))["resumed"] == 0


async def test_timeouts_take_the_default_or_fail(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [waiter("t1", timeout_seconds=0.3, default={"approved": False})])
        await client.result("tasks.create", [
            waiter("t2", timeout_seconds=0.3),
            {"id": "t2-next", "name": "next", "parent_id": "t2", "schemas": {"method": "noop_executor"},
             "dependencies": [{"id": "t2", "required": True}]}])
        first = await parked(client, "t1")
        assert first["waiting"]["deadline"] > first["waiting"]["since"]
        done = await client.wait_status("t1", ("completed", "failed"))
        assert done["status"] == "completed" and done["result"] == {"approved": False}
        failed = await client.wait_status("t2", ("completed", "failed"))
        assert failed["status"] == "failed" and failed["waiting"] is None
        assert "No answer within 0.3 s" in failed["error"]
        assert (await client.result("tasks.get", {"task_id": "t2-next"}))["status"] == "pending"
        assert await client.runs_ended()
        error = await client.error("tasks.respond", {"task_id": "t2", "value": 1})
        assert "not waiting" in error["message"]


async def test_cancel_ends_a_wait_at_once(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", approval_tree("c1"))
        await parked(client, "c1-approve")
        [answer] = await client.result("tasks.cancel", {"task_ids": ["c1-approve"]})
        assert answer["status"] == "cancelled"
        task = await client.result("tasks.get", {"task_id": "c1-approve"})
        assert task["status"] == "cancelled" and task["waiting"] is None
        assert await client.runs_ended()  # the tree's execution ended: nothing else can run
        assert (await client.result("tasks.get", {"task_id": "c1-ship"}))["status"] == "pending"
        assert (await client.error("tasks.respond", {"task_id": "c1-approve", "value": {"approved": True}}))


def event_waiter(tid: str, **inputs: Any) -> dict[str, Any]:
    return {"id": tid, "name": tid, "schemas": {"method": "event_wait_executor"}, "inputs": {"event": "deployed",
                                                                                            **inputs}}


async def test_events_resume_matching_waits_that_began_before_them(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        early = await client.result("events.emit", {"name": "deployed", "payload": {"service": "api", "n": 0}})
        assert early["resumed"] == 0 and early["event_id"]
        await client.result("tasks.create", [event_waiter("e-api", match={"service": "api"})])
        await client.result("tasks.create", [event_waiter("e-web", match={"service": "web"})])
        await client.result("tasks.create", [event_waiter("e-any")])
        for tid in ("e-api", "e-web", "e-any"):
            task = await parked(client, tid)
            assert task["waiting"]["kind"] == "event" and task["waiting"]["event"] == "deployed"
        await asyncio.sleep(0.2)  # the event emitted before the waits began does not count
        assert (await client.result("tasks.get", {"task_id": "e-any"}))["status"] == "in_progress"
        emitted = await client.result("events.emit", {"name": "deployed", "payload": {"service": "api", "n": 1}})
        assert emitted["resumed"] == 2 and sorted(emitted["task_ids"]) == ["e-any", "e-api"]
        for tid in ("e-api", "e-any"):
            done = await client.wait_status(tid, ("completed", "failed"))
            assert done["result"] == {"service": "api", "n": 1}
        assert (await client.result("tasks.get", {"task_id": "e-web"}))["waiting"]["match"] == {"service": "web"}
        other = await client.result("events.emit", {"name": "built", "payload": {"service": "web"}})
        assert other["resumed"] == 0
        assert (await client.result("events.emit", {"name": "deployed", "payload": {"service": "web"}}))["resumed"] == 1
        assert (await client.wait_status("e-web", ("completed",)))["result"] == {"service": "web"}
        error = await client.error("tasks.respond", {"task_id": "e-web", "value": 1})
        assert error["code"] == -32602


async def test_an_event_stored_just_before_the_wait_is_seen_finds_it(app_factory: Any) -> None:
    """The rule: an event counts when emitted at or after the moment the wait began, even if it was
    stored before the task's wait was (the engine looks once into the stored events on parking)."""
    from taskgrove.storage import wait_store as stored

    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        services = client.services
        original = services.engine.waits.watch

        def late(tid: str, run: Any) -> None:  # an event arrives between the wait's start and its store
            row = run.rows[tid]
            wait = stored.read(row["waiting"])
            asyncio.get_running_loop().create_task(services.repo.transact(
                stored.add_event, None, "deployed", {"service": "late"}, wait["since"]))
            asyncio.get_running_loop().call_later(0.1, original, tid, run)

        services.engine.waits.watch = late
        await client.result("tasks.create", [event_waiter("late")])
        done = await client.wait_status("late", ("completed", "failed"))
        assert done["result"] == {"service": "late"}


async def test_a_long_sleep_parks_and_survives_a_restart(make_settings: Any, backend: str) -> None:
    from tests.conftest import running_app

    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_PARK_SLEEP_SECONDS": "1",
                              "SERVICE_LEASE_SECONDS": "2"})
    async with running_app(settings) as client:
        await client.result("tasks.create", [{"id": "nap", "name": "nap", "schemas": {"method": "sleep_executor"},
                                              "inputs": {"seconds": 1.5}}])
        task = await parked(client, "nap")
        assert task["waiting"]["kind"] == "timer" and task["waiting"]["deadline"]
        assert not client.services.engine.running
    # stopped (on PostgreSQL its execution lease is handed back): the next instance wakes it
    async with running_app(settings) as client:
        done = await client.wait_status("nap", ("completed", "failed"))
        assert done["status"] == "completed" and done["result"] == {"slept": 1.5} and done["attempt"] == 1


# --- the params of tasks.respond and events.emit: never a 500, the right codes -------------------

def test_respond_and_emit_params_property(tmp_path: Any) -> None:
    """Whatever the params, tasks.respond and events.emit answer HTTP 200 with a result or a
    -32602 (bad params, not waiting, already answered) / -32001 error; a parked task with a schema
    keeps waiting unless a valid answer came."""
    import json as jsonlib

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from taskgrove.agent.foundations.settings import Settings
    from tests.conftest import running_app

    config = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
                                "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    runner = asyncio.Runner()
    context = running_app(config)
    client: Client = runner.run(context.__aenter__())
    try:
        tree = [waiter(f"p{n}", schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                        "required": ["n"], "additionalProperties": False}) for n in range(3)]
        for task in tree:
            runner.run(client.result("tasks.create", [task]))
        for n in range(3):
            runner.run(parked(client, f"p{n}"))
        text = st.text(max_size=8)
        values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text),
                              lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(text, inner, max_size=3)), max_leaves=8)
        ids = st.one_of(st.sampled_from(["p0", "p1", "p2", "missing", ""]), values)
        params = st.one_of(
            values,
            st.fixed_dictionaries({"task_id": ids}, optional={"value": values, "id": ids}),
            st.fixed_dictionaries({"name": st.one_of(text, values)},
                                  optional={"payload": values, "user_id": st.one_of(text, values)}),
        )

        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(method=st.sampled_from(["tasks.respond", "events.emit"]), params=params)
        def check(method: str, params: Any) -> None:
            body = jsonlib.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, allow_nan=True)
            response = runner.run(client.http.post("/tasks", content=body,
                                                   headers={"content-type": "application/json"}))
            assert response.status_code == 200, response.text
            answer = response.json()
            try:  # NaN and Infinity are no JSON: such a body is refused whole, before any method
                jsonlib.dumps(params, allow_nan=False)
            except ValueError:
                assert answer["error"]["code"] == -32700, answer
                return
            if "error" in answer:
                assert answer["error"]["code"] in (-32602, -32600, -32001), answer
            else:
                assert method == "events.emit" or answer["result"]["status"] == "resumed"

        check()
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()


async def test_respond_and_emit_are_served_on_the_agent_route_too(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [waiter("root-1")])
        await parked(client, "root-1")
        answer = await client.result("tasks.respond", {"task_id": "root-1", "value": "ok"}, path="/")
        assert answer["status"] == "resumed"
        assert (await client.wait_status("root-1", ("completed",)))["result"] == "ok"
        assert (await client.result("events.emit", {"name": "nothing"}, path="/"))["resumed"] == 0


class SeveralWaits(Executor):
    """An executor author's task: asks a person, sleeps on a durable timer, then waits for an
    event that names the person's choice. Each run of `execute` is counted (replays)."""

    id = "several_waits_probe"
    name = "Several waits"
    extension = "test"
    runs: list[str] = []

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        SeveralWaits.runs.append(context.task_id)
        plan = await context.wait_for_input("Which plan?", schema={"type": "string", "enum": ["a", "b"]})
        await context.sleep(0.2)
        go = await context.wait_for_event("go", match={"plan": plan})
        return {"plan": plan, "go": go, "attempt": context.attempt}


async def test_an_executor_with_several_waits_in_one_attempt(make_settings: Any) -> None:
    """`context.wait_for_input`, `context.sleep` and `context.wait_for_event` in one attempt: each
    parks the task (in progress, no slot), the next run replays the earlier answers by their order,
    and the result carries them all; the attempt stays the first one (a wait is not a retry)."""
    SeveralWaits.runs.clear()
    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    async with running_app(settings, registry=ExecutorRegistry([SeveralWaits])) as client:
        await client.result("tasks.create", [{"id": "w", "name": "w", "schemas": {"method": "several_waits_probe"}}])
        task = await parked(client, "w")
        assert task["status"] == "in_progress" and task["waiting"]["kind"] == "input"
        assert task["waiting"]["prompt"] == "Which plan?"
        assert (await client.error("tasks.respond", {"task_id": "w", "value": "c"}))["code"] == -32602
        await client.result("tasks.respond", {"task_id": "w", "value": "b"})
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while (task := await client.result("tasks.get", {"task_id": "w"}))["waiting"] is None or \
                task["waiting"]["kind"] != "event":  # the timer parks in between, then the event wait
            assert asyncio.get_running_loop().time() < deadline, task
            await asyncio.sleep(0.02)
        assert task["waiting"]["event"] == "go" and task["waiting"]["match"] == {"plan": "b"}
        assert (await client.result("events.emit", {"name": "go", "payload": {"plan": "a"}}))["resumed"] == 0
        assert (await client.result("events.emit", {"name": "go", "payload": {"plan": "b", "n": 7}}))["resumed"] == 1
        done = await client.wait_status("w", ("completed", "failed"))
        assert done["status"] == "completed", done
        assert done["result"] == {"plan": "b", "go": {"plan": "b", "n": 7}, "attempt": 1}
        assert SeveralWaits.runs == ["w"] * 4  # the first run, then one after each of the three waits


async def test_an_answer_during_a_reread_of_its_run_is_not_lost(client: Client) -> None:
    """A change to the tree (tasks.update: raise a budget) makes the engine re-read the run; when
    the answer comes while that read is in flight (it read the task still parked), the task must
    still resume, not stay pending with no instance queueing it."""
    await asyncio.wait_for(client.result("tasks.create", approval_tree("r9")), RESTS_WITHIN)
    await parked(client, "r9-approve")
    keeper = client.services.engine.run_keeper
    real_tree, read, go_on = keeper.repo.tree, asyncio.Event(), asyncio.Event()

    async def stale_tree(tree_id: str, *args: Any, **kw: Any) -> Any:
        rows = await real_tree(tree_id, *args, **kw)  # read while the task is parked
        read.set()
        await go_on.wait()  # returned only after the answer is stored
        return rows

    keeper.repo.tree = stale_tree  # type: ignore[method-assign]
    try:
        await client.result("tasks.update", {"task_id": "r9", "name": "refund (renamed)"})
        await asyncio.wait_for(read.wait(), EVENT_WAIT)
        keeper.repo.tree = real_tree  # type: ignore[method-assign]
        answer = await client.result("tasks.respond", {"task_id": "r9-approve", "value": {"approved": True}})
        assert answer["status"] == "resumed"
    finally:
        keeper.repo.tree = real_tree  # type: ignore[method-assign]
        go_on.set()
    done = await client.wait_status("r9", ("completed", "failed"))
    assert done["status"] == "completed"
