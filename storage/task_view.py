"""A stored task row as the wire shows it (`public`), lazily (`PublicView`), and a tree of them
nested under `children` (`nest`). Every surface answers with these, so a task looks the same on
each. No I/O.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from taskgrove.storage.jsonvalues import Unreadable
from taskgrove.storage.models import JSON_COLUMNS, TASK_FIELDS
from taskgrove.storage.outage import UNAVAILABLE, DatabaseOutage
from taskgrove.storage.usage_store import shown as shown_usage
from taskgrove.storage.wait_store import public_wait
from taskgrove.storage.wait_store import read as read_wait

# The JSON columns a task shows (its wire fields, and `extra` merged into them): a value that
# cannot be read back (jsonvalues.Unreadable) is named under `unreadable_fields`.
SHOWN_JSON = tuple(field for field in (*TASK_FIELDS, "extra") if field in JSON_COLUMNS)
# Float columns on the wire: a stored NaN or infinity is reported like an unreadable JSON value.
FLOAT_COLUMNS = ("progress", "timeout_seconds")
_TASK_VALUES = operator.itemgetter(*TASK_FIELDS)

log = logging.getLogger(__name__)


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
    if task["waiting"] is None and waiting is not None and isinstance(found := read_wait(waiting), Unreadable):
        unreadable["waiting"] = found.reason  # rare: stored text that cannot be read back
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

    Every caller knows the root is stored (tasks.create has just stored it, tasks.tree found it),
    so rows read back without it are a read that did not see what the database acknowledged: a
    restart, a failover or a backend cut off around the read (issue 46). That is answered as
    the database unavailable, retryable (storage/outage.py), not as an internal error: resent,
    the create finds its tree stored or stores it once.
    """
    by_parent: dict[str | None, list[Mapping[str, Any]]] = {}
    by_id: dict[str, Mapping[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["created_at"], r["id"])):
        by_id[row["id"]] = row
        by_parent.setdefault(row["parent_id"], []).append(row)
    root = by_id.get(root_id)
    if root is None:
        log.warning("the tree of task %s was read back without it (%d rows)", root_id, len(by_id))
        raise DatabaseOutage(UNAVAILABLE, f"the tree of task '{root_id}' was read back without it")
    top = public(root)
    top["children"] = []
    stack = [(root_id, top["children"])]
    while stack:
        parent_id, siblings = stack.pop()
        for child in by_parent.get(parent_id, ()):
            node = public(child)
            node["children"] = []
            siblings.append(node)
            stack.append((child["id"], node["children"]))
    return top
