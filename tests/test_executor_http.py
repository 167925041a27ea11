"""rest_executor against a real local server (and respx where the guard must see a public host)."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import respx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, ExecutorError
from taskgrove.executors.http import RestExecutor
from tests.servers import free_port, serve

HITS: Counter[str] = Counter()


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    answer: dict[str, Any] = {
        "method": request.method,
        "query": dict(request.query_params),
        "headers": dict(request.headers),
        "body": body.decode(),
    }
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        answer["form"] = dict(parse_qsl(body.decode()))
    return JSONResponse(answer)


async def flaky(request: Request) -> Response:
    """Fails with `code` for the first `fail` hits of `key`, then answers 200."""
    key = request.path_params["key"]
    HITS[key] += 1
    if HITS[key] <= int(request.query_params.get("fail", 0)):
        code = int(request.query_params.get("code", 503))
        return PlainTextResponse(f"failure {HITS[key]}", status_code=code)
    return JSONResponse({"hits": HITS[key]})


async def slow(request: Request) -> PlainTextResponse:
    deadline = time.monotonic() + float(request.query_params.get("seconds", 1))
    while time.monotonic() < deadline:  # stop early when the client went away
        if await request.is_disconnected():
            break
        await asyncio.sleep(0.02)
    return PlainTextResponse("late")


async def big(request: Request) -> PlainTextResponse:
    return PlainTextResponse("x" * int(request.query_params["n"]))


async def not_json(request: Request) -> Response:
    return Response("not json {", media_type="application/json")


async def redirect(request: Request) -> RedirectResponse:
    return RedirectResponse(request.query_params["to"], status_code=302)


APP = Starlette(routes=[
    Route("/echo", echo, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
    Route("/flaky/{key}", flaky, methods=["GET", "POST"]),
    Route("/slow", slow),
    Route("/big", big),
    Route("/notjson", not_json),
    Route("/redirect", redirect),
])


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async with serve(APP) as url:
        yield url


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RestExecutor, "backoff_base", 0.01)


def context(allow_private: bool = True) -> ExecutionContext:
    env = {"SERVICE_ALLOW_PRIVATE_URLS": "true" if allow_private else "false"}
    return ExecutionContext(task_id="t", task={}, settings=Settings.from_env(env))


async def call(inputs: dict[str, Any], allow_private: bool = True) -> dict[str, Any]:
    return await RestExecutor().execute(inputs, context(allow_private))


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def test_methods(server: str, method: str) -> None:
    result = await call({"method": method.lower(), "url": f"{server}/echo"})
    assert result["status_code"] == 200
    assert result["body"]["method"] == method
    assert result["truncated"] is False and result["attempts"] == 1 and result["elapsed"] >= 0
    assert result["headers"]["content-type"] == "application/json"


async def test_head_has_empty_body(server: str) -> None:
    result = await call({"method": "HEAD", "url": f"{server}/echo"})
    assert result["status_code"] == 200 and result["body"] == ""


async def test_json_body_query_and_headers(server: str) -> None:
    result = await call({
        "method": "POST",
        "url": f"{server}/echo",
        "query": {"q": "a b", "n": 2},
        "headers": {"X-Trace": "abc"},
        "json": {"k": [1, 2]},
    })
    body = result["body"]
    assert body["query"] == {"q": "a b", "n": "2"}
    assert body["headers"]["x-trace"] == "abc"
    assert body["headers"]["content-type"] == "application/json"
    assert body["body"].replace(" ", "") == '{"k":[1,2]}'


async def test_form_body(server: str) -> None:
    result = await call({"method": "POST", "url": f"{server}/echo", "data": {"a": "1", "b": "x y"}})
    assert result["body"]["form"] == {"a": "1", "b": "x y"}


async def test_json_and_data_together_refused(server: str) -> None:
    with pytest.raises(ExecutorError, match="either json or data"):
        await call({"method": "POST", "url": f"{server}/echo", "json": {}, "data": {}})


async def test_bearer_auth(server: str) -> None:
    result = await call({"url": f"{server}/echo", "auth": {"type": "bearer", "token": "tok"}})
    assert result["body"]["headers"]["authorization"] == "Bearer tok"


async def test_basic_auth(server: str) -> None:
    result = await call(
        {"url": f"{server}/echo", "auth": {"type": "basic", "username": "u", "password": "p w"}}
    )
    expected = "Basic " + base64.b64encode(b"u:p w").decode()
    assert result["body"]["headers"]["authorization"] == expected


async def test_bad_auth_refused_without_echoing_secret(server: str) -> None:
    with pytest.raises(ExecutorError) as info:
        await call({"url": f"{server}/echo", "auth": {"type": "digest", "token": "sekrit"}})
    assert "sekrit" not in str(info.value)


async def test_text_and_invalid_json_bodies(server: str) -> None:
    assert (await call({"url": f"{server}/big?n=5"}))["body"] == "xxxxx"
    assert (await call({"url": f"{server}/notjson"}))["body"] == "not json {"


async def test_response_cap(server: str) -> None:
    result = await call({"url": f"{server}/big?n=50000", "max_response_bytes": 1000})
    assert result["truncated"] is True
    assert result["body"] == "x" * 1000


async def test_retries_5xx_then_succeeds(server: str) -> None:
    result = await call({"url": f"{server}/flaky/r1?fail=2", "retries": 2})
    assert result["body"] == {"hits": 3}
    assert result["attempts"] == 3


async def test_5xx_after_retries_fails(server: str) -> None:
    with pytest.raises(ExecutorError, match=r"HTTP 503 from .*/flaky/r2.*: failure 3"):
        await call({"url": f"{server}/flaky/r2?fail=9", "retries": 2})
    assert HITS["r2"] == 3


async def test_4xx_is_never_retried(server: str) -> None:
    with pytest.raises(ExecutorError, match=r"HTTP 404 from .*: failure 1"):
        await call({"url": f"{server}/flaky/r3?fail=9&code=404", "retries": 3})
    assert HITS["r3"] == 1


async def test_network_errors_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = 0
    original = RestExecutor._attempt

    async def counting(self: RestExecutor, *args: Any) -> Any:
        nonlocal attempts
        attempts += 1
        return await original(self, *args)

    monkeypatch.setattr(RestExecutor, "_attempt", counting)
    closed_port = free_port()  # nothing listens there any more
    with pytest.raises(ExecutorError, match="failed: ConnectError"):
        await call({"url": f"http://127.0.0.1:{closed_port}/", "retries": 2})
    assert attempts == 3


async def test_backoff_doubles(monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def record(delay: float, *a: Any) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(RestExecutor, "backoff_base", 0.5)
    monkeypatch.setattr(RestExecutor, "pause", staticmethod(record))
    with pytest.raises(ExecutorError):
        await call({"url": f"{server}/flaky/r4?fail=9", "retries": 3})
    assert delays == [0.5, 1.0, 2.0]


async def test_timeout(server: str) -> None:
    started = time.monotonic()
    with pytest.raises(ExecutorError, match="timed out after 0.3s"):
        await call({"url": f"{server}/slow?seconds=60", "timeout": 0.3, "retries": 0})
    assert time.monotonic() - started < 10  # long before the answer; a busy machine's margin


async def test_cancel_aborts_the_request(server: str) -> None:
    executor = RestExecutor()
    task = asyncio.create_task(executor.execute({"url": f"{server}/slow?seconds=60"}, context()))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await executor.cancel()
    # Closing the client alone already ends the request (no retries after a cancel) ...
    done, _ = await asyncio.wait({task}, timeout=10)  # long before the answer; a busy machine's margin
    assert done, "closing the client did not stop the request"
    with pytest.raises(ExecutorError, match="cancelled"):
        task.result()
    assert time.monotonic() - started < 10


async def test_cancelling_the_coroutine_stops_the_request(server: str) -> None:
    task = asyncio.create_task(RestExecutor().execute({"url": f"{server}/slow?seconds=10"}, context()))
    await asyncio.sleep(0.2)
    task.cancel()  # ... and so does the engine cancelling the coroutine
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost/",
    ],
)
async def test_private_targets_refused_without_override(url: str) -> None:
    with pytest.raises(ExecutorError, match="SERVICE_ALLOW_PRIVATE_URLS=true"):
        await call({"url": url, "retries": 0}, allow_private=False)


async def test_private_target_allowed_with_override(server: str) -> None:
    assert (await call({"url": f"{server}/echo"}, allow_private=True))["status_code"] == 200
    with pytest.raises(ExecutorError, match="SERVICE_ALLOW_PRIVATE_URLS"):
        await call({"url": f"{server}/echo"}, allow_private=False)


async def test_non_http_scheme_refused() -> None:
    with pytest.raises(ExecutorError, match="scheme 'file' is not allowed"):
        await call({"url": "file:///etc/passwd"})


async def test_redirect_to_private_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def public_dns(host: str, port: int, **kw: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    monkeypatch.setattr(loop, "getaddrinfo", public_dns)
    with respx.mock(assert_all_called=False) as mock:
        mock.get("http://public.test/go").mock(
            return_value=httpx.Response(302, headers={"Location": "http://169.254.169.254/latest"})
        )
        metadata = mock.get("http://169.254.169.254/latest").mock(return_value=httpx.Response(200))
        mock.get("http://public.test/ok").mock(return_value=httpx.Response(200, json={"a": 1}))
        assert (await call({"url": "http://public.test/ok"}, allow_private=False))["body"] == {"a": 1}
        with pytest.raises(ExecutorError, match="169.254.169.254"):
            await call({"url": "http://public.test/go"}, allow_private=False)
        assert not metadata.called


async def test_credentials_in_url_not_in_error(server: str) -> None:
    url = server.replace("http://", "http://user:hunter2@") + "/flaky/r5?fail=9&code=400"
    with pytest.raises(ExecutorError) as info:
        await call({"url": url})
    assert "hunter2" not in str(info.value)
