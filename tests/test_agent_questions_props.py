"""Property tests for the inputs of questions that cross the hop (issue 45, item 4): whatever a remote
agent puts in its question, whatever a person answers, whatever a checkpoint holds, the code reads it
or refuses it, and never breaks (executors/a2a_questions.py, agent/services/remote_questions.py,
agent/surfaces/a2a/input_required.py)."""

from __future__ import annotations

import json
from typing import Any

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import Message, Role, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict
from hypothesis import given, settings, strategies as st

from taskgrove.agent.services.remote_questions import asked_remote
from taskgrove.agent.surfaces.a2a.input_required import waits_for_input
from taskgrove.executors.a2a_questions import answer_message, question_of, sent_answers, usable_schema
from taskgrove.executors.base import ExecutionContext, Waiting
from taskgrove.storage.wait_store import public_wait

_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=30)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                           max_size=4), max_leaves=15)
_states = st.sampled_from([TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED])


def _task(state: int, text: str | None, data: dict[str, Any] | None) -> Task:
    parts = []
    if text is not None:
        parts.append(new_text_part(text))
    if data is not None:
        parts.append(new_data_part(data))
    message = Message(role=Role.ROLE_AGENT, message_id="m", parts=parts)
    return Task(id="rt", context_id="ctx", status=TaskStatus(state=state, message=message))


@settings(max_examples=200, deadline=None)
@given(_states, st.one_of(st.none(), st.text(max_size=50)),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(["prompt", "schema", "agent", "progress", "x"]), _json,
                                            max_size=4)),
       st.one_of(st.none(), st.text(max_size=20)))
def test_any_remote_question_becomes_a_wait_that_can_be_stored_and_shown(
        state: int, text: str | None, data: dict[str, Any] | None, name: str | None) -> None:
    question = question_of(_task(state, text, data), name, "http://agent.example")
    assert isinstance(question["prompt"], str) and question["prompt"]
    assert question["schema"] is None or isinstance(question["schema"], dict)
    assert question["agent"]["url"] == "http://agent.example" and question["agent"]["remote_task_id"] == "rt"
    context = ExecutionContext(task_id="t", task={}, settings=None)  # type: ignore[arg-type]
    try:
        context._wait({"kind": "agent_input", **question}, None, None)
        raise AssertionError("a wait without its answer parks")
    except Waiting as waiting:
        stored = json.dumps({**waiting.wait, "since": "2026-01-01T00:00:00+00:00", "deadline": None})
    shown = public_wait(stored)
    assert shown is not None and shown["kind"] == "agent_input" and shown["agent"]["url"] == "http://agent.example"
    (wait,) = waits_for_input([{"id": "t", "status": "in_progress", "waiting": stored}])
    assert wait.agent is not None and wait.text().startswith("The agent ")
    assert wait.data()["agent"]["remote_context_id"] == "ctx"


@settings(max_examples=200, deadline=None)
@given(_json)
def test_any_answer_is_sent_as_text_or_as_a_value_data_part(value: Any) -> None:
    message = answer_message(value, Task(id="rt", context_id="ctx"), "mid")
    assert (message.task_id, message.context_id, message.message_id) == ("rt", "ctx", "mid")
    (part,) = message.parts
    if isinstance(value, str):
        assert part.text == value
    else:
        assert set(MessageToDict(part.data)) == {"value"}


@settings(max_examples=200, deadline=None)
@given(_json)
def test_any_schema_is_kept_only_when_it_can_check_answers(schema: Any) -> None:
    kept = usable_schema(schema)
    assert kept is None or kept == schema


@settings(max_examples=200, deadline=None)
@given(st.one_of(_json, st.dictionaries(st.sampled_from(["answers_sent", "asking", "agent_url", "remote_task_id"]),
                                        _json, max_size=4)))
def test_any_checkpoint_is_read_or_ignored(checkpoint: Any) -> None:
    sent = sent_answers(checkpoint)
    assert isinstance(sent, int) and sent >= 0
    found = asked_remote(checkpoint)
    assert found is None or (isinstance(checkpoint, dict) and checkpoint["asking"] is True
                             and found == (checkpoint["agent_url"], checkpoint["remote_task_id"]))
