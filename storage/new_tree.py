"""What a new tree must be, and the rows it becomes: `prepare_new_tree` (tasks.create), with
the checks and the wording of their errors (TreeError) that copies and clones share.

No I/O: every rule can be read (and tested) on its own; the repository writes the rows in one
transaction. A task field's own value is judged by its rule in storage.fields; this module
judges a tree: ids, parents, dependencies, one root, one user, no cycle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from taskgrove.storage import fields, jsonvalues, sharing
from taskgrove.storage.clock import now_iso
from taskgrove.storage.ids import new_id
from taskgrove.storage.models import TaskStatus
from taskgrove.storage.tree_graph import children_index, find_cycle, format_cycle

# SERVICE_MAX_TREE_TASKS default: the most tasks one create, copy or clone may write.
DEFAULT_MAX_TREE_TASKS = 10_000


class TreeError(ValueError):
    """A tree or task definition breaks a rule; the message says which task and what is wrong."""


# --- reading input --------------------------------------------------------------------------
# (The request shapes, e.g. tasks.create's params, are read in agent/foundations/requests.py.)

def too_many_tasks(max_tasks: int, count: int | None = None) -> TreeError:
    got = f" (this one has {count})" if count is not None else ""
    return TreeError(f"A tree may hold at most {max_tasks} tasks in one create, copy or clone{got}; "
                     f"the limit is SERVICE_MAX_TREE_TASKS")


def label(task: Mapping[str, Any], index: int) -> str:
    name = task.get("name")
    shown = f"'{short_text(name)}'" if isinstance(name, str) and name else f"#{index}"
    tid = task.get("id")
    return f"task {shown} (id '{short_text(tid)}')" if isinstance(tid, str) and tid else f"task {shown}"


class _Label(NamedTuple):
    """A task's `label`, made only when an error message formats it: a valid create never needs
    one, and making two a task up front was 0.8 of 10.3 ms of a 1000-task prepare_new_tree."""

    task: Mapping[str, Any]
    index: int  # type: ignore[assignment]  # a field named as tuple.index, which it hides

    def __str__(self) -> str:
        return label(self.task, self.index)


Who = str | _Label  # how error messages name a task: its label, or a text of the caller's


def short_text(text: str, limit: int = 80) -> str:
    """Names and ids as error messages show them: a huge value is not echoed back whole, and text
    that is not valid Unicode is shown escaped (an error message must itself be sendable)."""
    if not jsonvalues.is_valid_text(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_value(field: str, value: Any) -> str | None:
    """What is wrong with `value` for one settable task field (tasks.clone reset_fields), or None."""
    if (bad := jsonvalues.problem(value, field)) is not None:
        return bad
    return fields.problem(field, value)


def normalize_dependencies(value: Any, who: Who) -> list[dict[str, Any]]:
    """Accept `[{"id": ..., "required": bool}]` or plain id strings; `required` defaults to true."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TreeError(f"{who}: dependencies must be an array")
    deps: list[dict[str, Any]] = []
    for dep in value:
        if isinstance(dep, str):
            dep = {"id": dep}
        # dict first: the ABC check of Mapping costs more than the rest of the loop
        if not isinstance(dep, (dict, Mapping)) or not isinstance(dep_id := dep.get("id"), str) or not dep_id:
            raise TreeError(f"{who}: each dependency must be an object with a string 'id', got {dep!r}")
        required = dep.get("required", True)
        if required is not True and required is not False:
            raise TreeError(f"{who}: dependency '{dep_id}' required must be true or false")
        deps.append({"id": dep_id, "required": required})
    return deps


INPUT_FIELDS = {
    "id", "name", "description", "user_id", "parent_id", "priority", "dependencies", "inputs",
    "params", "schemas", "status", "progress", "result", "error", "started_at", "completed_at",
    "product_id", "token_success", "token_failed", "original_task_id", "origin_type",
    "has_copy", "has_references", "created_at", "updated_at", "task_tree_id",
    "retry", "timeout_seconds", "concurrency", "rate_limit",
    "attempt", "next_attempt_at", "interruptions",  # read-only: ignored at creation
    "waiting", "wait_answers", "wake_at",
    "usage",  # read-only: what the engine counted (docs/costs.md); ignored at creation
    "budget",
}


