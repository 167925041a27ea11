"""Reading tasks: tasks.get / tasks.detail, tasks.list (filters, limits, order, paging),
tasks.children and tasks.tree, through POST /tasks."""

from __future__ import annotations

import re
from typing import Any

import pytest

FAIL = {"method": "command_executor"}  # no allow-list configured: fails at once

TREE = [
    {"id": "root", "name": "root"},
    {"id": "a", "name": "a", "parent_id": "root"},
    {"id": "a1", "name": "a1", "parent_id": "a"},
    {"id": "a1x", "name": "a1x", "parent_id": "a1"},
    {"id": "a2", "name": "a2", "parent_id": "a"},
    {"id": "b", "name": "b", "parent_id": "root"},
]


async def invalid(client: Any, method: str, params: Any) -> str:
    error = await client.error(method, params)
    assert error["code"] == -32602, error
    return error["data"]


def shape(node: dict[str, Any]) -> dict[str, Any]:
    return {node["id"]: [shape(c) for c in node["children"]]}


# --- tasks.get / tasks.detail -----------------------------------------------------------------

@pytest.mark.parametrize("method", ["tasks.get", "tasks.detail"])
async def test_get_answers_the_task_object(client, method):
    await client.result("tasks.create", {"tasks": TREE})
    for params in ({"task_id": "a1"}, {"id": "a1"}):  # alias id
        task = await client.result(method, params)
        assert task["id"] == "a1" and task["parent_id"] == "a" and task["name"] == "a1"
        assert "children" not in task
        for field in ("user_id", "priority", "dependencies", "inputs", "params", "schemas", "status", "progress",
                      "result", "error", "created_at", "updated_at", "started_at", "completed_at", "product_id",
                      "token_success", "token_failed", "original_task_id", "has_copy", "has_references",
                      "origin_type", "task_tree_id"):
            assert field in task, field
        assert task["task_tree_id"] == "root"


@pytest.mark.parametrize("method", ["tasks.get", "tasks.detail"])
async def test_get_of_an_unknown_task_is_a_null_result(client, method):
    answer = await client.call(method, {"task_id": "nope"})
    assert answer["result"] is None and "error" not in answer
    assert await client.result(method, {"id": "x" * 5000}) is None


@pytest.mark.parametrize("params,message", [
    ({}, "task_id (or id) is required"),
    ({"task_id": None}, "task_id (or id) is required"),
    ({"task_id": 5}, "task_id must be a non-empty string, got 5"),
    ({"task_id": ""}, "task_id must be a non-empty string, got ''"),
    ({"task_id": ["a"]}, "task_id must be a non-empty string, got ['a']"),
    ({"task_id": "x" * 10_001}, "task_id is longer than 10000 characters"),
    ({"task_id": "a\x00"}, "task_id must not contain NUL characters"),
])
async def test_get_with_bad_params_is_32602(client, params, message):
    assert await invalid(client, "tasks.get", params) == message


# --- tasks.list -----------------------------------------------------------------------------

async def make_trees(client: Any, count: int, user: str | None = None, prefix: str = "t") -> list[str]:
    ids = []
    for i in range(count):
        task: dict[str, Any] = {"id": f"{prefix}{i:03d}", "name": f"{prefix} {i}"}
        if user:
            task["user_id"] = user
        await client.result("tasks.create", task)
        ids.append(task["id"])
    return ids


async def test_list_is_newest_first_by_created_at(client):
    await client.result("tasks.create", {"tasks": TREE})
    ids = await make_trees(client, 3)
    listed = await client.result("tasks.list")
    stamps = [t["created_at"] for t in listed]
    assert stamps == sorted(stamps, reverse=True)
    assert [t["id"] for t in listed[:3]] == list(reversed(ids))
    # within one tree the root was created first, so it comes last
    assert listed[-1]["id"] == "root" and len(listed) == 9
    assert all("children" not in t for t in listed)


