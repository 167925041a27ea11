"""A tree builder that reads like the work: tasks by name and executor, children by nesting,
dependencies by the task objects themselves, executor inputs as keyword arguments.

    report = Tree("Weekly report", "aggregate_results_executor")
    fetch = report.add("Fetch", "rest_executor", url="https://example.com/data.json")
    approve = report.add("Approve", "human_input_executor", prompt="Publish?", after=[fetch])
    report.after(approve)                   # the root runs last
    await client.create(report)

Why ids are chosen here: every task gets its id (a UUID) when it is added, so the tree sent to
`tasks.create` names all its ids. A resend of the same tree (after a dropped connection) is then
the same request, which the service answers with the stored tree instead of storing it twice.

The builder checks what a single call can get wrong, with the service's own rules and words
(storage/fields.py, storage/trees.py): a name, an id, a priority, a timeout out of range, a
dependency on a task of another tree, a cycle. It raises ValueError at the call that made the
mistake, not at the create. The service stays the judge of everything else (executor ids, input
schemas, JSON limits); tests/test_client_builder.py checks, with generated trees, that the
builder refuses exactly what the service refuses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# The service's limits (storage/fields.py: column widths and MAX_TEXT, MAX_TIMEOUT), copied so
# that the client imports nothing of the service; tests/test_client_builder.py compares them.
MAX_NAME = 1024
MAX_ID = 64
MAX_USER = 255
MAX_TEXT = 1_000_000
MAX_TIMEOUT = 7 * 86_400.0


class Needs:
    """A dependency on `task` that may be optional: `after=[fetch, optional(cache)]`."""

    __slots__ = ("task", "required")

    def __init__(self, task: TaskSpec, required: bool = True) -> None:
        if not isinstance(task, TaskSpec):
            raise TypeError(f"a dependency is a task of the builder, got {type(task).__name__}")
        self.task = task
        self.required = required


def optional(task: TaskSpec) -> Needs:
    """A dependency that does not have to succeed: the task runs once `task` has finished, however."""
    return Needs(task, required=False)


class TaskSpec:
    """One task of a tree being built. Made by `Tree(...)` (the root) or by `add` on a task (a child)."""

    def __init__(self, name: str, executor: str | None = None, /, *, id: str | None = None,  # noqa: A002
                 inputs: Mapping[str, Any] | None = None, after: Iterable[TaskSpec | Needs] = (),
                 priority: int | None = None, description: str | None = None,
                 params: Mapping[str, Any] | None = None, retry: Mapping[str, Any] | None = None,
                 timeout_seconds: float | None = None, user_id: str | None = None,
                 _parent: TaskSpec | None = None, **input_values: Any) -> None:
        _check_text("name", name, MAX_NAME, required=True)
        if id is not None:
            _check_id(id)
        if executor is not None and not isinstance(executor, str):
            raise ValueError(f"executor must be an executor id (a string), got {type(executor).__name__}")
        _check_priority(priority)
        if description is not None:
            _check_text("description", description, MAX_TEXT)
        if user_id is not None:
            _check_text("user_id", user_id, MAX_USER)
        _check_timeout(timeout_seconds)
        if inputs is not None and not isinstance(inputs, Mapping):
            raise ValueError(f"inputs must be an object, got {type(inputs).__name__}")
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"params must be an object, got {type(params).__name__}")
        if retry is not None and not isinstance(retry, Mapping):
            raise ValueError('retry must be an object such as {"max_attempts": 3}')
        clash = sorted(set(inputs or ()) & set(input_values))
        if clash:
            raise ValueError(f"inputs {clash} given twice: in inputs= and as keyword arguments")
        self.root: TaskSpec = _parent.root if _parent is not None else self
        self.parent = _parent
        if _parent is None:
            self._index: dict[str, TaskSpec] = {}
            self._order: list[TaskSpec] = []
        self.id = id if id is not None else str(uuid.uuid4())
        if self.id in self.root._index:
            raise ValueError(f"id '{self.id}' is used by more than one task")
        self.name = name
        self.executor = executor
        self.inputs: dict[str, Any] = {**(inputs or {}), **input_values}
        self.priority = priority
        self.description = description
        self.params = dict(params) if params is not None else None
        self.retry = dict(retry) if retry is not None else None
        self.timeout_seconds = timeout_seconds
        self.user_id = user_id
        self.children: list[TaskSpec] = []
        self.needs: list[Needs] = []
        self.root._index[self.id] = self
        self.root._order.append(self)
        if _parent is not None:
            _parent.children.append(self)
        try:
            self.after(*after)
        except ValueError:
            self._forget()
            raise

    def add(self, name: str, executor: str | None = None, /, *, id: str | None = None,  # noqa: A002
            inputs: Mapping[str, Any] | None = None, after: Iterable[TaskSpec | Needs] = (),
            priority: int | None = None, description: str | None = None,
            params: Mapping[str, Any] | None = None, retry: Mapping[str, Any] | None = None,
            timeout_seconds: float | None = None, **input_values: Any) -> TaskSpec:
        """A child of this task: `name`, its `executor` id, its inputs as keyword arguments (or
        `inputs=` for names that clash with these options), the tasks it runs `after`."""
        return TaskSpec(name, executor, id=id, inputs=inputs, after=after, priority=priority,
                        description=description, params=params, retry=retry, timeout_seconds=timeout_seconds,
                        _parent=self, **input_values)

    def after(self, *tasks: TaskSpec | Needs) -> TaskSpec:
        """Run this task after `tasks` (each a task of the same tree, or `optional(task)`); returns self."""
        for item in tasks:
            needs = item if isinstance(item, Needs) else Needs(item)
            target = needs.task
            if target.root is not self.root or self.root._index.get(target.id) is not target:
                raise ValueError(f"task '{self.name}' (id '{self.id}'): dependency '{target.id}' is not one of "
                                 "the submitted tasks (a dependency must be a task of the same tree)")
            if target is self or self._reaches(target):
                chain = " -> ".join([self.id, *self._path(target), self.id]) if target is not self \
                    else f"{self.id} -> {self.id}"
                raise ValueError(f"Circular dependency detected: {chain}")
            self.needs = [n for n in self.needs if n.task is not target] + [needs]
        return self

    # --- what tasks.create takes ------------------------------------------------------------------

    def tasks(self) -> list[dict[str, Any]]:
        """The whole tree as `tasks.create` takes it: a flat list, the root first, every id given."""
        return [spec._definition() for spec in self.root._order]

    def walk(self) -> Iterator[TaskSpec]:
        """Every task of the tree, in the order they were added."""
        return iter(list(self.root._order))

    def __repr__(self) -> str:
        return f"TaskSpec({self.name!r}, {self.executor!r}, id={self.id!r})"

    def _definition(self) -> dict[str, Any]:
        task: dict[str, Any] = {"id": self.id, "name": self.name}
        if self.parent is not None:
            task["parent_id"] = self.parent.id
        if self.executor is not None:
            task["schemas"] = {"method": self.executor}
        if self.inputs:
            task["inputs"] = dict(self.inputs)
        if self.needs:
            task["dependencies"] = [{"id": n.task.id, "required": n.required} for n in self.needs]
        for field in ("priority", "description", "params", "retry", "timeout_seconds", "user_id"):
            value = getattr(self, field)
            if value is not None:
                task[field] = value
        return task

    def _reaches(self, target: TaskSpec) -> bool:
        """True when `target` already depends on self (directly or not): adding self -> target closes a circle."""
        return bool(self._path(target))

    def _path(self, target: TaskSpec) -> list[str]:
        """Ids from `target` along its dependencies to self, without self; [] when there is none."""
        stack: list[tuple[TaskSpec, list[str]]] = [(target, [target.id])]
        seen: set[str] = set()
        while stack:  # iterative: the chain may be as long as the tree is large
            node, path = stack.pop()
            for needs in node.needs:
                if needs.task is self:
                    return path
                if needs.task.id not in seen:
                    seen.add(needs.task.id)
                    stack.append((needs.task, [*path, needs.task.id]))
        return []

    def _forget(self) -> None:
        """Undo the registration of a task whose construction failed."""
        self.root._index.pop(self.id, None)
        if self in self.root._order:
            self.root._order.remove(self)
        if self.parent is not None and self in self.parent.children:
            self.parent.children.remove(self)


class Tree(TaskSpec):
    """The root task of a new tree; `add` its children, then `client.create(tree)`.

    `Tree(name, executor, **inputs)`: the root's name, its executor id, its inputs. Options, all
    keyword-only: `id` (default: a new UUID), `inputs` (a dict, for input names that clash with
    these options), `after`, `priority` (0 urgent .. 3 low), `description`, `params`, `retry`,
    `timeout_seconds`, `user_id` (the owner, when an admin creates for another user)."""

    def __init__(self, name: str, executor: str | None = None, /, *, id: str | None = None,  # noqa: A002
                 inputs: Mapping[str, Any] | None = None, after: Iterable[TaskSpec | Needs] = (),
                 priority: int | None = None, description: str | None = None,
                 params: Mapping[str, Any] | None = None, retry: Mapping[str, Any] | None = None,
                 timeout_seconds: float | None = None, user_id: str | None = None, **input_values: Any) -> None:
        super().__init__(name, executor, id=id, inputs=inputs, after=after, priority=priority,
                         description=description, params=params, retry=retry, timeout_seconds=timeout_seconds,
                         user_id=user_id, **input_values)


# --- the service's rules for one value, worded as it words them (storage/fields.py) ---------------


def _check_text(field: str, value: Any, limit: int, *, required: bool = False) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters")
    if required and not value.strip():
        raise ValueError(f"{field} must not be empty")
    if len(value) > limit:
        raise ValueError(f"{field} is longer than {limit} characters")


def _check_id(value: Any) -> None:
    _check_text("id", value, MAX_ID)
    if not value.strip():
        raise ValueError("id must not be empty")


def _check_priority(value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3:
        raise ValueError(f"priority must be an integer from 0 (urgent) to 3 (low), got {value!r}")


def _check_timeout(value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
        raise ValueError(f"timeout_seconds must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, "
                         "or null")
