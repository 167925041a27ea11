"""Task logs (docs/observability.md, "Task logs"): what an attempt logs is kept with it, bounded
by SERVICE_MAX_LOG_BYTES, read with `tasks.logs` while it runs and after, followed as SSE, and
deleted with its task. Through the real ASGI app, on SQLite and (TASKGROVE_TEST_POSTGRES_URL)
PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.http import RestExecutor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.executors.stdio import CommandExecutor
from taskgrove.agent.app import build_app
from taskgrove.agent.engine.logbook import redact, secrets_of
from tests.conftest import POSTGRES_URL, Client, postgres_database, running_app
from tests.deadlines import EVENT_WAIT
from tests.servers import serve
from tests.test_auth import ALICE, BOB, JWT_ENV, PERMISSION_DENIED
from tests.test_streaming_webhooks import sse_events
from tests.test_ws import live  # noqa: F401 (a fixture)
from tests.test_ws import recv as ws_recv
from tests.test_ws import send as ws_send

LLM_KEY = "sk-test-llm-key-0123456789"
probe_log = logging.getLogger("tests.logprobe")


class LogProbe(Executor):
    """Logs through the context and the standard logger, secrets included, then returns."""

    id = "log_probe_executor"
    name = "Log probe"
    extension = "test"

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        context.log("hello from context.log")
        context.log(f"the key is {context.llm_api_key}", level="WARNING")
        context.log("an odd level", level="verbose-beyond-any-column-width")
        context.log("an alias", level="warn")
        context.log_output("a-stream-name-too-long", "an odd stream")
        probe_log.warning("from the standard logger, attempt %d", context.attempt)
        await asyncio.to_thread(probe_log.warning, "from a thread")
        return {"ok": True}


REGISTRY = [CommandExecutor, RestExecutor, LogProbe]


def command(tid: str, argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"id": tid, "name": tid, "schemas": {"method": "command_executor"}, "inputs": {"command": argv}, **extra}


@pytest.fixture
def logs_app(make_settings: Callable[..., Settings]) -> Callable[..., Any]:
    def factory(env: dict[str, str] | None = None) -> Any:
        settings = make_settings({"SERVICE_COMMAND_ALLOWLIST": "sh", **(env or {})})
        return running_app(settings, registry=ExecutorRegistry(REGISTRY))

    return factory


@pytest.fixture
async def client(logs_app: Callable[..., Any]) -> AsyncIterator[Client]:
    async with logs_app() as c:
        yield c


async def lines_of(client: Client, task_id: str, headers: dict[str, str] | None = None,
                   **params: Any) -> list[dict[str, Any]]:
    return (await client.result("tasks.logs", {"task_id": task_id, **params}, headers=headers))["lines"]


async def test_a_command_output_is_kept_line_by_line(client: Client) -> None:
    tree = await client.result("tasks.create", [command("c", ["sh", "-c", "echo one; echo two >&2; printf 'three'"])])
    assert tree["status"] == "completed"
    page = await client.result("tasks.logs", {"task_id": "c"})
    assert page["task_id"] == "c" and page["next_after"] is None
    shown = [(line["stream"], line["text"]) for line in page["lines"]]
    assert sorted(shown) == sorted([("stdout", "one"), ("stderr", "two"), ("stdout", "three")])
    assert [line["text"] for line in page["lines"] if line["stream"] == "stdout"] == ["one", "three"]
    seqs = [line["seq"] for line in page["lines"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert all(line["attempt"] == 1 and line["at"].endswith("+00:00") and "level" not in line
               for line in page["lines"])
    # Paging: after the first line, one at a time.
    first = await client.result("tasks.logs", {"task_id": "c", "limit": 1})
    assert first["lines"] == page["lines"][:1] and first["next_after"] == seqs[0]
    rest = await client.result("tasks.logs", {"task_id": "c", "after": first["next_after"]})
    assert rest["lines"] == page["lines"][1:]
    assert await lines_of(client, "c", attempt=2) == []


async def test_lines_are_readable_while_the_command_runs(client: Client, tmp_path: Any) -> None:
    gate = tmp_path / "gate"
    script = f"echo started; while [ ! -e {gate} ]; do sleep 0.02; done; echo finished"
    # tasks.create answers when the tree ends: it runs in the background meanwhile
    creating = asyncio.create_task(client.result("tasks.create", [command("w", ["sh", "-c", script])]))
    deadline = asyncio.get_running_loop().time() + 20
    seen: list[dict[str, Any]] = []
    while not seen:
        assert asyncio.get_running_loop().time() < deadline, "the first line never became readable"
        task = await client.result("tasks.get", {"task_id": "w"})
        if task is not None:
            seen = await lines_of(client, "w")
        await asyncio.sleep(0.05)
    assert [line["text"] for line in seen] == ["started"]
    assert (await client.result("tasks.get", {"task_id": "w"}))["status"] == "in_progress"
    gate.touch()
    tree = await creating
    assert tree["status"] == "completed"
    assert [line["text"] for line in await lines_of(client, "w")] == ["started", "finished"]


async def test_context_log_and_the_standard_logger_are_kept_without_secrets(client: Client) -> None:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    try:
        tree = await client.result("tasks.create", [{"id": "p", "name": "p", "schemas": {"method": "log_probe_executor"}}],
                                   headers={"X-LLM-API-KEY": LLM_KEY})
    finally:
        root.setLevel(level)
    assert tree["status"] == "completed"
    lines = await lines_of(client, "p")
    shown = [(line["stream"], line.get("level"), line["text"]) for line in lines]
    assert ("log", "info", "hello from context.log") in shown
    assert ("log", "warning", "the key is ***") in shown
    assert ("log", "warning", "from the standard logger, attempt 1") in shown
    assert ("log", "warning", "from a thread") in shown
    assert ("log", "info", "an odd level") in shown and ("log", "warning", "an alias") in shown
    assert ("log", None, "an odd stream") in shown
    assert all(LLM_KEY not in line["text"] for line in lines)


async def test_a_rest_call_is_logged_without_credentials(client: Client) -> None:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("fine")

    async with serve(Starlette(routes=[Route("/ok", ok)])) as url:
        host = url.split("://", 1)[1]
        target = f"http://user:pa55word-secret@{host}/ok?token=query-secret-value"
        tree = await client.result("tasks.create", [{
            "id": "r", "name": "r", "schemas": {"method": "rest_executor"},
            "inputs": {"url": target, "headers": {"X-Api-Key": "header-secret-value"},
                       "auth": {"type": "bearer", "token": "bearer-secret-value"}}}])
    assert tree["status"] == "completed", tree
    lines = await lines_of(client, "r")
    assert [(line["stream"], line["text"]) for line in lines] == [("http", f"GET http://{host}/ok -> 200")]
    raw = str(await client.result("tasks.logs", {"task_id": "r"}))
    for secret in ("pa55word-secret", "query-secret-value", "header-secret-value", "bearer-secret-value"):
        assert secret not in raw


async def test_an_attempt_is_bounded_and_the_rest_dropped_with_a_marker(logs_app: Callable[..., Any]) -> None:
    # 20 lines "line-NN" of 7 bytes each: 100 bytes keep 14 of them; the 6 others (42 bytes) are dropped.
    script = "for i in 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29; do echo line-$i; done"
    async with logs_app({"SERVICE_MAX_LOG_BYTES": "100"}) as client:
        await client.result("tasks.create", [command("b", ["sh", "-c", script])])
        lines = await lines_of(client, "b")
    assert [line["text"] for line in lines[:-1]] == [f"line-{i}" for i in range(10, 24)]
    assert lines[-1]["text"] == "... 42 bytes dropped (SERVICE_MAX_LOG_BYTES)"
    assert lines[-1]["level"] == "warning" and lines[-1]["stream"] == "log"


async def test_zero_keeps_nothing(logs_app: Callable[..., Any]) -> None:
    async with logs_app({"SERVICE_MAX_LOG_BYTES": "0"}) as client:
        tree = await client.result("tasks.create", [command("z", ["sh", "-c", "echo hidden"])])
        assert tree["result"]["stdout"] == "hidden\n"
        assert await lines_of(client, "z") == []


async def test_each_attempt_keeps_its_own_lines(client: Client) -> None:
    retry = {"max_attempts": 2, "backoff": "fixed", "base_seconds": 0, "jitter": False}
    tree = await client.result("tasks.create", [command("f", ["sh", "-c", "echo try $TASKGROVE_ATTEMPT; exit 1"],
                                                        retry=retry)])
    assert tree["status"] == "failed"
    assert [(line["attempt"], line["text"]) for line in await lines_of(client, "f")] == [(1, "try 1"), (2, "try 2")]
    assert [line["text"] for line in await lines_of(client, "f", attempt=2)] == ["try 2"]


async def test_lines_are_deleted_with_their_task(client: Client) -> None:
    # A failed first attempt leaves the task pending for an hour, with its lines: deletable.
    retry = {"max_attempts": 2, "backoff": "fixed", "base_seconds": 3600, "max_seconds": 3600, "jitter": False}
    creating = asyncio.create_task(client.result("tasks.create", [command("d", ["sh", "-c", "echo doomed; exit 1"],
                                                                          retry=retry)]))
    assert await _attempted(client, "d")
    assert [line["text"] for line in await lines_of(client, "d")] == ["doomed"]
    answer = await client.result("tasks.delete", {"task_id": "d"})
    assert answer["success"] is True
    assert await client.services.repo.log_lines("d") == []
    creating.cancel()
    await asyncio.gather(creating, return_exceptions=True)


async def _attempted(client: Client, task_id: str, timeout: float = EVENT_WAIT) -> bool:
    """True once the task's first attempt has ended (its lines are stored by then)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        task = await client.result("tasks.get", {"task_id": task_id})
        if task is not None and task["attempt"] >= 1 and task["status"] == "pending":
            return True
        await asyncio.sleep(0.02)
    return False