async def test_list_filters_by_user_id_and_status(client):
    await make_trees(client, 2, "alice", "al")
    await make_trees(client, 1, "bob", "bo")
    await client.result("tasks.create", [{"id": "r", "name": "r", "user_id": "alice"},
                                         {"id": "f", "name": "f", "parent_id": "r", "schemas": FAIL},
                                         {"id": "p", "name": "p", "parent_id": "r", "dependencies": ["f"]}])
    alice = await client.result("tasks.list", {"user_id": "alice"})
    assert {t["id"] for t in alice} == {"al000", "al001", "r", "f", "p"}
    assert [t["id"] for t in await client.result("tasks.list", {"user_id": "bob"})] == ["bo000"]
    assert await client.result("tasks.list", {"user_id": "carol"}) == []
    assert [t["id"] for t in await client.result("tasks.list", {"status": "failed"})] == ["f"]
    assert [t["id"] for t in await client.result("tasks.list", {"status": "pending"})] == ["p"]
    assert {t["id"] for t in await client.result("tasks.list", {"status": "completed", "user_id": "alice"})} \
        == {"al000", "al001", "r"}
    assert await client.result("tasks.list", {"status": "in_progress"}) == []
    assert await client.result("tasks.list", {"status": "cancelled"}) == []


async def test_list_status_deleted_is_accepted_and_deleted_tasks_never_appear(client):
    await client.result("tasks.create", [{"id": "r", "name": "r"},
                                         {"id": "f", "name": "f", "parent_id": "r", "schemas": FAIL},
                                         {"id": "p", "name": "p", "parent_id": "r", "dependencies": ["f"]}])
    assert await client.result("tasks.list", {"status": "deleted"}) == []
    await client.result("tasks.delete", {"task_id": "p"})
    assert await client.result("tasks.list", {"status": "deleted"}) == []
    assert "p" not in {t["id"] for t in await client.result("tasks.list")}


async def test_list_limit_defaults_to_100_and_accepts_up_to_1000(client):
    tasks = [{"id": "root", "name": "root"}] + [
        {"id": f"c{i:03d}", "name": f"c{i}", "parent_id": "root"} for i in range(104)
    ]
    await client.result("tasks.create", {"tasks": tasks})
    assert len(await client.result("tasks.list")) == 100
    assert len(await client.result("tasks.list", {})) == 100
    assert len(await client.result("tasks.list", {"limit": 1000})) == 105
    assert len(await client.result("tasks.list", {"limit": 1})) == 1
    assert len(await client.result("tasks.list", {"limit": 100, "offset": 100})) == 5


async def test_offset_paging_is_stable_and_complete(client):
    tasks = [{"id": "root", "name": "root"}] + [
        {"id": f"c{i:03d}", "name": f"c{i}", "parent_id": "root"} for i in range(46)
    ]
    await client.result("tasks.create", {"tasks": tasks})
    await make_trees(client, 3)
    everything = [t["id"] for t in await client.result("tasks.list", {"limit": 1000})]
    assert len(everything) == 50
    pages = []
    for offset in range(0, 60, 7):
        pages.extend(t["id"] for t in await client.result("tasks.list", {"limit": 7, "offset": offset}))
    assert pages == everything  # no task twice, none lost, same order
    again = [t["id"] for t in await client.result("tasks.list", {"limit": 7, "offset": 14})]
    assert again == everything[14:21]
    assert await client.result("tasks.list", {"offset": 50}) == []


@pytest.mark.parametrize("params,message", [
    ({"limit": 1001}, "limit must be between 1 and 1000, got 1001"),
    ({"limit": 0}, "limit must be between 1 and 1000, got 0"),
    ({"limit": -5}, "limit must be between 1 and 1000, got -5"),
    ({"limit": "10"}, "limit must be an integer, got '10'"),
    ({"limit": 10.5}, "limit must be an integer, got 10.5"),
    ({"limit": True}, "limit must be an integer, got True"),
    ({"offset": -1}, "offset must be between 0 and 1000000000, got -1"),
    ({"offset": "0"}, "offset must be an integer, got '0'"),
    ({"offset": 10**12}, "offset must be between 0 and 1000000000, got 1000000000000"),
    ({"status": "done"}, "status must be one of pending, in_progress, completed, failed, cancelled, deleted, got 'done'"),
    ({"status": 3}, "status must be a non-empty string, got 3"),
    ({"user_id": 42}, "user_id must be a non-empty string, got 42"),
    ({"user_id": "u\x00"}, "user_id must not contain NUL characters"),
    ({"root_only": "yes"}, "root_only must be true or false, got 'yes'"),
    ({"search": 5}, "search must be a non-empty string, got 5"),
])
async def test_list_with_bad_params_is_32602(client, params, message):
    assert await invalid(client, "tasks.list", params) == message


