"""Concurrent requests that race for the same tree (issue 25): no dependency cycle can be stored,
whatever runs at the same time, and no race answers -32603."""

from __future__ import annotations

import asyncio
from typing import Any

from taskgrove.storage import trees
from tests.conftest import Client

PAIRS = 100  # x 2 opposite updates each, x 5 rounds: 1,000 concurrent updates


def pair_tree(n: int) -> list[dict[str, Any]]:
    root = f"root{n}"
    return [{"id": root, "name": root},
            {"id": f"a{n}", "name": "a", "parent_id": root}, {"id": f"b{n}", "name": "b", "parent_id": root}]


async def test_opposite_dependency_updates_never_store_a_cycle(client: Client) -> None:
    # Stored, not run (the tasks must stay pending for their dependencies to be updated).
    for n in range(PAIRS):
        await client.result("tasks.create", {"tasks": pair_tree(n)})
        for tid in (f"root{n}", f"a{n}", f"b{n}"):
            await client.result("tasks.update", {"task_id": tid, "status": "pending"})
    answers: list[dict[str, Any]] = []
    for _ in range(5):
        calls = []
        for n in range(PAIRS):
            calls.append(client.call("tasks.update", {"task_id": f"a{n}", "dependencies": [{"id": f"b{n}"}]}))
            calls.append(client.call("tasks.update", {"task_id": f"b{n}", "dependencies": [{"id": f"a{n}"}]}))
        answers += await asyncio.gather(*calls)
        for n in range(PAIRS):  # back to no dependencies for the next round
            for tid in (f"a{n}", f"b{n}"):
                await client.result("tasks.update", {"task_id": tid, "dependencies": []})
    errors = [a["error"] for a in answers if "error" in a]
    assert all(e["code"] == -32602 and "Circular dependency" in e["data"] for e in errors), errors[:3]
    successes = len(answers) - len(errors)
    print(f"{len(answers)} concurrent opposite updates: {successes} succeeded, {len(errors)} refused as cycles")
    assert successes == len(errors) == 5 * PAIRS, "exactly one of each opposite pair wins"


async def test_after_a_race_the_stored_graph_has_no_cycle(client: Client) -> None:
    for n in range(20):
        await client.result("tasks.create", {"tasks": pair_tree(n)})
        for tid in (f"a{n}", f"b{n}"):
            await client.result("tasks.update", {"task_id": tid, "status": "pending"})
    await asyncio.gather(*(client.call("tasks.update", {"task_id": f"{x}{n}", "dependencies": [{"id": f"{y}{n}"}]})
                           for n in range(20) for x, y in (("a", "b"), ("b", "a"))))
    for n in range(20):
        stored = [await client.result("tasks.get", {"task_id": f"{x}{n}"}) for x in "ab"]
        graph = {row["id"]: [d["id"] for d in row["dependencies"]] for row in stored}
        assert trees.find_cycle(graph) is None, graph


async def test_a_result_that_is_not_an_object_is_refused_naming_the_field(client: Client) -> None:
    await client.result("tasks.create", [{"id": "t", "name": "t"}])
    for bad in (0.5, 1, "text", [1, 2], True):
        answer = await client.call("tasks.update", {"task_id": "t", "result": bad})
        assert answer["error"]["code"] == -32602, answer
        assert "result must be an object or null" in answer["error"]["data"]
    assert "error" not in await client.call("tasks.update", {"task_id": "t", "result": {"ok": 1}})
    assert "error" not in await client.call("tasks.update", {"task_id": "t", "result": None})
