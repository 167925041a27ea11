"""SQLite's pass completes a pure task in one row write (storage/statements.py claim_and_write,
issue 48's regression round): claimed and written by one UPDATE when the claim gives the epoch
and attempt predicted from memory, else by the two steps it replaces (claim, then the fenced
write). Either way the database must end as the two steps leave it, and answer the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from taskgrove.storage import executions, tree_insert
from taskgrove.storage.attempts import Attempt
from tests.conftest import Client
from tests.test_engine_speed_rules import LATER, OWNER, STAMP, UNTIL, _done, _row, _stored, _unprefixed

# What the memory of the run predicts for b (never claimed yet): epoch 1, attempt 1. Each case
# makes the database hold something else first, or nothing else.
CASES = {
    "as predicted": None,
    "epoch moved": {"lease_epoch": 3},  # an earlier claim elsewhere: the write must be refused
    "attempt moved": {"attempt": 2},  # the write's fence holds, the history row's attempt does not
    "not claimable": {"status": "completed"},  # finished meanwhile: neither claim nor write
}


def _scenario(prefix: str, case: dict[str, Any] | None, together: bool) -> Callable[[Any], Any]:
    """A tree a <- b, c alone; a completes; then b (pure) and c (durable) are taken in one pass."""
    def scenario(c: Any) -> Any:
        p = prefix
        statements: list[str] = []
        execution = tree_insert.insert_tree(c, [_row(p, "a"), _row(p, "b", ["a"]), _row(p, "c")], None, OWNER,
                                           UNTIL, STAMP)
        ea = executions.claim(c, [p + "a"], OWNER, UNTIL, STAMP)[p + "a"]["lease_epoch"]
        executions.fenced_writes(c, [(p + "a", ea, _done("completed"))], OWNER)
        if case:
            c.execute(update(executions.T).where(executions.T.c.id == p + "b").values(**case))
        history = {p + "b": Attempt(p + "b", 1, STAMP, LATER, LATER, "completed", None)}
        later = [(p + "b", 1, _done("completed"))]
        if together:
            driver = c.connection.driver_connection
            driver.set_trace_callback(statements.append)
            try:
                answer = executions.sqlite_pass(c, [], [p + "c", p + "b"], OWNER, UNTIL, LATER, (), history, later)
            finally:
                driver.set_trace_callback(None)
        else:
            claimed = executions.claim(c, [p + "c", p + "b"], OWNER, UNTIL, LATER)
            answer = (executions.fenced_writes(c, later, OWNER, history), claimed, {})
        tasks, attempts = _stored(c, p)
        assert execution is not None
        writes_of_b = sum(1 for s in statements if s.lstrip().startswith("UPDATE tasks") and f"'{p}b'" in s)
        return _unprefixed([answer[0], answer[1], tasks, attempts], p), writes_of_b

    return scenario


@pytest.mark.parametrize("backend", ["sqlite"])  # claim_and_write is SQLite's (PostgreSQL's pass is one statement)
@pytest.mark.parametrize("case", list(CASES))
async def test_a_pure_task_claimed_and_written_in_one_row_write_ends_as_the_two_steps_leave_it(
        client: Client, case: str) -> None:
    repo = client.services.repo
    apart, _ = await repo.transact(_scenario("apart-", CASES[case], together=False))
    together, writes_of_b = await repo.transact(_scenario("together-", CASES[case], together=True))
    assert together == apart
    # one row write of b where the prediction holds; else the claim and the fenced write after it
    assert writes_of_b == (1 if case == "as predicted" else 3)
    accepted, claimed, tasks, _ = together
    stored = {t["id"]: t for t in tasks}
    assert "c" in claimed and stored["c"]["status"] == "in_progress"  # the durable task's claim, as ever
    if case == "as predicted":
        assert accepted == ["b"] and claimed["b"]["lease_epoch"] == 1 and stored["b"]["status"] == "completed"
        assert stored["b"]["started_at"] == LATER and stored["b"]["lease_owner"] is None
    elif case == "epoch moved":  # claimed (an ordinary attempt runs it), its outcome refused
        assert accepted == [] and claimed["b"]["lease_epoch"] == 4 and stored["b"]["status"] == "in_progress"
    elif case == "not claimable":
        assert accepted == [] and "b" not in claimed
