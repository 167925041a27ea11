"""tasks.generate without HTTP: requirement -> prompt -> JSON task tree -> validation (+1 repair).

Why here and not in the RPC layer: the same core serves the JSON-RPC method and `generate_executor`,
and can be tested against a fake LLM server without any HTTP surface.

Reference rule (SPEC.md says "either all tasks have `id` or none"): when the model gives ids,
`parent_id` and dependency ids must name those ids. When it gives none, references may use task
`name`s, provided the name is unique in the tree (otherwise the reference is reported ambiguous).
Either way the returned tasks carry fresh UUIDs (so two generations never collide in storage),
with every reference rewritten to them, the root first and parents before children, and
`schemas.method` set to the executor id so the engine runs them: the list can go straight to
`tasks.create`. Keys are only passed through to the client; nothing here stores them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskgrove.llm.agent_prompt import agents_section, delegation_problems
from taskgrove.llm.client import LLMClient, add_usage, empty_usage
from taskgrove.storage import fields
from taskgrove.storage.tree_graph import find_cycle

MAX_TOKENS_LIMIT = 200_000


class GenerationError(Exception):
    """Base of tasks.generate failures (all map to JSON-RPC -32602)."""


class GenerationInputError(GenerationError, ValueError):
    """A tasks.generate parameter is missing or out of range."""


class GenerationValidationError(GenerationError):
    """The generated tree broke the tree rules, even after the repair round."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("generated task tree is invalid: " + "; ".join(self.problems))


@dataclass
class GenerationResult:
    tasks: list[dict[str, Any]]
    usage: dict[str, int] = field(default_factory=empty_usage)
    attempts: int = 1


# -- inputs -------------------------------------------------------------------------------------


def check_inputs(requirement: Any, temperature: Any, max_tokens: Any) -> tuple[str, float, int]:
    """Validate tasks.generate parameters; returns them normalised or raises GenerationInputError."""
    if not isinstance(requirement, str) or not requirement.strip():
        raise GenerationInputError("requirement is required (mandatory for tasks.generate)")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0.0 <= temperature <= 2.0:
        raise GenerationInputError(f"temperature must be a number between 0.0 and 2.0, got {temperature!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise GenerationInputError(f"max_tokens must be an integer between 1 and {MAX_TOKENS_LIMIT}, got {max_tokens!r}")
    return requirement.strip(), float(temperature), max_tokens


def describe_executors(executors: Iterable[Any]) -> list[dict[str, Any]]:
    """Accept descriptor dicts or Executor classes; return [{id, description, input_schema}]."""
    out: list[dict[str, Any]] = []
    for item in executors:
        if isinstance(item, Mapping):
            info = dict(item)
        else:  # an Executor class
            info = dict(item.descriptor())
            info["input_schema"] = getattr(item, "input_schema", None)
        if info.get("id"):
            out.append({"id": info["id"], "description": info.get("description") or info.get("name") or "",
                        "input_schema": info.get("input_schema")})
    return out


# -- prompt -------------------------------------------------------------------------------------

RULES = """Rules for the tree:
1. Answer with ONE JSON array of task objects and nothing else.
2. Each task object has: "id" (short unique string such as "t1"), "name" (exactly one of the executor
   ids listed above), "inputs" (object matching that executor's input schema), "parent_id" (the id of
   its parent task, or null for the root), "dependencies" (list of {"id": <task id>, "required": true|false}),
   "priority" (0 urgent, 1 high, 2 normal, 3 low).
3. Exactly one root task (parent_id null); every other task's parent_id names a task in the array, so
   every task is reachable from the root. parent_id only organises the tree.
4. dependencies decide execution order: a task runs after the tasks it depends on. Dependencies must
   name tasks in the array and must not form a cycle. A task that combines the results of other tasks
   depends on them.
5. Use only the executors listed; do not invent executor ids or input fields."""


def build_messages(requirement: str, executors: Sequence[Mapping[str, Any]],
                   agents: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, str]]:
    lines = []
    for info in executors:
        schema = json.dumps(info.get("input_schema") or {"type": "object"}, separators=(",", ":"))
        lines.append(f"- {info['id']}: {info.get('description') or 'no description'}\n  input schema: {schema}")
    system = (
        "You design task trees for a task orchestration service. Each task is run by one executor.\n\n"
        "Available executors:\n" + "\n".join(lines) + "\n\n"
        + (agents_section(agents) + "\n\n" if agents else "") + RULES
    )
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Requirement:\n{requirement}\n\nReturn the JSON array of tasks."}]


def repair_message(problems: Sequence[str]) -> dict[str, str]:
    listed = "\n".join(f"- {p}" for p in problems)
    return {"role": "user", "content": (
        "Your previous answer is not a valid task tree. Problems:\n" + listed +
        "\n\nReturn the corrected, complete JSON array of tasks only, following every rule.")}


