"""Rules of the engine's cheaper paths (issue 32, seventh round): each must do exactly what the
plain path it replaces does.

- agent/foundations/metrics.py counts the engine's series through plain functions (`_counting`,
  `_observing`) instead of prometheus_client's `inc`/`observe`: /metrics must read the same.
- storage/executions.py `sqlite_pass` runs a pass's three steps on one cursor: the same rows as
  fenced_writes, claim and end_execution one after the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import Histogram
from sqlalchemy import select

from taskgrove.agent.foundations.metrics import Metrics, _observing
from taskgrove.storage import executions, tree_insert
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.models import task_attempts_table, with_defaults
from tests.conftest import Client

AMOUNTS = (0.0, 0.0005, 0.001, 0.0011, 0.3, 5.0, 1800.0, 1e9, math.nan)


def _series(metrics: Metrics) -> list[str]:
    """The rendered series without their creation times (which differ between two registries)."""
    return [line for line in metrics.render({}, 0, 0).decode().splitlines() if "_created" not in line]


def test_engine_series_read_as_through_the_library() -> None:
    fast, plain = Metrics(), Metrics()
    for metrics in (fast, plain):
        metrics.know_executors(["noop_executor"])
    for seconds in AMOUNTS:
        fast.attempt_started("noop_executor")
        fast.attempt_ended("noop_executor", "completed", seconds)
        fast.attempt_ended(None, "retry", seconds)
        fast.queue_waited(seconds)
        fast.engine_pass(seconds)
        plain.child(plain.started, "noop_executor").inc()
        plain.child(plain.finished, "noop_executor", "completed").inc()
        plain.child(plain.duration, "noop_executor").observe(seconds)
        plain.child(plain.finished, "none", "retry").inc()
        plain.child(plain.retries, "none").inc()
        plain.child(plain.duration, "none").observe(seconds)
        plain.queue_wait.observe(seconds)
        plain.passes.observe(seconds)
    fast.attempt_ended("elsewhere", "failed", None)
    plain.child(plain.finished, "unknown", "failed").inc()
    assert _series(fast) == _series(plain)


def test_request_series_read_as_through_the_library() -> None:
    """The HTTP and JSON-RPC series (HttpMetrics, Metrics.rpc_call) count through the same plain
    functions: /metrics must read as if each request went through inc and observe."""
    fast, plain = Metrics(), Metrics()
    for seconds in AMOUNTS:
        for path, method, status in (("/tasks", "POST", 200), ("/nowhere/x", "BREW", 404), ("/", "GET", 200)):
            count, observe = fast.http_series(path, method, status)
            count(1)
            observe(seconds)
        fast.rpc_call("tasks.get", "ok", seconds)
        fast.rpc_call("other", "error", seconds)
        for surface, verb, code in (("tasks", "POST", "200"), ("other", "other", "404"), ("a2a", "GET", "200")):
            plain.child(plain.requests, surface, verb, code).inc()
            plain.child(plain.latency, surface, verb).observe(seconds)
        plain.child(plain.rpc_latency, "tasks.get", "ok").observe(seconds)
        plain.child(plain.rpc_latency, "other", "error").observe(seconds)
    assert _series(fast) == _series(plain)


def test_an_unknown_histogram_falls_back_to_observe() -> None:
    """A histogram whose inner values are not where this prometheus_client keeps them is
    observed through its own method."""

    class Odd:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    odd = Odd()
    _observing(odd)(0.5)
    assert odd.seen == [0.5]
    real = Histogram("h", "h", registry=None, buckets=(1.0, 2.0))
    assert _observing(real) != real.observe  # the library as installed takes the plain function


# --- sqlite_pass: one cursor for the pass's three steps ----------------------------------------

OWNER = "instance-a"
UNTIL = "2999-01-01T00:00:00.000000+00:00"
STAMP = "2026-01-01T00:00:00.000000+00:00"
LATER = "2026-01-01T00:00:01.000000+00:00"


def _row(prefix: str, name: str, deps: list[str] = ()) -> dict[str, Any]:
    return with_defaults({"id": prefix + name, "name": name, "task_tree_id": prefix + "a",
                          "parent_id": None if name == "a" else prefix + "a",
                          "dependencies": [{"id": prefix + d, "required": True} for d in deps], "inputs": {},
                          "params": {}, "schemas": {}, "status": "pending", "created_at": STAMP, "updated_at": STAMP})


def _done(status: str) -> dict[str, Any]:
    return {"status": status, "progress": 1.0, "result": {"ok": True} if status == "completed" else None,
            "error": None if status == "completed" else "boom", "completed_at": LATER, "updated_at": LATER,
            "lease_owner": None, "lease_expires_at": None}


def _pass_of_tree(prefix: str, together: bool) -> Callable[[Any], Any]:
    """A tree a (root) <- b, x alone; then a pass: a completes (with its history row), x gets
    progress, a stale write to b's root token, b is claimed; then a second pass ends x, b and the
    execution. `together`: through sqlite_pass, else the three functions one after the other."""
    def run(c: Any, writes: list[Any], claims: list[str], ends: list[tuple[str, str]],
            history: dict[str, Attempt]) -> Any:
        if together:
            return executions.sqlite_pass(c, writes, claims, OWNER, UNTIL, LATER, ends, history)
        return (executions.fenced_writes(c, writes, OWNER, history), executions.claim(c, claims, OWNER, UNTIL, LATER),
                {eid: executions.end_execution(c, eid, OWNER, version, LATER) for eid, version in ends})

    def scenario(c: Any) -> Any:
        p = prefix
        execution = tree_insert.insert_tree(c, [_row(p, "a"), _row(p, "b", ["a"]), _row(p, "x")], None, OWNER,
                                           UNTIL, STAMP)
        tokens = executions.claim(c, [p + "a", p + "x"], OWNER, UNTIL, STAMP)
        ea, ex = tokens[p + "a"]["lease_epoch"], tokens[p + "x"]["lease_epoch"]
        first = run(c, [(p + "a", ea, _done("completed")), (p + "x", ex, {"progress": 0.5, "updated_at": LATER}),
                        (p + "a", ea + 7, _done("failed"))], [p + "b"], [],
                    {p + "a": Attempt(p + "a", 1, STAMP, STAMP, LATER, "completed", None)})
        eb = first[1][p + "b"]["lease_epoch"]
        second = run(c, [(p + "x", ex, _done("failed")), (p + "b", eb, _done("completed"))], [],
                     [(execution["id"], execution["updated_at"])],
                     {p + "x": Attempt(p + "x", 1, STAMP, STAMP, LATER, "failed", "boom"),
                      p + "b": Attempt(p + "b", 1, LATER, LATER, LATER, "completed", None)})
        tasks, attempts = _stored(c, p)
        answers = (first[0], first[1], second[0], second[1], list(second[2].values()))
        return _unprefixed([answers, tasks, attempts], p)

    return scenario


def _stored(c: Any, p: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tree `p`a's task rows (their execution's id left out) and the history rows of its tasks,
    in a stable order: what two ways of writing the same pass must leave alike."""
    tasks = [{k: v for k, v in dict(r._mapping).items() if k != "execution_id"}
             for r in c.execute(executions.T.select().where(executions.T.c.task_tree_id == p + "a")
                                .order_by(executions.T.c.id))]
    attempts = [dict(r._mapping) | {"id": None} for r in c.execute(
        select(task_attempts_table).where(task_attempts_table.c.task_id.like(p + "%"))
        .order_by(task_attempts_table.c.task_id))]
    return tasks, attempts


