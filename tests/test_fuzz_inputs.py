"""Our own input fuzzer (issue 18, item 8), against a real server (uvicorn in this process).

Hypothesis generates JSON-RPC envelopes and batches with params for every /tasks and /system
method, task trees, GraphQL documents and variables, and /ws and graphql-transport-ws frames,
including the values that broke the service before: NaN and Infinity tokens, numbers that
overflow (1e400), lone surrogates, wrong types, deep nesting. After every example:

* no HTTP 5xx and no -32603 (an internal error is never the answer to a client's input), and every
  answer is JSON: a valid JSON-RPC envelope on /tasks and /system (HTTP 204 only when nothing was
  to be answered), a GraphQL-shaped body on /graphql;
* nothing stored on an error (a single call that answers an error leaves the task count as it was);
* `tasks.list` still answers, for the caller and for another user;
* the other user's tasks are byte-identical (the fuzzing caller is a plain user, JWT on);
* a WebSocket either answers (and still answers a ping) or is closed with a close frame.

The number of examples is bounded (TASKGROVE_FUZZ_EXAMPLES, default 100 per strategy) so the file
runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.conftest import BACKENDS, create_postgres_database, drop_postgres_database
from tests.deadlines import EVENT_WAIT
from tests.test_ws import Live, live_server


# One worker runs this module (make test's --dist loadgroup): its module-scoped services are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_fuzz_inputs")

EXAMPLES = int(os.environ.get("TASKGROVE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SECRET = "fuzz-secret-0123456789abcdef0123456789abcdef"
BIG = "__OVERFLOW__"  # replaced by the number 1e400 in the request text

TASK_METHODS = ["tasks.create", "tasks.get", "tasks.detail", "tasks.update", "tasks.delete", "tasks.copy",
                "tasks.clone", "tasks.list", "tasks.children", "tasks.tree", "tasks.execute", "execute_task_tree",
                "tasks.running.list", "tasks.running.status", "tasks.running.count", "tasks.cancel",
                "tasks.running.cancel", "tasks.generate", "tasks.respond", "events.emit", "tasks.logs",
                # the directory of agents (docs/agents.md)
                "agents.add", "agents.get", "agents.list", "agents.refresh", "agents.remove"]
SYSTEM_METHODS = ["system.health", "system.executors", "config.llm_key.set", "config.llm_key.get",
                  "config.llm_key.delete", "examples.status"]


# --- values -------------------------------------------------------------------------------------

text = st.text(alphabet=st.characters(categories=["L", "N", "P", "S", "Z", "Cs", "Cc"]), max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.just(BIG), text,
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=12)
# Task ids: mostly real ones (the caller's and another user's), then the known troublemakers.
TROUBLE = st.sampled_from(["\ud800", "a\udc00", BIG, float("nan"), "x" * 300, [], True, "\x00"])
ids = st.one_of(st.sampled_from(["a1", "a2", "b1", "b2", "missing", ""]), TROUBLE, TROUBLE, text, json_values)


def encode(value: Any) -> bytes:
    """JSON text as a hostile client writes it: NaN/Infinity tokens, \\ud800 escapes, 1e400."""
    return json.dumps(value, allow_nan=True, ensure_ascii=True).replace(f'"{BIG}"', "1e400").encode()


@st.composite
def task_trees(draw: Any) -> Any:
    size = draw(st.integers(min_value=0, max_value=5))
    tasks = []
    for index in range(size):
        task: dict[str, Any] = {"name": draw(st.one_of(st.just(f"t{index}"), text, json_values))}
        if draw(st.booleans()):
            task["id"] = draw(st.one_of(st.just(f"n{index}"), ids))
        if index and draw(st.booleans()):
            task["parent_id"] = draw(st.one_of(st.just(f"n{index - 1}"), ids))
        for field in ("inputs", "params", "result", "priority", "progress", "dependencies", "user_id",
                      "status", "schemas", "custom"):
            if draw(st.integers(0, 5)) == 0:
                task[field] = draw(json_values)
        tasks.append(task)
    return draw(st.sampled_from([{"tasks": tasks}, tasks, tasks[0] if tasks else {}, {"tasks": draw(json_values)}]))


PARAM_NAMES = ["id", "parent_id", "user_id", "status", "limit", "offset", "task_ids", "children", "origin_type",
               "reset_fields", "save", "recursive", "force", "api_key", "provider", "inputs", "result", "progress",
               "name", "dependencies", "use_streaming", "link_task_ids", "priority", "webhook_config",
               "card_url", "agent_id", "tags", "headers", "credential", "shared", "concurrency", "skill", "tag",
               "health", "cursor", "accept"]


def params_for(method: str) -> Any:
    extra = st.dictionaries(st.sampled_from(PARAM_NAMES), st.one_of(ids, json_values), max_size=3)
    common = st.builds(lambda task_id, more: {**({"task_id": task_id} if task_id is not None else {}), **more},
                       st.one_of(ids, ids, st.none()), extra)
    if method == "tasks.create":
        return st.one_of(task_trees(), json_values)
    return st.one_of(common, json_values, st.none())


@st.composite
def envelopes(draw: Any, methods: list[str]) -> Any:
    method = draw(st.one_of(st.sampled_from(methods), st.sampled_from(methods), json_values))
    message: dict[str, Any] = {}
    if draw(st.integers(0, 9)):  # mostly well-formed envelopes, so that the params reach the methods
        message["jsonrpc"] = "2.0" if draw(st.integers(0, 5)) else draw(json_values)
    if draw(st.integers(0, 4)):
        message["id"] = draw(st.one_of(st.integers(), st.text(max_size=5), json_values))
    message["method"] = method
    if draw(st.integers(0, 5)):
        message["params"] = draw(params_for(method if isinstance(method, str) else ""))
    return message


def bodies(methods: list[str]) -> Any:
    one = envelopes(methods)
    return st.one_of(
        one.map(encode),
        st.lists(one, max_size=4).map(encode),
        json_values.map(encode),
        st.sampled_from([b"", b"[", b"[" * 3000, b'{"jsonrpc":"2.0","id":1e400,"method":"tasks.list"}', b"\xff"]),
    )


# --- the world: one server, two users -------------------------------------------------------------

@dataclass
class World:
    loop: asyncio.Runner
    server: Live
    alice: dict[str, str]
    bob: dict[str, str]
    bob_rows: Any

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)


@contextlib.contextmanager
def started_world(env: dict[str, str]) -> Iterator[World]:
    """A live server with two users, alice and bob, each owning a stored tree a1/a2 and b1/b2."""
    config = Settings.from_env(env)
    alice = {"Authorization": "Bearer " + mint_token(config, "alice")}
    bob = {"Authorization": "Bearer " + mint_token(config, "bob")}
    runner = asyncio.Runner()
    context = live_server(config)
    server = runner.run(context.__aenter__())
    try:
        for who, prefix in ((alice, "a"), (bob, "b")):
            runner.run(server.rpc("tasks.create", {"tasks": [
                {"id": f"{prefix}1", "name": "root", "inputs": {"k": [1, 2.5, "x"]}},
                {"id": f"{prefix}2", "name": "child", "parent_id": f"{prefix}1"}]}, who))
        runner.run(server.wait_status("b2", ("completed",), bob))
        yield World(runner, server, alice, bob, None)
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """On every backend: some inputs only hurt PostgreSQL (a NUL character in an id)."""
    with fuzz_database(request.param, tmp_path_factory) as url, started_world({
            "SERVICE_DATABASE_URL": url,
            "SERVICE_API_PROTOCOL": "graphql", "SERVICE_JWT_SECRET": SECRET, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
            "SERVICE_MAX_TREE_TASKS": "50", "SERVICE_SECRET_KEY": "fuzz-key-secret"}) as world:
        world.bob_rows = world.run(bob_snapshot(world))
        yield world


@contextlib.contextmanager
def fuzz_database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of the module's own (a PostgreSQL one is dropped afterwards)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"
        return
    url = asyncio.run(create_postgres_database())  # a sync fixture: no event loop runs here
    try:
        yield url
    finally:
        asyncio.run(drop_postgres_database(url))


async def bob_snapshot(world: World) -> Any:
    return sorted(json.dumps(r, sort_keys=True, default=str)
                  for r in await world.server.services.repo.list(user_id="bob", limit=1000))


async def task_count(world: World) -> int:
    return await world.server.services.repo.count()


async def invariants_hold(world: World) -> None:
    for who in (world.alice, world.bob):
        answer = await world.server.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.list",
                                                              "params": {"limit": 1000}}, headers=who)
        assert answer.status_code == 200 and isinstance(answer.json()["result"], list), answer.text
    assert await bob_snapshot(world) == world.bob_rows, "another user's tasks changed"


def check_envelope(answer: Any) -> None:
    assert isinstance(answer, dict), answer
    assert answer.get("jsonrpc") == "2.0"
    id_ = answer.get("id")
    assert id_ is None or isinstance(id_, str) or (isinstance(id_, (int, float)) and not isinstance(id_, bool)
                                                   and math.isfinite(id_))
    assert ("result" in answer) != ("error" in answer), answer
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int) and isinstance(answer["error"]["message"], str)
        assert answer["error"]["code"] != -32603, f"an internal error for a client's input: {answer}"
        for leak in ("Traceback", "codec can't", "surrogates not allowed", "pydantic", "Error:"):
            assert leak not in json.dumps(answer["error"]), answer


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def sent_ids(body: bytes) -> list[Any] | None:
    """The ids an answer to `body` must echo: each request's own when valid, else null; None when
    the body is not JSON (nothing to echo): a lone surrogate escape anywhere makes it no JSON for
    the service (storage.jsonvalues.loads)."""
    try:  # NaN and Infinity are no JSON (RFC 8259) for the service either
        payload = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # no JSON, or nested past what the service reads
        return None
    if re.search("[\ud800-\udfff]", json.dumps(payload, ensure_ascii=False)):
        return None  # (json.loads joins the pairs: what is left of a surrogate is alone)
    requests = payload if isinstance(payload, list) else [payload]
    return [r.get("id") if isinstance(r, dict) and valid_id(r.get("id")) else None for r in requests]


def valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, int) or (
        isinstance(value, str) and not any("\ud800" <= c <= "\udfff" for c in value))


def check_ids(body: bytes, answer: Any) -> None:
    """Each answer carries the id of its request (null only when that id was unusable, or the body
    was no JSON at all)."""
    expected = sent_ids(body)
    answers = answer if isinstance(answer, list) else [answer]
    for item in answers:
        if item.get("error", {}).get("code") == -32700:
            continue
        if expected is None:
            assert item["id"] is None, item
            continue
        if isinstance(answer, list) or len(expected) == 1:
            assert item["id"] in expected, f"id {item['id']!r} is not one of the request's {expected!r}"


async def post_rpc(world: World, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
    before = await task_count(world)
    response = await world.server.http.post(path, content=body, headers={
        **world.alice, "Content-Type": "application/json", **(headers or {})})
    assert response.status_code < 500, response.text
    if response.status_code == 204:
        assert response.content == b""
    else:
        answer = response.json()
        if isinstance(answer, list):
            assert answer, "an empty batch answer must be HTTP 204"
            for item in answer:
                check_envelope(item)
        else:
            check_envelope(answer)
            if "error" in answer:
                assert await task_count(world) == before, f"stored on an error: {answer}"
        check_ids(body, answer)
    await invariants_hold(world)


@FUZZ
@given(body=bodies(TASK_METHODS))
def test_fuzz_tasks_endpoint(world: World, body: bytes) -> None:
    world.run(post_rpc(world, "/tasks", body))


@FUZZ
@given(body=bodies(SYSTEM_METHODS))
def test_fuzz_system_endpoint(world: World, body: bytes) -> None:
    world.run(post_rpc(world, "/system", body))


# --- Content-Type --------------------------------------------------------------------------------

JSON_TYPES = ("application/json", "application/json-rpc", "application/jsonrequest")
content_types = st.one_of(
    st.sampled_from(["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain",
                     "text/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", "",
                     "application/problem+json", "application/jsonx", "json", ";", "application/json-rpc"]),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=30))


def refusal_codes(path: str, body: bytes, count: int) -> list[int]:
    """The code of each answer to a body not declared as JSON: -32600 for our own methods; on `/`,
    -32005 (A2A ContentTypeNotSupportedError, as the A2A TCK wants) for any other call, or for a
    body that cannot be read."""
    if path != "/":
        return [-32600] * count
    try:
        payload = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return [-32005] * count
    calls = payload if isinstance(payload, list) and payload else [payload]
    ours = set(TASK_METHODS) | {"tasks.execute", "cancel"}
    return [-32600 if isinstance(c, dict) and isinstance(c.get("method"), str) and c["method"] in ours else -32005
            for c in calls]


@FUZZ
@given(path=st.sampled_from(["/", "/tasks", "/system"]), content_type=content_types, body=bodies(TASK_METHODS))
def test_fuzz_content_types(world: World, path: str, content_type: str, body: bytes) -> None:
    """A body declared as anything but JSON is HTTP 415 with -32600 naming application/json (-32005
    for A2A calls on `/`), the request's ids echoed when the body parses; nothing runs. A JSON type is answered as usual.
    (A body nested too deeply is -32700 before any of this, whatever its type.)"""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in JSON_TYPES or media.endswith("+json"):
        world.run(post_rpc(world, path, body, {"Content-Type": content_type}))
        return

    async def refused() -> None:
        before = await task_count(world)
        response = await world.server.http.post(path, content=body,
                                                headers={**world.alice, "Content-Type": content_type})
        answer = response.json()
        if response.status_code == 200:  # the body limits of every route come first (agent/surfaces/bodylimit.py)
            assert answer["error"]["code"] == -32700 and "nested deeper" in answer["error"]["data"], answer
            return
        assert response.status_code == 415, response.text
        items = answer if isinstance(answer, list) else [answer]
        for item, code in zip(items, refusal_codes(path, body, len(items))):
            check_envelope(item)
            assert item["error"]["code"] == code and "application/json" in item["error"]["message"], item
        check_ids(body, answer)
        assert await task_count(world) == before

    world.run(refused())


@st.composite
def method_calls(draw: Any) -> tuple[str, bytes]:
    """A well-formed envelope, so that every example reaches a method with fuzzed params."""
    path, method = draw(st.sampled_from([("/tasks", m) for m in TASK_METHODS] + [("/system", m) for m in SYSTEM_METHODS]))
    return path, encode({"jsonrpc": "2.0", "id": draw(st.integers(0, 1000)), "method": method,
                         "params": draw(params_for(method))})


@settings(FUZZ, max_examples=2 * EXAMPLES)
@given(call=method_calls())
def test_fuzz_params_of_every_method(world: World, call: tuple[str, bytes]) -> None:
    world.run(post_rpc(world, *call))


# --- schedules -----------------------------------------------------------------------------------

SCHEDULE_METHODS = ["schedules.create", "schedules.get", "schedules.list", "schedules.update",
                    "schedules.delete", "schedules.trigger"]
SCHEDULE_VALUES = {
    "task_id": st.sampled_from(["a1", "a2", "b1", "missing"]),
    "schedule_id": st.sampled_from(["missing", ""]),
    "cron": st.sampled_from(["* * * * *", "0 9 * * 1-5", "*/5 * * * *", "61 * * * *", "0 0 30 2 *", "* * * *",
                             "@daily", "0 0 * * * *", "a b c d e", "0 0 L * *", "0 0 1W * *"]),
    "interval_seconds": st.one_of(st.sampled_from([1, 60, 0.5, 0, -1, 1e308]), st.floats()),
    "timezone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Mars/Base", "../etc", "/etc/passwd",
                                 "Europe", "\x00", "EST5EDT", "Etc/GMT+14"]),
    "enabled": st.booleans(),
    "max_runs": st.integers(-3, 2**40),
    "start_at": st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "9999-12-31T23:59:59+14:00",
                                 "0001-01-01T00:00:00-12:00", "yesterday", "2026-13-01T00:00:00Z"]),
    "end_at": st.sampled_from(["2027-01-01T00:00:00Z", "2020-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00"]),
    "overlap": st.sampled_from(["skip", "allow", "SKIP", ""]),
    "catch_up": st.sampled_from(["latest", "none", "all"]),
    "webhook_config": st.sampled_from([{"url": "http://127.0.0.1:9/hook"}, {"url": "ftp://x"}, {}, "x"]),
    "user_id": st.sampled_from(["alice", "bob"]),
    "limit": st.integers(-2, 2000),
    "offset": st.integers(-2, 10),
}


EXISTING = "__EXISTING_SCHEDULE__"  # replaced by the id of a stored schedule of alice's, when there is one


@st.composite
def schedule_params(draw: Any, method: str) -> Any:
    """Mostly plausible params (so that most examples reach the checks past the first), each field
    sometimes replaced by anything at all."""
    params: dict[str, Any] = {}
    if method == "schedules.create":
        params["task_id"] = draw(st.sampled_from(["a1", "a1", "a1", "a2", "b1", "missing"]))
        timing = draw(st.sampled_from(["cron", "interval_seconds", "both", "neither"]))
        for key in (("cron", "interval_seconds") if timing == "both" else () if timing == "neither" else (timing,)):
            params[key] = draw(SCHEDULE_VALUES[key])
    elif method != "schedules.list":
        params["schedule_id"] = draw(st.sampled_from([EXISTING, EXISTING, EXISTING, "missing"]))
    listing = ["user_id", "task_id", "limit", "offset"]
    fields = [k for k in SCHEDULE_VALUES if k not in ("schedule_id", "user_id", "limit", "offset", "task_id")]
    keys = draw(st.lists(st.sampled_from(listing if method == "schedules.list" else fields), max_size=3,
                         unique=True))
    if not draw(st.integers(0, 9)):
        keys.append(draw(st.sampled_from(["id", "color", *SCHEDULE_VALUES])))
    for key in keys:
        good = SCHEDULE_VALUES.get(key, ids)
        params[key] = draw(st.one_of(good, good, good, good, good, ids, json_values))
    return draw(st.one_of(st.just(params), st.just(params), st.just(params), json_values, st.none()))


@pytest.fixture(scope="module")
def schedule_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A server of its own with the scheduler off: no run may start in the background of an example."""
    with started_world({
            "SERVICE_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'schedules.db'}",
            "SERVICE_JWT_SECRET": SECRET, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
            "SERVICE_ENABLE_SCHEDULER": "false"}) as world:
        yield world