async def test_follow_streams_lines_until_the_task_ends(make_settings: Callable[..., Settings],
                                                       tmp_path: Any) -> None:
    """Over a real server (the ASGI test transport would hold the stream back until its end)."""
    gate = tmp_path / "gate"
    script = f"echo before; while [ ! -e {gate} ]; do sleep 0.02; done; echo after"
    settings = make_settings({"SERVICE_COMMAND_ALLOWLIST": "sh", "SERVICE_SHUTDOWN_GRACE_SECONDS": "0"})
    app = build_app(settings, registry=ExecutorRegistry(REGISTRY))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        client = Client(http, app)  # JSON-RPC helpers over the real server
        creating = asyncio.create_task(client.result("tasks.create", [command("s", ["sh", "-c", script])]))
        while not await _has_lines(client, "s"):
            await asyncio.sleep(0.02)
        body = {"jsonrpc": "2.0", "id": 3, "method": "tasks.logs", "params": {"task_id": "s", "follow": True}}
        text = ""
        async with http.stream("POST", "/tasks", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for chunk in response.aiter_text():
                text += chunk
                if '"result"' in text and not gate.exists():
                    gate.touch()  # the first page arrived: now let the command finish
        assert (await creating)["status"] == "completed"
    events = sse_events(text)
    assert events[0]["id"] == 3 and [line["text"] for line in events[0]["result"]["lines"]] == ["before"]
    followed = [line["text"] for event in events[1:] if event["type"] == "task_log" for line in event["lines"]]
    assert followed == ["after"]
    assert events[-1]["type"] == "stream_end"


async def _has_lines(client: Client, task_id: str) -> bool:
    if await client.result("tasks.get", {"task_id": task_id}) is None:
        return False
    return bool(await lines_of(client, task_id))


async def test_the_method_is_served_on_the_a2a_route_too(client: Client) -> None:
    await client.result("tasks.create", [command("a", ["sh", "-c", "echo via-root"])])
    answer = await client.result("tasks.logs", {"task_id": "a"}, path="/")
    assert [line["text"] for line in answer["lines"]] == ["via-root"]


# --- refusals --------------------------------------------------------------------------------

async def test_an_unknown_task_is_not_found(client: Client) -> None:
    error = await client.error("tasks.logs", {"task_id": "nope"})
    assert error["code"] == -32602 and "Task 'nope' not found" in str(error)


@pytest.mark.parametrize(("params", "named"), [
    ({}, "task_id"), ({"task_id": 5}, "task_id"), ({"task_id": "a", "attempt": 0}, "attempt"),
    ({"task_id": "a", "attempt": "1"}, "attempt"), ({"task_id": "a", "after": -1}, "after"),
    ({"task_id": "a", "limit": 0}, "limit"), ({"task_id": "a", "limit": 1001}, "limit"),
    ({"task_id": "a", "follow": "yes"}, "follow"), ({"task_id": "a", "attempt": 2**31}, "attempt"),
])
async def test_bad_params_are_named(client: Client, params: dict[str, Any], named: str) -> None:
    error = await client.error("tasks.logs", params)
    assert error["code"] == -32602 and named in str(error.get("data") or error["message"])


async def test_another_users_task_is_refused(logs_app: Callable[..., Any]) -> None:
    async with logs_app(JWT_ENV) as client:
        await client.result("tasks.create", [command("mine", ["sh", "-c", "echo alice"])], headers=ALICE)
        error = await client.error("tasks.logs", {"task_id": "mine"}, headers=BOB)
        assert error["code"] == PERMISSION_DENIED
        assert [line["text"] for line in await lines_of(client, "mine", headers=ALICE)] == ["alice"]


def test_tasks_logs_params_property(tmp_path: Any) -> None:
    """Whatever the params, tasks.logs answers a page or a -32602 error naming the problem (the
    task is unknown, or a param is wrong), never an internal error."""
    config = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
                                "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_COMMAND_ALLOWLIST": "sh"})
    runner = asyncio.Runner()
    context = running_app(config, registry=ExecutorRegistry(REGISTRY))
    client: Client = runner.run(context.__aenter__())
    try:
        runner.run(client.result("tasks.create", [command("known", ["sh", "-c", "echo 1; echo 2; echo 3"])]))
        values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=12),
                           st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(), max_size=2))
        params = st.one_of(values, st.dictionaries(
            st.sampled_from(["task_id", "id", "attempt", "after", "limit", "x"]),
            st.one_of(values, st.just("known")), max_size=5))

        @given(params=params)
        @hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        def check(params: Any) -> None:
            answer = runner.run(client.call("tasks.logs", params))
            if "error" in answer:
                # -32600: params that are neither an object nor an array (JSON-RPC's own rule)
                assert answer["error"]["code"] in (-32602, -32600), answer
            else:
                page = answer["result"]
                assert set(page) == {"task_id", "lines", "next_after"} and page["task_id"] == "known"
                assert all(line["text"] in ("1", "2", "3") for line in page["lines"])

        check()
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()


