"""A tree whose every task is pure is stored completed by its own insert (agent/engine/insert_inline.py):
each task's result, attempt 1, its history row, its execution ended, and afterwards the same events
(in the passes' order) and metrics as the passes' inline completions; the create answers with the
rows it stored, exactly as a read right after it finds them. A tree with one task that is not
pure, retries or has a timeout keeps the pass's path whole. Both backends (the `client` fixture)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import select

from taskgrove.agent.engine import insert_inline
from taskgrove.executors.core import AggregateResultsExecutor, NoopExecutor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.models import executions_table as X
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT
from tests.test_operations import sample
from tests.test_pure_inline import ThirdParty, attempts_started


def inserted_runs(client: Client) -> list[str]:
    """Spy on the pass's path: the trees whose insert left them to a pass (RunKeeper.run_inserted)."""
    keeper = client.services.engine.run_keeper
    trees: list[str] = []
    real = keeper.run_inserted

    async def run_inserted(execution: Any, rows: Any, call: Any) -> Any:
        trees.append(rows[0]["task_tree_id"])
        return await real(execution, rows, call)

    keeper.run_inserted = run_inserted  # type: ignore[method-assign]
    return trees


async def executions_of(client: Client, tree_id: str) -> list[dict[str, Any]]:
    async with client.services.repo.transaction() as conn:
        rows = (await conn.execute(select(X).where(X.c.task_tree_id == tree_id))).mappings().all()
    return [dict(row) for row in rows]


async def test_a_pure_one_task_tree_is_stored_completed_by_its_insert(client: Client) -> None:
    started, passed = attempts_started(client), inserted_runs(client)
    before = (await client.http.get("/metrics")).text
    with client.services.bus.subscribe(lambda e: e.get("root_task_id") == "one") as sub:
        tree = await client.result("tasks.create", [
            {"id": "one", "name": "one", "inputs": {"n": 2}, "schemas": {"method": "noop_executor"}}])
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "final" for e in events):
            events.append(await asyncio.wait_for(sub.get(), EVENT_WAIT))
    assert started == [] and passed == []  # no attempt ran, no pass took the tree
    assert tree["status"] == "completed" and tree["result"] == {"ok": True, "inputs": {"n": 2}}
    stored = await client.result("tasks.get", {"task_id": "one"})
    assert stored["attempt"] == 1 and stored["progress"] == 1.0
    assert stored["started_at"] == stored["completed_at"] and stored["completed_at"]
    history = await client.result("tasks.attempts", {"task_id": "one"})
    assert [(h["attempt"], h["outcome"], h["started_at"], h["ended_at"]) for h in history] == [
        (1, "completed", stored["started_at"], stored["completed_at"])]
    [execution] = await executions_of(client, "one")
    assert (execution["status"], execution["final_status"], execution["ended_at"]) == (
        "ended", "completed", stored["completed_at"])
    assert execution["lease_expires_at"] is None
    assert [e["type"] for e in events] == ["task_start", "progress", "task_completed", "final"]
    assert events[2]["result"] == tree["result"] and events[3]["status"] == "completed"
    after = (await client.http.get("/metrics")).text
    for name, labels in (("taskgrove_executions_started_total", {}),
                         ("taskgrove_executions_finished_total", {"outcome": "completed"})):
        assert sample(after, name, executor="noop_executor", **labels) == \
            sample(before, name, executor="noop_executor", **labels) + 1, name


async def test_a_resent_pure_create_answers_the_stored_tree_once(client: Client) -> None:
    sent = [{"id": "again", "name": "again", "schemas": {"method": "noop_executor"}}]
    first = await client.result("tasks.create", sent)
    second = await client.result("tasks.create", sent)
    assert first == second and second["status"] == "completed"
    assert len(await client.result("tasks.attempts", {"task_id": "again"})) == 1
    assert len(await executions_of(client, "again")) == 1


