"""Property tests (hypothesis) of every new input of triggers (issue 49): the params of the
`triggers.*` methods and the payloads `events.emit` hands to triggers, against a real server on
every backend (the harness of tests/test_fuzz_inputs.py), and the flow-control decisions
themselves (agent/engine/trigger_policy.py) over any arrival of events.

After every call: no 5xx, no -32603, a valid envelope, nothing stored on an error, never a
trigger on another user's template, and bob's trigger untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgrove.agent.engine.trigger_policy import decide
from tests.conftest import BACKENDS
from tests.test_fuzz_inputs import (EXAMPLES, FUZZ, SECRET, World, check_envelope, encode, fuzz_database, ids,
                                    json_values, started_world)

pytestmark = pytest.mark.xdist_group("test_triggers_fuzz")

METHODS = ["triggers.create", "triggers.get", "triggers.list", "triggers.update", "triggers.delete",
           "triggers.runs", "events.emit"]
SECONDS = st.one_of(st.sampled_from([0, 0.01, 1, 5, 604800, 604801, -1, 1e308, True, "5"]), st.floats())
VALUES = {
    "task_id": st.sampled_from(["a1", "a2", "b1", "missing"]),
    "event": st.sampled_from(["ticket", "e", "", "x" * 300, "\x00"]),
    "match": st.one_of(st.dictionaries(st.sampled_from(["k", "q"]), json_values, max_size=2), json_values),
    "key": st.sampled_from(["k", "ticket_id", "", "x" * 300]),
    "debounce": st.one_of(st.fixed_dictionaries({"seconds": SECONDS}, optional={"max_wait_seconds": SECONDS}),
                          json_values),
    "batch": st.one_of(st.fixed_dictionaries({"size": st.integers(-2, 2000)}, optional={"seconds": SECONDS}),
                       json_values),
    "singleton": st.sampled_from(["skip", "queue", "replace", "SKIP", ""]),
    "cancel_on": st.sampled_from(["ticket.closed", "ticket", "", None]),
    "enabled": st.booleans(),
    "user_id": st.sampled_from(["alice", "bob"]),
    "limit": st.integers(-2, 2000),
    "offset": st.integers(-2, 10),
}
EXISTING = "__EXISTING_TRIGGER__"  # replaced by the id of a stored trigger of alice's
BOBS = "__BOBS_TRIGGER__"


@st.composite
def trigger_params(draw: Any, method: str) -> Any:
    """Mostly plausible params, each field sometimes replaced by anything at all."""
    params: dict[str, Any] = {}
    if method == "events.emit":
        params["name"] = draw(st.sampled_from(["ticket", "ticket.closed", "e"]))
        params["payload"] = draw(st.one_of(st.fixed_dictionaries({"k": json_values, "ticket_id": json_values}),
                                           json_values))
        return draw(st.one_of(st.just(params), st.just(params), json_values))
    if method == "triggers.create":
        params["task_id"] = draw(st.sampled_from(["a1", "a1", "a2", "b1", "missing"]))
        params["event"] = draw(VALUES["event"])
    elif method != "triggers.list":
        params["trigger_id"] = draw(st.sampled_from([EXISTING, EXISTING, EXISTING, BOBS, "missing"]))
    listing = ["user_id", "task_id", "event", "limit", "offset"]
    fields = ["event", "match", "key", "debounce", "batch", "singleton", "cancel_on", "enabled"]
    if method == "triggers.runs":
        fields = ["key", "limit"]
    keys = draw(st.lists(st.sampled_from(listing if method == "triggers.list" else fields), max_size=4, unique=True))
    if not draw(st.integers(0, 9)):
        keys.append(draw(st.sampled_from(["id", "color", *VALUES])))
    for key in keys:
        good = VALUES.get(key, ids)
        params[key] = draw(st.one_of(good, good, good, good, ids, json_values))
    return draw(st.one_of(st.just(params), st.just(params), st.just(params), json_values, st.none()))


@st.composite
def trigger_calls(draw: Any) -> dict[str, Any]:
    method = draw(st.sampled_from(METHODS))
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.integers(0, 1000)), "method": method}
    params = draw(trigger_params(method))
    if params is not None:
        message["params"] = params
    return message


@pytest.fixture(scope="module", params=BACKENDS)
def trigger_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A server of its own with the loops off: no run starts in the background of an example (the
    inbox rows an emit writes are still written)."""
    with fuzz_database(request.param, tmp_path_factory) as url, started_world({
            "SERVICE_DATABASE_URL": url, "SERVICE_JWT_SECRET": SECRET, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
            "SERVICE_ENABLE_SCHEDULER": "false"}) as world:
        world.bob_rows = world.run(world.server.rpc("triggers.create", {"task_id": "b1", "event": "ticket",
                                                                        "key": "k"}, world.bob))
        yield world


