"""The tree builder (client/builder.py) refuses exactly what the service refuses.

Generated programs (hypothesis) build a tree call by call: names, ids, priorities, timeouts,
executors of every kind of value, parents, and dependency edges (cycles included). The same tree
written as the plain task list a client would send goes to the service's own validation
(storage/new_tree.py prepare_new_tree). The builder must accept it exactly when the service does:
it never blocks valid work, and what it accepts is never refused for these fields. A few built
trees then go through a real service's tasks.create.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgrove.client import AsyncClient, TaskSpec, Tree, optional
from taskgrove.client import builder
from taskgrove.storage import fields
from taskgrove.storage.new_tree import prepare_new_tree
from tests.client_helpers import served

def mostly(valid: st.SearchStrategy[Any], wrong: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` 19 times in 20, else `wrong`: so that a tree of six tasks is accepted about half the time."""
    return st.integers(0, 19).flatmap(lambda n: wrong if n == 0 else valid)


NAMES = mostly(st.one_of(st.text(min_size=1, max_size=12).filter(lambda t: t.strip() and "\x00" not in t),
                         st.just("x" * 1024)),
               st.one_of(st.sampled_from(["", "   ", "a\x00b", "x" * 1025]), st.text(max_size=3)))
IDS = mostly(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(["t-1", "a" * 64, "Ω", "dup"])),
             st.sampled_from(["", " ", "a" * 65, "nul\x00"]))
PRIORITIES = mostly(st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.integers(-2, 5), st.booleans()))
TIMEOUTS = mostly(st.one_of(st.none(), st.sampled_from([0.5, 30, 7 * 86_400])),
                  st.sampled_from([0, -1, 7 * 86_400 + 1, True]))
EXECUTORS = st.one_of(st.none(), st.sampled_from(["noop_executor", "", "aggregate_results_executor"]))


@dataclass
class Step:
    name: str
    id: str | None
    priority: Any
    timeout: Any
    executor: str | None
    parent: int  # index of an earlier task (ignored for the root)


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[Step], set[tuple[int, int]]]:
    count = draw(st.integers(1, 6))
    steps = [Step(draw(NAMES), draw(IDS), draw(PRIORITIES), draw(TIMEOUTS), draw(EXECUTORS),
                  draw(st.integers(0, max(0, i - 1)))) for i in range(count)]
    node = st.integers(0, count - 1)
    edges = draw(st.sets(st.tuples(node, node).filter(lambda e: e[0] > e[1]), max_size=4))  # no circle ...
    extra = draw(mostly(st.none(), st.tuples(node, node)))  # ... but now and then any edge at all
    if extra is not None:
        edges.add(extra)
    return steps, edges


def built(steps: list[Step], edges: set[tuple[int, int]]) -> list[dict[str, Any]] | None:
    """The builder's tasks, or None when one of its calls refused."""
    nodes: list[TaskSpec] = []
    try:
        for index, step in enumerate(steps):
            options: dict[str, Any] = {"id": step.id, "priority": step.priority, "timeout_seconds": step.timeout}
            node = Tree(step.name, step.executor, **options) if index == 0 else \
                nodes[step.parent].add(step.name, step.executor, **options)
            nodes.append(node)
        for source, target in sorted(edges):
            nodes[source].after(nodes[target])
    except ValueError:
        return None
    return nodes[0].tasks()


def written(steps: list[Step], edges: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """The same tree as plain task dicts, as a client writes them by hand."""
    ids = [step.id if step.id is not None else f"auto-{index}" for index, step in enumerate(steps)]
    tasks = []
    for index, step in enumerate(steps):
        task: dict[str, Any] = {"id": ids[index], "name": step.name}
        if index:
            task["parent_id"] = ids[step.parent]
        for key, value in (("priority", step.priority), ("timeout_seconds", step.timeout)):
            if value is not None:
                task[key] = value
        if step.executor is not None:
            task["schemas"] = {"method": step.executor}
        deps = [{"id": ids[target], "required": True} for source, target in sorted(edges) if source == index]
        if deps:
            task["dependencies"] = deps
        tasks.append(task)
    return tasks


def service_accepts(tasks: list[dict[str, Any]]) -> bool:
    try:
        prepare_new_tree([dict(t) for t in tasks])
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_the_builder_refuses_exactly_what_the_service_refuses(program: tuple[list[Step], set[tuple[int, int]]]) -> None:
    steps, edges = program
    tasks = built(steps, edges)
    expected = service_accepts(written(steps, edges))
    assert (tasks is not None) == expected, (steps, edges)
    if tasks is not None:
        assert service_accepts(tasks)
        assert len({t["id"] for t in tasks}) == len(tasks) and all("parent_id" in t for t in tasks[1:])


def test_the_limits_are_the_services() -> None:
    assert (builder.MAX_NAME, builder.MAX_ID, builder.MAX_USER, builder.MAX_TEXT, builder.MAX_TIMEOUT) == \
        (fields.MAX_NAME, fields.MAX_ID, fields.MAX_USER, fields.MAX_TEXT, fields.MAX_TIMEOUT)


@given(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in {"id", "inputs", "after"}),
                       st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()), max_size=4))
def test_executor_inputs_are_keyword_arguments(inputs: dict[str, Any]) -> None:
    keywords = {k: v for k, v in inputs.items() if k.isidentifier() and k not in TaskSpec.__init__.__code__.co_varnames}
    root = Tree("root", "noop_executor", **keywords)
    assert root.tasks()[0].get("inputs", {}) == keywords
    both = Tree("root", "noop_executor", inputs={"priority": 2}, week=1)  # a clashing name goes in inputs=
    assert both.tasks()[0]["inputs"] == {"priority": 2, "week": 1} and "priority" not in both.tasks()[0]


def test_dependencies_are_objects_of_the_same_tree() -> None:
    root = Tree("root", "aggregate_results_executor")
    cached = root.add("cached", "noop_executor")
    fresh = root.add("fresh", "noop_executor", after=[optional(cached)])
    root.after(fresh, cached)
    assert fresh.tasks()[2]["dependencies"] == [{"id": cached.id, "required": False}]
    assert root.tasks()[0]["dependencies"] == [{"id": fresh.id, "required": True}, {"id": cached.id, "required": True}]
    stranger = Tree("other", "noop_executor")
    with pytest.raises(ValueError, match="not one of the submitted tasks"):
        fresh.after(stranger)
    with pytest.raises(ValueError, match="Circular dependency detected"):
        cached.after(root)
    with pytest.raises(ValueError, match="given twice"):
        root.add("x", "noop_executor", inputs={"week": 1}, week=2)
    assert [t.name for t in root.walk()] == ["root", "cached", "fresh"]  # a refused add leaves nothing


async def test_built_trees_run_on_a_real_service(make_settings: Callable[..., Any]) -> None:
    async with served(make_settings()) as (url, _app), AsyncClient(url) as client:
        report = Tree("Weekly report", "aggregate_results_executor", priority=0)
        numbers = report.add("Numbers", "noop_executor", week=12)
        words = report.add("Words", "noop_executor", after=[numbers], lang="en")
        section = report.add("Section", "aggregate_results_executor", after=[numbers, optional(words)])
        section.add("Note", "noop_executor", text="inside")
        report.after(section)
        tree = await client.create(report)
        assert tree.status == "completed" and tree.id == report.id and tree.priority == 0
        assert tree.find(numbers.id).inputs == {"week": 12}
        assert [c.name for c in tree.children] == ["Numbers", "Words", "Section"]
        assert tree.find(section.id).dependencies[1].required is False
        assert await client.create(report) == tree  # the same tree again: the stored one, nothing twice