async def test_a_retrying_or_timed_task_keeps_its_whole_tree_on_the_pass_path(client: Client) -> None:
    passed = inserted_runs(client)
    noop = {"method": "noop_executor"}
    for tid, extra in (("retrying", {"retry": {"max_attempts": 2}}), ("timed", {"timeout_seconds": 30})):
        tree = await client.result("tasks.create", [{"id": tid, "name": tid, "schemas": noop, **extra}])
        assert tree["status"] == "completed", tid
    tree = await client.result("tasks.create", [
        {"id": "two", "name": "two", "schemas": noop},
        {"id": "kid", "name": "kid", "parent_id": "two", "schemas": noop, "retry": {"max_attempts": 2}},
        {"id": "after", "name": "after", "parent_id": "two", "schemas": noop, "dependencies": ["kid"]}])
    assert tree["status"] == "completed"
    assert passed == ["retrying", "timed", "two"]
    history = await client.result("tasks.attempts", {"task_id": "retrying"})
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "completed")]


async def test_a_one_task_tree_of_an_executor_not_pure_keeps_the_pass_path(make_settings: Any) -> None:
    registry = ExecutorRegistry([NoopExecutor, ThirdParty])
    async with running_app(make_settings(), registry=registry) as client:
        started, passed = attempts_started(client), inserted_runs(client)
        tree = await client.result("tasks.create", [
            {"id": "tp", "name": "tp", "schemas": {"method": "third_party_executor"}}])
        assert tree["status"] == "completed" and tree["result"] == {"ok": True}
        assert started == ["tp"] and passed == ["tp"]


# --- trees of several tasks ---------------------------------------------------------------

def shape(kind: str, p: str, method: str = "noop_executor") -> list[dict[str, Any]]:
    """Small trees of the benchmark's shapes (bench/wire.py): a chain, a fan-out, a diamond."""
    schemas = {"method": method}
    if kind == "chain":
        return [{"id": f"{p}0", "name": "t", "schemas": schemas, "inputs": {"i": 0}}] + [
            {"id": f"{p}{i}", "name": "t", "parent_id": f"{p}0", "schemas": schemas, "inputs": {"i": i},
             "dependencies": [{"id": f"{p}{i - 1}"}]} for i in range(1, 5)]
    if kind == "fan-out":
        return [{"id": f"{p}r", "name": "root", "schemas": schemas}] + [
            {"id": f"{p}{i}", "name": "t", "parent_id": f"{p}r", "schemas": schemas, "priority": i % 3}
            for i in range(5)]
    tasks = [{"id": f"{p}r", "name": "root", "schemas": schemas}]
    for layer in range(3):
        for i in range(3):
            deps = [{"id": f"{p}{layer - 1}-{j}"} for j in range(3)] if layer else []
            tasks.append({"id": f"{p}{layer}-{i}", "name": "t", "parent_id": f"{p}r", "schemas": schemas,
                          "dependencies": deps})
    return tasks


def dependencies(tasks: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {t["id"]: [d["id"] if isinstance(d, dict) else d for d in t.get("dependencies") or ()] for t in tasks}


async def create_watched(client: Client, tasks: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """tasks.create, and the events of its tree up to `final`."""
    root = tasks[0]["id"]
    with client.services.bus.subscribe(lambda e: e.get("root_task_id") == root) as sub:
        tree = await client.result("tasks.create", tasks)
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "final" for e in events):
            events.append(await asyncio.wait_for(sub.get(), EVENT_WAIT))
    return tree, events


def flat(tree: dict[str, Any]) -> list[dict[str, Any]]:
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node["children"])
    return out