async def post_schedule_call(world: World, message: dict[str, Any]) -> None:
    stored = await world.server.services.repo.transact(_all_schedules)
    if not stored:  # something for get, update, trigger and delete to work on
        await world.server.rpc("schedules.create", {"task_id": "a1", "interval_seconds": 60}, world.alice)
        stored = await world.server.services.repo.transact(_all_schedules)
    before = len(stored)
    body = encode(message).replace(EXISTING.encode(), (stored[0]["id"] if stored else "missing").encode())
    response = await world.server.http.post("/tasks", content=body, headers={**world.alice,
                                                                             "Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    answer = response.json()
    check_envelope(answer)
    after = await world.server.services.repo.transact(_all_schedules)
    if "error" in answer:
        assert len(after) == before, f"stored on an error: {answer}"
    assert all(row["user_id"] == "alice" for row in after), "a schedule on another user's template"


def _all_schedules(c: Any) -> list[dict[str, Any]]:
    from taskgrove.storage import schedule_store

    return schedule_store.list_schedules(c, None, None, 10_000, 0)


@st.composite
def schedule_calls(draw: Any) -> dict[str, Any]:
    method = draw(st.sampled_from(SCHEDULE_METHODS))
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.integers(0, 1000)), "method": method}
    params = draw(schedule_params(method))
    if params is not None:
        message["params"] = params
    return message


