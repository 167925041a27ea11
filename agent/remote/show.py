"""Rich renderings for people: a task list as a table, one task as fields, a tree as a tree.
Every user string is printed as text (markup escaped): a task name is data, never styling."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from taskgrove.storage.status import TaskStatus

COLOURS: dict[str, str] = {TaskStatus.COMPLETED: "green", TaskStatus.FAILED: "red", TaskStatus.CANCELLED: "yellow",
           TaskStatus.IN_PROGRESS: "cyan", TaskStatus.PENDING: "white"}
DETAIL_FIELDS = ("id", "name", "status", "waiting", "progress", "priority", "user_id", "parent_id", "task_tree_id",
                 "dependencies", "inputs", "params", "schemas", "result", "error", "retry", "attempt",
                 "next_attempt_at", "created_at", "started_at", "completed_at", "updated_at")


def status(value: str) -> str:
    return f"[{COLOURS.get(value, 'white')}]{escape(value)}[/]"


def task_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(show_lines=False)
    for column in ("id", "name", "status", "progress", "created_at"):
        table.add_column(column)
    with_counts = any("status_counts" in row for row in rows)
    if with_counts:
        table.add_column("tasks by status")
    for row in rows:
        cells = [escape(str(row["id"])), escape(str(row["name"])), status(str(row["status"])),
                 f"{(row.get('progress') or 0.0):.0%}", escape(str(row.get("created_at") or ""))]
        if with_counts:
            counts = row.get("status_counts") or {}
            cells.append(", ".join(f"{n} {status(s)}" for s, n in counts.items()))
        table.add_row(*cells)
    return table


def waiting_line(task_id: str, wait: Mapping[str, Any]) -> str:
    """What a waiting task waits for, and for input how to answer it (markup escaped)."""
    if wait.get("kind") == "input":
        said = f"waits for input: {escape(str(wait.get('prompt') or ''))}"
        if wait.get("schema") is not None:
            said += f"\n  [dim]schema {escape(json.dumps(wait['schema']))}[/]"
        return said + f"\n  [dim]answer with: taskgrove tasks respond {escape(task_id)} --value JSON[/]"
    if wait.get("kind") == "event":
        return f"waits for the event {escape(str(wait.get('event')))} [dim](taskgrove events emit NAME)[/]"
    return f"waits until {escape(str(wait.get('deadline')))}"


def task_detail(task: Mapping[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for field in DETAIL_FIELDS:
        if field not in task:
            continue
        value = task[field]
        if field == "waiting" and isinstance(value, Mapping):
            table.add_row(field, waiting_line(str(task["id"]), value))
            continue
        shown = status(value) if field == "status" and isinstance(value, str) else escape(
            json.dumps(value, indent=2) if isinstance(value, (dict, list)) else str(value if value is not None else "—"))
        table.add_row(field, shown)
    return table


def task_tree(root: Mapping[str, Any]) -> Tree:
    top = Tree(_node_label(root))
    stack = [(root, top)]
    while stack:  # iterative: a tree may be as deep as it is large
        node, branch = stack.pop()
        for child in node.get("children") or []:
            stack.append((child, branch.add(_node_label(child))))
    return top


def _node_label(node: Mapping[str, Any]) -> str:
    deps = [str(d.get("id")) for d in node.get("dependencies") or []]
    named = ", ".join(deps[:5]) + (f" and {len(deps) - 5} more" if len(deps) > 5 else "")
    after = f" [dim]after {escape(named)}[/]" if deps else ""
    wait = node.get("waiting")
    waits = f" [magenta]{waiting_line(str(node['id']), wait)}[/]" if isinstance(wait, Mapping) else ""
    return (f"{escape(str(node['name']))} [dim]{escape(str(node['id']))}[/] {status(str(node['status']))} "
            f"{(node.get('progress') or 0.0):.0%}{after}{waits}")


def emit(console: Console, value: Any, as_json: bool, render: Any = None) -> None:
    """`value` as JSON for scripts, or its rich rendering for people."""
    if as_json or render is None:
        print(json.dumps(value, indent=None if as_json else 2), flush=True)
    else:
        console.print(render(value))
