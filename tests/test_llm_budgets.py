"""Budgets of LLM work (docs/costs.md) through the real app against the fake LLM (15 tokens a
call: 10 prompt, 5 completion): a subtree's budget stops spending at the documented point, a
`downgrade` budget switches models, a user's daily budget refuses the next call,
config.budget.set|get and the field rules."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from taskgrove.agent.foundations.errors import RpcError
from taskgrove.agent.foundations.requests_services import SetBudget
from taskgrove.storage.fields import check_budget
from tests.deadlines import EVENT_WAIT

JWT_SECRET = "budget-test-jwt-secret-" + "0123456789abcdef" * 4


def llm_env(fake: Any, **extra: str) -> dict[str, str]:
    return {"SERVICE_LLM_BASE_URL": fake.base_url, "SERVICE_LLM_MAX_RETRIES": "0", **extra}


def bearer(user: str | None, roles: list[str] | None = None) -> dict[str, str]:
    claims: dict[str, Any] = {"user_id": user} if user else {}
    if roles:
        claims["roles"] = roles
    return {"Authorization": "Bearer " + jwt.encode(claims, JWT_SECRET, algorithm="HS256")}


def crew(id_: str, parent: str | None, steps: int, max_tokens: int = 10, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": id_, "parent_id": parent, "schemas": {"method": "crew_executor"},
            "inputs": {"agents": [{"role": "writer"}], "max_tokens": max_tokens,
                       "steps": [{"description": f"step {n}"} for n in range(steps)]}, **extra}


def llm(id_: str, parent: str | None, model: str = "m", max_tokens: int = 10, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": id_, "parent_id": parent, "schemas": {"method": "llm_executor"},
            "inputs": {"prompt": "hi", "model": model, "max_tokens": max_tokens, "stream": False}, **extra}


async def test_a_subtree_budget_stops_spending_before_the_call_it_cannot_cover(app_factory, fake_llm):
    # 50 tokens, calls of max_tokens 10 that use 15: calls at 0, 15 and 30 used fit (used + 10 <= 50),
    # the fourth (45 + 10 > 50) is not made. The retry policy does not bring it back.
    tasks = [{"id": "root", "name": "root", "budget": {"max_tokens": 50}},
             crew("c", "root", steps=6, retry={"max_attempts": 3, "base_seconds": 0.01})]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)
        task = await c.result("tasks.get", {"task_id": "c"})
        root = await c.result("tasks.get", {"task_id": "root"})
    assert len(fake_llm.requests) == 3
    assert task["status"] == "failed" and task["attempt"] == 1
    assert "budget of task 'root' exhausted: used 45 of 50 tokens" in task["error"]
    assert "was not made" in task["error"]
    assert task["usage"]["total_tokens"] == 45 and task["usage"]["calls"] == 3
    assert root["tree_usage"]["total_tokens"] == 45 and root["budget"] == {"max_tokens": 50}
    assert root["budget_remaining"] == {"tokens": 5, "cost_usd": None}
    assert "budget_remaining" not in task  # a task without a budget of its own


async def test_a_budget_covers_its_subtree_across_tasks_and_a_call_past_it_fails_the_task(app_factory, fake_llm):
    # 40 tokens over three chained tasks: 0+10 and 15+10 fit; the third call fits by max_tokens
    # (30+10 <= 40) but uses 15, past the budget: the task that made it fails after it.
    tasks = [{"id": "root", "name": "root", "budget": {"max_tokens": 40}},
             llm("a", "root"), llm("b", "root", dependencies=[{"id": "a"}]),
             llm("x", "root", dependencies=[{"id": "b"}]), llm("y", "root", dependencies=[{"id": "x"}])]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)
        got = {t: await c.result("tasks.get", {"task_id": t}) for t in ("a", "b", "x", "y")}
    assert [got[t]["status"] for t in ("a", "b", "x")] == ["completed", "completed", "failed"]
    assert "budget of task 'root' exhausted: used 45 of 40 tokens; the last call went past it" in got["x"]["error"]
    assert got["y"]["status"] != "completed" and got["y"]["usage"] is None
    assert len(fake_llm.requests) == 3


async def test_downgrade_switches_to_a_fallback_model_the_budget_covers(app_factory, fake_llm):
    # gpt-4o's 1000 completion tokens cost more than $0.005; gpt-4o-mini's do not.
    budget = {"max_cost_usd": 0.005, "on_exhausted": "downgrade", "fallback_models": ["gpt-4o-mini"]}
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", [llm("r", None, model="gpt-4o", max_tokens=1000, budget=budget)])
        task = await c.result("tasks.get", {"task_id": "r"})
    assert task["status"] == "completed", task["error"]
    assert [r["model"] for r in fake_llm.requests] == ["gpt-4o-mini"]
    assert task["result"]["model"] == "gpt-4o-mini"


async def test_downgrade_without_a_fitting_fallback_fails_clearly(app_factory, fake_llm):
    budget = {"max_cost_usd": 0.0001, "on_exhausted": "downgrade", "fallback_models": ["gpt-4o-mini"]}
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", [llm("r", None, model="gpt-4o", max_tokens=1000, budget=budget)])
        task = await c.result("tasks.get", {"task_id": "r"})
    assert task["status"] == "failed" and fake_llm.requests == []
    assert "budget of task 'r' exhausted" in task["error"] and "fallback models ['gpt-4o-mini']" in task["error"]


async def test_the_daily_budget_of_a_user_refuses_the_next_call_and_an_admin_raises_it(app_factory, fake_llm):
    env = llm_env(fake_llm, SERVICE_USER_DAILY_BUDGET_TOKENS="30")
    async with app_factory(env=env) as c:
        await c.result("tasks.create", [llm("a", None, user_id="alice")])
        await c.result("tasks.create", [llm("b", None, user_id="alice")])  # 15 + 10 <= 30
        await c.result("tasks.create", [llm("x", None, user_id="alice")])  # 30 + 10 > 30
        refused = await c.result("tasks.get", {"task_id": "x"})
        assert refused["status"] == "failed"
        assert refused["error"].startswith("budget of user 'alice' on ")
        assert "used 30 of 30 tokens" in refused["error"]
        error = await c.error("tasks.generate", {"requirement": "plan", "user_id": "alice"})
        assert error["code"] == -32602 and "budget of user 'alice'" in json.dumps(error)
        assert len(fake_llm.requests) == 2

        got = await c.result("config.budget.get", {"user_id": "alice"}, path="/system")
        assert (got["source"], got["max_tokens"], got["remaining"]["tokens"]) == ("settings", 30, 0)
        got = await c.result("config.budget.set", {"user_id": "alice", "max_tokens": 100}, path="/system")
        assert (got["source"], got["max_tokens"], got["remaining"]["tokens"]) == ("user", 100, 70)
        await c.result("tasks.create", [llm("y", None, user_id="alice")])
        assert (await c.result("tasks.get", {"task_id": "y"}))["status"] == "completed"
        await c.result("config.budget.set", {"user_id": "alice"}, path="/system")  # back to the settings
        assert (await c.result("config.budget.get", {"user_id": "alice"}, path="/system"))["source"] == "settings"


# A model without a price (llm/usage.py) followed by a priced one, under a dollar budget of $0.0002.
# gpt-4o (litellm's bundled table): $2.5 a million prompt tokens, $10 a million completion tokens.
# The check before a call prices its max_tokens (10) as completion: 1 prompt token ("hi") and 10
# completion tokens, $0.0001025; a call uses 10 + 5 tokens, $0.000075. The unpriced call adds no
# known cost; known spend $0 and $0.000075 can take the next call, $0.00015 + $0.0001025 cannot.
DOLLARS = 0.0002
UNPRICED, PRICED = "fake-model-without-price", "gpt-4o"


async def test_a_call_of_a_model_without_a_price_never_switches_a_subtree_dollar_budget_off(app_factory, fake_llm):
    def after(id_: str, before: str) -> dict[str, Any]:  # in order, with the prompt "hi" alone
        task = llm(id_, "root", model=PRICED, dependencies=[{"id": before}])
        task["inputs"]["include_dependency_results"] = False
        return task

    tasks = [{"id": "root", "name": "root", "budget": {"max_cost_usd": DOLLARS}}, llm("a", "root", model=UNPRICED),
             after("b", "a"), after("c", "b"), after("d", "c")]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)
        got = {t: await c.result("tasks.get", {"task_id": t}) for t in ("root", "a", "b", "c", "d")}
    assert [r["model"] for r in fake_llm.requests] == [UNPRICED, PRICED, PRICED]
    assert [got[t]["status"] for t in ("a", "b", "c", "d")] == ["completed", "completed", "completed", "failed"]
    assert got["d"]["error"].startswith("budget of task 'root' exhausted: used $0.000150 (calls of models without "
                                        "a price not included) of $0.0002;")
    assert "was not made" in got["d"]["error"] and got["d"]["usage"] is None
    # What the answers show is unchanged: a sum with an unpriced call has an unknown cost.
    assert got["a"]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                                 "cost_usd": None, "calls": 1}
    assert got["root"]["tree_usage"] == {"prompt_tokens": 30, "completion_tokens": 15, "total_tokens": 45,
                                         "cost_usd": None, "calls": 3}
    assert got["root"]["budget_remaining"] == {"tokens": None, "cost_usd": None}


async def test_a_call_of_a_model_without_a_price_never_switches_a_users_daily_dollar_budget_off(app_factory,
                                                                                                 fake_llm):
    """The known spend of the day is stored: a restarted service refuses at the same point."""
    env = llm_env(fake_llm, SERVICE_USER_DAILY_BUDGET_USD=str(DOLLARS))
    async with app_factory(env=env) as c:
        await c.result("tasks.create", [llm("a", None, model=UNPRICED, user_id="alice")])
        await c.result("tasks.create", [llm("b", None, model=PRICED, user_id="alice")])
    async with app_factory(env=env) as c:  # a restart: only the database remembers
        await c.result("tasks.create", [llm("c", None, model=PRICED, user_id="alice")])
        await c.result("tasks.create", [llm("x", None, model=PRICED, user_id="alice")])
        # A call that cannot be priced is made while the known spend is under the limit ...
        await c.result("tasks.create", [llm("y", None, model=UNPRICED, user_id="alice")])
        budget = await c.result("config.budget.get", {"user_id": "alice"}, path="/system")
        # ... and not once it is not (an admin lowers the limit to what the priced calls cost).
        await c.result("config.budget.set", {"user_id": "alice", "max_cost_usd": 0.00015}, path="/system")
        await c.result("tasks.create", [llm("z", None, model=UNPRICED, user_id="alice")])
        got = {t: await c.result("tasks.get", {"task_id": t}) for t in ("a", "b", "c", "x", "y", "z")}
        today = (await c.result("usage.get", {"user_id": "alice"}))["today"]
    assert [r["model"] for r in fake_llm.requests] == [UNPRICED, PRICED, PRICED, UNPRICED]
    assert [got[t]["status"] for t in ("a", "b", "c", "x", "y", "z")] == [
        "completed", "completed", "completed", "failed", "completed", "failed"]
    assert got["x"]["error"].startswith("budget of user 'alice' on ")
    assert "used $0.000150 (calls of models without a price not included) of $0.0002;" in got["x"]["error"]
    assert "of $0.00015; the next call (max_tokens 10, model fake-model-without-price)" in got["z"]["error"]
    assert (today["total_tokens"], today["calls"], today["cost_usd"]) == (60, 4, None)
    assert budget["remaining"] == {"tokens": None, "cost_usd": None} and budget["today"]["cost_usd"] is None


async def test_config_budget_is_for_admins(app_factory):
    async with app_factory(env={"SERVICE_JWT_SECRET": JWT_SECRET}) as c:
        alice, admin = bearer("alice"), bearer("root", ["admin"])
        error = await c.error("config.budget.set", {"user_id": "alice", "max_tokens": 5}, path="/system",
                              headers=alice)
        assert error["code"] == -32001
        await c.result("config.budget.set", {"user_id": "alice", "max_tokens": 5}, path="/system", headers=admin)
        own = await c.result("config.budget.get", {}, path="/system", headers=alice)
        assert (own["user_id"], own["max_tokens"]) == ("alice", 5)
        error = await c.error("config.budget.get", {"user_id": "bob"}, path="/system", headers=alice)
        assert error["code"] == -32001


@pytest.mark.parametrize("budget, words", [
    ("lots", "budget must be an object"), ({}, "needs max_tokens or max_cost_usd"),
    ({"max_tokens": 0}, "budget.max_tokens"), ({"max_cost_usd": -1}, "budget.max_cost_usd"),
    ({"max_tokens": 5, "on_exhausted": "pray"}, "budget.on_exhausted"),
    ({"max_tokens": 5, "on_exhausted": "downgrade"}, "needs budget.fallback_models"),
    ({"max_tokens": 5, "colour": "red"}, "unknown keys"),
])
async def test_a_bad_budget_is_refused_naming_the_field(client, budget, words):
    error = await client.error("tasks.create", [{"id": "t", "name": "t", "budget": budget}])
    assert error["code"] == -32602 and words in json.dumps(error)
    assert await client.result("tasks.get", {"task_id": "t"}) is None
    await client.result("tasks.create", [{"id": "ok", "name": "ok"}])
    error = await client.error("tasks.update", {"task_id": "ok", "budget": budget})
    assert error["code"] == -32602 and words in json.dumps(error)


@pytest.mark.parametrize("params, words", [({}, "user_id"), ({"user_id": "a", "max_tokens": "5"}, "max_tokens"),
                                           ({"user_id": "a", "max_cost_usd": 0}, "max_cost_usd"),
                                           ({"user_id": "a", "limit": 3}, "unknown params")])
async def test_config_budget_set_names_a_bad_param(client, params, words):
    error = await client.error("config.budget.set", params, path="/system")
    assert error["code"] == -32602 and words in json.dumps(error)


_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                    max_size=3), max_leaves=6)
_budget_like = st.fixed_dictionaries({}, optional={
    "max_tokens": _values | st.integers(-5, 10**16), "max_cost_usd": _values | st.floats(-1, 2e9),
    "on_exhausted": _values | st.sampled_from(["fail", "downgrade", "pause"]),
    "fallback_models": _values | st.lists(st.text(max_size=3), max_size=3)}) | _values


@hsettings(max_examples=300, deadline=None)
@given(_budget_like)
def test_the_budget_rule_accepts_exactly_the_documented_shape(value: Any) -> None:
    problem = check_budget(value)
    if value is None:
        assert problem is None
        return
    ok = (isinstance(value, dict) and set(value) <= {"max_tokens", "max_cost_usd", "on_exhausted", "fallback_models"}
          and (value.get("max_tokens") is not None or value.get("max_cost_usd") is not None)
          and (value.get("max_tokens") is None or (type(value["max_tokens"]) is int
                                                   and 1 <= value["max_tokens"] <= 10**15))
          and (value.get("max_cost_usd") is None or (type(value["max_cost_usd"]) in (int, float)
                                                     and 0 < value["max_cost_usd"] <= 1e9))
          and value.get("on_exhausted", "fail") in ("fail", "downgrade", "pause")
          and isinstance(value.get("fallback_models", []), list)
          and all(isinstance(m, str) and 0 < len(m) <= 200 for m in value.get("fallback_models", []))
          and (value.get("on_exhausted") != "downgrade" or bool(value.get("fallback_models"))))
    assert (problem is None) == ok, (value, problem)


@hsettings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional={"user_id": _values | st.text(min_size=1, max_size=5),
                                           "max_tokens": _values, "max_cost_usd": _values | st.floats(-1, 2e9),
                                           "extra": _values}))
def test_config_budget_set_params_are_read_or_refused_with_32602(params: dict[str, Any]) -> None:
    try:
        request = SetBudget.from_params(params)
    except RpcError as exc:
        assert exc.code == -32602
        return
    assert isinstance(request.user_id, str) and request.user_id == params["user_id"]
    assert request.max_tokens is None or 1 <= request.max_tokens <= 10**15
    assert request.max_cost_usd is None or 0 < request.max_cost_usd <= 1e9
    assert "extra" not in params


async def test_a_restart_cannot_overspend_a_budget(tmp_path, fake_llm):
    """kill -9 while the third call is in flight: the two answered calls were stored, so the
    restarted service's retaken attempt may make one more call (30 + 10 <= 50), not three."""
    import asyncio
    import time

    from tests.processes import Service

    fake_llm.script("[[spend]]", ["one", "two", {"content": "three", "delay": 8}, "more"])
    tasks = [{"id": "root", "name": "root", "budget": {"max_tokens": 50}},
             {**crew("c", "root", steps=6), "inputs": {"agents": [{"role": "writer"}], "max_tokens": 10,
                                                       "steps": [{"description": f"[[spend]] step {n}"}
                                                                 for n in range(6)]}}]
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0", "SERVICE_LEASE_SECONDS": "3"}
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", tasks)
        start = time.monotonic()
        while len(fake_llm.requests) < 3:  # the third call is in flight (answered in 8 s: after the kill)
            assert time.monotonic() - start < 30, "the third call never came"
            await asyncio.sleep(0.05)
        service.kill()
        service.start()
        task = await service.wait_status("c", ("failed", "completed"))
    finally:
        service.stop()
    assert task["status"] == "failed" and task["interruptions"] == 1
    assert "budget of task 'root' exhausted: used 45 of 50 tokens" in task["error"]
    assert len(fake_llm.requests) == 4  # 3 before the kill (one never answered), 1 after
    assert task["usage"]["calls"] == 3 and task["usage"]["total_tokens"] == 45