# --- /ws subscribe_logs ------------------------------------------------------------------------

async def test_ws_subscribe_logs_sends_stored_then_new_lines_then_the_end(live: Callable[..., Any],
                                                                         tmp_path: Any) -> None:
    gate = tmp_path / "gate"
    script = f"echo before; while [ ! -e {gate} ]; do sleep 0.02; done; echo after"
    async with live({"SERVICE_COMMAND_ALLOWLIST": "sh"}) as server:
        await server.rpc("tasks.create", [command("w", ["sh", "-c", script])])
        deadline = asyncio.get_running_loop().time() + 20
        while not (await server.rpc("tasks.logs", {"task_id": "w"}))["lines"]:
            assert asyncio.get_running_loop().time() < deadline, "no line stored"
            await asyncio.sleep(0.02)
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            await ws_send(ws, {"action": "subscribe_logs", "task_id": "nope"})
            refused = await ws_recv(ws)
            assert refused["type"] == "error" and "Task 'nope' not found" in refused["message"]
            await ws_send(ws, {"action": "subscribe_logs", "task_id": "w"})
            first = await ws_recv(ws)
            assert first["type"] == "task_log" and first["task_id"] == "w"
            assert [line["text"] for line in first["data"]["lines"]] == ["before"]
            gate.touch()
            texts: list[str] = []
            while (message := await ws_recv(ws, 20))["type"] == "task_log":
                texts += [line["text"] for line in message["data"]["lines"]]
            assert message["type"] == "task_log_end" and texts == ["after"]
            await ws_send(ws, {"action": "unsubscribe_logs", "task_id": "w"})  # it ended already
            assert (await ws_recv(ws))["type"] == "error"


