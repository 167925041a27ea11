"""Example trees for `examples.init`: dependencies, priorities and aggregation at a glance."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

EXAMPLE_PRODUCT = "taskgrove-examples"


def example_trees(available: Iterable[str]) -> list[list[dict[str, Any]]]:
    """Only trees whose executors are available (SERVICE_EXTENSIONS may hide some)."""
    have = set(available)
    trees: list[list[dict[str, Any]]] = []
    if {"system_info_executor", "aggregate_results_executor"} <= have:
        trees.append([
            {"id": "ex-sysinfo", "name": "System report", "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": "ex-cpu"}, {"id": "ex-mem"}, {"id": "ex-disk", "required": False}]},
            {"id": "ex-cpu", "name": "CPU", "parent_id": "ex-sysinfo", "priority": 0, "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "system_info_executor"}, "inputs": {"resource": "cpu"}},
            {"id": "ex-mem", "name": "Memory", "parent_id": "ex-sysinfo", "priority": 1, "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "system_info_executor"}, "inputs": {"resource": "memory"}},
            {"id": "ex-disk", "name": "Disk", "parent_id": "ex-sysinfo", "priority": 3, "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "system_info_executor"}, "inputs": {"resource": "disk"}},
        ])
    if "aggregate_results_executor" in have:
        trees.append([
            {"id": "ex-pipeline", "name": "Pipeline (runs last)", "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": "ex-step-2"}]},
            {"id": "ex-step-1", "name": "Step 1", "parent_id": "ex-pipeline", "product_id": EXAMPLE_PRODUCT,
             "schemas": {"method": "aggregate_results_executor"}},
            {"id": "ex-step-2", "name": "Step 2 (after step 1)", "parent_id": "ex-pipeline",
             "product_id": EXAMPLE_PRODUCT, "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": "ex-step-1"}]},
        ])
    return [_fresh_ids(tree) for tree in trees]


def _fresh_ids(tree: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unique ids per call, so `examples.init` with force can add the examples again."""
    suffix = uuid.uuid4().hex[:8]
    ids = {task["id"]: f"{task['id']}-{suffix}" for task in tree}
    return [
        {**task, "id": ids[task["id"]],
         **({"parent_id": ids[task["parent_id"]]} if "parent_id" in task else {}),
         "dependencies": [{**dep, "id": ids[dep["id"]]} for dep in task.get("dependencies", [])]}
        for task in tree
    ]
