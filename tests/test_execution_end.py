"""The end of an execution (storage/statements.py END_EXECUTION) is refused while a member may still
run, alike on both backends, and granted exactly when the engine's run (engine/tree_run.py) is over.

Why: the engine decides to end from its memory, and a tasks.update stored after the run read the
tree (a new dependency of a pending member) made it end the execution in the pass whose claim of
that member the database refused; nobody ran it (tests/test_races.py forces that race). The other
way round, an end refused while the run, re-read from the database, is over would be asked for
again after every re-read, without end; and a run that takes a task the database holds back for
runnable would have its claim refused and re-read the tree after every pass, without end (the last test).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from taskgrove.agent.engine.tree_run import TreeRun
from taskgrove.storage import executions
from taskgrove.storage.models import tasks_table as T
from tests.conftest import POSTGRES_URL, Client
from tests.deadlines import EVENT_WAIT
from tests.test_statement_forms import LATER, OWNER, STAMP, Twin, clear, stored, task, tree, twin  # noqa: F401 (twin: a fixture)

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")

# A pending member `t` with one dependency on `d` in a state, required or not, and the final status
# the end gives (None: refused, `t` may still run).
CASES = [
    ("completed", True, None), ("completed", False, None),
    ("failed", True, "failed"), ("failed", False, None),
    ("cancelled", True, "failed"), ("cancelled", False, None),
    ("held", True, "failed"), ("held", False, "failed"),  # pending in the execution, itself after a failure
    ("outside", True, "failed"), ("outside", False, None),  # pending in no execution
    ("elsewhere", True, None), ("elsewhere", False, None),  # in progress outside the execution: t waits for it
    ("missing", True, "failed"), ("missing", False, None),  # no such task
]


def end(c: Any) -> str | None:
    return executions.end_execution(c, "e-root", OWNER, STAMP, LATER)


def run_is_over(rows: list[dict[str, Any]], outside: list[dict[str, Any]]) -> bool:
    """Whether the engine's run of these rows (read as RunKeeper._read_run reads them: pending rows
    are members, waiting or, with a retry time, retrying) is over once it queued what may run."""
    by_id = {row["id"]: dict(row) for row in rows + outside}
    run = TreeRun(tree_id="root", rows=by_id, execution_id="e-root")
    pending = [row["id"] for row in rows if row["status"] == "pending"]
    run.retrying.update(tid for tid in pending if by_id[tid].get("next_attempt_at"))
    run.add(tid for tid in pending if tid not in run.retrying)
    run.runnable()
    return run.is_over()


@needs_postgres
@pytest.mark.parametrize("state, required, final", CASES)
def test_the_end_waits_for_a_pending_member_that_may_still_run(twin: Twin, state: str, required: bool,
                                                               final: str | None) -> None:
    twin.both(clear)
    rows = [task("root", status="completed"), task("t", [{"id": "nobody" if state == "missing" else "d",
                                                          "required": required}])]
    outside: list[dict[str, Any]] = []
    if state == "held":
        rows += [task("d", [{"id": "f", "required": True}]), task("f", status="failed")]
    elif state in ("outside", "elsewhere"):
        outside.append(task("d", task_tree_id="other", status="pending" if state == "outside" else "in_progress"))
    elif state != "missing":
        rows.append(task("d", status=state))
    twin.both(tree(rows))
    for row in outside:
        twin.both(lambda c, row=row: c.execute(T.insert(), row))
    assert twin.alike(end) == final
    twin.alike(stored)
    # The engine asks for the end exactly when the database grants it: no end refused again and again.
    assert run_is_over(rows, outside) == (final is not None)


@needs_postgres
def test_the_end_waits_for_a_retry_and_for_a_member_without_dependencies(twin: Twin) -> None:
    twin.both(clear)
    twin.both(tree([task("root", status="completed"), task("retry", next_attempt_at=LATER, attempt=1),
                    task("free")]))
    done: Callable[[str], Callable[[Any], Any]] = (
        lambda tid: lambda c: c.execute(T.update().where(T.c.id == tid).values(status="completed")))
    assert twin.alike(end) is None
    twin.both(done("free"))
    assert twin.alike(end) is None  # the retry is still due
    twin.both(done("retry"))
    assert twin.alike(end) == "completed"
    twin.alike(stored)


FAIL = {"schemas": {"method": "command_executor"}, "inputs": {"command": "false"}}  # refused: no allow-list
NOOP = {"schemas": {"method": "noop_executor"}}


async def test_a_task_after_an_optional_dependency_that_never_runs_waits_and_the_execution_ends(
        client: Client) -> None:
    """`opt` depends, optionally, on `after`, which requires `bad`, which fails: `after` never runs
    in this execution, so neither may `opt` (an optional dependency must have ended,
    docs/execution.md; the claim refuses `opt` while `after` is pending in the execution). The
    engine's run must hold `opt` back as the database does: queued, its claim refused, the run
    re-read and `opt` queued again, the execution would never end."""
    await client.result("tasks.create", [
        {"id": "root", "name": "root"},
        {"id": "bad", "name": "bad", "parent_id": "root", **FAIL},
        {"id": "after", "name": "after", "parent_id": "root", "dependencies": [{"id": "bad"}], **NOOP},
        {"id": "opt", "name": "opt", "parent_id": "root", "dependencies": [{"id": "after", "required": False}],
         "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 0}}])
    assert await client.runs_ended(EVENT_WAIT)
    statuses = {tid: (await client.result("tasks.get", {"task_id": tid}))["status"]
                for tid in ("root", "bad", "after", "opt")}
    assert statuses == {"root": "completed", "bad": "failed", "after": "pending", "opt": "pending"}
    execution = await client.services.engine.run_keeper.executions.latest("root")
    assert execution is not None and execution["final_status"] == "failed", execution
