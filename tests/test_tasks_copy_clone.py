"""tasks.copy and tasks.clone through POST /tasks: selection, resets, id remapping, flags, modes."""

from __future__ import annotations

import re
from typing import Any

import pytest

FAIL = {"method": "command_executor"}  # no allow-list configured: fails at once
NOOP = {"method": "noop_executor"}

# r                      grouping, completed
# ├── a   (noop, 5 success tokens, product p-1, priority 0)
# │   └── a1 (noop, depends on s)
# ├── s   (noop)
# ├── b   (noop, depends on a)
# │   └── b1
# ├── d   (depends on b)
# └── z
TREE = [
    {"id": "r", "name": "R", "user_id": "alice"},
    {"id": "a", "name": "A", "parent_id": "r", "schemas": NOOP, "token_success": 5, "token_failed": 2,
     "product_id": "p-1", "priority": 0, "inputs": {"x": 1}},
    {"id": "a1", "name": "A1", "parent_id": "a", "schemas": NOOP, "dependencies": ["s"]},
    {"id": "s", "name": "S", "parent_id": "r", "schemas": NOOP},
    {"id": "b", "name": "B", "parent_id": "r", "schemas": NOOP, "dependencies": ["a"]},
    {"id": "b1", "name": "B1", "parent_id": "b"},
    {"id": "d", "name": "D", "parent_id": "r", "dependencies": [{"id": "b", "required": False}]},
    {"id": "z", "name": "Z", "parent_id": "r"},
]
RESET = {"status": "pending", "progress": 0.0, "result": None, "error": None, "started_at": None,
         "completed_at": None, "token_success": 0, "token_failed": 0}


async def completed_tree(client: Any) -> dict[str, dict[str, Any]]:
    await client.result("tasks.create", {"tasks": TREE})
    await client.result("tasks.update", {"task_id": "a", "error": "an old warning"})
    stored = await by_id(client)
    assert all(t["status"] == "completed" for t in stored.values())
    assert stored["a"]["result"] is not None and stored["a"]["started_at"] and stored["a"]["completed_at"]
    return stored


async def by_id(client: Any) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in await client.result("tasks.list", {"limit": 1000})}


