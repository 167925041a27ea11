"""One table of field rules (storage/fields.py): the same wrong value gets the same sentence from
tasks.create, tasks.update, tasks.clone's reset_fields and the planner's validation."""

from __future__ import annotations

from typing import Any

import pytest

from taskgrove.llm.generate import validate_tree

# (field, a wrong value, the sentence every call answers with)
WRONG = [
    ("name", "", "name must not be empty"),
    ("name", 5, "name must be a string, got int"),
    ("name", "n" * 1025, "name is longer than 1024 characters"),
    ("description", 5, "description must be a string or null, got int"),
    ("priority", 9, "priority must be an integer from 0 (urgent) to 3 (low), got 9"),
    ("priority", True, "priority must be an integer from 0 (urgent) to 3 (low), got True"),
    ("inputs", [1], "inputs must be an object, got list"),
    ("params", "x", "params must be an object, got str"),
    ("schemas", 3, "schemas must be an object, got int"),
    ("status", "done", "status must be one of pending, in_progress, completed, failed, cancelled, got 'done'"),
    ("progress", 1.5, "progress must be a number from 0.0 to 1.0, got 1.5"),
    ("error", 5, "error must be a string or null, got int"),
    ("started_at", 1700000000, "started_at must be a string or null, got int"),
    ("completed_at", "2026-01-01T00:00:00+00:00" + "9" * 30, "completed_at is longer than 40 characters"),
]


async def _problems(client: Any, field: str, value: Any) -> dict[str, str]:
    """The sentence each call answers for `field: value`, with the call's own prefix removed."""
    await client.result("tasks.create", [{"id": "t", "name": "T"}])
    answers = {
        "create": await client.error("tasks.create", [{"id": "new", "name": "N", field: value}]),
        "update": await client.error("tasks.update", {"task_id": "t", field: value}),
        "clone": await client.error("tasks.clone", {"task_id": "t", "reset_fields": {field: value}}),
    }
    assert {call: error["code"] for call, error in answers.items()} == dict.fromkeys(answers, -32602)
    create, update, clone = (answers[call]["data"] for call in ("create", "update", "clone"))
    return {"create": create.split(": ", 1)[1],
            "update": update.removeprefix(f"Update failed:\nCannot update '{field}': "),
            "clone": clone.removeprefix("reset_fields: ")}


@pytest.mark.parametrize("field,value,sentence", WRONG, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(WRONG)])
async def test_create_update_and_clone_word_a_wrong_value_alike(client, field, value, sentence):
    assert await _problems(client, field, value) == dict.fromkeys(("create", "update", "clone"), sentence)


@pytest.mark.parametrize("field,value,sentence", [row for row in WRONG if row[0] in ("priority", "inputs")])
def test_the_planner_words_a_wrong_value_as_create_does(field, value, sentence):
    tasks, problems = validate_tree([{"name": "noop_executor", field: value}], ["noop_executor"])
    assert tasks == [] and problems == [f"task #1 (noop_executor): {sentence}"]
