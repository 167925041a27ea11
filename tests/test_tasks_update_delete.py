"""tasks.update and tasks.delete through POST /tasks: every rule and message pattern of SPEC.md.

Pending tasks are made by depending on a task that fails at once (command_executor without an
allow-list); an executing task is a sleep_executor task, with tasks.create answering early.
"""

from __future__ import annotations

from typing import Any

import pytest

FAIL = {"method": "command_executor"}  # no allow-list configured: fails at once
SLEEP = {"method": "sleep_executor"}

# r (completed grouping task)
# ├── f  failed
# ├── p  pending (depends on f)
# │   ├── p1 pending (depends on f)
# │   └── p2 pending (depends on f)
# ├── q  pending (depends on p)
# └── done  completed
PENDING_TREE = [
    {"id": "r", "name": "R"},
    {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
    {"id": "p", "name": "P", "parent_id": "r", "dependencies": ["f"], "inputs": {"a": 1, "b": 2}},
    {"id": "p1", "name": "P1", "parent_id": "p", "dependencies": ["f"]},
    {"id": "p2", "name": "P2", "parent_id": "p", "dependencies": ["f"]},
    {"id": "q", "name": "Q", "parent_id": "r", "dependencies": ["p"]},
    {"id": "done", "name": "Done", "parent_id": "r"},
]


async def pending_tree(client: Any) -> dict[str, dict[str, Any]]:
    await client.result("tasks.create", {"tasks": PENDING_TREE})
    stored = {t["id"]: t for t in await client.result("tasks.list", {"limit": 1000})}
    assert {tid: t["status"] for tid, t in stored.items()} == {
        "r": "completed", "f": "failed", "p": "pending", "p1": "pending", "p2": "pending", "q": "pending",
        "done": "completed"}
    return stored


async def snapshot(client: Any) -> list[dict[str, Any]]:
    return await client.result("tasks.list", {"limit": 1000})


async def update_failed(client: Any, params: dict[str, Any]) -> list[str]:
    """The problem lines of an `Update failed:` error; the task must be unchanged."""
    before = await snapshot(client)
    error = await client.error("tasks.update", params)
    assert error["code"] == -32602 and error["message"] == "Invalid params"
    head, *lines = error["data"].split("\n")
    assert head == "Update failed:"
    assert await snapshot(client) == before
    return lines


HIERARCHY = "Cannot update 'parent_id': field cannot be modified (task hierarchy is fixed)"
OWNERSHIP = "Cannot update 'user_id': field cannot be modified (task ownership is fixed)"


# --- tasks.update: what may change ------------------------------------------------------------

@pytest.mark.parametrize("task_id", ["p", "f", "done"])  # pending, failed, completed
async def test_free_fields_update_from_any_status(client, task_id):
    await pending_tree(client)
    before = await client.result("tasks.get", {"task_id": task_id})
    changes = {
        "name": "renamed", "description": "described", "priority": 0, "inputs": {"new": True},
        "params": {"p": 1}, "schemas": {"method": "noop_executor"}, "result": {"value": [1, 2]},
        "error": "some error", "progress": 0.25, "started_at": "2026-01-02T03:04:05.000000+00:00",
        "completed_at": "2026-01-02T03:04:06.000000+00:00",
    }
    updated = await client.result("tasks.update", {"task_id": task_id, **changes})
    for key, value in changes.items():
        assert updated[key] == value, key
    assert updated["updated_at"] > before["updated_at"]
    assert updated["status"] == before["status"] and updated["parent_id"] == before["parent_id"]
    assert await client.result("tasks.get", {"task_id": task_id}) == updated  # the complete stored task


async def test_inputs_and_result_are_replaced_not_merged(client):
    await pending_tree(client)
    updated = await client.result("tasks.update", {"task_id": "p", "inputs": {"b": 3}, "result": {"x": 1}})
    assert updated["inputs"] == {"b": 3} and updated["result"] == {"x": 1}
    updated = await client.result("tasks.update", {"id": "p", "result": {"y": 2}})  # alias id
    assert updated["result"] == {"y": 2} and updated["inputs"] == {"b": 3}


async def test_status_can_be_set_from_any_status(client):
    await pending_tree(client)
    for status in ("in_progress", "completed", "failed", "cancelled", "pending"):
        assert (await client.result("tasks.update", {"task_id": "done", "status": status}))["status"] == status


async def test_nullable_fields_can_be_cleared(client):
    await pending_tree(client)
    updated = await client.result("tasks.update", {"task_id": "f", "error": None, "result": None, "description": None})
    assert updated["error"] is None and updated["result"] is None


async def test_dependencies_of_a_pending_task_can_be_changed(client):
    await pending_tree(client)
    updated = await client.result("tasks.update", {"task_id": "q", "dependencies": ["p", {"id": "done", "required": False}]})
    assert updated["dependencies"] == [{"id": "p", "required": True}, {"id": "done", "required": False}]
    updated = await client.result("tasks.update", {"task_id": "q", "dependencies": []})
    assert updated["dependencies"] == []
    assert (await client.result("tasks.get", {"task_id": "q"}))["dependencies"] == []


# --- tasks.update: every refusal --------------------------------------------------------------

async def test_parent_id_is_refused(client):
    await pending_tree(client)
    assert await update_failed(client, {"task_id": "p", "parent_id": "done"}) == [HIERARCHY]
    assert await update_failed(client, {"task_id": "p", "parent_id": None}) == [HIERARCHY]


async def test_user_id_is_refused(client):
    await pending_tree(client)
    assert await update_failed(client, {"task_id": "p", "user_id": "mallory"}) == [OWNERSHIP]


@pytest.mark.parametrize("task_id,status", [("f", "failed"), ("done", "completed")])
async def test_dependencies_only_when_pending(client, task_id, status):
    await pending_tree(client)
    assert await update_failed(client, {"task_id": task_id, "dependencies": []}) == [
        f"Cannot update 'dependencies': task status is '{status}' (must be 'pending')"]


async def test_dependency_reference_must_be_in_the_same_tree(client):
    await pending_tree(client)
    await client.result("tasks.create", {"id": "other", "name": "other tree"})
    assert await update_failed(client, {"task_id": "q", "dependencies": ["zz", {"id": "other"}]}) == [
        "Dependency reference 'zz' not found in task tree",
        "Dependency reference 'other' not found in task tree",
    ]


async def test_dependency_cycle_is_refused_with_the_chain(client):
    await pending_tree(client)
    assert await update_failed(client, {"task_id": "p", "dependencies": ["q"]}) == [
        "Circular dependency detected: p -> q -> p"]
    assert await update_failed(client, {"task_id": "p1", "dependencies": ["p1"]}) == [
        "Circular dependency detected: p1 -> p1"]


async def test_longer_cycle_reports_the_whole_chain(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "a", "name": "A", "parent_id": "r", "dependencies": ["f"]},
        {"id": "b", "name": "B", "parent_id": "r", "dependencies": ["a"]},
        {"id": "c", "name": "C", "parent_id": "r", "dependencies": ["b"]},
    ])
    assert await update_failed(client, {"task_id": "a", "dependencies": ["c"]}) == [
        "Circular dependency detected: a -> c -> b -> a"]