async def test_pause_parks_the_task_until_a_person_raises_the_budget_and_answers(app_factory, fake_llm):
    budget = {"max_tokens": 20, "on_exhausted": "pause"}
    tasks = [{"id": "root", "name": "root", "budget": budget},
             llm("a", "root"), llm("b", "root", dependencies=[{"id": "a"}])]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)  # answers once b waits: 15 + 10 > 20
        b = await c.wait_status("b", ("in_progress",))
        assert b["waiting"]["kind"] == "input"
        assert "budget of task 'root' exhausted: used 15 of 20 tokens" in b["waiting"]["prompt"]
        assert len(fake_llm.requests) == 1

        await c.result("tasks.respond", {"task_id": "b", "value": "go on"})  # not raised: it waits again
        again = await next_wait(c, "b", b["waiting"]["since"])
        assert "used 15 of 20 tokens" in again["waiting"]["prompt"] and len(fake_llm.requests) == 1

        await c.result("tasks.update", {"task_id": "root", "budget": {**budget, "max_tokens": 100}})
        await c.result("tasks.respond", {"task_id": "b", "value": "raised"})
        b = await c.wait_status("b", ("completed", "failed"))
    assert b["status"] == "completed", b["error"]
    assert len(fake_llm.requests) == 2 and b["usage"]["total_tokens"] == 15