@pytest.mark.parametrize("kind", ["chain", "fan-out", "diamond"])
async def test_a_pure_tree_is_stored_completed_by_its_insert(client: Client, kind: str) -> None:
    tasks = shape(kind, "p")
    started, passed = attempts_started(client), inserted_runs(client)
    before = (await client.http.get("/metrics")).text
    tree, events = await create_watched(client, tasks)
    assert started == [] and passed == []  # no attempt ran, no pass took the tree
    nodes = {node["id"]: node for node in flat(tree)}
    assert set(nodes) == {t["id"] for t in tasks}
    assert {(n["status"], n["attempt"], n["progress"]) for n in nodes.values()} == {("completed", 1, 1.0)}
    assert all(n["started_at"] == n["completed_at"] for n in nodes.values())
    deps = dependencies(tasks)
    for tid, node in nodes.items():  # tests/test_races.py's rule: no start before a dependency's end
        assert all(node["started_at"] > nodes[dep]["completed_at"] for dep in deps[tid])
    history = await client.result("tasks.attempts", {"task_id": tasks[0]["id"], "tree": True})
    assert sorted((h["task_id"], h["attempt"], h["outcome"], h["started_at"], h["ended_at"]) for h in history) == \
        sorted((tid, 1, "completed", n["started_at"], n["completed_at"]) for tid, n in nodes.items())
    [execution] = await executions_of(client, tasks[0]["id"])
    assert (execution["status"], execution["final_status"], execution["ended_at"]) == (
        "ended", "completed", max(n["completed_at"] for n in nodes.values()))
    assert execution["created_at"] == min(n["started_at"] for n in nodes.values())
    # Events: each task's start, progress and completion, in dependency order, then `final`.
    kinds = [e["type"] for e in events]
    assert kinds == ["task_start", "progress", "task_completed"] * len(tasks) + ["final"]
    order = [e["task_id"] for e in events if e["type"] == "task_completed"]
    assert order == sorted(nodes, key=lambda tid: nodes[tid]["started_at"])  # the stored times say the order
    for tid in order:
        assert all(order.index(dep) < order.index(tid) for dep in deps[tid]), (tid, order)
    assert [e["tree_progress"] for e in events if e["type"] == "task_completed"] == \
        [round(n / len(tasks), 4) for n in range(1, len(tasks) + 1)]
    assert events[-1]["status"] == "completed" and events[-1]["progress"] == 1.0
    after = (await client.http.get("/metrics")).text
    for name, labels in (("taskgrove_executions_started_total", {}),
                         ("taskgrove_executions_finished_total", {"outcome": "completed"})):
        assert sample(after, name, executor="noop_executor", **labels) == \
            sample(before, name, executor="noop_executor", **labels) + len(tasks), name


@pytest.mark.parametrize("kind", ["chain", "fan-out", "diamond"])
async def test_a_pure_tree_publishes_what_the_passes_publish(client: Client, kind: str) -> None:
    """The same tree through the passes (the insert path turned off) and through its insert:
    the same events, in the same order."""
    seen = []
    for p, limit in (("a", 0), ("b", insert_inline.MAX_TASKS)):
        passed = inserted_runs(client)
        kept, insert_inline.MAX_TASKS = insert_inline.MAX_TASKS, limit
        try:
            _, events = await create_watched(client, shape(kind, p))
        finally:
            insert_inline.MAX_TASKS = kept
        assert passed == ([f"{p}0" if kind == "chain" else f"{p}r"] if p == "a" else [])
        seen.append([(e["type"], e["task_id"][1:], e.get("status"), e.get("attempt"), e.get("progress"),
                      e["tree_progress"], e["task_count"], e.get("result")) for e in events])
    assert seen[0] == seen[1]


async def test_a_tree_with_one_task_that_is_not_pure_keeps_the_pass_path_whole(make_settings: Any) -> None:
    registry = ExecutorRegistry([NoopExecutor, AggregateResultsExecutor, ThirdParty])
    async with running_app(make_settings(), registry=registry) as client:
        started, passed = attempts_started(client), inserted_runs(client)
        tree = await client.result("tasks.create", [
            {"id": "m", "name": "m", "schemas": {"method": "aggregate_results_executor"}, "dependencies": ["x", "y"]},
            {"id": "x", "name": "x", "parent_id": "m", "schemas": {"method": "noop_executor"}},
            {"id": "y", "name": "y", "parent_id": "m", "schemas": {"method": "third_party_executor"}}])
        assert passed == ["m"] and started == ["y"]  # the pure ones completed inline by the passes
        assert tree["status"] == "completed"
        assert tree["result"] == {"results": {"x": {"ok": True, "inputs": {}}, "y": {"ok": True}}, "count": 2}


async def test_a_resent_pure_tree_answers_the_stored_tree_once(client: Client) -> None:
    sent = shape("diamond", "re")
    first = await client.result("tasks.create", sent)
    second = await client.result("tasks.create", sent)
    assert first == second and second["status"] == "completed"
    history = await client.result("tasks.attempts", {"task_id": "rer", "tree": True})
    assert sorted(h["task_id"] for h in history) == sorted(t["id"] for t in sent)
    assert len(await executions_of(client, "rer")) == 1