# -- parsing ------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON task list in `text`, tolerating code fences and prose around it.

    An answer that is one JSON value (fenced or not) is taken as is; otherwise the first array of
    task-like objects (or `{"tasks": [...]}`) found in it, so an inner list of a broken outer array
    (say, a task's dependencies) is never mistaken for the tree. Raises ValueError saying why not.
    """
    text = text or ""
    fenced = [m.group(1) for m in _FENCE.finditer(text)]
    for whole in (*fenced, text):
        try:
            return json.loads(whole.strip())
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    last_error = "no JSON array found"
    for candidate in (*fenced, text):
        for match in re.finditer(r"[\[{]", candidate):
            try:
                value, _ = decoder.raw_decode(candidate, match.start())
            except json.JSONDecodeError as exc:
                last_error = f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                continue
            if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
                return value
            if isinstance(value, dict) and isinstance(value.get("tasks"), list):
                return value
    raise ValueError(f"the answer is not a JSON array of tasks: {last_error}")


def tasks_of(value: Any) -> list[Any]:
    if isinstance(value, dict):
        value = value.get("tasks", [value])
    if not isinstance(value, list):
        raise ValueError("the answer is not a JSON array of tasks")
    return value


# -- validation ---------------------------------------------------------------------------------


def _find_cycle(edges: Mapping[int, list[int]], n: int) -> list[int] | None:
    """One cycle in a directed graph over 0..n-1, as a closed path [a, b, ..., a], or None.

    storage.tree_graph.find_cycle: iterative, so a long generated chain cannot exhaust the stack."""
    return find_cycle({i: edges.get(i, []) for i in range(n)})


def validate_tree(raw_tasks: Sequence[Any], executor_ids: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Check the SPEC.md rules; returns (normalised tasks with fresh UUIDs, problems).

    The tasks are only meaningful when `problems` is empty.
    """
    available = set(executor_ids)
    problems: list[str] = []
    if not raw_tasks:
        return [], ["the tree is empty: at least one task is required"]
    tasks: list[dict[str, Any]] = []
    for i, raw in enumerate(raw_tasks):
        if not isinstance(raw, dict):
            problems.append(f"task #{i + 1} is not a JSON object")
            raw = {}
        tasks.append(raw)
    if problems:
        return [], problems

    with_id = [i for i, t in enumerate(tasks) if t.get("id") not in (None, "")]
    use_ids = bool(with_id)

    def label(i: int) -> str:
        ident = tasks[i].get("id") if use_ids else None
        return f"task {ident!r} ({tasks[i].get('name')})" if ident is not None else f"task #{i + 1} ({tasks[i].get('name')})"

    for i, t in enumerate(tasks):
        name = t.get("name")
        if not isinstance(name, str) or name not in available:
            problems.append(f"{label(i)}: name {name!r} is not an available executor id "
                            f"(available: {', '.join(sorted(available))})")
        # The field rules tasks.create applies (storage.fields); a model may leave these out (or
        # give an empty value or null, read as the default by _normalise).
        for field, value in (("inputs", t.get("inputs") or {}), ("priority", t.get("priority"))):
            if value is not None and (problem := fields.problem(field, value)) is not None:
                problems.append(f"{label(i)}: {problem}")

    if use_ids and len(with_id) != len(tasks):
        missing = [f"#{i + 1} ({tasks[i].get('name')})" for i in range(len(tasks)) if i not in set(with_id)]
        problems.append("either all tasks have an id or none: tasks without id: " + ", ".join(missing))
        return [], problems

    # Index by id, or by unique name when there are no ids.
    index: dict[str, int] = {}
    ambiguous: set[str] = set()
    for i, t in enumerate(tasks):
        key = str(t.get("id")) if use_ids else t.get("name")
        if not isinstance(key, str):
            continue
        if key in index:
            if use_ids:
                problems.append(f"duplicate task id {key!r}")
            ambiguous.add(key)
        else:
            index[key] = i

    def resolve(ref: Any, where: str, i: int) -> int | None:
        if isinstance(ref, (int, float)) and not isinstance(ref, bool):
            ref = str(int(ref))
        if not isinstance(ref, str) or ref not in index:
            what = "task id" if use_ids else "task name"
            problems.append(f"{label(i)}: {where} {ref!r} does not exist (no {what} {ref!r} in the tree)")
            return None
        if ref in ambiguous and not use_ids:
            problems.append(f"{label(i)}: {where} {ref!r} is ambiguous: several tasks have that name; give every task an id")
            return None
        return index[ref]

    parents: dict[int, int | None] = {}
    deps: dict[int, list[tuple[int, bool]]] = {}
    for i, t in enumerate(tasks):
        parent = t.get("parent_id")
        parents[i] = None if parent in (None, "") else resolve(parent, "parent_id", i)
        if parent not in (None, "") and parents[i] is None:
            parents[i] = -1  # dangling: not a root, not attached
        raw_deps = t.get("dependencies") or []
        if not isinstance(raw_deps, list):
            problems.append(f"{label(i)}: dependencies must be a list")
            raw_deps = []
        deps[i] = []
        for dep in raw_deps:
            ref, required = (dep.get("id"), dep.get("required", True)) if isinstance(dep, dict) else (dep, True)
            target = resolve(ref, "dependency", i)
            if target is not None:
                deps[i].append((target, bool(required)))

    n = len(tasks)
    dep_cycle = _find_cycle({i: [d for d, _ in deps[i]] for i in range(n)}, n)
    if dep_cycle:
        problems.append("dependency cycle: " + " -> ".join(_ref(tasks, j, use_ids) for j in dep_cycle))
    parent_cycle = _find_cycle({i: [p] for i, p in parents.items() if p is not None and p >= 0}, n)
    if parent_cycle:
        problems.append("parent_id cycle: " + " -> ".join(_ref(tasks, j, use_ids) for j in parent_cycle))

    roots = [i for i in range(n) if parents[i] is None]
    if not roots:
        problems.append("no root task: exactly one task must have parent_id null")
    elif len(roots) > 1:
        problems.append("multiple root tasks: " + ", ".join(label(i) for i in roots) +
                        "; exactly one task may have parent_id null")
    else:
        children: dict[int, list[int]] = {}
        for i, p in parents.items():
            if p is not None and p >= 0:
                children.setdefault(p, []).append(i)
        order, seen = [roots[0]], {roots[0]}
        for node in order:  # breadth-first: parents before children
            for child in children.get(node, []):
                if child not in seen:
                    seen.add(child)
                    order.append(child)
        unreachable = [label(i) for i in range(n) if i not in seen]
        if unreachable:
            problems.append(f"tasks not reachable from the root {label(roots[0])}: " + ", ".join(unreachable))
        if not problems:
            return _normalise(tasks, order, parents, deps), []
    return [], problems


def _ref(tasks: Sequence[Mapping[str, Any]], i: int, use_ids: bool) -> str:
    return str(tasks[i].get("id")) if use_ids else str(tasks[i].get("name"))


def _normalise(tasks: Sequence[Mapping[str, Any]], order: Sequence[int], parents: Mapping[int, int | None],
               deps: Mapping[int, list[tuple[int, bool]]]) -> list[dict[str, Any]]:
    new_ids = {i: str(uuid.uuid4()) for i in order}
    out = []
    for i in order:
        t = tasks[i]
        parent = parents[i]
        priority = t.get("priority")
        out.append({
            "id": new_ids[i],
            "name": t["name"],
            "parent_id": new_ids[parent] if parent is not None else None,
            "priority": priority if isinstance(priority, int) else 1,
            "inputs": dict(t.get("inputs") or {}),
            "dependencies": [{"id": new_ids[d], "required": req} for d, req in deps[i]],
            "schemas": {"method": t["name"]},
        })
    return out


def check_answer(text: str, executor_ids: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse and validate one model answer; returns (tasks, problems)."""
    try:
        raw = tasks_of(extract_json(text))
    except ValueError as exc:
        return [], [str(exc)]
    return validate_tree(raw, executor_ids)


# -- the whole thing ----------------------------------------------------------------------------


async def generate_tree(
    requirement: Any,  # checked here (check_inputs)
    *,
    client: LLMClient,
    executors: Iterable[Any],
    provider: str | None = None,
    model: str | None = None,
    temperature: float = 0.7,
    max_tokens: int = 4000,
    api_key: str | None = None,
    user_id: str | None = None,
    agents: Sequence[Mapping[str, Any]] = (),
) -> GenerationResult:
    """Ask the model for a task tree, validate it, and give it one chance to repair its errors.

    Raises GenerationInputError (bad parameters), GenerationValidationError (still invalid after
    the repair round), or an `llm.client.LLMError` (missing key, provider failure).
    """
    requirement, temperature, max_tokens = check_inputs(requirement, temperature, max_tokens)
    described = describe_executors(executors)
    if not described:
        raise GenerationInputError("no executors are available to build a task tree from")
    ids = [d["id"] for d in described]
    messages = build_messages(requirement, described, agents)
    usage = empty_usage()
    call: dict[str, Any] = dict(provider=provider, model=model, api_key=api_key, user_id=user_id,
                                temperature=temperature, max_tokens=max_tokens)

    answer = await client.complete(messages, **call)
    add_usage(usage, answer.usage)
    tasks, problems = check_answer(answer.text, ids)
    problems += delegation_problems(tasks, agents)
    if not problems:
        return GenerationResult(tasks=tasks, usage=usage, attempts=1)

    messages = messages + [{"role": "assistant", "content": answer.text}, repair_message(problems)]
    answer = await client.complete(messages, **call)
    add_usage(usage, answer.usage)
    tasks, problems = check_answer(answer.text, ids)
    problems += delegation_problems(tasks, agents)
    if problems:
        raise GenerationValidationError(problems)
    return GenerationResult(tasks=tasks, usage=usage, attempts=2)
