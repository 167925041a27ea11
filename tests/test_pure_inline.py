"""Pure tasks complete inline (agent/engine/inline.py): claimed and completed in one pass's
transaction, with no attempt run; their outcome, history and events as the durable path's. An
executor that does not declare itself pure on its own class keeps the durable path."""

from __future__ import annotations

import asyncio
from typing import Any

from taskgrove.agent.engine.inline import declares_pure
from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.core import AggregateResultsExecutor, NoopExecutor
from taskgrove.executors.registry import ExecutorRegistry
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT


def task(tid: str, parent: str | None = None, deps: tuple[str, ...] = (), method: str | None = "noop_executor",
         **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": tid, "name": tid, "dependencies": [{"id": d} for d in deps], **extra}
    if parent:
        out["parent_id"] = parent
    if method:
        out["schemas"] = {"method": method}
    return out


def attempts_started(client: Client) -> list[str]:
    """Spy on the durable path: the ids whose attempt the engine starts (Attempts.start)."""
    attempts = client.services.engine.attempts
    started: list[str] = []
    real = attempts.start

    def start(tid: str, *args: Any, **kw: Any) -> None:
        started.append(tid)
        real(tid, *args, **kw)

    attempts.start = start  # type: ignore[method-assign]
    return started


class ThirdParty(Executor):
    """Looks pure, but does not say so."""

    id = "third_party_executor"
    extension = "test"

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        return {"ok": True}


class Declared(Executor):
    id = "declared_pure_executor"
    extension = "test"
    pure = True

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        return {"declared": True}


class Inherited(NoopExecutor):
    """A subclass of a pure executor does not inherit the declaration."""

    id = "inherited_noop_executor"
    extension = "test"


def test_only_a_class_that_says_so_itself_is_pure() -> None:
    assert declares_pure(NoopExecutor) and declares_pure(AggregateResultsExecutor) and declares_pure(Declared)
    assert not declares_pure(ThirdParty) and not declares_pure(Inherited)


async def test_pure_tasks_complete_inline_with_their_outcome_history_and_events(client: Client) -> None:
    started = attempts_started(client)
    with client.services.bus.subscribe(lambda e: e.get("root_task_id") == "root") as sub:
        tree = await client.result("tasks.create", [
            task("root", deps=("b",), method="aggregate_results_executor"),
            task("a", "root", inputs={"n": 1}), task("b", "root", deps=("a",)), task("g", "root", method=None)])
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "task_completed" and e["task_id"] == "root" for e in events):
            events.append(await asyncio.wait_for(sub.get(), EVENT_WAIT))
    assert started == []  # no attempt ran: every task completed inline
    assert tree["status"] == "completed"
    stored = {t: await client.result("tasks.get", {"task_id": t}) for t in ("root", "a", "b", "g")}
    assert {t["status"] for t in stored.values()} == {"completed"}
    assert stored["a"]["result"] == {"ok": True, "inputs": {"n": 1}} and stored["g"]["result"] is None
    assert stored["root"]["result"] == {"results": {"b": {"ok": True, "inputs": {}}}, "count": 1}
    assert all(t["attempt"] == 1 and t["started_at"] and t["completed_at"] for t in stored.values())
    history = await client.result("tasks.attempts", {"task_id": "root", "tree": True})
    assert sorted((h["task_id"], h["attempt"], h["outcome"]) for h in history) == [
        (t, 1, "completed") for t in ("a", "b", "g", "root")]
    for tid in ("root", "a", "b", "g"):
        kinds = [e["type"] for e in events if e["task_id"] == tid]
        assert kinds[kinds.index("task_start"):] [-1] == "task_completed", (tid, kinds)
        assert kinds.count("task_start") == 1 and kinds.count("task_completed") == 1, (tid, kinds)


async def test_a_third_party_executor_without_the_flag_keeps_the_durable_path(make_settings: Any) -> None:
    registry = ExecutorRegistry([NoopExecutor, ThirdParty, Declared, Inherited])
    async with running_app(make_settings(), registry=registry) as client:
        started = attempts_started(client)
        tree = await client.result("tasks.create", [
            task("r", method="declared_pure_executor"), task("x", "r", method="third_party_executor"),
            task("y", "r", method="inherited_noop_executor"), task("z", "r", deps=("x", "y"))])
        assert tree["status"] == "completed"
        assert sorted(started) == ["x", "y"]  # the declared one and the noop completed inline
        stored = {t: await client.result("tasks.get", {"task_id": t}) for t in ("r", "x", "y", "z")}
    assert stored["r"]["result"] == {"declared": True} and stored["x"]["result"] == {"ok": True}
    assert {t["status"] for t in stored.values()} == {"completed"}


async def test_a_pure_task_with_an_input_schema_of_its_own_keeps_the_durable_path(client: Client) -> None:
    started = attempts_started(client)
    schema = {"type": "object", "required": ["n"]}
    tree = await client.result("tasks.create", [
        {"id": "s", "name": "s", "inputs": {}, "schemas": {"method": "noop_executor", "input_schema": schema}}])
    assert started == ["s"] and tree["status"] == "failed"
