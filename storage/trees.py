"""Pure tree logic on plain dicts: validating new trees, nesting, copy and clone planning.

Nothing here touches the database, so every rule can be read (and tested) on its own; the
repository writes what these functions return in one transaction.
"""

from __future__ import annotations

import functools
import math
import operator
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from taskgrove.storage import fields, jsonvalues, sharing
from taskgrove.storage.jsonvalues import Unreadable
from taskgrove.storage.models import JSON_COLUMNS, TASK_FIELDS, TaskStatus
from taskgrove.storage.usage import shown as shown_usage
from taskgrove.storage.waits import public_wait

# SERVICE_MAX_TREE_TASKS default: the most tasks one create, copy or clone may write.
DEFAULT_MAX_TREE_TASKS = 10_000
# The JSON columns a task shows (its wire fields, and `extra` merged into them): a value that
# cannot be read back (jsonvalues.Unreadable) is named under `unreadable_fields`.
SHOWN_JSON = tuple(field for field in (*TASK_FIELDS, "extra") if field in JSON_COLUMNS)
# Float columns on the wire: a stored NaN or infinity is reported like an unreadable JSON value.
FLOAT_COLUMNS = ("progress", "timeout_seconds")
_TASK_VALUES = operator.itemgetter(*TASK_FIELDS)


class TreeError(ValueError):
    """A tree or task definition breaks a rule; the message says which task and what is wrong."""