async def next_wait(c: Any, task_id: str, since: str) -> dict[str, Any]:
    """The task once parked on a wait that began after `since` (the first answered, the budget
    still short)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + EVENT_WAIT
    while True:
        task = await c.result("tasks.get", {"task_id": task_id})
        if task["waiting"] is not None and task["waiting"]["since"] != since:
            return task
        assert asyncio.get_running_loop().time() < deadline, f"{task_id} never waited again: {task}"
        await asyncio.sleep(0.02)


async def arrived(fake: Any, count: int) -> None:
    """Until the fake LLM has received `count` requests (the last may be held at a gate)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + EVENT_WAIT
    while len(fake.requests) < count:
        assert asyncio.get_running_loop().time() < deadline, f"only {len(fake.requests)} of {count} calls came"
        await asyncio.sleep(0.02)


def held_crew(id_: str, parent: str | None, steps: int, **extra: Any) -> dict[str, Any]:
    """A crew whose second call waits at the fake LLM's gate 'second' (later calls do not)."""
    task = crew(id_, parent, steps, **extra)
    task["inputs"]["steps"][1]["description"] = "[[held]] step 1"
    return task


async def test_pause_parks_a_crew_mid_way_and_every_call_counts_once(app_factory, fake_llm):
    # 40 tokens, calls of max_tokens 10 that use 15: calls at 0, 15 and 30 fit, the fourth
    # (45 + 10 > 40) parks the crew after three calls. Raised to 70, the attempt starts over and
    # the stored 45 still count: two calls (45, 60) fit, the third parks it again. Raised to
    # 1000, its four calls run. A change to the tree while its second call is in flight (the run
    # is re-read from the database) must not make any call count twice.
    fake_llm.script("[[held]]", [{"content": "second", "hold": "second"}, "later"])
    budget = {"max_tokens": 40, "on_exhausted": "pause"}
    tasks = [{"id": "root", "name": "root", "budget": budget, "user_id": "alice"},
             held_crew("c", "root", steps=4, user_id="alice")]
    async with app_factory(env=llm_env(fake_llm, SERVICE_CREATE_WAIT_TIMEOUT="0")) as c:
        await c.result("tasks.create", tasks)
        await arrived(fake_llm, 2)
        await c.result("tasks.update", {"task_id": "root", "name": "renamed while c calls"})
        await c.result("tasks.get", {"task_id": "root"})  # the run's re-read is under way or done
        fake_llm.release("second")
        parked = await next_wait(c, "c", "")
        assert "used 45 of 40 tokens" in parked["waiting"]["prompt"] and len(fake_llm.requests) == 3
        assert parked["usage"]["calls"] == 3 and parked["usage"]["total_tokens"] == 45

        await c.result("tasks.update", {"task_id": "root", "budget": {**budget, "max_tokens": 70}})
        await c.result("tasks.respond", {"task_id": "c", "value": "raised to 70"})
        parked = await next_wait(c, "c", parked["waiting"]["since"])
        assert "used 75 of 70 tokens" in parked["waiting"]["prompt"] and len(fake_llm.requests) == 5
        assert parked["usage"]["total_tokens"] == 75

        await c.result("tasks.update", {"task_id": "root", "budget": {**budget, "max_tokens": 1000}})
        await c.result("tasks.respond", {"task_id": "c", "value": "raised to 1000"})
        task = await c.wait_status("c", ("completed", "failed"))
        root = await c.result("tasks.get", {"task_id": "root"})
        day = (await c.result("usage.get", {"user_id": "alice"}))["today"]
    calls = len(fake_llm.requests)
    assert task["status"] == "completed", task["error"]
    assert calls == 9  # 3 + 2 + 4: each resumed attempt starts over
    for usage in (task["usage"], root["tree_usage"], day):
        assert (usage["calls"], usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) \
            == (calls, 10 * calls, 5 * calls, 15 * calls)
    assert task["usage"]["cost_usd"] == pytest.approx(day["cost_usd"]) and day["cost_usd"] > 0
    assert root["budget_remaining"]["tokens"] == 1000 - 15 * calls