@settings(FUZZ, max_examples=3 * EXAMPLES)
@given(message=schedule_calls())
def test_fuzz_params_of_the_schedule_methods(schedule_world: World, message: dict[str, Any]) -> None:
    """No 5xx, no -32603, nothing stored on an error, never a schedule on another user's template."""
    schedule_world.run(post_schedule_call(schedule_world, message))


# --- GraphQL ------------------------------------------------------------------------------------

FIELDS = st.lists(st.sampled_from(["id", "name", "status", "priority", "progress", "result", "error",
                                   "createdAt", "parentId", "children { id name }",
                                   "waiting { kind prompt schema since deadline event match }"]), min_size=1, max_size=4)


@st.composite
def graphql_documents(draw: Any) -> str:
    fields = " ".join(draw(FIELDS))
    literal = draw(st.one_of(st.sampled_from(['"a1"', '"b1"', '"missing"', '""', "1e400", "NaN", "null", "[1]",
                                              '"\\ud800"', "{v: 1e999}", "-1e400"]),
                             st.text(max_size=8).map(json.dumps)))
    operation = draw(st.sampled_from([
        f"{{ task(taskId: {literal}) {{ {fields} }} }}",
        f"{{ tasks(limit: {draw(st.integers(-5, 3000))}) {{ {fields} }} }}",
        f"{{ taskChildren(parentId: {literal}) {{ {fields} }} }}",
        f"mutation {{ createTask(taskInput: {{name: {literal}, inputs: {literal}}}) {{ {fields} }} }}",
        f"mutation {{ updateTask(taskId: {literal}, taskInput: {{inputs: {literal}}}) {{ {fields} }} }}",
        f"mutation {{ cancelTask(taskId: {literal}) }}",
        f"mutation {{ deleteTask(taskId: {literal}) }}",
        f"mutation {{ respondToTask(taskId: {literal}, value: {literal}) {{ {fields} }} }}",
        f"mutation {{ emitEvent(name: {literal}, payload: {literal}) }}",
        "query($id: String) { task(taskId: $id) { id } }",
        "{ " + " ".join(f"a{i}: tasks {{ id }}" for i in range(draw(st.integers(0, 60)))) + " }",
        "{ tasks { " + "children { " * draw(st.integers(0, 20)) + "id" + " }" * 0 + " }",
        # Fragments, defined or not, and empty selections: the depth limit must not trip on them.
        f"{{ ...{draw(st.sampled_from(['F', 'Nope']))} }} fragment F on Query {{ tasks {{ {fields} }} }}",
        f"query {{ tasks {{ ...{draw(st.sampled_from(['F', 'G']))} }} }} fragment F on TaskType {{ {fields} }}",
        draw(st.sampled_from(["mutation { }", "{ }", "query { tasks { } }", "fragment F on Query { tasks { id } }"])),
    ]))
    # A valid-looking document cut anywhere (a client that sent half of it).
    cut = draw(st.integers(0, len(operation)))
    tokens = st.lists(st.sampled_from(["{", "}", "(", ")", "...", "on", "query", "mutation", "fragment", "F",
                                       "tasks", "id", ":", "$x", "@skip", "[", "]", '"s"', "1"]), max_size=12)
    return draw(st.one_of(st.just(operation), st.just(operation[:cut]), tokens.map(" ".join), text))