def flatten(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [t for child in node["children"] for t in flatten(child)]


def copies_by_original(root: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["original_task_id"]: t for t in flatten(root)}


def assert_remapped(copies: dict[str, dict[str, Any]], originals: dict[str, dict[str, Any]],
                    outside_ok: set[str] = frozenset()) -> None:
    """New ids; parent and dependency ids point at the copies (or, outside the selection, at originals)."""
    new_ids = {c["id"] for c in copies.values()}
    assert not new_ids & set(originals), "copies must get new ids"
    assert len(new_ids) == len(copies)
    new_of = {orig: c["id"] for orig, c in copies.items()}
    root_ids = [c["id"] for c in copies.values() if c["parent_id"] is None]
    assert len(root_ids) == 1
    for orig, copy in copies.items():
        parent = originals[orig]["parent_id"]
        if copy["parent_id"] is not None:
            assert copy["parent_id"] == new_of[parent]
        assert copy["task_tree_id"] == root_ids[0]
        expected = [{"id": new_of.get(d["id"], d["id"]), "required": d["required"]}
                    for d in originals[orig]["dependencies"]]
        assert copy["dependencies"] == expected
        for dep in copy["dependencies"]:
            assert dep["id"] in new_ids or dep["id"] in outside_ok


# --- tasks.copy -------------------------------------------------------------------------------

async def test_copy_takes_the_subtree_and_every_dependent_transitively(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.copy", {"task_id": "a"})
    copies = copies_by_original(root)
    # a's subtree, b (depends on a) with its subtree, d (depends on b), joined under a copy of r
    assert set(copies) == {"r", "a", "a1", "b", "b1", "d"}
    assert root["original_task_id"] == "r" and root["parent_id"] is None
    assert_remapped(copies, originals, outside_ok={"s"})
    assert copies["a1"]["dependencies"] == [{"id": "s", "required": True}]  # s was not copied
    assert copies["d"]["dependencies"] == [{"id": copies["b"]["id"], "required": False}]
    for key in ("id", "name", "original_task_id", "status", "progress", "children"):
        assert key in root


async def test_copy_resets_execution_state_and_keeps_definitions(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.copy", {"task_id": "a"})
    stored = await by_id(client)
    for orig, node in copies_by_original(root).items():
        copy = stored[node["id"]]
        for field, value in RESET.items():
            assert copy[field] == value, (orig, field)
        for field in ("name", "user_id", "product_id", "priority", "inputs", "params", "schemas"):
            assert copy[field] == originals[orig][field], (orig, field)
        assert copy["original_task_id"] == orig
        assert copy["has_copy"] is False and copy["has_references"] is False
        assert copy["created_at"] > originals[orig]["created_at"]
    assert stored[copies_by_original(root)["a"]["id"]]["user_id"] == "alice"


async def test_copy_sets_has_copy_on_the_originals_only(client):
    await completed_tree(client)
    await client.result("tasks.copy", {"task_id": "a"})
    stored = await by_id(client)
    flagged = {tid for tid, t in stored.items() if t["has_copy"]}
    assert flagged == {"r", "a", "a1", "b", "b1", "d"}
    assert not any(t["has_references"] for t in stored.values())
    originals = {tid: t for tid, t in stored.items() if t["original_task_id"] is None}
    assert originals["s"]["status"] == "completed" and originals["a"]["error"] == "an old warning"


async def test_copy_with_children_brings_each_direct_childs_dependencies(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.copy", {"task_id": "a", "children": True})
    copies = copies_by_original(root)
    assert set(copies) == {"r", "a", "a1", "s", "b", "b1", "d"}
    assert copies["a1"]["dependencies"] == [{"id": copies["s"]["id"], "required": True}]
    assert_remapped(copies, originals)


async def test_copy_of_a_leaf_without_dependents_is_one_task(client):
    await completed_tree(client)
    root = await client.result("tasks.copy", {"task_id": "z"})
    assert root["original_task_id"] == "z" and root["parent_id"] is None and root["children"] == []
    assert root["status"] == "pending" and root["task_tree_id"] == root["id"]


async def test_copy_of_the_root_copies_the_whole_tree_and_is_not_executed(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.copy", {"task_id": "r", "children": False})
    copies = copies_by_original(root)
    assert set(copies) == set(originals)
    assert_remapped(copies, originals)
    assert [c["original_task_id"] for c in root["children"]] == ["a", "s", "b", "d", "z"]
    tree = await client.result("tasks.tree", {"task_id": root["id"]})
    assert all(t["status"] == "pending" for t in flatten(tree))
    assert len(await client.result("tasks.list", {"limit": 1000})) == 2 * len(originals)


async def test_copy_of_a_copy_points_at_its_direct_original(client):
    await completed_tree(client)
    first = await client.result("tasks.copy", {"task_id": "z"})
    second = await client.result("tasks.copy", {"task_id": first["id"]})
    assert second["original_task_id"] == first["id"]
    assert (await client.result("tasks.get", {"task_id": first["id"]}))["has_copy"] is True


@pytest.mark.parametrize("params,message", [
    ({"task_id": "nope"}, "Task 'nope' not found"),
    ({}, "task_id (or id) is required"),
    ({"task_id": "a", "children": "yes"}, "children must be true or false, got 'yes'"),
])
async def test_copy_with_bad_params_is_32602_and_changes_nothing(client, params, message):
    await completed_tree(client)
    before = await client.result("tasks.list", {"limit": 1000})
    error = await client.error("tasks.copy", params)
    assert error["code"] == -32602 and error["data"] == message
    assert await client.result("tasks.list", {"limit": 1000}) == before


# --- tasks.clone ------------------------------------------------------------------------------

async def test_clone_copies_the_subtree_with_resets_and_sets_has_references(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a"})
    copies = copies_by_original(root)
    assert set(copies) == {"a", "a1"}  # the subtree only (recursive defaults to true)
    assert root["parent_id"] is None and root["original_task_id"] == "a"
    assert_remapped(copies, originals, outside_ok={"s"})
    stored = await by_id(client)
    for orig, node in copies.items():
        copy = stored[node["id"]]
        assert copy["origin_type"] == "clone"
        for field, value in RESET.items():
            assert copy[field] == value, (orig, field)
        assert copy["product_id"] == originals[orig]["product_id"]
    assert {tid for tid, t in stored.items() if t["has_references"]} == {"a", "a1"}
    assert not any(t["has_copy"] for t in stored.values())


async def test_clone_not_recursive_is_only_the_task(client):
    await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a", "recursive": False})
    assert root["original_task_id"] == "a" and root["children"] == [] and root["dependencies"] == []
    stored = await by_id(client)
    assert {tid for tid, t in stored.items() if t["has_references"]} == {"a"}


@pytest.mark.parametrize("flag", ["_recursive", "children"])
async def test_clone_with_children_brings_their_dependencies(client, flag):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a", "recursive": False, flag: True})
    copies = copies_by_original(root)
    assert set(copies) == {"r", "a", "a1", "s"}  # a, its child a1, a1's dependency s, joined under r
    assert copies["a1"]["dependencies"] == [{"id": copies["s"]["id"], "required": True}]
    assert_remapped(copies, originals)


async def test_clone_link_needs_a_fully_completed_tree(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "p", "name": "P", "parent_id": "r", "dependencies": ["f"]},
        {"id": "ok", "name": "OK", "parent_id": "r"},
    ])
    before = await client.result("tasks.list", {"limit": 1000})
    for task_id in ("r", "ok"):  # even a completed task of an unfinished tree
        error = await client.error("tasks.clone", {"task_id": task_id, "origin_type": "link"})
        assert error["code"] == -32602
        assert error["data"] == "origin_type 'link' needs a fully completed tree; not completed: [f: failed, p: pending]"
    assert await client.result("tasks.list", {"limit": 1000}) == before


async def test_clone_link_keeps_state_and_results(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "r", "origin_type": "link"})
    copies = copies_by_original(root)
    assert set(copies) == set(originals)
    assert_remapped(copies, originals)
    for orig, copy in copies.items():
        assert copy["origin_type"] == "link"
        for field in ("status", "progress", "result", "error", "started_at", "completed_at", "token_success"):
            assert copy[field] == originals[orig][field], (orig, field)


async def test_clone_archive_keeps_state_and_is_read_only(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a", "origin_type": "archive"})
    copies = copies_by_original(root)
    assert {c["origin_type"] for c in copies.values()} == {"archive"}
    assert copies["a"]["result"] == originals["a"]["result"] and copies["a"]["status"] == "completed"
    error = await client.error("tasks.update", {"task_id": root["id"], "priority": 2})
    assert error["data"] == f"Update failed:\nCannot update task '{root['id']}': task is an archive (read-only)"
    error = await client.error("tasks.execute", {"task_id": root["id"]})
    assert error["code"] == -32602
    assert error["data"] == f"Task '{root['id']}' is an archive (read-only) and cannot be executed"
    assert (await client.result("tasks.get", {"task_id": root["id"]}))["priority"] == 0


async def test_clone_mixed_links_the_listed_tasks_and_copies_the_rest(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "r", "origin_type": "mixed", "link_task_ids": ["s", "b"]})
    copies = copies_by_original(root)
    assert_remapped(copies, originals)
    for orig, copy in copies.items():
        if orig in ("s", "b"):
            assert copy["origin_type"] == "link" and copy["status"] == "completed"
            assert copy["result"] == originals[orig]["result"]
        else:
            assert copy["origin_type"] == "clone" and copy["status"] == "pending" and copy["result"] is None


@pytest.mark.parametrize("params,message", [
    ({"origin_type": "mixed"}, "origin_type 'mixed' needs link_task_ids: the ids to link instead of copy"),
    ({"origin_type": "mixed", "link_task_ids": []}, "origin_type 'mixed' needs link_task_ids: the ids to link instead of copy"),
    ({"origin_type": "mixed", "link_task_ids": ["zz"]}, "link_task_ids not in the cloned tasks: [zz]"),
    ({"origin_type": "mixed", "link_task_ids": [5]}, "link_task_ids must be an array of non-empty strings"),
    ({"origin_type": "mixed", "link_task_ids": ["f"]}, "linked tasks must be completed; not completed: [f: failed]"),
    ({"origin_type": "reference"}, "origin_type must be one of copy, link, archive, mixed, got 'reference'"),
    ({"origin_type": 3}, "origin_type must be a non-empty string, got 3"),
    ({"recursive": "no"}, "recursive must be true or false, got 'no'"),
    ({"save": 0}, "save must be true or false, got 0"),
    ({"reset_fields": ["status", "bogus"]},
     ("reset_fields: cannot reset ['bogus']; resettable fields are ['completed_at', 'error', 'progress', 'result', "
      "'started_at', 'status', 'token_failed', 'token_success']")),
    ({"reset_fields": {"id": "x"}}, None),
    ({"reset_fields": "status"}, "reset_fields must be an array of field names or an object of field values"),
    ({"reset_fields": {"priority": 9}}, "reset_fields: priority must be an integer from 0 (urgent) to 3 (low), got 9"),
    ({"reset_fields": {"status": "done"}},
     "reset_fields: status must be one of pending, in_progress, completed, failed, cancelled, got 'done'"),
    ({"reset_fields": {"name": ""}}, "reset_fields: name must not be empty"),
    ({"reset_fields": {"name": 5}}, "reset_fields: name must be a string, got int"),
    ({"reset_fields": {"inputs": [1]}}, "reset_fields: inputs must be an object, got list"),
    ({"task_id": "nope"}, "Task 'nope' not found"),
])
async def test_clone_with_bad_params_is_32602_and_changes_nothing(client, params, message):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "ok", "name": "OK", "parent_id": "r"},
    ])
    before = await client.result("tasks.list", {"limit": 1000})
    error = await client.error("tasks.clone", {"task_id": "r", **params})
    assert error["code"] == -32602
    if message is None:
        assert re.fullmatch(r"reset_fields: cannot set \['id'\]; allowed fields are \[.*\]", error["data"])
    else:
        assert error["data"] == message
    assert await client.result("tasks.list", {"limit": 1000}) == before


