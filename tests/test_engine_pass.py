"""One engine pass in the database (storage.executions): fenced writes, then claims that see them.

On PostgreSQL a pass is the rows of one statement (`pg_pass`, here one by one; the repository
sends them at once: tests/test_pg_fast_paths.py); elsewhere it is fenced_writes then claim in one
transaction. Both must decide the same: a dependent is claimed in
the pass that stores its dependency's `completed`, and only if that write was accepted."""

from __future__ import annotations

from typing import Any

import pytest

from taskgrove.storage import executions, tree_insert
from taskgrove.storage.models import with_defaults
from tests.conftest import Client

OWNER = "instance-a"
UNTIL = "2999-01-01T00:00:00.000000+00:00"
STAMP = "2026-01-01T00:00:00.000000+00:00"


def row(tid: str, deps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return with_defaults({"id": tid, "name": tid, "task_tree_id": "a", "parent_id": None if tid == "a" else "a",
                          "dependencies": deps or [], "inputs": {}, "params": {}, "schemas": {}, "status": "pending",
                          "created_at": STAMP, "updated_at": STAMP})


def one_pass(c: Any, writes: list[Any], claims: list[str]) -> tuple[set[str], set[str]]:
    if c.dialect.name == "postgresql":
        accepted, claimed, _ = executions.pg_pass(c, writes, claims, OWNER, UNTIL, STAMP)
    else:
        accepted = executions.fenced_writes(c, writes, OWNER)
        claimed = executions.claim(c, claims, OWNER, UNTIL, STAMP)
    return accepted, set(claimed)


def outcome(status: str) -> dict[str, Any]:
    return {"status": status, "progress": 1.0, "result": {"ok": True} if status == "completed" else None,
            "error": None if status == "completed" else "boom", "completed_at": STAMP, "updated_at": STAMP,
            "lease_owner": None, "lease_expires_at": None}


@pytest.mark.parametrize("status, epoch_offset, claimed_b", [
    ("completed", 0, True),   # accepted completed: its dependent is claimed in the same pass
    ("failed", 0, False),     # a required dependency that failed blocks
    ("completed", 1, False),  # a stale token: the write is refused and the dependent waits
])
async def test_a_dependent_is_claimed_in_the_pass_that_completes_its_dependency(
        client: Client, status: str, epoch_offset: int, claimed_b: bool) -> None:
    def scenario(c: Any) -> tuple[set[str], set[str], dict[str, Any]]:
        tree_insert.insert_tree(c, [row("a"), row("b", [{"id": "a", "required": True}]), row("x")],
                               None, OWNER, UNTIL, STAMP)
        epoch = executions.claim(c, ["a", "x"], OWNER, UNTIL, STAMP)["a"]["lease_epoch"]
        progress = {"progress": 0.5, "updated_at": STAMP}  # a second shape in the same pass
        accepted, claimed = one_pass(c, [("a", epoch + epoch_offset, outcome(status)), ("x", 1, progress)], ["b"])
        stored = {r.id: dict(r._mapping) for r in c.execute(executions.T.select())}
        return accepted, claimed, stored

    accepted, claimed, stored = await client.services.repo.transact(scenario)
    assert ("a" in accepted) == (epoch_offset == 0)
    assert "x" in accepted and stored["x"]["progress"] == 0.5 and stored["x"]["status"] == "in_progress"
    assert ("b" in claimed) == claimed_b
    assert stored["b"]["status"] == ("in_progress" if claimed_b else "pending")
    if epoch_offset == 0:
        assert stored["a"]["status"] == status
        assert stored["a"]["result"] == ({"ok": True} if status == "completed" else None)
    else:
        assert stored["a"]["status"] == "in_progress"