async def test_a_change_to_the_tree_while_a_task_calls_counts_each_call_once(app_factory, fake_llm):
    # The run is re-read from the database while the crew's second call is in flight; the task's
    # usage stored until then must not be added again when the attempt ends (it was: 5 of 4 calls).
    fake_llm.script("[[held]]", [{"content": "second", "hold": "second"}, "later"])
    tasks = [{"id": "root", "name": "root"}, held_crew("c", "root", steps=4)]
    async with app_factory(env=llm_env(fake_llm, SERVICE_CREATE_WAIT_TIMEOUT="0")) as c:
        await c.result("tasks.create", tasks)
        await arrived(fake_llm, 2)
        await c.result("tasks.update", {"task_id": "root", "budget": {"max_tokens": 500}})  # raised mid-run
        await c.result("tasks.get", {"task_id": "root"})  # the run's re-read is under way or done
        fake_llm.release("second")
        task = await c.wait_status("c", ("completed", "failed"))
        root = await c.result("tasks.get", {"task_id": "root"})
    assert task["status"] == "completed", task["error"]
    assert len(fake_llm.requests) == 4
    assert task["usage"]["calls"] == 4 and task["usage"]["total_tokens"] == 60
    assert root["tree_usage"]["total_tokens"] == 60 and root["budget_remaining"]["tokens"] == 440