@st.composite
def graphql_bodies(draw: Any) -> bytes:
    request: Any = {"query": draw(graphql_documents())}
    if draw(st.booleans()):
        request["variables"] = draw(st.one_of(st.dictionaries(st.just("id"), json_values), json_values))
    if draw(st.integers(0, 5)) == 0:
        request = draw(json_values)
    return encode(request)


@FUZZ
@given(body=graphql_bodies())
def test_fuzz_graphql_endpoint(world: World, body: bytes) -> None:
    async def example() -> None:
        before = await task_count(world)
        response = await world.server.http.post("/graphql", content=body,
                                                headers={**world.alice, "Content-Type": "application/json"})
        assert response.status_code < 500, response.text
        answer = response.json()
        assert isinstance(answer, dict) and ("data" in answer or "errors" in answer), answer
        for error in answer.get("errors") or []:
            assert isinstance(error["extensions"]["code"], int), error
            assert error["extensions"]["code"] != -32603, f"an internal error for a client's input: {error}"
            assert "Traceback" not in error["message"]
        if answer.get("errors") and not answer.get("data"):
            assert await task_count(world) == before, f"stored on an error: {answer}"
        await invariants_hold(world)

    world.run(example())


# --- WebSocket frames ------------------------------------------------------------------------------

ws_frames = st.one_of(
    st.fixed_dictionaries({"action": st.one_of(st.sampled_from(["subscribe", "unsubscribe", "ping"]), json_values),
                           "task_id": ids}).map(encode),
    json_values.map(encode),
    st.sampled_from([b"[" * 3000, b"\xff", b"", b'{"action":"subscribe","task_id":"\\ud800"}']),
)