def now_iso(offset_us: int = 0) -> str:
    """UTC now (+ offset) as `datetime.isoformat(timespec="microseconds")` writes it. Every event
    and write carries one, so the date part is formatted once per second, not once per call."""
    second, micro = divmod(time.time_ns() // 1000 + offset_us, 1_000_000)
    return f"{_second_text(second)}.{micro:06d}+00:00"


@functools.lru_cache(maxsize=8)  # now, and the moments a lease or a retry delay ends
def _second_text(second: int) -> str:
    return datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def new_id() -> str:
    return str(uuid.uuid4())


# --- reading input --------------------------------------------------------------------------
# (The request shapes, e.g. tasks.create's params, are read in agent/foundations/requests.py.)

def too_many_tasks(max_tasks: int, count: int | None = None) -> TreeError:
    got = f" (this one has {count})" if count is not None else ""
    return TreeError(f"A tree may hold at most {max_tasks} tasks in one create, copy or clone{got}; "
                     f"the limit is SERVICE_MAX_TREE_TASKS")


def label(task: Mapping[str, Any], index: int) -> str:
    name = task.get("name")
    shown = f"'{_short(name)}'" if isinstance(name, str) and name else f"#{index}"
    tid = task.get("id")
    return f"task {shown} (id '{_short(tid)}')" if isinstance(tid, str) and tid else f"task {shown}"


class _Label(NamedTuple):
    """A task's `label`, made only when an error message formats it: a valid create never needs
    one, and making two a task up front was 0.8 of 10.3 ms of a 1000-task prepare_new_tree."""

    task: Mapping[str, Any]
    index: int

    def __str__(self) -> str:
        return label(self.task, self.index)


Who = str | _Label  # how error messages name a task: its label, or a text of the caller's


def _short(text: str, limit: int = 80) -> str:
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


# --- cycles and reachability ----------------------------------------------------------------

def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A dependency chain that returns to its start (`[a, b, a]`), or None. Iterative DFS."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {node: WHITE for node in graph}
    for start in graph:
        if color[start] != WHITE:
            continue
        stack: list[tuple[str, Iterable[str]]] = [(start, iter(graph[start]))]
        path = [start]
        color[start] = GREY
        while stack:
            node, edges = stack[-1]
            advanced = False
            for nxt in edges:
                if nxt not in color:
                    continue
                if color[nxt] == GREY:
                    return path[path.index(nxt):] + [nxt]
                if color[nxt] == WHITE:
                    color[nxt] = GREY
                    stack.append((nxt, iter(graph[nxt])))
                    path.append(nxt)
                    advanced = True
                    break
            if not advanced:
                color[node] = BLACK
                stack.pop()
                path.pop()
    return None


def format_cycle(chain: Sequence[str]) -> str:
    return "Circular dependency detected: " + " -> ".join(chain)


# --- creating -------------------------------------------------------------------------------

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
        names = ", ".join(f"'{_short(r['name'])}' ({r['id']})" for r in roots)
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


def children_index(rows: Iterable[Mapping[str, Any]]) -> dict[str | None, list[Mapping[str, Any]]]:
    index: dict[str | None, list[Mapping[str, Any]]] = {}
    for row in rows:
        index.setdefault(row["parent_id"], []).append(row)
    return index


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


# --- reading trees --------------------------------------------------------------------------

def public(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row as the wire shows it: every SPEC field, custom fields merged in.

    A stored value that cannot be read back (see jsonvalues.read_stored; a non-finite progress)
    is shown as null and named under `unreadable_fields`, so one bad row never fails a read.
    """
    try:  # a stored row has every field: taken at C speed (tasks.get, every task of a tree read)
        task = dict(zip(TASK_FIELDS, _TASK_VALUES(row)))
    except KeyError:
        task = {field: row.get(field) for field in TASK_FIELDS}
    unreadable: dict[str, str] = {}
    if Unreadable in set(map(type, map(row.get, SHOWN_JSON))):  # rare (and never subclassed): then one by one
        for field in SHOWN_JSON:
            value = row.get(field)
            if isinstance(value, Unreadable):
                unreadable[field] = value.reason
                if field in task:
                    task[field] = None
    for field in FLOAT_COLUMNS:
        number = task.get(field)
        if isinstance(number, float) and not math.isfinite(number):
            unreadable[field] = "cannot be read back: the stored number is not finite"
            task[field] = None
    task["usage"] = shown_usage(task.get("usage"))  # its budgets' bookkeeping stays inside
    waiting = row.get("waiting")  # NULL for a task that is not parked on a wait: nothing to decode
    task["waiting"] = None if waiting is None else public_wait(waiting)
    extra = row.get("extra") or {}
    for key, value in extra.items():
        task.setdefault(key, value)
    if unreadable:
        task["unreadable_fields"] = unreadable
    return task


class PublicView(Mapping[str, Any]):
    """`public(row)` as of now, built only when first read: the engine hands one to every
    executor, and most (noop, sleep, aggregate...) never look at it."""

    __slots__ = ("_row", "_task")

    def __init__(self, row: Mapping[str, Any]) -> None:
        self._row: Mapping[str, Any] | None = dict(row)  # the engine changes its row later
        self._task: dict[str, Any] | None = None

    def _view(self) -> dict[str, Any]:
        if self._task is None:
            assert self._row is not None
            self._task, self._row = public(self._row), None
        return self._task

    def __getitem__(self, key: str) -> Any:
        return self._view()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())

    def __repr__(self) -> str:
        return repr(self._view())


def nest(rows: Sequence[Mapping[str, Any]], root_id: str) -> dict[str, Any]:
    """The tree under `root_id` as nested nodes with `children`, siblings in creation order.

    Built without recursion: each node is made once and appended to its parent's list, so a
    parent_id chain as long as the largest accepted tree nests as well as a flat one.
    """
    by_parent: dict[str | None, list[Mapping[str, Any]]] = {}
    by_id: dict[str, Mapping[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["created_at"], r["id"])):
        by_id[row["id"]] = row
        by_parent.setdefault(row["parent_id"], []).append(row)
    top = public(by_id[root_id])
    top["children"] = []
    stack = [(by_id[root_id]["id"], top["children"])]
    while stack:
        parent_id, siblings = stack.pop()
        for child in by_parent.get(parent_id, ()):
            node = public(child)
            node["children"] = []
            siblings.append(node)
            stack.append((child["id"], node["children"]))
    return top


def subtree_ids(rows: Sequence[Mapping[str, Any]], task_id: str) -> list[str]:
    children = children_index(rows)
    ordered = [task_id]
    for current in ordered:
        ordered.extend(child["id"] for child in children.get(current, ()))
    return ordered


def dependents_index(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Task id -> ids of tasks that list it as a dependency."""
    index: dict[str, list[str]] = {}
    for row in rows:
        for dep in row.get("dependencies") or ():
            index.setdefault(dep["id"], []).append(row["id"])
    return index


def transitive(start: Iterable[str], edges: Mapping[str, Iterable[str]]) -> set[str]:
    found = set(start)
    stack = list(found)
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in found:
                found.add(nxt)
                stack.append(nxt)
    return found


# --- copy and clone -------------------------------------------------------------------------

RESETTABLE = {
    "status": TaskStatus.PENDING.value,
    "progress": 0.0,
    "result": None,
    "error": None,
    "started_at": None,
    "completed_at": None,
    "token_success": 0,
    "token_failed": 0,
}


# Bookkeeping of one execution of a task: never copied, cloned or given at creation.
EXECUTION_STATE = ("lease_owner", "lease_expires_at", "lease_epoch", "attempt", "next_attempt_at", "checkpoint",
                   "execution_id", "interruptions", "usage")


def copy_selection(rows: Sequence[Mapping[str, Any]], task_id: str, with_children: bool) -> set[str]:
    """What `tasks.copy` copies: the task's subtree and everything that depends on it, transitively.

    With `children`, each direct child's own dependencies come along too (each task once).
    The ancestors that join the selection into one tree are added by `connect`.
    The selection is closed under "child of" and "depends on": one worklist, linear in the tree.
    """
    by_id = {row["id"]: row for row in rows}
    children = children_index(rows)
    selected = set(subtree_ids(rows, task_id))
    if with_children:
        deps = {row["id"]: [d["id"] for d in row["dependencies"] if d["id"] in by_id] for row in rows}
        for child in children.get(task_id, ()):
            selected |= transitive([child["id"]], deps)
    dependents = dependents_index(rows)
    stack = list(selected)
    while stack:
        tid = stack.pop()
        for nxt in (*dependents.get(tid, ()), *(c["id"] for c in children.get(tid, ()))):
            if nxt not in selected:
                selected.add(nxt)
                stack.append(nxt)
    return selected


def connect(rows: Sequence[Mapping[str, Any]], selected: set[str]) -> tuple[set[str], str]:
    """Add the ancestors needed to make `selected` one tree; return it and its root id.

    Linear in the tree: the paths from every selected task up to the root are marked once (a
    walk stops where an earlier one passed), then the top is the highest marked task below which
    the marked paths do not yet branch (the lowest common ancestor).
    """
    by_id = {row["id"]: row for row in rows}
    marked: set[str] = set()
    for tid in selected:
        while tid in by_id and tid not in marked:
            marked.add(tid)
            tid = by_id[tid]["parent_id"]
    marked_children: dict[str, list[str]] = {}
    tops = []
    for tid in marked:
        parent = by_id[tid]["parent_id"]
        if parent in marked:
            marked_children.setdefault(parent, []).append(tid)
        else:
            tops.append(tid)
    top = tops[0]  # one tree: every walk ends at the same root
    dropped = set()
    while top not in selected and len(marked_children.get(top, ())) == 1:
        dropped.add(top)
        top = marked_children[top][0]
    return marked - dropped, top


def plan_copies(
    rows: Sequence[Mapping[str, Any]],
    selected: set[str],
    root_id: str,
    *,
    origin_for: Mapping[str, str],
    reset: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """New rows for the selected tasks: new ids, parent and dependency ids re-pointed.

    `origin_for` maps each selected id to its origin_type; `reset` is the set of field values to
    apply (None keeps the original values, as archive and link do).
    Dependencies on tasks outside the selection keep pointing at the original task, whose
    result the copy then reuses.
    """
    mapping = {tid: new_id() for tid in selected}
    ordered = [row for row in sorted(rows, key=lambda r: (r["created_at"], r["id"])) if row["id"] in selected]
    ordered.sort(key=lambda r: r["id"] != root_id)
    copies: list[dict[str, Any]] = []
    for offset, row in enumerate(ordered):
        copy = {key: value for key, value in row.items() if key not in EXECUTION_STATE}
        copy["id"] = mapping[row["id"]]
        copy["parent_id"] = None if row["id"] == root_id else mapping.get(row["parent_id"])
        copy["task_tree_id"] = mapping[root_id]
        copy["dependencies"] = [
            {"id": mapping.get(dep["id"], dep["id"]), "required": dep["required"]}
            for dep in row["dependencies"]
        ]
        copy["original_task_id"] = row["id"]
        copy["origin_type"] = origin_for[row["id"]]
        copy["has_copy"] = False
        copy["has_references"] = False
        if reset is not None:
            copy.update(reset)
        stamp = now_iso(offset)
        copy["created_at"] = stamp
        copy["updated_at"] = stamp
        copies.append(copy)
    return copies


def reset_values(reset_fields: Any) -> dict[str, Any]:
    """`reset_fields` as a list of names (reset to defaults) or an object of values (override)."""
    if reset_fields is None:
        return dict(RESETTABLE)
    if isinstance(reset_fields, list):
        if not all(isinstance(f, str) for f in reset_fields):
            raise TreeError(f"reset_fields: an array must list field names (strings); resettable fields "
                            f"are {sorted(RESETTABLE)}")
        unknown = [f for f in reset_fields if f not in RESETTABLE]
        if unknown:
            raise TreeError(
                f"reset_fields: cannot reset {unknown}; resettable fields are {sorted(RESETTABLE)}"
            )
        return {f: RESETTABLE[f] for f in reset_fields} if reset_fields else dict(RESETTABLE)
    if isinstance(reset_fields, Mapping):
        allowed = set(RESETTABLE) | {"priority", "inputs", "params", "schemas", "name", "description", "product_id"}
        unknown = [f for f in reset_fields if f not in allowed]
        if unknown:
            shown = [_short(str(f), 40) for f in unknown[:10]]
            raise TreeError(f"reset_fields: cannot set {shown}; allowed fields are {sorted(allowed)}")
        for field, value in reset_fields.items():
            if (problem := check_value(field, value)) is not None:
                raise TreeError(f"reset_fields: {problem}")
        if reset_fields.get("status") == TaskStatus.IN_PROGRESS:
            raise TreeError("reset_fields: status 'in_progress' cannot be given to a clone")
        return {**RESETTABLE, **dict(reset_fields)}
    raise TreeError("reset_fields must be an array of field names or an object of field values")