@pytest.mark.parametrize("field,value,problem", [
    ("priority", 9, "priority must be an integer from 0 (urgent) to 3 (low), got 9"),
    ("priority", "1", "priority must be an integer from 0 (urgent) to 3 (low), got '1'"),
    ("progress", 1.5, "progress must be a number from 0.0 to 1.0, got 1.5"),
    ("progress", True, "progress must be a number from 0.0 to 1.0, got True"),
    ("status", "done", "status must be one of pending, in_progress, completed, failed, cancelled, got 'done'"),
    ("status", "deleted", "status must be one of pending, in_progress, completed, failed, cancelled, got 'deleted'"),
    ("name", "", "name must not be empty"),
    ("name", 5, "name must be a string, got int"),
    ("name", "n" * 1025, "name is longer than 1024 characters"),
    ("name", "a\x00b", "name must not contain NUL characters"),
    ("inputs", [1], "inputs must be an object, got list"),
    ("params", "x", "params must be an object, got str"),
    ("schemas", None, "schemas must be an object, got null"),
    ("error", 5, "error must be a string or null, got int"),
    ("error", "e\x00", "error must not contain NUL characters"),
    ("started_at", 1700000000, "started_at must be a string or null, got int"),
    ("completed_at", "2026-01-01T00:00:00+00:00" + "9" * 30, "completed_at is longer than 40 characters"),
    ("dependencies", "p1", "dependencies: dependencies must be an array"),
    ("dependencies", [{"required": True}], "dependencies: each dependency must be an object with a string 'id', got {'required': True}"),
    ("token_success", 5, "unknown field"),
    ("has_copy", True, "unknown field"),
    ("created_at", "2020-01-01", "unknown field"),
])
async def test_bad_values_are_refused(client, field, value, problem):
    await pending_tree(client)
    assert await update_failed(client, {"task_id": "p2", field: value}) == [f"Cannot update '{field}': {problem}"]