def prepare_new_tree(raw_tasks: list[dict[str, Any]], default_user: str | None = None, *,
                     values_checked: bool = False) -> list[dict[str, Any]]:
    """Validate a tree given to `tasks.create` and return the rows to insert, root first.
    `values_checked`: the JSON value gate already cleared these values (a request text it found
    nothing suspect in), so check_values would walk them for nothing."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_tasks):
        who = _Label(raw, index)
        if not values_checked:
            check_values(raw, who)
        _check_given(raw, who)
        task_id = raw.get("id")
        if task_id is not None and not task_id.strip():
            raise TreeError(f"{who}: id must not be empty")
        task_id = task_id or new_id()
        if task_id in seen:
            raise TreeError(f"{who}: id '{task_id}' is used by more than one task")
        seen[task_id] = index
        rows.append(_row_from_input(raw, task_id, who))

    ids = set(seen)
    roots = [row for row in rows if row["parent_id"] is None]
    for index, row in enumerate(rows):
        who = _Label(row, index)
        if row["parent_id"] is not None and row["parent_id"] not in ids:
            raise TreeError(f"{who}: parent_id '{row['parent_id']}' is not one of the submitted tasks")
        for dep in row["dependencies"]:
            if dep["id"] not in ids:
                raise TreeError(f"{who}: dependency '{dep['id']}' is not one of the submitted tasks")
    if not roots:
        raise TreeError("No root task: exactly one task must have no parent_id")
    if len(roots) > 1:
        names = ", ".join(f"'{short_text(r['name'])}' ({r['id']})" for r in roots)
        raise TreeError(f"Multiple root tasks found: {names}; exactly one task must have no parent_id")
    root = roots[0]
    _check_reachable(rows, root)
    cycle = find_cycle({row["id"]: [d["id"] for d in row["dependencies"]] for row in rows})
    if cycle:
        raise TreeError(format_cycle(cycle))

    users = {row["user_id"] for row in rows if row["user_id"] is not None}
    if len(users) > 1:
        raise TreeError(
            "All tasks in a tree must have the same user_id, got: " + ", ".join(sorted(users))
        )
    user = users.pop() if users else default_user
    ordered = _root_first(rows, root)
    for offset, row in enumerate(ordered):
        row["user_id"] = user
        row["task_tree_id"] = root["id"]
        stamp = now_iso(offset)
        row["created_at"] = stamp
        row["updated_at"] = stamp
    return ordered


def check_values(task: Mapping[str, Any], who: Who) -> None:
    """The one gate for JSON values (storage.jsonvalues) over every field of one task, whichever
    surface it came from: non-finite numbers, lone surrogates and over-deep values are refused
    with the field named, before anything is written."""
    for key, value in task.items():
        if not isinstance(key, str) or not jsonvalues.is_valid_text(key):
            raise TreeError(f"{who}: a field name is not valid Unicode text")
        found = jsonvalues.problem(value, key, jsonvalues.STORED_MAX_DEPTH)
        if found is not None:
            raise TreeError(f"{who}: {found}")


# Fields whose null means "absent" at creation (an empty object), not a value their rule judges.
_NULL_IS_EMPTY = frozenset({"inputs", "params", "schemas"})


def _check_given(raw: Mapping[str, Any], who: Who) -> None:
    """Every field the client gave, checked by its rule in storage.fields. Only given fields: an
    absent one takes its default, which its rule accepts (a task usually sends 3-5 of the ~20)."""
    rules = fields.RULES
    for field, value in raw.items():
        check = rules.get(field)
        if check is not None and (value is not None or field not in _NULL_IS_EMPTY) \
                and (problem := check(value)) is not None:
            raise TreeError(f"{who}: {problem}")
    if "name" not in raw:
        raise TreeError(f"{who}: {fields.problem('name', None)}")


_PENDING = TaskStatus.PENDING.value  # read once: an enum member's .value is two calls a task
_NO_LIMITS: Mapping[str, Any] = {"concurrency": None, "rate_limit": None, "concurrency_key": None}


# A new row before the task's own fields go in: every column a task may give, at its default.
_ROW_DEFAULTS: Mapping[str, Any] = {
    "id": None, "name": None, "description": None, "user_id": None, "parent_id": None, "priority": 1,
    "dependencies": None, "inputs": None, "params": None, "schemas": None, "status": _PENDING, "progress": 0.0,
    "result": None, "error": None, "started_at": None, "completed_at": None, "product_id": None,
    "original_task_id": None, "origin_type": "own", "has_copy": False, "has_references": False, "retry": None,
    "timeout_seconds": None, "budget": None, "extra": None, "token_success": 0, "token_failed": 0, **_NO_LIMITS}
# Fields stored as the task gives them (their rules in storage.fields have accepted them); the
# other fields of _ROW_DEFAULTS are converted or checked below.
_AS_GIVEN = frozenset({
    "description", "user_id", "parent_id", "priority", "result", "error", "started_at", "completed_at",
    "product_id", "original_task_id", "origin_type", "retry", "budget", "token_success", "token_failed"})


def _row_from_input(raw: Mapping[str, Any], task_id: str, who: Who) -> dict[str, Any]:
    """One task's row from fields already checked by _check_given, defaults filled in.

    Built from the fields the task gives (usually 3-5), not by asking for each of the ~30 it
    could: a 1000-task create builds a thousand of these."""
    row = dict(_ROW_DEFAULTS)
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _AS_GIVEN:
            row[key] = value
        elif key not in INPUT_FIELDS:
            extra[key] = value
    status = raw.get("status", _PENDING)
    if status == TaskStatus.IN_PROGRESS:  # only the engine puts a task in progress, by claiming it
        raise TreeError(f"{who}: status 'in_progress' cannot be given at creation")
    schemas = raw.get("schemas") or {}
    if schemas and not isinstance(schemas.get("method"), str) and not isinstance(schemas.get("type"), str):
        raise TreeError(f"{who}: schemas.method (the executor id) is required when schemas is given")
    inputs = dict(raw.get("inputs") or {})
    concurrency, rate_limit = raw.get("concurrency"), raw.get("rate_limit")
    if concurrency is not None or rate_limit is not None:  # most tasks: nothing to resolve
        try:
            row["concurrency"] = sharing.concurrency(concurrency, row["user_id"], inputs)
            row["rate_limit"] = sharing.rate_limit(rate_limit, row["user_id"], inputs)
        except sharing.SharingError as exc:
            raise TreeError(f"{who}: {exc}") from None
        row["concurrency_key"] = row["concurrency"]["key"] if row["concurrency"] else None
    row.update(id=task_id, name=raw["name"], status=status, schemas=dict(schemas), inputs=inputs,
               params=dict(raw.get("params") or {}), extra=extra,
               dependencies=normalize_dependencies(raw.get("dependencies"), who))
    if "progress" in raw:
        row["progress"] = float(raw["progress"])
    if "has_copy" in raw:
        row["has_copy"] = bool(raw["has_copy"])
    if "has_references" in raw:
        row["has_references"] = bool(raw["has_references"])
    if raw.get("timeout_seconds") is not None:
        row["timeout_seconds"] = float(raw["timeout_seconds"])
    return row


def _check_reachable(rows: list[dict[str, Any]], root: Mapping[str, Any]) -> None:
    children = children_index(rows)
    reached = {root["id"]}
    stack = [root["id"]]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child["id"] not in reached:
                reached.add(child["id"])
                stack.append(child["id"])
    for index, row in enumerate(rows):
        if row["id"] not in reached:
            raise TreeError(
                f"{label(row, index)} is not reachable from the root task '{root['id']}' via parent_id"
            )


def _root_first(rows: list[dict[str, Any]], root: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Breadth-first from the root, keeping input order among siblings (defines creation order)."""
    children = children_index(rows)
    ordered: list[dict[str, Any]] = []
    queue: deque[Mapping[str, Any]] = deque([root])
    while queue:
        node = queue.popleft()
        ordered.append(node)  # type: ignore[arg-type]
        queue.extend(children.get(node["id"], ()))
    return ordered