async def test_list_root_only_counts_each_tree_and_search_matches_name_or_id_start(client):
    """The dashboard's tree list and the CLI's `tasks list --roots --search`."""
    await client.result("tasks.create", {"tasks": TREE})
    await client.result("tasks.create", [{"id": "r2", "name": "Report 100%_done"},
                                         {"id": "f", "name": "f", "parent_id": "r2", "schemas": FAIL}])
    roots = await client.result("tasks.list", {"root_only": True})
    assert [t["id"] for t in roots] == ["r2", "root"]
    assert roots[0]["status_counts"] == {"completed": 1, "failed": 1}
    assert roots[1]["status_counts"] == {"completed": 6}
    assert "status_counts" not in (await client.result("tasks.list", {"limit": 1}))[0]
    assert [t["id"] for t in await client.result("tasks.list", {"root_only": True, "status": "completed"})] \
        == ["r2", "root"]
    assert [t["id"] for t in await client.result("tasks.list", {"search": "REPORT"})] == ["r2"]  # any case
    assert [t["id"] for t in await client.result("tasks.list", {"search": "100%_"})] == ["r2"]  # % and _ literal
    assert await client.result("tasks.list", {"search": "100_%"}) == []
    assert [t["id"] for t in await client.result("tasks.list", {"search": "a1"})] == ["a1x", "a1"]  # id start
    assert [t["id"] for t in await client.result("tasks.list", {"search": "a1", "root_only": True})] == []


# --- tasks.children ---------------------------------------------------------------------------

async def test_children_is_a_flat_array_of_direct_children_in_creation_order(client):
    await client.result("tasks.create", {"tasks": TREE})
    for params in ({"parent_id": "root"}, {"task_id": "root"}):  # alias task_id
        children = await client.result("tasks.children", params)
        assert [c["id"] for c in children] == ["a", "b"]
        assert all("children" not in c for c in children)
    assert [c["id"] for c in await client.result("tasks.children", {"parent_id": "a"})] == ["a1", "a2"]
    assert await client.result("tasks.children", {"parent_id": "a1x"}) == []


@pytest.mark.parametrize("params,message", [
    ({}, "parent_id (or task_id) is required"),
    ({"parent_id": 3}, "parent_id must be a non-empty string, got 3"),
    ({"parent_id": "nope"}, "Task 'nope' not found"),
])
async def test_children_with_bad_params_is_32602(client, params, message):
    assert await invalid(client, "tasks.children", params) == message


# --- tasks.tree -------------------------------------------------------------------------------

EXPECTED_SHAPE = {"root": [{"a": [{"a1": [{"a1x": []}]}, {"a2": []}]}, {"b": []}]}


@pytest.mark.parametrize("params", [{"task_id": "root"}, {"root_id": "root"}, {"task_id": "a1x"}, {"task_id": "a2"},
                                    {"root_id": "b"}, {"id": "a1"}])
async def test_tree_from_any_node_is_the_whole_tree_from_the_root(client, params):
    await client.result("tasks.create", {"tasks": TREE})
    tree = await client.result("tasks.tree", params)
    assert shape(tree) == EXPECTED_SHAPE
    assert tree["parent_id"] is None and tree["children"][0]["children"][0]["parent_id"] == "a"
    assert tree["status"] == "completed"


async def test_tree_of_one_task(client):
    await client.result("tasks.create", {"id": "solo", "name": "solo"})
    assert shape(await client.result("tasks.tree", {"task_id": "solo"})) == {"solo": []}


async def test_trees_are_kept_apart(client):
    await client.result("tasks.create", {"tasks": TREE})
    await client.result("tasks.create", [{"id": "r2", "name": "r2"}, {"id": "x", "name": "x", "parent_id": "r2"}])
    assert shape(await client.result("tasks.tree", {"task_id": "x"})) == {"r2": [{"x": []}]}
    assert shape(await client.result("tasks.tree", {"task_id": "a1x"})) == EXPECTED_SHAPE


@pytest.mark.parametrize("params,pattern", [
    ({}, r"task_id \(or .*root_id.*\) is required"),
    ({"task_id": "nope"}, r"Task 'nope' not found"),
    ({"root_id": "nope"}, r"Task 'nope' not found"),
    ({"task_id": 1}, r"task_id must be a non-empty string, got 1"),
])
async def test_tree_with_bad_params_is_32602(client, params, pattern):
    assert re.fullmatch(pattern, await invalid(client, "tasks.tree", params))