async def test_dependents_that_are_executing_block_a_dependency_change(app_factory):
    # d runs a command that writes nothing while it runs: a sleep_executor stores its progress and a
    # checkpoint every second, which could land between update_failed's two snapshots.
    async with app_factory({"SERVICE_COMMAND_ALLOWLIST": "sleep"}, create_wait_timeout=0.2) as client:
        await client.result("tasks.create", [
            {"id": "r", "name": "R"},
            {"id": "x", "name": "X", "parent_id": "r", "schemas": {"method": "noop_executor"}},
            {"id": "d", "name": "D", "parent_id": "r", "schemas": {"method": "command_executor"},
             "inputs": {"command": ["sleep", "30"]}, "dependencies": ["x"]},
            {"id": "e", "name": "E", "parent_id": "r", "dependencies": ["d"]},
        ])
        await client.wait_status("d", ("in_progress",))
        assert (await client.result("tasks.get", {"task_id": "x"}))["status"] == "completed"
        # x is completed and d (depending on it) runs: both problems in one error
        assert await update_failed(client, {"task_id": "x", "dependencies": []}) == [
            "Cannot update 'dependencies': task status is 'completed' (must be 'pending')",
            "Cannot update dependencies: task 'x' has dependent tasks that are executing: [d]",
        ]
        # back to pending, only the executing dependent is left to refuse it
        await client.result("tasks.update", {"task_id": "x", "status": "pending"})
        assert await update_failed(client, {"task_id": "x", "dependencies": []}) == [
            "Cannot update dependencies: task 'x' has dependent tasks that are executing: [d]"]
        # other fields of x still update freely
        assert (await client.result("tasks.update", {"task_id": "x", "name": "X2"}))["name"] == "X2"
        # e waits for d: it is pending and its dependents are not executing
        assert (await client.result("tasks.update", {"task_id": "e", "dependencies": ["x"]}))["dependencies"] == [
            {"id": "x", "required": True}]


async def test_all_problems_are_collected_into_one_error_and_nothing_is_applied(client):
    await pending_tree(client)
    lines = await update_failed(client, {
        "task_id": "p", "name": "", "parent_id": "r", "user_id": "u2", "priority": 7, "progress": -1,
        "colour": "red", "inputs": {"ok": True}, "dependencies": ["zz", "q"],
    })
    assert lines == [
        "Cannot update 'name': name must not be empty",
        HIERARCHY,
        OWNERSHIP,
        "Cannot update 'priority': priority must be an integer from 0 (urgent) to 3 (low), got 7",
        "Cannot update 'progress': progress must be a number from 0.0 to 1.0, got -1",
        "Cannot update 'colour': unknown field",
        "Dependency reference 'zz' not found in task tree",
        "Circular dependency detected: p -> q -> p",
    ]
    task = await client.result("tasks.get", {"task_id": "p"})
    assert task["inputs"] == {"a": 1, "b": 2} and task["dependencies"] == [{"id": "f", "required": True}]


async def test_update_of_an_unknown_task_is_32602(client):
    error = await client.error("tasks.update", {"task_id": "nope", "name": "x"})
    assert error["code"] == -32602 and error["data"] == "Task 'nope' not found"


@pytest.mark.parametrize("params,message", [
    ({"name": "x"}, "task_id (or id) is required"),
    ({"task_id": 12, "name": "x"}, "task_id must be a non-empty string, got 12"),
])
async def test_update_without_a_usable_task_id_is_32602(client, params, message):
    error = await client.error("tasks.update", params)
    assert error["code"] == -32602 and error["data"] == message


async def test_archived_tasks_are_read_only(client):
    await client.result("tasks.create", [{"id": "r", "name": "R"}, {"id": "c", "name": "C", "parent_id": "r"}])
    archive = await client.result("tasks.clone", {"task_id": "r", "origin_type": "archive"})
    for task_id in (archive["id"], archive["children"][0]["id"]):
        assert await update_failed(client, {"task_id": task_id, "name": "changed"}) == [
            f"Cannot update task '{task_id}': task is an archive (read-only)"]
        assert await update_failed(client, {"task_id": task_id, "status": "pending", "user_id": "u"}) == [
            f"Cannot update task '{task_id}': task is an archive (read-only)", OWNERSHIP]
    # the original stays writable
    assert (await client.result("tasks.update", {"task_id": "c", "name": "ok"}))["name"] == "ok"


# --- tasks.delete -----------------------------------------------------------------------------

async def test_delete_a_pending_leaf(client):
    await pending_tree(client)
    answer = await client.result("tasks.delete", {"task_id": "q"})
    assert answer == {"success": True, "task_id": "q", "deleted_count": 1, "children_deleted": 0}
    assert await client.result("tasks.get", {"task_id": "q"}) is None
    assert len(await snapshot(client)) == 6


