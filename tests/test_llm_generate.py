"""tasks.generate core (llm/generate.py): prompt, JSON extraction, every validation rule, repair."""

from __future__ import annotations

import json

import pytest

from taskgrove.agent.foundations.settings import Settings
from taskgrove.llm.client import LLMAuthError, LLMClient, LLMKeyMissingError
from taskgrove.llm.generate import (
    GenerationInputError,
    GenerationValidationError,
    build_messages,
    extract_json,
    generate_tree,
    validate_tree,
)
from tests.fakellm import VALID_TREE

EXECUTORS = [
    {"id": "llm_executor", "description": "Calls an LLM", "input_schema": {"type": "object", "properties": {"prompt": {"type": "string"}}}},
    {"id": "aggregate_results_executor", "description": "Merges dependency results"},
]
IDS = [e["id"] for e in EXECUTORS]


def client_for(fake) -> LLMClient:
    return LLMClient(Settings(llm_base_url=fake.base_url, llm_max_retries=0, environ={}))


def t(id_, name="llm_executor", parent=None, deps=()):
    task = {"name": name, "parent_id": parent, "inputs": {}, "dependencies": [{"id": d, "required": True} for d in deps]}
    if id_ is not None:
        task["id"] = id_
    return task


# -- one bad tree per SPEC.md rule ---------------------------------------------------------------

BAD_TREES = {
    "unknown executor": ([t("r"), t("a", name="web_scraper", parent="r")],
                         "name 'web_scraper' is not an available executor id"),
    "mixed ids": ([t("r"), t(None, parent="r")], "either all tasks have an id or none"),
    "missing parent": ([t("r"), t("a", parent="nope")], "parent_id 'nope' does not exist"),
    "missing dependency": ([t("r", deps=["ghost"]), t("a", parent="r")], "dependency 'ghost' does not exist"),
    "cycle": ([t("r"), t("a", parent="r", deps=["b"]), t("b", parent="r", deps=["c"]), t("c", parent="r", deps=["a"])],
              "dependency cycle: a -> b -> c -> a"),
    "two roots": ([t("r"), t("s")], "multiple root tasks"),
    "unreachable": ([t("r"), t("x", parent="y"), t("y", parent="x")], "not reachable from the root"),
}


@pytest.mark.parametrize("rule", list(BAD_TREES))
def test_each_rule_rejects(rule):
    tree, phrase = BAD_TREES[rule]
    tasks, problems = validate_tree(tree, IDS)
    assert tasks == []
    assert any(phrase in p for p in problems), problems


def test_self_dependency_and_parent_cycle_are_cycles():
    _, problems = validate_tree([t("r", deps=["r"])], IDS)
    assert any("dependency cycle: r -> r" in p for p in problems)
    _, problems = validate_tree([t("r"), t("x", parent="y"), t("y", parent="x")], IDS)
    assert any(p.startswith("parent_id cycle:") for p in problems)


def test_a_generated_chain_deeper_than_the_recursion_limit_validates():
    """Cycle checks are iterative (issue 18): a 3000-long dependency and parent chain is fine."""
    chain = [t("n0")] + [t(f"n{i}", parent=f"n{i - 1}", deps=[f"n{i - 1}"]) for i in range(1, 3000)]
    tasks, problems = validate_tree(chain, IDS)
    assert problems == [] and len(tasks) == 3000
    looped = chain + [t("loop", parent="n0", deps=["n2999"])]
    looped[0] = t("n0", deps=["loop"])
    _, problems = validate_tree(looped, IDS)
    assert any(p.startswith("dependency cycle: n0 -> loop -> n2999") for p in problems), problems[:2]


def test_no_root_and_duplicate_ids():
    _, problems = validate_tree([t("a", parent="b"), t("b", parent="a")], IDS)
    assert any("no root task" in p for p in problems)
    _, problems = validate_tree([t("r"), t("r", parent="r")], IDS)
    assert any("duplicate task id 'r'" in p for p in problems)


def test_valid_tree_is_normalised_for_tasks_create():
    tasks, problems = validate_tree(list(reversed(VALID_TREE)), IDS)
    assert problems == []
    root = tasks[0]
    assert root["parent_id"] is None and root["name"] == "aggregate_results_executor"  # root first
    ids = {x["id"] for x in tasks}
    assert len(ids) == 3 and "root" not in ids                                       # fresh UUIDs
    assert all(x["schemas"] == {"method": x["name"]} for x in tasks)
    assert all(x["parent_id"] == root["id"] for x in tasks[1:])
    assert {d["id"] for d in root["dependencies"]} == {x["id"] for x in tasks[1:]}
    b = next(x for x in tasks if x["inputs"].get("prompt") == "Summarise topic B")
    assert b["dependencies"][0]["required"] is False and b["priority"] == 2