async def test_reset_fields_as_a_list_resets_only_those(client):
    originals = await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a", "reset_fields": ["result", "error"]})
    copy = (await by_id(client))[root["id"]]
    assert copy["result"] is None and copy["error"] is None
    assert copy["status"] == "completed" and copy["progress"] == 1.0  # not listed: kept
    assert copy["token_success"] == originals["a"]["token_success"]
    assert copy["started_at"] == originals["a"]["started_at"]


async def test_reset_fields_as_an_object_overrides_values(client):
    await completed_tree(client)
    root = await client.result("tasks.clone", {"task_id": "a", "reset_fields": {
        "priority": 3, "name": "renamed", "inputs": {"y": 2}, "status": "cancelled", "progress": 0.5}})
    for node in flatten(root):
        assert node["priority"] == 3 and node["name"] == "renamed" and node["inputs"] == {"y": 2}
        assert node["status"] == "cancelled" and node["progress"] == 0.5
        assert node["result"] is None and node["completed_at"] is None  # the other resets still apply


async def test_clone_preview_is_not_saved_and_tasks_create_accepts_it(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R", "schemas": NOOP},
        {"id": "c1", "name": "C1", "parent_id": "r", "schemas": NOOP},
        {"id": "c2", "name": "C2", "parent_id": "r", "dependencies": ["c1"], "inputs": {"k": "v"}},
    ])
    before = await client.result("tasks.list", {"limit": 1000})
    preview = await client.result("tasks.clone", {"task_id": "r", "save": False})
    assert set(preview) == {"tasks", "saved"} and preview["saved"] is False
    tasks = preview["tasks"]
    assert [t["original_task_id"] for t in tasks] == ["r", "c1", "c2"]
    new_of = {t["original_task_id"]: t["id"] for t in tasks}
    assert not set(new_of.values()) & {"r", "c1", "c2"}
    assert tasks[0]["parent_id"] is None
    assert tasks[2]["parent_id"] == new_of["r"] and tasks[2]["dependencies"] == [{"id": new_of["c1"], "required": True}]
    assert all(t["status"] == "pending" and t["result"] is None for t in tasks)
    assert await client.result("tasks.list", {"limit": 1000}) == before  # nothing saved, no flags set

    root = await client.result("tasks.create", {"tasks": tasks})
    assert root["id"] == new_of["r"] and [c["id"] for c in root["children"]] == [new_of["c1"], new_of["c2"]]
    assert all(t["status"] == "completed" for t in flatten(root))
    assert root["children"][1]["inputs"] == {"k": "v"} and root["children"][1]["original_task_id"] == "c2"
    # the preview shape is also accepted as params itself
    preview = await client.result("tasks.clone", {"task_id": "r", "save": False})
    assert (await client.result("tasks.create", preview["tasks"]))["original_task_id"] == "r"
