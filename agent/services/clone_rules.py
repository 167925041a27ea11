"""The rules of tasks.clone that depend on nothing but the rows: which origin each cloned task
gets (clone, link, archive, mixed), and what a clone preview shows. Out of agent/services/task_service.py, which
keeps the operation itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.task_view import public


def origins(mode: str, rows: list[dict[str, Any]], selected: set[str], link_ids: list[str]) -> dict[str, str]:
    """The origin type of each selected task for `mode`; -32602 when the mode's conditions fail
    (a link needs completed tasks; mixed links must be among the cloned tasks)."""
    by_id = {r["id"]: r for r in rows}
    if mode == "link":
        unfinished = [f"{r['id']}: {r['status']}" for r in rows if r["status"] != TaskStatus.COMPLETED]
        if unfinished:
            raise invalid_params(
                "origin_type 'link' needs a fully completed tree; not completed: [" + ", ".join(unfinished) + "]"
            )
        return dict.fromkeys(selected, "link")
    if mode == "archive":
        return dict.fromkeys(selected, "archive")
    if mode == "mixed":
        unknown = [tid for tid in link_ids if tid not in selected]
        if unknown:
            raise invalid_params(f"link_task_ids not in the cloned tasks: [{', '.join(unknown)}]")
        unfinished = [f"{tid}: {by_id[tid]['status']}" for tid in link_ids if by_id[tid]["status"] != TaskStatus.COMPLETED]
        if unfinished:
            raise invalid_params("linked tasks must be completed; not completed: [" + ", ".join(unfinished) + "]")
        return {tid: "link" if tid in link_ids else "clone" for tid in selected}
    return dict.fromkeys(selected, "clone")


def preview(row: Mapping[str, Any]) -> dict[str, Any]:
    """A clone preview task: what tasks.create accepts to make the clone later."""
    task = public(row)
    for key in ("created_at", "updated_at", "task_tree_id"):
        task.pop(key, None)
    return task