def take_over(c: Any, task_id: str) -> None:
    """What another instance's claim does to a task whose lease it found expired: a new epoch
    and owner (the claim's fencing token), a lease that runs for an hour."""
    from sqlalchemy import update

    from taskgrove.storage.clock import iso_in
    from taskgrove.storage.models import tasks_table as T

    c.execute(update(T).where(T.c.id == task_id).values(lease_epoch=T.c.lease_epoch + 1, lease_owner="elsewhere",
                                                        lease_expires_at=iso_in(3600)))


async def test_an_attempt_that_lost_its_task_makes_no_more_calls_and_counts_each_call_once(app_factory, fake_llm):
    # While the crew's second call is in flight, another instance takes the task over. The stale
    # attempt's second call still counts (it was made and paid for), once; its third is not made.
    import asyncio

    fake_llm.script("[[held]]", [{"content": "second", "hold": "second"}, "later"])
    env = llm_env(fake_llm, SERVICE_CREATE_WAIT_TIMEOUT="0", SERVICE_LEASE_SECONDS="600")  # no renewal meanwhile
    async with app_factory(env=env) as c:
        await c.result("tasks.create", [held_crew("c", None, steps=4)])
        await arrived(fake_llm, 2)
        engine = c.services.engine
        await engine.repo.transact(take_over, "c")
        fake_llm.release("second")
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while "c" in engine.running:  # the stale attempt ends (its outcome is not written)
            assert asyncio.get_running_loop().time() < deadline, "the stale attempt never ended"
            await asyncio.sleep(0.02)
        task = await engine.repo.get("c")
    assert len(fake_llm.requests) == 2
    assert task["usage"]["calls"] == 2 and task["usage"]["total_tokens"] == 30
    assert (task["status"], task["lease_owner"]) == ("in_progress", "elsewhere")