def _unprefixed(value: Any, prefix: str) -> Any:
    """`value` with the tree's prefix taken off every id (sets as sorted lists)."""
    if isinstance(value, str):
        return value.replace(prefix, "")
    if isinstance(value, (set, frozenset)):
        return sorted(_unprefixed(v, prefix) for v in value)
    if isinstance(value, dict):
        return {_unprefixed(k, prefix): _unprefixed(v, prefix) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unprefixed(v, prefix) for v in value]
    return value


@pytest.mark.parametrize("backend", ["sqlite"])  # sqlite_pass is SQLite's pass (PostgreSQL's is one statement)
async def test_a_pass_on_one_cursor_stores_what_its_three_steps_store(client: Client) -> None:
    repo = client.services.repo
    apart = await repo.transact(_pass_of_tree("apart-", together=False))
    together = await repo.transact(_pass_of_tree("together-", together=True))
    assert together == apart
    answers = apart[0]
    assert answers[0] == ["a", "x"] and list(answers[1]) == ["b"] and answers[2] == ["b", "x"]
    assert answers[4] == ["failed"]


def test_a_full_row_is_the_same_whichever_way_it_is_merged() -> None:
    """storage/models.py with_defaults merges a row of columns only at C speed: the row (values
    and key order) must be what the filtering path makes, and unknown keys are still dropped."""
    from taskgrove.storage.models import _DEFAULTS, _TASK_COLUMNS

    row = {"id": "a", "name": "a", "task_tree_id": "a", "created_at": "t", "updated_at": "t",
           "inputs": {"x": 1}, "status": "completed", "execution_id": "e"}
    filtered = {**_DEFAULTS, **{k: v for k, v in row.items() if k in _TASK_COLUMNS}}
    assert list(with_defaults(row).items()) == list(filtered.items())
    assert list(with_defaults({**row, "tree_usages": "[]", "no such column": 1}).items()) == list(filtered.items())
