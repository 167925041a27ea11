"""Watching a tree (client/watch.py): the documented event names, waits answered from the events,
`wait()`, the sync Client's watch, and above all a watch whose connection is cut mid-run: a real
`taskgrove serve` behind a TCP proxy that the test cuts and blocks while the tree finishes; the
watch reconnects, reads the tree again, and still ends with the final event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskgrove.client import AsyncClient, Client, Event, Retry, TaskStatus, Tree
from tests.client_helpers import CuttingProxy, served
from tests.processes import Service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp("client-watch")
    started = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work / 'watch.db'}"}, "watch").start()
    try:
        yield started
    finally:
        started.stop()


def approval_tree(prefix: str) -> Tree:
    """root <- [ask (waits for an answer), work]: completes once `ask` is answered."""
    root = Tree(f"{prefix} root", "aggregate_results_executor", id=f"{prefix}-root")
    work = root.add(f"{prefix} work", "noop_executor", id=f"{prefix}-work", step=1)
    ask = root.add(f"{prefix} ask", "human_input_executor", id=f"{prefix}-ask", prompt="Ship it?",
                   schema={"type": "boolean"}, after=[work])
    root.after(ask, work)
    return root


async def test_a_watch_cut_mid_run_still_sees_the_final_event(service: Service) -> None:
    host, port = service.url.removeprefix("http://").split(":")
    async with CuttingProxy((host, int(port))) as proxy, AsyncClient(service.url) as direct, \
            AsyncClient(proxy.url, retry=Retry(backoff=0.1, max_backoff=1.0)) as watcher:
        created = await direct.create(approval_tree("cut"))
        assert created.find("cut-ask").waiting is not None  # parked: the tree is mid-run

        events: list[Event[Any]] = []
        watch = watcher.watch("cut-root", reconnect_for=120)
        async with watch:
            async for event in watch:  # up to the moment the question shows
                events.append(event)
                if event.task_id == "cut-ask" and event.wants_input:
                    break
            assert watch.connections == 1
            proxy.blocked = True
            proxy.cut()  # the connection drops; reconnecting is refused for now
            following = asyncio.create_task(anext(watch))
            await asyncio.wait_for(proxy.refused.wait(), 60)  # the watch tried again, and was refused

            await direct.respond("cut-ask", True)  # the tree finishes while nobody watches
            done = await direct.wait("cut-root", timeout=60)
            assert done.status == TaskStatus.COMPLETED
            proxy.blocked = False

            events.append(await asyncio.wait_for(following, 120))
            async for event in watch:
                events.append(event)
        assert events[-1].type == "final" and events[-1].status == TaskStatus.COMPLETED
        assert events[-1].data.statuses == {"cut-root": "completed", "cut-work": "completed", "cut-ask": "completed"}
        after_cut = events[events.index(next(e for e in events if e.wants_input)) + 1:]
        assert {(e.task_id, e.type) for e in after_cut} >= {("cut-ask", "task_completed"),
                                                             ("cut-root", "task_completed")}
        # What happened during the cut came from reading the tree again once the proxy let it through.
        assert all(e.data.snapshot for e in after_cut[:-1]) and proxy.accepted >= 3


async def test_a_watch_reconnects_and_follows_the_live_events_after_a_cut(service: Service) -> None:
    host, port = service.url.removeprefix("http://").split(":")
    async with CuttingProxy((host, int(port))) as proxy, AsyncClient(service.url) as direct, \
            AsyncClient(proxy.url, retry=Retry(backoff=0.1, max_backoff=1.0)) as watcher:
        await direct.create(approval_tree("again"))
        async with watcher.watch("again-root") as watch:
            async for event in watch:
                if event.wants_input:
                    break
            before = proxy.accepted
            proxy.cut()  # nothing changes during the cut: the watch must subscribe again

            async def rest() -> list[tuple[str, str]]:
                return [(event.task_id, event.type) async for event in watch]

            following = asyncio.create_task(rest())
            await asyncio.wait_for(proxy.until_accepted(before + 2), 60)  # the tree read again, then /ws
            await direct.respond("again-ask", True)  # now the tree goes on, seen live
            types = await asyncio.wait_for(following, 120)
            assert watch.connections == 2
            assert types[-1] == ("again-root", "final") and ("again-ask", "task_completed") in types


async def test_events_have_the_documented_names_and_a_wait_is_answered_from_its_event(
        make_settings: Callable[..., Any]) -> None:
    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    async with served(settings) as (url, _app), AsyncClient(url) as client:
        await client.create(approval_tree("ev"))
        seen: list[Event[Any]] = []
        async for event in client.watch("ev-root"):
            seen.append(event)
            if event.wants_input:
                assert event.waiting is not None and event.waiting.prompt == "Ship it?"
                assert event.waiting.json_schema == {"type": "boolean"}
                answered = await event.respond(True)
                assert answered.task_id == "ev-ask" and answered.status == "resumed"
        names = {e.type for e in seen}
        assert names <= {"task_status", "task_progress", "task_completed", "task_failed", "final"}
        assert seen[-1].type == "final" and [e for e in seen if e.type == "final"] == [seen[-1]]
        assert seen[-1].data.statuses == {t: TaskStatus.COMPLETED for t in ("ev-root", "ev-work", "ev-ask")}
        assert ("ev-ask", "task_completed") in {(e.task_id, e.type) for e in seen}
        assert all(e.tree_id == "ev-root" for e in seen)

        # A finished tree: its current state, then final at once.
        again = [event async for event in client.watch("ev-work")]
        assert [e.type for e in again] == ["task_completed"] * 3 + ["final"]
        assert all(e.data.snapshot for e in again[:-1])
        with pytest.raises(ValueError, match="does not wait for input"):
            again[0].respond(True)

        tree = await client.wait("ev-ask", timeout=60)
        assert tree.id == "ev-root" and tree.status == TaskStatus.COMPLETED and tree.result is not None


async def test_the_sync_client_watches_and_answers(service: Service) -> None:
    def script() -> list[str]:
        with Client(service.url) as client:
            created = client.create(approval_tree("sync"))
            assert created.find("sync-ask").waiting is not None
            kinds = []
            with client.watch(created.id) as watch:
                for event in watch:
                    kinds.append(event.type)
                    if event.wants_input:
                        answered = event.respond(True)  # no await: the Client's events answer directly
                        assert answered.status == "resumed"
                assert watch.tasks["sync-ask"].status == TaskStatus.COMPLETED
            assert client.wait(created.id, timeout=60).status == TaskStatus.COMPLETED
            assert [t.id for t in client.list(search="sync", roots=True)] == ["sync-root"]
            return kinds

    kinds = await asyncio.to_thread(script)
    assert kinds[-1] == "final"


async def test_a_watch_stopped_early_closes_its_connections(service: Service) -> None:
    async with AsyncClient(service.url) as client:
        await client.create(approval_tree("early"))
        watch = client.watch("early-root")
        async with watch:
            first = await anext(watch)
            assert first.data.snapshot
        with pytest.raises(StopAsyncIteration):
            await anext(watch)
        await client.respond("early-ask", False)


def test_each_question_asks_once_however_many_events_carry_it() -> None:
    """A progress event published after a park carries the wait too (the pass writes progress after
    the park): the watch's documented loop (`if event.wants_input: respond`) must answer each
    question once, and a second question of the same task asks again."""
    from taskgrove.client.answers import TaskTree
    from taskgrove.client.watch import WatchState

    tree = TaskTree.model_validate({"id": "q", "name": "q", "status": "in_progress", "task_tree_id": "q"})
    state = WatchState(tree)
    asked = {"kind": "input", "prompt": "Ship it?", "since": "2026-11-29T10:00:00+00:00"}

    def message(kind: str, waiting: Any, status: str = "in_progress") -> dict[str, Any]:
        return {"type": kind, "task_id": "q", "context_id": "q",
                "data": {"status": status, "progress": 0.0, "waiting": waiting}}

    first = state.apply_message(message("task_status", asked))
    again = state.apply_message(message("task_progress", asked))
    assert first is not None and first.wants_input
    assert again is not None and not again.wants_input and again.waiting is not None
    assert again.bound(lambda *_: None).wants_input is False  # as the clients hand it out
    resumed = state.apply_message(message("task_status", None, status="pending"))
    assert resumed is not None and not resumed.wants_input
    second = state.apply_message(message("task_status", {**asked, "since": "2026-11-29T10:00:05+00:00"}))
    assert second is not None and second.wants_input
    same_prompt_new_wait = state.apply_message(message("task_progress", {**asked, "since": "2026-11-29T10:00:09+00:00"}))
    assert same_prompt_new_wait is not None and same_prompt_new_wait.wants_input