async def test_a_crew_parked_by_its_budget_survives_a_kill_and_counts_every_call_once(tmp_path, db_url, fake_llm):
    """A real `taskgrove serve` (each backend): the crew parks after three calls; kill -9; the restarted service
    still holds the wait and the stored 45 tokens; raised and answered, the crew starts over and
    completes: 3 + 4 calls, the same in the task's usage, the tree's and the user's day."""
    import asyncio
    import time

    from tests.processes import Service

    env = {"SERVICE_DATABASE_URL": db_url, "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_LEASE_SECONDS": "3",
           "SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0"}
    budget = {"max_tokens": 40, "on_exhausted": "pause"}
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", [{"id": "root", "name": "root", "budget": budget, "user_id": "gus"},
                                           crew("c", "root", steps=4, user_id="gus")])
        start = time.monotonic()
        while (await service.task("c"))["waiting"] is None:
            assert time.monotonic() - start < 30, "the crew never parked"
            await asyncio.sleep(0.05)
        service.kill()
        service.start()
        parked = await service.task("c")
        assert parked["waiting"]["kind"] == "input" and parked["usage"]["total_tokens"] == 45
        await service.rpc("tasks.update", {"task_id": "root", "budget": {**budget, "max_tokens": 1000}})
        await service.rpc("tasks.respond", {"task_id": "c", "value": "raised"})
        task = await service.wait_status("c", ("completed", "failed"))
        root = await service.task("root")
        day = (await service.rpc("usage.get", {"user_id": "gus"}))["today"]
    finally:
        service.stop()
    assert task["status"] == "completed", task["error"]
    calls = len(fake_llm.requests)
    assert calls == 7
    for usage in (task["usage"], root["tree_usage"], day):
        assert (usage["calls"], usage["total_tokens"]) == (calls, 15 * calls)