async def test_an_aggregate_gets_its_dependencies_results(client: Client) -> None:
    passed = inserted_runs(client)
    agg = {"method": "aggregate_results_executor"}
    tree = await client.result("tasks.create", [
        {"id": "all", "name": "all", "schemas": agg, "dependencies": ["sum", "c"]},
        {"id": "sum", "name": "sum", "parent_id": "all", "schemas": agg, "dependencies": ["a", "b"]},
        {"id": "a", "name": "a", "parent_id": "sum", "schemas": {"method": "noop_executor"}, "inputs": {"v": 1}},
        {"id": "b", "name": "b", "parent_id": "sum", "schemas": {"method": "noop_executor"}, "inputs": {"v": 2}},
        {"id": "c", "name": "c", "parent_id": "all"}])  # a grouping task: completes with no result
    assert passed == [] and tree["status"] == "completed"
    inner = {"results": {"a": {"ok": True, "inputs": {"v": 1}}, "b": {"ok": True, "inputs": {"v": 2}}}, "count": 2}
    assert tree["result"] == {"results": {"sum": inner, "c": None}, "count": 2}
    assert (await client.result("tasks.get", {"task_id": "sum"}))["result"] == inner


# --- the answer, built from the inserted rows ------------------------------------------------

ODD_VALUES = {"float": 1.5, "whole_float": 2.0, "big": 2 ** 62, "tiny": 1e-300, "text": "é ✓ \u00e9\U0001F600",
              "nested": {"b": [1, {"z": None, "a": True}], "a": []}, "neg_zero": -0.0}


def answer_trees() -> dict[str, list[dict[str, Any]]]:
    return {
        "one": [{"id": "o", "name": "one", "description": "d", "schemas": {"method": "noop_executor"},
                 "inputs": ODD_VALUES, "priority": 0, "product_id": "p", "my_field": {"x": [1, 2.5]}}],
        "chain": shape("chain", "c"), "fan-out": shape("fan-out", "f"), "diamond": shape("diamond", "d"),
        "grouping": [
            {"id": "g", "name": "group"},  # no executor: a grouping task
            {"id": "g1", "name": "left", "parent_id": "g", "schemas": {"method": "noop_executor"},
             "inputs": {"n": 1}},
            {"id": "g2", "name": "right", "parent_id": "g", "schemas": {"method": "noop_executor"},
             "inputs": ODD_VALUES},
            {"id": "gs", "name": "sum", "parent_id": "g", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": "g1"}, {"id": "g2", "required": False}]}],
    }


@pytest.mark.parametrize("name", list(answer_trees()))
async def test_the_create_answers_the_rows_it_stored_as_a_read_finds_them(client: Client, name: str) -> None:
    tasks = answer_trees()[name]
    repo = client.services.repo
    reads: list[str] = []
    real_tree = repo.tree

    async def tree_read(tree_id: str, *args: Any, **kw: Any) -> Any:
        reads.append(tree_id)
        return await real_tree(tree_id, *args, **kw)

    repo.tree = tree_read  # type: ignore[method-assign]
    passed = inserted_runs(client)
    answer = await client.call("tasks.create", tasks)
    assert passed == [] and reads == []  # stored completed by its insert, answered with no read
    read = await client.result("tasks.tree", {"task_id": tasks[0]["id"]})
    del read["tree_usage"]  # tasks.tree's own addition (a create never had it)
    # Identical, key order and types included: compared as JSON text.
    assert json.dumps(answer["result"]) == json.dumps(read)
    for node in flat(read):
        got = await client.result("tasks.get", {"task_id": node["id"]})
        assert json.dumps({k: v for k, v in got.items() if k != "tree_usage"}) == \
            json.dumps({k: v for k, v in node.items() if k != "children"})
    assert answer["result"]["status"] == "completed"


async def test_a_tree_larger_than_the_cap_takes_the_passes(client: Client) -> None:
    passed = inserted_runs(client)
    kept, insert_inline.MAX_TASKS = insert_inline.MAX_TASKS, 4
    try:
        small = await client.result("tasks.create", shape("chain", "s")[:4])
        large = await client.result("tasks.create", shape("chain", "l"))  # 5 tasks
    finally:
        insert_inline.MAX_TASKS = kept
    assert passed == ["l0"] and small["status"] == large["status"] == "completed"