async def test_delete_removes_the_pending_subtree_physically(client):
    await pending_tree(client)
    await client.result("tasks.delete", {"task_id": "q"})  # q depends on p
    answer = await client.result("tasks.delete", {"id": "p"})  # alias id
    assert answer == {"success": True, "task_id": "p", "deleted_count": 3, "children_deleted": 2}
    for tid in ("p", "p1", "p2"):
        assert await client.result("tasks.get", {"task_id": tid}) is None
    assert {t["id"] for t in await snapshot(client)} == {"r", "f", "done"}
    assert [c["id"] for c in await client.result("tasks.children", {"parent_id": "r"})] == ["f", "done"]
    assert await client.result("tasks.list", {"status": "deleted"}) == []


async def test_delete_of_a_task_that_others_depend_on_is_refused(client):
    await pending_tree(client)
    before = await snapshot(client)
    error = await client.error("tasks.delete", {"task_id": "p"})
    assert error["code"] == -32602
    assert error["data"] == "Cannot delete task: 1 tasks depend on this task: [q]"
    assert await snapshot(client) == before  # atomic: nothing of the subtree went


async def test_dependents_of_descendants_also_block(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "p", "name": "P", "parent_id": "r", "dependencies": ["f"]},
        {"id": "p1", "name": "P1", "parent_id": "p", "dependencies": ["f"]},
        {"id": "u", "name": "U", "parent_id": "r", "dependencies": ["p1"]},
        {"id": "v", "name": "V", "parent_id": "r", "dependencies": ["p1", "p"]},
    ])
    error = await client.error("tasks.delete", {"task_id": "p"})
    assert error["data"] == "Cannot delete task: 2 tasks depend on this task: [u, v]"


async def test_delete_with_non_pending_children_is_refused_with_ids_and_statuses(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "p", "name": "P", "parent_id": "r", "dependencies": ["f"]},
        {"id": "c1", "name": "C1", "parent_id": "p"},                       # completes at once
        {"id": "c2", "name": "C2", "parent_id": "p", "dependencies": ["f"]},  # pending
        {"id": "c3", "name": "C3", "parent_id": "c2", "schemas": FAIL},     # fails (grandchild)
    ])
    before = await snapshot(client)
    error = await client.error("tasks.delete", {"task_id": "p"})
    assert error["code"] == -32602
    assert error["data"] == "Cannot delete task: task has 2 non-pending children: [c1: completed, c3: failed]"
    assert await snapshot(client) == before


async def test_both_blockers_are_joined_with_semicolon(client):
    await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "p", "name": "P", "parent_id": "r", "dependencies": ["f"]},
        {"id": "c1", "name": "C1", "parent_id": "p"},
        {"id": "q", "name": "Q", "parent_id": "r", "dependencies": ["p"]},
    ])
    before = await snapshot(client)
    error = await client.error("tasks.delete", {"task_id": "p"})
    assert error["data"] == ("Cannot delete task: task has 1 non-pending children: [c1: completed]; "
                             "Cannot delete task: 1 tasks depend on this task: [q]")
    assert await snapshot(client) == before


@pytest.mark.parametrize("task_id,status", [("f", "failed"), ("done", "completed"), ("r", "completed")])
async def test_delete_of_a_task_that_is_not_pending_is_refused(client, task_id, status):
    await pending_tree(client)
    before = await snapshot(client)
    error = await client.error("tasks.delete", {"task_id": task_id})
    assert error["code"] == -32602
    assert error["data"].startswith(f"Cannot delete task: task status is '{status}' (must be 'pending')")
    assert await snapshot(client) == before


async def test_delete_of_a_running_task_is_refused(app_factory):
    async with app_factory(create_wait_timeout=0.1) as client:
        await client.result("tasks.create", {"id": "s", "name": "S", "schemas": SLEEP, "inputs": {"seconds": 30}})
        await client.wait_status("s", ("in_progress",))
        error = await client.error("tasks.delete", {"task_id": "s"})
        assert error["data"] == "Cannot delete task: task status is 'in_progress' (must be 'pending')"
        assert (await client.result("tasks.get", {"task_id": "s"}))["status"] == "in_progress"


@pytest.mark.parametrize("params,message", [
    ({"task_id": "nope"}, "Task 'nope' not found"),
    ({}, "task_id (or id) is required"),
    ({"task_id": ["p"]}, "task_id must be a non-empty string, got ['p']"),
])
async def test_delete_with_bad_params_is_32602(client, params, message):
    await pending_tree(client)
    before = await snapshot(client)
    error = await client.error("tasks.delete", params)
    assert error["code"] == -32602 and error["data"] == message
    assert await snapshot(client) == before


async def test_deleted_task_cannot_be_deleted_again(client):
    await pending_tree(client)
    await client.result("tasks.delete", {"task_id": "q"})
    error = await client.error("tasks.delete", {"task_id": "q"})
    assert error["data"] == "Task 'q' not found"