def _all_triggers(c: Any) -> list[dict[str, Any]]:
    from taskgrove.storage import trigger_store

    return trigger_store.list_triggers(c, None, None, None, 10_000, 0)


async def post_trigger_call(world: World, message: dict[str, Any]) -> None:
    repo = world.server.services.repo
    stored = [t for t in await repo.transact(_all_triggers) if t["user_id"] == "alice"]
    if not stored:  # something for get, update, runs and delete to work on
        await world.server.rpc("triggers.create", {"task_id": "a1", "event": "ticket", "key": "ticket_id",
                                                   "cancel_on": "ticket.closed"}, world.alice)
        stored = [t for t in await repo.transact(_all_triggers) if t["user_id"] == "alice"]
    before = len(stored)
    body = encode(message).replace(EXISTING.encode(), stored[0]["id"].encode())
    body = body.replace(BOBS.encode(), world.bob_rows["id"].encode())
    response = await world.server.http.post("/tasks", content=body, headers={**world.alice,
                                                                             "Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    answer = response.json()
    check_envelope(answer)
    after = await repo.transact(_all_triggers)
    mine = [t for t in after if t["user_id"] == "alice"]
    if "error" in answer:
        assert len(mine) == before, f"stored on an error: {answer}"
    bobs = [t for t in after if t["user_id"] == "bob"]
    assert len(bobs) == 1 and bobs[0]["updated_at"] == world.bob_rows["updated_at"], "bob's trigger changed"
    assert bobs[0]["matched"] == 0, "alice's event reached bob's trigger"
    assert {t["user_id"] for t in after} <= {"alice", "bob"}


@settings(FUZZ, max_examples=3 * EXAMPLES)
@given(message=trigger_calls())
def test_fuzz_params_of_the_trigger_methods_and_emitted_payloads(trigger_world: World, message: dict[str, Any]) -> None:
    trigger_world.run(post_trigger_call(trigger_world, message))


# --- the decisions ---------------------------------------------------------------------------------

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
POLICIES = st.one_of(
    st.just({}),
    st.builds(lambda s, m: {"debounce": {"seconds": s, "max_wait_seconds": m}},
              st.floats(0.01, 100), st.one_of(st.none(), st.floats(100, 1000))),
    st.builds(lambda n, s: {"batch": {"size": n, "seconds": s}}, st.integers(1, 50), st.floats(0.01, 100)),
)


@settings(max_examples=EXAMPLES * 3, deadline=None, derandomize=True, database=None)
@given(policy=POLICIES, gaps=st.lists(st.floats(0, 50), min_size=0, max_size=60), later=st.floats(0, 2000),
       singleton=st.sampled_from([None, "skip", "queue", "replace"]), running=st.booleans())
def test_any_arrival_of_events_is_decided_by_the_rules_of_its_policy(
        policy: dict[str, Any], gaps: list[float], later: float, singleton: str | None, running: bool) -> None:
    moment, rows = START, []
    for n, gap in enumerate(gaps):
        moment += timedelta(seconds=gap)
        rows.append({"seq": n, "event_id": f"e{n}", "created_at": moment.isoformat(), "payload": {"n": n}})
    now = moment + timedelta(seconds=later)
    trigger = {**policy, "singleton": singleton}
    plan = decide(trigger, rows, ["r"] if running else [], now)
    json.dumps(plan._asdict())  # plain data
    if not rows:
        assert plan.action == "wait" and not plan.taken
        return
    if plan.action == "wait":
        assert plan.due_at is not None and datetime.fromisoformat(plan.due_at) > now
        return
    if running and singleton == "queue":
        assert plan.action == "hold" and not plan.taken
        return
    taken = plan.taken
    assert taken == rows[:len(taken)], "always the oldest events, in their order"
    if "debounce" in policy:
        assert taken == rows  # every waiting event, the last one's payload goes to the run
        quiet = now - datetime.fromisoformat(rows[-1]["created_at"]) >= timedelta(seconds=policy["debounce"]["seconds"])
        most = policy["debounce"]["max_wait_seconds"]
        waited = most is not None and now - datetime.fromisoformat(rows[0]["created_at"]) >= timedelta(seconds=most)
        assert quiet or waited
    elif "batch" in policy:
        assert len(taken) == min(len(rows), policy["batch"]["size"])
    else:
        assert len(taken) == 1
    expected = {"skip": "skip", "replace": "replace"}.get(singleton or "", "start") if running else "start"
    assert plan.action == expected
    if plan.action == "replace":
        assert plan.running == ("r",)