# --- what a kept line never shows ---------------------------------------------------------------

@pytest.mark.parametrize(("text", "shown"), [
    ("GET https://bob:hunter2-pw@example.com/x", "GET https://***@example.com/x"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abcdef", "Authorization: Bearer ***"),
    ("basic authentication failed, token expired", "basic authentication failed, token expired"),
    ("key=sk-test-llm-key-0123456789 and the header value-secret-1", "key=*** and the header ***"),
    ("short ab stays", "short ab stays"),
])
def test_redact(text: str, shown: str) -> None:
    secrets = secrets_of({"headers": {"X-Key": "value-secret-1", "X-Short": "ab"}}, LLM_KEY)
    assert redact(text, secrets) == shown


# --- several instances (PostgreSQL) -------------------------------------------------------------

@pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")
async def test_lines_of_an_attempt_on_one_instance_are_followed_on_another(tmp_path: Any) -> None:
    gate = tmp_path / "gate"
    script = f"echo on-a; while [ ! -e {gate} ]; do sleep 0.02; done; echo still-on-a"
    async with postgres_database() as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
               "SERVICE_RATE_LIMIT_PER_USER": "0", "SERVICE_SHUTDOWN_GRACE_SECONDS": "0"}
        async with running_app(Settings.from_env(env), registry=ExecutorRegistry(REGISTRY)) as a:
            # B runs no task of its own: every line it shows was stored by A.
            b_app = build_app(Settings.from_env({**env, "SERVICE_MAX_CONCURRENCY": "1"}),
                              registry=ExecutorRegistry(REGISTRY))
            await a.result("tasks.create", [command("x", ["sh", "-c", script])])
            while not await _has_lines(a, "x"):
                await asyncio.sleep(0.02)
            assert a.services.engine.running  # the attempt runs on A
            async with serve(b_app) as b_url, httpx.AsyncClient(base_url=b_url, timeout=30) as http:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.logs", "params": {"task_id": "x", "follow": True}}
                text = ""
                async with http.stream("POST", "/tasks", json=body) as response:
                    async for chunk in response.aiter_text():
                        text += chunk
                        if '"result"' in text and not gate.exists():
                            gate.touch()
            assert not b_app.state.services.engine.running
    events = sse_events(text)
    assert [line["text"] for line in events[0]["result"]["lines"]] == ["on-a"]
    assert [line["text"] for e in events[1:] if e["type"] == "task_log" for line in e["lines"]] == ["still-on-a"]
    assert events[-1]["type"] == "stream_end"
