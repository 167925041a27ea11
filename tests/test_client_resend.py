"""Safe retries (client/resend.py) against a real service: a resend never runs anything twice.

The faults sit between the client and the service, as in production: an answer lost after the
service acted (LosingTransport), a 503 in front of it (RefusingTransport), and the service's own
429 while the per-user quota is full. What counts is read back from the service: how many trees
and tasks are stored, how many attempts each task had.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from taskgrove.client import AsyncClient, QuotaExceeded, Retry, RetryEvent, Tree, Unreachable
from tests.client_helpers import LosingTransport, RefusingTransport, method_is, served

FAST = Retry(attempts=4, backoff=0.05, max_backoff=0.2)


async def roots_named(client: AsyncClient, name: str) -> list[str]:
    return [task.id async for task in client.list(roots=True, search=name)]


async def test_a_create_whose_answer_was_lost_is_stored_and_run_once(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app):
        # A builder tree (its ids named) and a dict tree without any id (only the Idempotency-Key).
        for name, tree in (("lost-built", _built("lost-built")),
                           ("lost-plain", [{"name": "lost-plain", "schemas": {"method": "aggregate_results_executor"},
                                            "children": [{"name": "leaf", "schemas": {"method": "noop_executor"}}]}])):
            losing = LosingTransport(method_is("tasks.create"))
            async with AsyncClient(url, retry=FAST, transport=losing) as client:
                created = await client.create(tree)
                assert losing.lost == 1 and len([r for r in losing.sent if method_is("tasks.create")(r)]) == 2
                keys = {r.headers["Idempotency-Key"] for r in losing.sent if method_is("tasks.create")(r)}
                assert len(keys) == 1  # the resend is the same request
                assert created.status == "completed", created.statuses
                assert await roots_named(client, name) == [created.id]
                attempts = await client.attempts(created.id, tree=True)
                assert sorted(a.task_id for a in attempts) == sorted(created.statuses)  # one attempt each


async def test_execute_copy_and_clone_resent_after_a_lost_answer_act_once(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app):
        async with AsyncClient(url, retry=FAST) as client:
            await client.create(_built("source"))
        losing = LosingTransport(method_is("tasks.execute", "tasks.copy", "tasks.clone"), times=3)
        async with AsyncClient(url, retry=FAST, transport=losing) as client:
            ran = await client.execute("source", copy=True)
            copied = await client.copy("source")
            cloned = await client.clone("source")
            assert losing.lost == 3
            assert len(await roots_named(client, "source")) == 4  # the original and three copies, once each
            assert {ran.root_task_id, copied.id, cloned.id} <= set(await roots_named(client, "source"))
            done = await client.wait(ran.root_task_id, timeout=60)
            assert done.status == "completed"
            assert all(a.attempt == 1 for a in await client.attempts(done.id, tree=True))


async def test_an_event_whose_answer_was_lost_is_emitted_once(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app):
        losing = LosingTransport(method_is("events.emit"))
        async with AsyncClient(url, retry=FAST, transport=losing) as client:
            await client.create(Tree("waits", "event_wait_executor", id="emit-wait", event="emit-once"))
            emitted = await client.emit("emit-once", {"n": 1})
            assert losing.lost == 1 and emitted.resumed == 1 and emitted.task_ids == ["emit-wait"]
            again = await client.emit("emit-once", {"n": 1}, idempotency_key="emit-key")
            assert (await client.emit("emit-once", {"n": 1}, idempotency_key="emit-key")) == again  # the same event
            done = await client.wait("emit-wait", timeout=60)
            outcomes = [a.outcome for a in await client.attempts("emit-wait")]
            assert done.result == {"n": 1} and outcomes == ["waiting", "completed"]  # parked, resumed once


async def test_an_answer_to_a_wait_is_not_resent_after_a_lost_answer(make_settings: Callable[..., Any]) -> None:
    """tasks.respond is not deduplicated by the service: the client must not guess; it says so."""
    async with served(make_settings()) as (url, _app):
        losing = LosingTransport(method_is("tasks.respond"))
        async with AsyncClient(url, retry=FAST, transport=losing) as client:
            await client.create(Tree("asks", "human_input_executor", id="once-ask", prompt="go?"))
            with pytest.raises(Unreachable) as lost:
                await client.respond("once-ask", "yes")
            assert lost.value.maybe_sent is True
            assert len([r for r in losing.sent if method_is("tasks.respond")(r)]) == 1  # not resent
            done = await client.wait("once-ask", timeout=60)
            assert done.result == "yes"  # the one answer the service took


async def test_trigger_and_agent_writes_resend_only_what_repeats_harmlessly(make_settings: Callable[..., Any]) -> None:
    """The service honours no Idempotency-Key for triggers.* and agents.*: a create, an add, a
    delete or a remove whose answer was lost is not sent again (one trigger, one agent stored);
    an update or a refresh, which leave the same state when repeated, is resent with the same key."""
    creates = ("triggers.create", "triggers.delete", "agents.add", "agents.remove")
    not_lost_yet = {*creates, "triggers.update", "agents.refresh"}

    def first_of_each(request: httpx.Request) -> bool:  # each method's first answer is lost
        for method in not_lost_yet:
            if method_is(method)(request):
                not_lost_yet.discard(method)
                return True
        return False

    async with served(make_settings()) as (url, _app):
        losing = LosingTransport(first_of_each, times=6)
        async with AsyncClient(url, retry=FAST, transport=losing) as client:
            await client.create(Tree("template", "noop_executor", id="once-template"))
            with pytest.raises(Unreachable) as lost:
                await client.triggers.create("once-template", "once.event")
            assert lost.value.maybe_sent is True
            (trigger,) = [t async for t in client.triggers.list(task_id="once-template")]  # stored once
            updated = await client.triggers.update(trigger.id, enabled=False)
            assert updated.enabled is False
            with pytest.raises(Unreachable):
                await client.agents.add(url, name="once-self")
            assert [a.name async for a in client.agents.list()] == ["once-self"]
            assert (await client.agents.refresh("once-self")).name == "once-self"
            with pytest.raises(Unreachable):
                await client.triggers.delete(trigger.id)
            with pytest.raises(Unreachable):
                await client.agents.remove("once-self")
            assert [t async for t in client.triggers.list()] == [] and [a async for a in client.agents.list()] == []
        sent: dict[str, list[str]] = {}
        for request in losing.sent:
            for method in (*creates, "triggers.update", "agents.refresh"):
                if method_is(method)(request):
                    sent.setdefault(method, []).append(request.headers["Idempotency-Key"])
        assert {m: len(keys) for m, keys in sent.items() if m in creates} == dict.fromkeys(creates, 1)
        for resent in ("triggers.update", "agents.refresh"):
            assert len(sent[resent]) == 2 and len(set(sent[resent])) == 1  # resent, as the same request


async def test_a_503_is_retried_after_retry_after(make_settings: Callable[..., Any]) -> None:
    waits: list[RetryEvent] = []
    retry = Retry(attempts=3, backoff=0.05, on_retry=waits.append)
    async with served(make_settings()) as (url, _app):
        outage = RefusingTransport(method_is("tasks.create"), status=503, times=2, retry_after="1")
        async with AsyncClient(url, retry=retry, transport=outage) as client:
            created = await client.create(Tree("after outage", "noop_executor", id="outage"))
        assert created.status == "completed" and outage.refused == 2
        # A call the service does not deduplicate is resent too: a 503 says nothing was carried out.
        outage = RefusingTransport(method_is("schedules.create"), status=503, times=1, retry_after="1")
        async with AsyncClient(url, retry=retry, transport=outage) as client:
            await client.schedules.create("outage", interval_seconds=3600)
            assert len(await client.schedules.list(task_id="outage")) == 1
        assert outage.refused == 1
        assert [w.method for w in waits] == ["tasks.create", "tasks.create", "schedules.create"]
        assert all(w.delay >= 1.0 for w in waits)  # the service's Retry-After, not the backoff


async def test_a_retry_after_beyond_the_limit_is_raised_at_once(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app):
        outage = RefusingTransport(method_is("system.health"), status=429, retry_after="3600")
        async with AsyncClient(url, retry=Retry(max_retry_after=60), transport=outage) as client:
            with pytest.raises(QuotaExceeded) as over:
                await client.health()
        assert over.value.retry_after == 3600 and outage.refused == 1


async def test_a_create_over_the_quota_is_retried_after_retry_after_and_stored_once(
        make_settings: Callable[..., Any]) -> None:
    """The issue's case: the per-user pending quota is full (a task waits for an answer); a create
    is refused with 429 + Retry-After, the quota frees up, the client's resend is stored, once."""
    refused = asyncio.Event()
    waits: list[RetryEvent] = []

    def on_retry(event: RetryEvent) -> None:
        waits.append(event)
        refused.set()

    settings = make_settings({"SERVICE_MAX_PENDING_PER_USER": "1"})
    async with served(settings) as (url, _app):
        async with AsyncClient(url, retry=Retry(attempts=10, on_retry=on_retry)) as client:
            await client.create(Tree("holds the quota", "human_input_executor", id="quota-ask", prompt="go?"))
            blocked = asyncio.create_task(client.create(Tree("queued", "noop_executor", id="quota-next")))
            await asyncio.wait_for(refused.wait(), 60)
            assert isinstance(waits[0].error, QuotaExceeded) and not blocked.done()
            assert waits[0].delay >= (waits[0].error.retry_after or 1)
            await client.respond("quota-ask", "go")  # the waiting task completes: the quota frees up
            created = await asyncio.wait_for(blocked, 120)
            assert created.id == "quota-next" and created.status == "completed"
            assert await roots_named(client, "queued") == ["quota-next"]
            assert len(await client.attempts("quota-next")) == 1


def _built(name: str) -> Tree:
    root = Tree(name, "aggregate_results_executor", id=name)
    leaf = root.add(f"{name} leaf", "noop_executor", n=1)
    root.after(leaf)
    return root
