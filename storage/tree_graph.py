"""The graph of a tree's tasks on plain rows: cycles, the children and dependents of a task,
what a set of tasks reaches. Every walk is iterative (a parent_id chain as long as the largest
accepted tree walks as well as a flat one). No I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

Node = TypeVar("Node", bound=Hashable)  # a task id; llm/generate.py checks a plan's task numbers


def find_cycle(graph: Mapping[Node, Iterable[Node]]) -> list[Node] | None:
    """A dependency chain that returns to its start (`[a, b, a]`), or None. Iterative DFS."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {node: WHITE for node in graph}
    for start in graph:
        if color[start] != WHITE:
            continue
        stack: list[tuple[Node, Iterable[Node]]] = [(start, iter(graph[start]))]
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


def children_index(rows: Iterable[Mapping[str, Any]]) -> dict[str | None, list[Mapping[str, Any]]]:
    index: dict[str | None, list[Mapping[str, Any]]] = {}
    for row in rows:
        index.setdefault(row["parent_id"], []).append(row)
    return index


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
