"""Every exception of the client, provoked on a real service (the app over HTTP), so that the one
table mapping answers to exceptions (client/exceptions.py) is checked against the service's own
codes and sentences: a reworded message fails here instead of silently raising another class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jwt
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from taskgrove.client import (AsyncClient, Conflict, InvalidParams, MethodNotFound, NotFound, PermissionDenied,
                              ProtocolError, QuotaExceeded, Retry, TaskgroveError, Tree, Unavailable, Unreachable)
from taskgrove.client.exceptions import CODES, HTTP_STATUSES, parse_retry_after
from tests.client_helpers import RefusingTransport, method_is, served
from tests.servers import free_port, serve

SECRET = "client-errors-secret-with-enough-bytes"
NO_RETRY = Retry(attempts=1)


def token(user: str, *roles: str) -> str:
    return jwt.encode({"user_id": user, "roles": list(roles)}, SECRET, algorithm="HS256")


async def test_not_found_conflict_and_invalid_params(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app), AsyncClient(url) as client:
        for call in (client.get("nope"), client.tree("nope"), client.delete("nope"), client.respond("nope", 1),
                     client.execute("nope"), client.attempts("nope"), client.schedules.get("nope")):
            with pytest.raises(NotFound) as found:
                await call
            assert isinstance(found.value, InvalidParams) and found.value.code in (-32602, None)
        with pytest.raises(NotFound, match="tasks.tree: Task 'nope' not found"):
            await client.tree("nope")

        asked = Tree("asks", "human_input_executor", id="err-ask", prompt="ok?", schema={"type": "boolean"})
        await client.create(asked)
        with pytest.raises(Conflict, match="already exists"):  # the same id, other content
            await client.create([{"id": "err-ask", "name": "another"}])
        with pytest.raises(InvalidParams) as refused:  # the schema refuses the value: not a conflict
            await client.respond("err-ask", "yes")
        assert type(refused.value) is InvalidParams
        await client.respond("err-ask", True)
        with pytest.raises(Conflict, match="not waiting for input"):  # a wait takes one answer
            await client.respond("err-ask", False)
        with pytest.raises(Conflict, match="Cannot delete task"):  # completed: delete is blocked
            await client.delete("err-ask")
        with pytest.raises(InvalidParams, match="Circular dependency") as cycle:
            await client.create([{"id": "c1", "name": "a", "dependencies": [{"id": "c2"}]},
                                 {"id": "c2", "name": "b", "parent_id": "c1", "dependencies": [{"id": "c1"}]}])
        assert type(cycle.value) is InvalidParams
        with pytest.raises(Conflict, match="Idempotency-Key was already used"):
            await client.execute("err-ask", copy=True, idempotency_key="err-key")
            await client.copy("err-ask", idempotency_key="err-key")
        with pytest.raises(MethodNotFound):
            await client.call("tasks.nothing_of_the_kind")


async def test_triggers_and_agents_not_found_and_conflict(make_settings: Callable[..., Any]) -> None:
    """The service's sentences for triggers and agents map to NotFound and Conflict; a null answer of
    a get (triggers.get, triggers.runs, agents.get) is NotFound too."""
    async with served(make_settings()) as (url, _app), AsyncClient(url) as client:
        for call in (client.triggers.get("nope"), client.triggers.runs("nope"), client.triggers.update("nope"),
                     client.triggers.delete("nope"), client.agents.get("nope"), client.agents.refresh("nope"),
                     client.agents.remove("nope")):
            with pytest.raises(NotFound):
                await call
        await client.create(Tree("template", "noop_executor", id="err-template"))
        await client.triggers.create("err-template", "err.event", trigger_id="err-trigger")
        with pytest.raises(Conflict, match="already exists"):
            await client.triggers.create("err-template", "err.event", trigger_id="err-trigger")
        await client.agents.add(url, name="err-self")
        with pytest.raises(Conflict, match="in the directory already"):
            await client.agents.add(url, name="err-self")
        with pytest.raises(InvalidParams) as bad:  # a bad field: neither missing nor a clash
            await client.triggers.create("err-template", "err.other", singleton="sometimes")
        assert type(bad.value) is InvalidParams


async def test_permission_denied_for_no_token_and_for_another_users_task(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings({"SERVICE_JWT_SECRET": SECRET})) as (url, _app):
        async with AsyncClient(url) as anonymous:
            with pytest.raises(PermissionDenied) as missing:
                await anonymous.get("x")
            assert missing.value.http_status == 401 and missing.value.code == -32001
        async with AsyncClient(url, token("alice")) as alice, AsyncClient(url, token("bob")) as bob:
            await alice.create(Tree("mine", "noop_executor", id="alices"))
            with pytest.raises(PermissionDenied) as denied:
                await bob.tree("alices")
            assert denied.value.http_status == 200 and denied.value.code == -32001
            with pytest.raises(PermissionDenied):
                async with bob.watch("alices") as events:  # /ws refuses the subscription the same way
                    async for _event in events:
                        pass


async def test_quota_exceeded_carries_retry_after(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings({"SERVICE_MAX_PENDING_PER_USER": "1"})) as (url, _app):
        async with AsyncClient(url, retry=NO_RETRY) as client:
            await client.create(Tree("waits", "human_input_executor", id="q-wait", prompt="go?"))
            with pytest.raises(QuotaExceeded) as over:
                await client.create(Tree("more", "noop_executor"))
            assert over.value.http_status == 429 and over.value.code == -32029
            assert over.value.retry_after is not None and over.value.retry_after >= 1
            assert over.value.data["setting"] == "SERVICE_MAX_PENDING_PER_USER"


async def test_unavailable_unreachable_and_not_a_taskgrove_service(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app):
        outage = RefusingTransport(method_is("system.health"), status=503, retry_after="7")
        async with AsyncClient(url, retry=NO_RETRY, transport=outage) as client:
            with pytest.raises(Unavailable) as down:
                await client.health()
            assert down.value.retry_after == 7 and down.value.http_status == 503
            assert (await client.health()).status == "healthy"  # the next try reached the service

    nowhere = f"http://127.0.0.1:{free_port()}"
    async with AsyncClient(nowhere, retry=Retry(attempts=2, backoff=0.01)) as client:
        with pytest.raises(Unreachable, match="cannot reach the service at") as lost:
            await client.health()
        assert lost.value.maybe_sent is False

    async def html(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("<html>not here</html>", status_code=404)

    other = Starlette(routes=[Route("/{path:path}", html, methods=["POST", "GET"])])
    async with serve(other) as other_url, AsyncClient(other_url, retry=NO_RETRY) as client:
        with pytest.raises(ProtocolError, match="is this a taskgrove service"):
            await client.health()


def test_the_mapping_table_is_one_place() -> None:
    assert all(issubclass(cls, TaskgroveError) for cls in [*CODES.values(), *HTTP_STATUSES.values()])
    assert CODES[-32029] is QuotaExceeded and HTTP_STATUSES[503] is Unavailable and HTTP_STATUSES[429] is QuotaExceeded
    from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE, QUOTA_EXCEEDED

    assert CODES[DATABASE_UNAVAILABLE] is Unavailable and CODES[QUOTA_EXCEEDED] is QuotaExceeded  # the service's codes
    assert parse_retry_after("5") == 5.0 and parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now