def test_without_ids_references_use_unique_names():
    tree = [
        {"name": "aggregate_results_executor", "dependencies": ["llm_executor"]},
        {"name": "llm_executor", "parent_id": "aggregate_results_executor", "inputs": {"prompt": "x"}},
    ]
    tasks, problems = validate_tree(tree, IDS)
    assert problems == []
    assert tasks[0]["dependencies"] == [{"id": tasks[1]["id"], "required": True}]
    # Ambiguous name reference is refused.
    tree.append({"name": "llm_executor", "parent_id": "aggregate_results_executor"})
    _, problems = validate_tree(tree, IDS)
    assert any("ambiguous" in p for p in problems)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(VALID_TREE),
        "Sure, here it is:\n```json\n" + json.dumps(VALID_TREE) + "\n```\nAnything else?",
        "Plan [draft]: " + json.dumps(VALID_TREE) + " -- end",
        json.dumps({"tasks": VALID_TREE}),
    ],
)
def test_extract_json_tolerates_fences_and_prose(text):
    tree = extract_json(text)
    tree = tree["tasks"] if isinstance(tree, dict) else tree
    assert [x["id"] for x in tree] == ["root", "a", "b"]


def test_extract_json_reports_malformed():
    with pytest.raises(ValueError, match="not a JSON array of tasks"):
        extract_json('Sure! [{"id": "root", "name": oops')


def test_prompt_describes_executors_and_rules():
    system = build_messages("Build a report", EXECUTORS)[0]["content"]
    assert "llm_executor: Calls an LLM" in system and '"prompt":{"type":"string"}' in system
    assert "Exactly one root task" in system and "must not form a cycle" in system


# -- end to end against the fake server ----------------------------------------------------------


async def test_generate_valid_tree(fake_llm):
    result = await generate_tree("[[tree:valid]] Summarise two topics", client=client_for(fake_llm),
                                 executors=EXECUTORS, temperature=0.3, max_tokens=1234)
    assert result.attempts == 1 and len(result.tasks) == 3
    assert result.usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    sent = fake_llm.requests[0]
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 1234
    assert "aggregate_results_executor" in sent["messages"][0]["content"]


@pytest.mark.parametrize("marker", ["[[tree:repair]]", "[[tree:malformed]]"])
async def test_repair_round_shows_errors_and_succeeds(fake_llm, marker):
    result = await generate_tree(f"{marker} two topics", client=client_for(fake_llm), executors=EXECUTORS)
    assert result.attempts == 2 and len(result.tasks) == 3
    assert result.usage["total_tokens"] == 30
    second = fake_llm.requests[1]["messages"]
    assert second[-2]["role"] == "assistant"                    # its own previous answer
    assert "Problems:" in second[-1]["content"]
    expected = "web_scraper_executor" if marker == "[[tree:repair]]" else "not a JSON array"
    assert expected in second[-1]["content"]


@pytest.mark.parametrize("rule", list(BAD_TREES))
async def test_invalid_twice_raises_naming_the_problem(fake_llm, rule):
    tree, phrase = BAD_TREES[rule]
    fake_llm.script("[[bad]]", [json.dumps(tree)])
    with pytest.raises(GenerationValidationError) as err:
        await generate_tree("[[bad]] anything", client=client_for(fake_llm), executors=EXECUTORS)
    assert phrase in str(err.value) and any(phrase in p for p in err.value.problems)
    assert len(fake_llm.requests) == 2


async def test_builtin_invalid_tree_marker(fake_llm):
    with pytest.raises(GenerationValidationError, match="multiple root tasks"):
        await generate_tree("[[tree:invalid]]", client=client_for(fake_llm), executors=EXECUTORS)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(requirement=""), "requirement is required (mandatory for tasks.generate)"),
        (dict(requirement=None), "requirement is required (mandatory for tasks.generate)"),
        (dict(requirement="x", temperature=2.5), "temperature must be a number between 0.0 and 2.0"),
        (dict(requirement="x", temperature=-0.1), "temperature"),
        (dict(requirement="x", max_tokens=0), "max_tokens must be an integer"),
        (dict(requirement="x", max_tokens="100"), "max_tokens"),
    ],
)
async def test_input_errors(kwargs, message):
    requirement = kwargs.pop("requirement")
    client = LLMClient(Settings(environ={}))
    with pytest.raises(GenerationInputError) as err:
        await generate_tree(requirement, client=client, executors=EXECUTORS, **kwargs)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


async def test_missing_key():
    with pytest.raises(LLMKeyMissingError, match="OPENAI_API_KEY"):
        await generate_tree("anything", client=LLMClient(Settings(environ={})), executors=EXECUTORS)


async def test_provider_failure_propagates_as_llm_error(fake_llm):
    with pytest.raises(LLMAuthError):
        await generate_tree("[[error:401]]", client=client_for(fake_llm), executors=EXECUTORS, api_key="sk-x")
