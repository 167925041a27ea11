"""Copy and clone planning on plain rows: what `tasks.copy` selects, the ancestors that join a
selection into one tree, the new rows with their ids re-pointed, and the values a clone starts
from. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskgrove.storage.clock import now_iso
from taskgrove.storage.ids import new_id
from taskgrove.storage.models import TaskStatus
from taskgrove.storage.new_tree import TreeError, check_value, short_text
from taskgrove.storage.tree_graph import children_index, dependents_index, subtree_ids, transitive

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
            shown = [short_text(str(f), 40) for f in unknown[:10]]
            raise TreeError(f"reset_fields: cannot set {shown}; allowed fields are {sorted(allowed)}")
        for field, value in reset_fields.items():
            if (problem := check_value(field, value)) is not None:
                raise TreeError(f"reset_fields: {problem}")
        if reset_fields.get("status") == TaskStatus.IN_PROGRESS:
            raise TreeError("reset_fields: status 'in_progress' cannot be given to a clone")
        return {**RESETTABLE, **dict(reset_fields)}
    raise TreeError("reset_fields must be an array of field names or an object of field values")