@FUZZ
@given(frames=st.lists(ws_frames, min_size=1, max_size=3))
def test_fuzz_ws_frames(world: World, frames: list[bytes]) -> None:
    async def example() -> None:
        async with websockets.connect(f"{world.server.ws_url}/ws", additional_headers=world.alice) as ws:
            for frame in frames:
                try:
                    await ws.send(frame.decode("utf-8"))
                except UnicodeDecodeError:
                    await ws.send(frame)
                answer = json.loads(await asyncio.wait_for(ws.recv(), EVENT_WAIT))
                assert answer["type"] in ("error", "pong", "task_status", "task_completed", "task_failed"), answer
            await ws.send(json.dumps({"action": "ping"}))
            while (answer := json.loads(await asyncio.wait_for(ws.recv(), 5)))["type"] != "pong":
                pass
        await invariants_hold(world)

    world.run(example())


transport_frames = st.one_of(
    st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["subscribe", "ping", "pong", "complete"]), json_values),
                           "id": ids, "payload": st.one_of(graphql_documents().map(lambda q: {"query": q}),
                                                           json_values)}).map(encode),
    json_values.map(encode),
)


@FUZZ
@given(frame=transport_frames)
def test_fuzz_graphql_transport_ws(world: World, frame: bytes) -> None:
    async def example() -> None:
        async with websockets.connect(f"{world.server.ws_url}/graphql", subprotocols=["graphql-transport-ws"],
                                      additional_headers=world.alice) as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
            await ws.send(frame.decode("utf-8"))
            await ws.send(json.dumps({"type": "ping"}))
            try:
                while True:  # answers until our ping's pong, or a close frame
                    answer = json.loads(await asyncio.wait_for(ws.recv(), EVENT_WAIT))
                    if answer["type"] == "pong":
                        break
            except ConnectionClosed as closed:
                assert closed.rcvd is not None, "dropped without a close frame"
                assert closed.rcvd.code in (4400, 4401, 4403, 4409, 4429, 1000), closed.rcvd
        await invariants_hold(world)

    world.run(example())


