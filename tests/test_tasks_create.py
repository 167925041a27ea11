"""tasks.create through POST /tasks: input shapes, defaults, every validation rule.

Every refused tree answers -32602 with `data` naming the task and the problem (SPEC.md,
tasks.create rules), and leaves the database exactly as it was.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from taskgrove.agent.foundations.requests import NewTree

FAIL = {"method": "command_executor"}  # no allow-list configured: fails at once
PRIORITY = "priority must be an integer from 0 (urgent) to 3 (low)"
PROGRESS = "progress must be a number from 0.0 to 1.0"
NOT_TASKS = "tasks must be a non-empty array of task objects or one task object"


async def snapshot(client: Any) -> list[dict[str, Any]]:
    return await client.result("tasks.list", {"limit": 1000})


async def seeded(client: Any) -> list[dict[str, Any]]:
    """A stored tree, so 'unchanged' is checked against a non-empty table."""
    await client.result("tasks.create", [{"id": "seed", "name": "Seed"},
                                         {"id": "seed-1", "name": "Seed child", "parent_id": "seed"}])
    before = await snapshot(client)
    assert len(before) == 2
    return before


def ids_of(node: dict[str, Any]) -> list[str]:
    return [node["id"]] + [i for child in node["children"] for i in ids_of(child)]


# --- accepted shapes --------------------------------------------------------------------------

TWO = [{"id": "r", "name": "Root"}, {"id": "c", "name": "Child", "parent_id": "r"}]


@pytest.mark.parametrize(
    "params",
    [
        {"tasks": TWO},            # params.tasks as an array
        TWO,                       # params itself as an array
        {"tasks": {"id": "r", "name": "Root", "children": [{"id": "c", "name": "Child"}]}},  # params.tasks one object
        {"id": "r", "name": "Root", "children": [{"id": "c", "name": "Child"}]},  # params itself one object
    ],
    ids=["tasks-array", "params-array", "tasks-object", "params-object"],
)
async def test_every_input_shape_creates_the_tree_and_answers_the_root_node(client, params):
    root = await client.result("tasks.create", params)
    assert root["id"] == "r" and root["parent_id"] is None and root["name"] == "Root"
    assert [c["id"] for c in root["children"]] == ["c"]
    child = root["children"][0]
    assert child["parent_id"] == "r" and child["children"] == []
    # executed automatically: grouping tasks complete at once, and the answer shows it
    assert root["status"] == "completed" and child["status"] == "completed"
    assert {t["id"] for t in await snapshot(client)} == {"r", "c"}


async def test_single_task_object_without_children(client):
    root = await client.result("tasks.create", {"tasks": {"name": "alone"}})
    assert root["children"] == [] and root["name"] == "alone"
    assert (await client.result("tasks.get", {"task_id": root["id"]}))["name"] == "alone"


async def test_nested_children_input_is_flattened_with_parent_ids_and_generated_ids(client):
    root = await client.result("tasks.create", {"tasks": {
        "name": "root",
        "children": [
            {"name": "a", "children": [{"name": "a1"}, {"name": "a2"}]},
            {"id": "b", "name": "b", "children": [{"name": "b1", "dependencies": [{"id": "b"}]}]},
        ],
    }})
    assert [c["name"] for c in root["children"]] == ["a", "b"]  # input order kept
    a, b = root["children"]
    assert [c["name"] for c in a["children"]] == ["a1", "a2"]
    assert a["parent_id"] == root["id"] and a["children"][0]["parent_id"] == a["id"]
    assert b["id"] == "b" and b["children"][0]["parent_id"] == "b"
    assert b["children"][0]["dependencies"] == [{"id": "b", "required": True}]
    all_ids = ids_of(root)
    assert len(set(all_ids)) == 6
    for tid in all_ids:
        if tid != "b":
            uuid.UUID(tid)  # generated ids are UUIDs
    stored = await snapshot(client)
    assert {t["id"] for t in stored} == set(all_ids)
    assert {t["task_tree_id"] for t in stored} == {root["id"]}


async def test_ids_generated_when_omitted_and_references_by_id(client):
    root = await client.result("tasks.create", [
        {"name": "root"},
    ])
    uuid.UUID(root["id"])
    assert root["task_tree_id"] == root["id"]

    tree = await client.result("tasks.create", [
        {"id": "p", "name": "plan"},
        {"id": "s1", "name": "step 1", "parent_id": "p", "schemas": {"method": "noop_executor"}},
        {"id": "s2", "name": "step 2", "parent_id": "p", "dependencies": ["s1"]},
        {"id": "s3", "name": "step 3", "parent_id": "p",
         "dependencies": [{"id": "s1", "required": False}, {"id": "s2"}]},
    ])
    by_id = {c["id"]: c for c in tree["children"]}
    assert by_id["s2"]["dependencies"] == [{"id": "s1", "required": True}]
    assert by_id["s3"]["dependencies"] == [{"id": "s1", "required": False}, {"id": "s2", "required": True}]
    assert all(c["status"] == "completed" for c in tree["children"])
    assert by_id["s1"]["result"] is not None


async def test_defaults_and_given_fields_are_stored(client):
    root = await client.result("tasks.create", {"tasks": [{
        "id": "r", "name": "Root", "description": "what it is", "user_id": "alice", "product_id": "prod-1",
        "inputs": {"x": 1}, "params": {"p": True}, "priority": 3, "color": "blue",
    }, {"id": "c", "name": "Child", "parent_id": "r"}]})
    task = await client.result("tasks.get", {"task_id": "r"})
    assert task["priority"] == 3 and task["description"] == "what it is"
    assert task["inputs"] == {"x": 1} and task["params"] == {"p": True}
    assert task["product_id"] == "prod-1" and task["color"] == "blue"  # custom field kept
    child = await client.result("tasks.get", {"task_id": "c"})
    assert child["user_id"] == "alice"  # the tree's user_id applies to every task
    assert child["priority"] == 1  # default priority on tasks.create
    assert child["dependencies"] == [] and child["inputs"] == {} and child["schemas"] == {}
    assert child["origin_type"] == "own" and child["has_copy"] is False and child["has_references"] is False
    assert child["original_task_id"] is None and child["task_tree_id"] == "r"
    assert child["token_success"] == 0 and child["token_failed"] == 0
    assert root["created_at"] <= root["children"][0]["created_at"]


@pytest.mark.parametrize("priority", [0, 1, 2, 3])
async def test_priority_range_is_accepted(client, priority):
    root = await client.result("tasks.create", {"name": "p", "priority": priority})
    assert root["priority"] == priority


@pytest.mark.parametrize("progress", [0, 0.0, 0.5, 1, 1.0])
async def test_progress_range_is_accepted(client, progress):
    await client.result("tasks.create", {"name": "p", "progress": progress})


async def test_same_user_id_on_every_task_is_accepted(client):
    root = await client.result("tasks.create", [{"id": "r", "name": "r", "user_id": "u1"},
                                                {"id": "c", "name": "c", "parent_id": "r", "user_id": "u1"}])
    assert root["user_id"] == "u1" and root["children"][0]["user_id"] == "u1"


# --- refused trees ----------------------------------------------------------------------------

LONG = "n" * 1025

INVALID = [
    # exactly one root
    ("multiple-roots", [{"id": "a", "name": "A"}, {"id": "b", "name": "B"}],
     r"Multiple root tasks found: 'A' \(a\), 'B' \(b\); exactly one task must have no parent_id"),
    ("no-root", [{"id": "a", "name": "A", "parent_id": "b"}, {"id": "b", "name": "B", "parent_id": "a"}],
     r"No root task: exactly one task must have no parent_id"),
    ("unreachable", [{"id": "r", "name": "R"}, {"id": "a", "name": "A", "parent_id": "b"},
                     {"id": "b", "name": "B", "parent_id": "a"}],
     r"task 'A' \(id 'a'\) is not reachable from the root task 'r' via parent_id"),
    ("parent-not-in-input", [{"id": "r", "name": "R"}, {"id": "a", "name": "A", "parent_id": "seed"}],
     r"task 'A' \(id 'a'\): parent_id 'seed' is not one of the submitted tasks"),
    # dependencies
    ("dependency-not-in-input", [{"id": "r", "name": "R"}, {"id": "a", "name": "A", "parent_id": "r",
                                                            "dependencies": ["seed-1"]}],
     r"task 'A' \(id 'a'\): dependency 'seed-1' is not one of the submitted tasks"),
    ("cycle-of-two", [{"id": "r", "name": "R"},
                      {"id": "a", "name": "A", "parent_id": "r", "dependencies": ["b"]},
                      {"id": "b", "name": "B", "parent_id": "r", "dependencies": [{"id": "a"}]}],
     r"Circular dependency detected: a -> b -> a"),
    ("cycle-of-three", [{"id": "r", "name": "R"},
                        {"id": "a", "name": "A", "parent_id": "r", "dependencies": ["b"]},
                        {"id": "b", "name": "B", "parent_id": "r", "dependencies": ["c"]},
                        {"id": "c", "name": "C", "parent_id": "r", "dependencies": ["a"]}],
     r"Circular dependency detected: a -> b -> c -> a"),
    ("self-dependency", [{"id": "r", "name": "R", "dependencies": ["r"]}],
     r"Circular dependency detected: r -> r"),
    ("dependencies-not-array", {"id": "r", "name": "R", "dependencies": "a"},
     r"task 'R' \(id 'r'\): dependencies must be an array"),
    ("dependency-without-id", {"id": "r", "name": "R", "dependencies": [{"required": True}]},
     r"task 'R' \(id 'r'\): each dependency must be an object with a string 'id', got \{'required': True\}"),
    ("dependency-required-not-bool", [{"id": "r", "name": "R"},
                                      {"id": "a", "name": "A", "parent_id": "r",
                                       "dependencies": [{"id": "r", "required": "yes"}]}],
     r"task 'A' \(id 'a'\): dependency 'r' required must be true or false"),
    # owner
    ("different-user-ids", [{"id": "r", "name": "R", "user_id": "u1"},
                            {"id": "a", "name": "A", "parent_id": "r", "user_id": "u2"}],
     r"All tasks in a tree must have the same user_id, got: u1, u2"),
    ("user-id-not-string", {"id": "r", "name": "R", "user_id": 7},
     r"task 'R' \(id 'r'\): user_id must be a string or null, got int"),
    ("user-id-huge", {"id": "r", "name": "R", "user_id": "u" * 256},
     r"task 'R' \(id 'r'\): user_id is longer than 255 characters"),
    # name
    ("name-missing", [{"id": "r", "name": "R"}, {"id": "a", "parent_id": "r"}],
     r"task #1 \(id 'a'\): name is required"),
    ("name-null", {"id": "r", "name": None}, r"task #0 \(id 'r'\): name is required"),
    ("name-empty", {"id": "r", "name": ""}, r"task #0 \(id 'r'\): name must not be empty"),
    ("name-blank", {"id": "r", "name": "   "}, r"task '   ' \(id 'r'\): name must not be empty"),
    ("name-not-string", {"id": "r", "name": ["x"]}, r"task #0 \(id 'r'\): name must be a string, got list"),
    ("name-huge", {"id": "r", "name": LONG},
     r"task 'n{77}\.\.\.' \(id 'r'\): name is longer than 1024 characters"),
    ("name-with-nul", {"id": "r", "name": "a\x00b"},
     r"task 'a\x00b' \(id 'r'\): name must not contain NUL characters"),
    # priority
    ("priority-too-high", {"id": "r", "name": "R", "priority": 4}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got 4"),
    ("priority-negative", {"id": "r", "name": "R", "priority": -1}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got -1"),
    ("priority-string", {"id": "r", "name": "R", "priority": "1"}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got '1'"),
    ("priority-float", {"id": "r", "name": "R", "priority": 1.5}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got 1.5"),
    ("priority-bool", {"id": "r", "name": "R", "priority": True}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got True"),
    ("priority-null", {"id": "r", "name": "R", "priority": None}, rf"task 'R' \(id 'r'\): {re.escape(PRIORITY)}, got None"),
    # progress
    ("progress-too-high", {"id": "r", "name": "R", "progress": 1.5}, rf"task 'R' \(id 'r'\): {re.escape(PROGRESS)}, got 1.5"),
    ("progress-negative", {"id": "r", "name": "R", "progress": -0.1}, rf"task 'R' \(id 'r'\): {re.escape(PROGRESS)}, got -0.1"),
    ("progress-string", {"id": "r", "name": "R", "progress": "0.5"}, rf"task 'R' \(id 'r'\): {re.escape(PROGRESS)}, got '0.5'"),
    ("progress-bool", {"id": "r", "name": "R", "progress": False}, rf"task 'R' \(id 'r'\): {re.escape(PROGRESS)}, got False"),
    # ids
    ("duplicate-ids", [{"id": "r", "name": "R"}, {"id": "r", "name": "S", "parent_id": "r"}],
     r"task 'S' \(id 'r'\): id 'r' is used by more than one task"),
    ("id-already-stored", [{"id": "new", "name": "New"}, {"id": "seed-1", "name": "Old", "parent_id": "new"}],
     r"task 'Old' \(id 'seed-1'\): id 'seed-1' already exists"),
    ("id-not-string", {"id": 5, "name": "R"}, r"task 'R': id must be a string or null, got int"),
    ("id-empty", {"id": "", "name": "R"}, r"task 'R': id must not be empty"),
    ("id-huge", {"id": "i" * 500, "name": "R"}, r"task 'R' \(id 'i{77}\.\.\.'\): id is longer than 64 characters"),
    # other fields
    ("inputs-not-object", {"id": "r", "name": "R", "inputs": [1]}, r"task 'R' \(id 'r'\): inputs must be an object, got list"),
    ("params-not-object", {"id": "r", "name": "R", "params": "x"}, r"task 'R' \(id 'r'\): params must be an object, got str"),
    ("schemas-without-method", {"id": "r", "name": "R", "schemas": {"input_schema": {}}},
     r"task 'R' \(id 'r'\): schemas.method \(the executor id\) is required when schemas is given"),
    ("unknown-executor", {"id": "r", "name": "R", "schemas": {"method": "no_such_executor"}},
     r"task 'R' \(id 'r'\): executor 'no_such_executor' is not available \(available: .*noop_executor.*\)"),
    ("status-unknown", {"id": "r", "name": "R", "status": "done"},
     r"task 'R' \(id 'r'\): status must be one of pending, in_progress, completed, failed, cancelled, got 'done'"),
    ("origin-type-unknown", {"id": "r", "name": "R", "origin_type": "stolen"},
     r"task 'R' \(id 'r'\): origin_type must be one of own, clone, reference, link, archive, got 'stolen'"),
    ("error-not-string", {"id": "r", "name": "R", "error": 5}, r"task 'R' \(id 'r'\): error must be a string or null, got int"),
    ("token-counter-negative", {"id": "r", "name": "R", "token_success": -1},
     r"task 'R' \(id 'r'\): token_success must be an integer from 0 to 2147483647, got -1"),
    ("token-counter-huge", {"id": "r", "name": "R", "token_failed": 2**70},
     r"task 'R' \(id 'r'\): token_failed must be an integer from 0 to 2147483647, got 1180591620717411303424"),
    ("product-id-huge", {"id": "r", "name": "R", "product_id": "p" * 256},
     r"task 'R' \(id 'r'\): product_id is longer than 255 characters"),
    ("started-at-huge", {"id": "r", "name": "R", "started_at": "2026-01-01T00:00:00+00:00" + "0" * 20},
     r"task 'R' \(id 'r'\): started_at is longer than 40 characters"),
    ("original-task-id-huge", {"id": "r", "name": "R", "original_task_id": "o" * 65},
     r"task 'R' \(id 'r'\): original_task_id is longer than 64 characters"),
    ("error-with-nul", {"id": "r", "name": "R", "error": "bad\x00"},
     r"task 'R' \(id 'r'\): error must not contain NUL characters"),
    ("description-huge", {"id": "r", "name": "R", "description": "d" * 1_000_001},
     r"task 'R' \(id 'r'\): description is longer than 1000000 characters"),
    ("description-not-string", {"id": "r", "name": "R", "description": {"a": 1}},
     r"task 'R' \(id 'r'\): description must be a string or null, got dict"),
    ("description-with-nul", {"id": "r", "name": "R", "description": "x\x00"},
     r"task 'R' \(id 'r'\): description must not contain NUL characters"),
    # input shapes
    ("tasks-empty-array", {"tasks": []}, re.escape(NOT_TASKS)),
    ("params-empty-array", [], re.escape(NOT_TASKS)),
    ("tasks-string", {"tasks": "r"}, re.escape(NOT_TASKS)),
    ("tasks-number", {"tasks": 5}, re.escape(NOT_TASKS)),
    ("tasks-null", {"tasks": None}, re.escape(NOT_TASKS)),
    ("task-not-object", {"tasks": [{"id": "r", "name": "R"}, "child"]}, r"tasks\[1\]: each task must be an object, got str"),
    ("params-empty-object", {}, r"task #0: name is required"),
    ("children-not-array", {"id": "r", "name": "R", "children": {"name": "c"}}, r"tasks\[0\]: children must be an array"),
    ("nested-child-not-object", {"id": "r", "name": "R", "children": [{"name": "c", "children": [3]}]},
     r"tasks\[0\]\.children\[0\]\.children\[0\]: each task must be an object, got int"),
    ("nested-child-bad-dependency", {"id": "r", "name": "R", "children": [
        {"id": "c", "name": "C", "children": [{"id": "d", "name": "D", "dependencies": ["zz"]}]}]},
     r"task 'D' \(id 'd'\): dependency 'zz' is not one of the submitted tasks"),
    ("nested-child-bad-priority", {"id": "r", "name": "R", "children": [{"id": "c", "name": "C", "priority": 9}]},
     rf"task 'C' \(id 'c'\): {re.escape(PRIORITY)}, got 9"),
]


@pytest.mark.parametrize("params,pattern", [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
async def test_invalid_tree_is_refused_with_a_clear_message_and_nothing_stored(client, params, pattern):
    before = await seeded(client)
    error = await client.error("tasks.create", params)
    assert error["code"] == -32602
    assert re.fullmatch(pattern, error["data"]), error["data"]
    assert error["message"]
    assert await snapshot(client) == before


async def test_tree_with_a_failing_task_is_stored_and_its_dependents_stay_pending(client):
    root = await client.result("tasks.create", [
        {"id": "r", "name": "R"},
        {"id": "f", "name": "F", "parent_id": "r", "schemas": FAIL},
        {"id": "d", "name": "D", "parent_id": "r", "dependencies": ["f"]},
    ])
    by_id = {c["id"]: c for c in root["children"]}
    assert by_id["f"]["status"] == "failed" and by_id["f"]["error"]
    assert by_id["d"]["status"] == "pending"


async def test_wide_tree_is_created_in_one_request(client):
    tasks = [{"id": "root", "name": "root"}] + [
        {"id": f"t{i:03d}", "name": f"t{i}", "parent_id": "root",
         "dependencies": [f"t{i - 1:03d}"] if i else []} for i in range(150)
    ]
    root = await client.result("tasks.create", {"tasks": tasks})
    assert [c["id"] for c in root["children"]] == [f"t{i:03d}" for i in range(150)]
    assert all(c["status"] == "completed" for c in root["children"])


async def test_create_is_atomic_when_the_database_refuses_a_row(client, monkeypatch):
    """Even past validation (here: the id pre-check is bypassed), a refused row stores nothing."""
    before = await seeded(client)

    async def nothing_taken(_ids, conn=None):
        return {}

    monkeypatch.setattr(client.services.repo, "get_many", nothing_taken)
    error = await client.error("tasks.create", [{"id": "fresh", "name": "Fresh"},
                                                {"id": "fresh-1", "name": "Fresh 1", "parent_id": "fresh"},
                                                {"id": "seed-1", "name": "Clash", "parent_id": "fresh"}])
    assert error["code"] == -32602
    assert error["data"] == "One of the task ids already exists; nothing was created"
    assert await snapshot(client) == before


# --- resending a create (issue 19: a client cut off cannot tell whether its tree was stored) -----

RESENT = [{"id": "re-root", "name": "Root", "schemas": {"method": "aggregate_results_executor"},
           "dependencies": [{"id": "re-kid"}]},
          {"id": "re-kid", "name": "Kid", "parent_id": "re-root", "schemas": {"method": "noop_executor"},
           "inputs": {"n": 1}}]


async def test_the_same_create_resent_answers_with_the_stored_tree(client):
    first = await client.result("tasks.create", RESENT)
    assert first["status"] == "completed"
    again = await client.result("tasks.create", RESENT)
    assert again == first, "the stored tree, not run a second time"


async def test_a_create_that_differs_from_the_stored_tree_is_still_refused(client):
    await client.result("tasks.create", RESENT)
    changed = [RESENT[0], {**RESENT[1], "inputs": {"n": 2}}]
    error = await client.error("tasks.create", changed)
    assert error["code"] == -32602 and "id 're-root' already exists" in error["data"]
    fewer = [{**RESENT[0], "dependencies": []}]
    assert "already exists" in (await client.error("tasks.create", fewer))["data"]


async def test_a_resent_create_of_a_tree_stored_but_never_run_runs_it(client):
    from taskgrove.agent.foundations.auth import ANONYMOUS

    await client.services.tasks.create_tree(NewTree.from_params(RESENT), ANONYMOUS)  # as a create cut off before it ran
    answer = await client.result("tasks.create", RESENT)
    assert answer["status"] == "completed" and answer["children"][0]["status"] == "completed"


async def test_an_idempotency_key_makes_a_resend_answer_with_the_first_answer(client):
    """Requests without ids (generated ones) resent with the same Idempotency-Key create one tree."""
    tree = [{"name": "no id given", "schemas": {"method": "noop_executor"}}]
    headers = {"Idempotency-Key": "order-42"}
    first = await client.result("tasks.create", tree, headers=headers)
    again = await client.result("tasks.create", tree, headers=headers)
    assert again == first
    assert len(await client.result("tasks.list", {})) == 1, "one tree, not two"
    other = await client.result("tasks.create", tree, headers={"Idempotency-Key": "order-43"})
    assert other["id"] != first["id"]
    # The same key for another request is a client mistake, said so.
    error = await client.error("tasks.create", [{"name": "something else"}], headers=headers)
    assert error["code"] == -32602 and "already used for a different request" in error["data"]
    # execute and copy honour it too
    copied = await client.result("tasks.copy", {"task_id": first["id"]}, headers={"Idempotency-Key": "copy-1"})
    assert await client.result("tasks.copy", {"task_id": first["id"]},
                               headers={"Idempotency-Key": "copy-1"}) == copied
    assert len(await client.result("tasks.list", {})) == 3


async def test_a_failed_request_does_not_use_up_its_idempotency_key(client):
    headers = {"Idempotency-Key": "try-again"}
    assert (await client.error("tasks.create", [{"id": "x"}], headers=headers))["code"] == -32602
    answer = await client.result("tasks.create", [{"id": "x", "name": "fixed"}], headers=headers)
    assert answer["name"] == "fixed"
    assert (await client.error("tasks.create", [{"name": "n"}], headers={"Idempotency-Key": " "}))["code"] == -32602