# --- POST / (A2A 0.3 and 1.0, our own methods) ------------------------------------------------------

# Nulls, the wrong container, empty and huge values, numbers past int32/int64 (protobuf fields).
ODD = st.one_of(st.sampled_from([None, [], {}, [{}], "", "x" * 10_000, -1, 1.5, True, 2**31, -(2**31) - 1, 2**63,
                                 2**64, 10**40, "missing", "b1"]), TROUBLE, json_values)


def a2a_templates(task_id: str) -> dict[str, dict[str, Any]]:
    """Well-formed params of each A2A method (a noop tree to send, alice's a1 to read or cancel), from
    which the fuzzer takes a few fields away or replaces them with odd values."""
    tasks = [{"id": task_id, "name": "root", "schemas": {"method": "noop_executor"}, "inputs": {"n": 1}}]
    message_03 = {"kind": "message", "role": "user", "messageId": task_id,
                  "parts": [{"kind": "data", "data": {"tasks": tasks}}], "metadata": {}}
    message_10 = {"role": "ROLE_USER", "messageId": task_id, "parts": [{"data": {"tasks": tasks}}], "metadata": {}}
    return {
        "message/send": {"message": message_03, "configuration": {"blocking": True}, "metadata": {}},
        "SendMessage": {"message": message_10, "configuration": {"blocking": True}, "metadata": {}},
        "tasks/cancel": {"id": "a1", "metadata": {}},
        "CancelTask": {"id": "a1", "metadata": {}},
        "tasks/get": {"id": "a1", "historyLength": 2},
        "GetTask": {"id": "a1", "historyLength": 2},
        "ListTasks": {"contextId": "a1", "pageSize": 5},
        "tasks/pushNotificationConfig/get": {"id": "a1", "pushNotificationConfigId": "p1"},
        "GetTaskPushNotificationConfig": {"taskId": "a1", "id": "p1"},
        "cancel": {"task_id": "a1"},
        "tasks.execute": {"task_id": "a1"},
    }


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `value` a mutation may hit (object members and array items, at any depth)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths_of(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths_of(child, (*prefix, index))
    return found


def mutated(value: Any, path: tuple[Any, ...], action: str, new: Any) -> Any:
    """`value` with the member at `path` replaced, removed, or given an unknown sibling."""
    if not path:
        return new if action == "replace" else value
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    if rest:
        copy[head] = mutated(copy[head], rest, action, new)
    elif action == "remove":
        del copy[head]
    elif action == "unknown" and isinstance(copy, dict):
        copy["zz" + str(head)] = new
    else:
        copy[head] = new
    return copy


@st.composite
def a2a_calls(draw: Any) -> tuple[str, bytes]:
    """(A2A-Version header, body): a request to `/` whose params (and sometimes envelope) are odd."""
    templates = a2a_templates(f"f-{draw(st.integers(0, 10**9))}")
    method = draw(st.sampled_from(sorted(templates)))
    params: Any = templates[method]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(params)))
        params = mutated(params, path, draw(st.sampled_from(["replace", "replace", "remove", "unknown"])), draw(ODD))
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.one_of(st.integers(0, 10**6), st.text(max_size=5))),
                               "method": method, "params": params}
    if method == "cancel" and draw(st.booleans()):  # SPEC.md's cancel also reads top-level members
        message[draw(st.sampled_from(["metadata", "task_id", "context_id"]))] = draw(st.one_of(ODD, ids))
    if not draw(st.integers(0, 5)):
        message = mutated(message, (draw(st.sampled_from(["jsonrpc", "id", "method", "params"])),),
                          draw(st.sampled_from(["replace", "remove"])), draw(ODD))
    version = "1.0" if method[:1].isupper() else "0.3"
    return version, encode(draw(st.one_of(st.just(message), st.just(message), st.just([message, message]))))


@settings(FUZZ, max_examples=3 * EXAMPLES)
@given(call=a2a_calls())
def test_fuzz_a2a_methods_with_odd_params(world: World, call: tuple[str, bytes]) -> None:
    """Odd params of A2A and our own methods on `/` get the protocol's codes (-32602, -32600,
    TaskNotFound...), never -32603 or a 5xx; ids are echoed."""
    version, body = call
    world.run(post_rpc(world, "/", body, {"A2A-Version": version}))
