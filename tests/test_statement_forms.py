"""The dialect forms of each statement in storage/statements.py decide alike: the SQLite form run on
SQLite and the PostgreSQL form run on PostgreSQL, on the same rows, give the same answer and
leave the same rows.

The claim is written twice (json_each against json_array_elements with a LATERAL lookup), and on
PostgreSQL the claim, the fenced writes and the end of an execution are parts of one statement
(statements.pass_statement): a difference in any of them shows up here as a task claimed on one
backend and not on the other, or a write accepted on one only. Random trees (hypothesis) cover
dependency shapes the hand-written cases do not.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, Boolean, case, delete, select

from taskgrove.storage import executions, statements, tree_insert
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.db import create_batch_engine, create_engine, migrate
from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import rate_limits_table as R
from taskgrove.storage.models import task_attempts_table as A
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.models import with_defaults
from tests.conftest import POSTGRES_URL, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")

OWNER, OTHER = "instance-a", "instance-b"
PAST, STAMP, LATER = "2025-01-01T00:00:00.000000+00:00", "2026-01-01T00:00:00.000000+00:00", \
    "2027-01-01T00:00:00.000000+00:00"
UNTIL = "2999-01-01T00:00:00.000000+00:00"


class Twin:
    """A SQLite database and a PostgreSQL one, both at the newest migration; `both(fn)` runs
    `fn(connection)` in a transaction on each and returns the two answers."""

    def __init__(self, sqlite_path: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        sqlite_url = f"sqlite+aiosqlite:///{sqlite_path}"
        self.pg_url = self._await(create_postgres_database())
        self.pg = create_engine(self.pg_url.replace("postgresql://", "postgresql+asyncpg://", 1), pool_size=1)
        setup = create_engine(sqlite_url)
        self._await(migrate(setup))
        self._await(setup.dispose())
        self._await(migrate(self.pg))
        sync = create_batch_engine(sqlite_url)
        assert sync is not None
        self.sqlite = sync

    def _await(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def both(self, fn: Callable[[Any], Any]) -> tuple[Any, Any]:
        with self.sqlite.begin() as c:
            on_sqlite = fn(c)

        async def on_pg() -> Any:
            async with self.pg.begin() as c:
                return await c.run_sync(fn)

        return on_sqlite, self._await(on_pg())

    def alike(self, fn: Callable[[Any], Any]) -> Any:
        on_sqlite, on_pg = self.both(fn)
        assert on_sqlite == on_pg
        return on_sqlite

    def close(self) -> None:
        self.sqlite.dispose()
        self._await(self.pg.dispose())
        self._await(drop_postgres_database(self.pg_url))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    made = Twin(tmp_path_factory.mktemp("forms") / "db.sqlite")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(autouse=True)
def empty(twin: Twin) -> None:
    twin.both(clear)


def clear(c: Any) -> None:
    for table in (T, X, R, A):
        c.execute(delete(table))


def stored(c: Any) -> tuple[list[dict[str, Any]], ...]:
    """Every row of the tables these statements change, decoded by SQLAlchemy, in key order (the
    attempt history without its generated id)."""
    return ([dict(r._mapping) for r in c.execute(select(T).order_by(T.c.id))],
            [dict(r._mapping) for r in c.execute(select(X).order_by(X.c.id))],
            [dict(r._mapping) for r in c.execute(select(R).order_by(R.c.key))],
            [{k: v for k, v in r._mapping.items() if k != "id"}
             for r in c.execute(select(A).order_by(A.c.task_id, A.c.id))])


def task(tid: str, deps: list[dict[str, Any]] | None = None, **values: Any) -> dict[str, Any]:
    return with_defaults({"id": tid, "name": tid, "task_tree_id": "root",
                          "parent_id": None if tid == "root" else "root",
                          "dependencies": deps or [], "status": "pending", "created_at": STAMP, "updated_at": STAMP,
                          **values})


def tree(rows: list[dict[str, Any]], owner: str = OWNER) -> Callable[[Any], str]:
    """Store `rows` with a running execution owned by `owner` (its pending rows are its members),
    the execution's generated id replaced by `e-<tree id>` so that both databases hold the same."""
    def insert(c: Any) -> str:
        generated = tree_insert.insert_tree(c, rows, None, owner, UNTIL, STAMP)["id"]
        named = f"e-{rows[0]['task_tree_id']}"
        c.execute(X.update().where(X.c.id == generated).values(id=named))
        c.execute(T.update().where(T.c.execution_id == generated).values(execution_id=named))
        return named

    return insert


def claim(ids: list[str], owner: str = OWNER) -> Callable[[Any], dict[str, Any]]:
    return lambda c: executions.claim(c, ids, owner, UNTIL, STAMP)


# Each case: a task `t` with one dependency on `d` in the given state, required or not (None: not
# said, which means required); whether `t` may be claimed.
DEPENDENCY_CASES = [
    ("completed", True, True), ("completed", False, True), ("completed", None, True),
    ("failed", True, False), ("failed", False, True), ("failed", None, False),
    ("cancelled", True, False), ("cancelled", False, True),
    ("in_progress", True, False), ("in_progress", False, False),
    ("pending", True, False), ("pending", False, False),  # pending in the same execution
    ("outside", True, False), ("outside", False, True), ("outside", None, False),  # pending in no execution
    ("missing", True, True),  # a dependency on a task that does not exist holds nothing back
]


@pytest.mark.parametrize("state, required, claimable", DEPENDENCY_CASES)
def test_the_claim_decides_alike_on_each_dependency_state(twin: Twin, state: str, required: bool | None,
                                                          claimable: bool) -> None:
    dependency = {"id": "d" if state != "missing" else "nobody", **({} if required is None else {"required": required})}
    rows = [task("root", status="completed"), task("t", [dependency])]
    if state not in ("outside", "missing"):
        rows.append(task("d", status=state))
    twin.both(tree(rows))
    if state == "outside":  # pending, but in no execution
        twin.both(lambda c: c.execute(T.insert(), task("d", task_tree_id="other")))
    claimed = twin.alike(claim(["t"]))
    assert ("t" in claimed) == claimable
    twin.alike(stored)


def test_the_claim_decides_alike_on_leases_retries_and_owners(twin: Twin) -> None:
    rows = [task("root", status="completed"), task("free"), task("due", next_attempt_at=PAST),
            task("later", next_attempt_at=LATER), task("done", status="completed"),
            task("resumed", attempt=2, lease_epoch=3, checkpoint={"step": 4, "\u00e9": [1.5, None]}),
            task("required_default", [{"id": "root"}]), task("odd \"id\" %_", [{"id": "done", "required": False}])]
    twin.both(tree(rows))
    twin.both(tree([task("foreign", task_tree_id="other")], owner=OTHER))
    wanted = [row["id"] for row in rows] + ["foreign", "nobody"]
    claimed = twin.alike(claim(wanted))
    assert set(claimed) == {"free", "due", "resumed", "required_default", "odd \"id\" %_"}
    assert claimed["resumed"] == {"lease_epoch": 4, "attempt": 3, "checkpoint": {"step": 4, "\u00e9": [1.5, None]}}
    assert twin.alike(claim(wanted)) == {}  # claimed once only
    twin.alike(stored)


def test_a_task_claimed_with_its_trees_insert_is_stored_as_a_claim_leaves_it(twin: Twin) -> None:
    """tree_insert.insert_tree(claims=...) stores its claimed tasks as the claim statement would
    have left them right after the insert, on both backends, and answers the same tokens."""
    rows = [task("root", [{"id": "a"}, {"id": "b"}]), task("a", priority=0), task("b"), task("c", [{"id": "a"}])]

    def insert_claiming(c: Any) -> dict[str, Any]:
        execution = tree_insert.insert_tree(c, rows, None, OWNER, UNTIL, STAMP, claims={"a", "b"})
        c.execute(X.update().where(X.c.id == execution["id"]).values(id="e-root"))
        c.execute(T.update().where(T.c.execution_id == execution["id"]).values(execution_id="e-root"))
        return execution["claimed"]

    tokens = twin.alike(insert_claiming)
    assert tokens == {"a": {"lease_epoch": 1, "attempt": 1, "checkpoint": None},
                      "b": {"lease_epoch": 1, "attempt": 1, "checkpoint": None}}
    claimed_at_insert = twin.alike(stored)
    twin.both(clear)
    twin.both(tree(rows))
    assert twin.alike(claim(["a", "b", "c"])) == tokens  # c waits for a
    assert twin.alike(stored) == claimed_at_insert


def test_a_claim_of_more_ids_than_one_list_holds_decides_alike(twin: Twin) -> None:
    rows = [task("root", status="completed")] + [task(f"t{i:04}", [{"id": f"t{i - 1:04}"}] if i % 2 else None)
                                                for i in range(1100)]
    twin.both(tree(rows))
    claimed = twin.alike(claim([row["id"] for row in rows]))
    assert len(claimed) == 550
    twin.alike(stored)


def test_fenced_writes_decide_alike(twin: Twin) -> None:
    twin.both(tree([task("root", status="completed"), task("a"), task("b"), task("c"), task("d", [{"id": "a"}])]))
    epochs = {tid: token["lease_epoch"] for tid, token in twin.alike(claim(["a", "b", "c"])).items()}
    outcome = {"status": "completed", "progress": 1.0, "result": {"z": [1, "\u00e9", None], "a": True},
               "error": None, "completed_at": STAMP, "updated_at": STAMP, "lease_owner": None,
               "lease_expires_at": None}
    writes = [("a", epochs["a"], {"progress": 0.5, "updated_at": STAMP}),
              ("a", epochs["a"], {"checkpoint": {"n": 1}}),
              ("a", epochs["a"], outcome),
              ("b", epochs["b"] + 1, outcome),  # a stale epoch
              ("c", epochs["c"], {"token_success": 7, "token_failed": 1, "result": None}),
              ("nobody", 1, outcome)]
    accepted = twin.alike(lambda c: executions.fenced_writes(c, writes, OWNER))
    assert accepted == {"a", "c"}
    assert twin.alike(lambda c: executions.fenced_writes(c, [("c", epochs["c"], outcome)], OTHER)) == set()
    assert set(twin.alike(claim(["d"]))) == {"d"}  # sees the outcome written before
    twin.alike(stored)


def test_the_history_of_accepted_outcomes_is_stored_alike(twin: Twin) -> None:
    """An outcome's attempt row is stored with its write, and only if the write was accepted."""
    twin.both(tree([task("root", status="completed"), task("a"), task("b"), task("c")]))
    epochs = {tid: token["lease_epoch"] for tid, token in twin.alike(claim(["a", "b", "c"])).items()}
    outcome = {"status": "failed", "error": "boom", "completed_at": LATER, "updated_at": LATER, "lease_owner": None}
    writes = [("a", epochs["a"], outcome), ("c", epochs["c"], {"progress": 0.2}),
              ("b", epochs["b"] + 1, {**outcome, "progress": 0.0})]  # a stale epoch: no history either
    history = {tid: Attempt(tid, 1, PAST, STAMP, LATER, "failed", "boom") for tid in ("a", "b")}
    assert twin.alike(lambda c: executions.fenced_writes(c, writes, OWNER, history)) == {"a", "c"}
    rows = twin.alike(stored)[3]
    assert [(r["task_id"], r["outcome"], r["queued_at"], r["error"]) for r in rows] == [("a", "failed", PAST, "boom")]


def test_a_refused_write_does_not_refuse_the_others_of_its_shape(twin: Twin) -> None:
    """Same-shape outcomes, one with a stale epoch: the others are accepted, with their history
    (SQLite sends a shape as one executemany and, when a write is refused, tries each alone)."""
    twin.both(tree([task("root", status="completed"), task("a"), task("b"), task("c")]))
    epochs = {tid: token["lease_epoch"] for tid, token in twin.alike(claim(["a", "b", "c"])).items()}
    outcome = {"status": "completed", "completed_at": LATER, "updated_at": LATER, "lease_owner": None}
    writes = [("a", epochs["a"], outcome), ("b", epochs["b"] + 1, outcome), ("c", epochs["c"], outcome)]
    history = {tid: Attempt(tid, 1, PAST, STAMP, LATER, "completed", None) for tid in ("a", "b", "c")}
    assert twin.alike(lambda c: executions.fenced_writes(c, writes, OWNER, history)) == {"a", "c"}
    tasks, *_, attempts = twin.alike(stored)
    assert sorted(r["task_id"] for r in attempts) == ["a", "c"]


@pytest.mark.parametrize("last", ["completed", "failed", "cancelled"])
def test_the_end_of_an_execution_decides_alike(twin: Twin, last: str) -> None:
    twin.both(tree([task("root"), task("a")]))
    epochs = {tid: token["lease_epoch"] for tid, token in twin.alike(claim(["root", "a"])).items()}
    end = (lambda version, owner=OWNER: lambda c: executions.end_execution(c, "e-root", owner, version, LATER))
    assert twin.alike(end(STAMP)) is None  # members in progress
    outcome = {"status": "completed", "completed_at": STAMP, "lease_owner": None}
    twin.alike(lambda c: executions.fenced_writes(c, [("root", epochs["root"], outcome),
                                                      ("a", epochs["a"], {**outcome, "status": last})], OWNER))
    assert twin.alike(end(PAST)) is None  # another version
    assert twin.alike(end(STAMP, OTHER)) is None  # another owner
    assert twin.alike(end(STAMP)) == ("completed" if last == "completed" else "failed")
    assert twin.alike(end(STAMP)) is None  # ended once
    twin.alike(stored)


def test_limited_claims_decide_alike(twin: Twin) -> None:
    twin.both(tree([task("root", status="completed")] + [task(f"k{i}", concurrency_key="key") for i in range(3)]))
    limited = (lambda tid, rate=None: lambda c: executions.claim_limited(
        c, tid, "key", 2, rate, 10.0, OWNER, UNTIL, STAMP))
    assert twin.alike(limited("k0"))[0] == "claimed"
    assert twin.alike(limited("k1", "r"))[0] == "claimed"
    assert twin.alike(limited("k2")) == ("key", 2)
    twin.both(lambda c: c.execute(T.update().where(T.c.id == "k0").values(status="completed")))
    assert twin.alike(limited("k2", "r")) == ("rate", "2026-01-01T00:00:10.000000+00:00")
    twin.alike(stored)


def test_an_inserted_tree_is_stored_alike(twin: Twin) -> None:
    """statements.insert_tasks, both PostgreSQL forms (a NUL in a JSON value takes the second)."""
    rows = [task("root", inputs={"n": 10 ** 30, "f": 1e300, "s": "\u00e9\U0001F600"}, retry={"max_attempts": 3}),
            task("nul", inputs={"k": "a\u0000b"}, extra={"x": [1, {}]}, has_copy=True, priority=3)]
    twin.both(tree(rows[:1]))
    twin.both(tree([{**rows[1], "task_tree_id": "t2"}]))
    twin.alike(stored)


def _decoded(row: Any) -> list[Any]:
    """A raw row of a read as SQLAlchemy would decode a task's: JSON text parsed (SQLite hands it
    over as text), booleans as booleans (SQLite stores integers). Other rows (counts) as they are."""
    values = list(row)
    if len(values) != len(T.c):
        return values
    for at, column in enumerate(T.c):
        if isinstance(column.type, JSON) and isinstance(values[at], str):
            values[at] = read_stored(values[at])
        elif isinstance(column.type, Boolean) and values[at] is not None:
            values[at] = bool(values[at])
    return values


READS = [
    (statements.TASK_BY_ID, ("a",)), (statements.TASK_BY_ID, ("nobody",)), (statements.TASK_TREE, ("root",)),
    (statements.TASK_CHILDREN, ("root",)), (statements.tasks_by_ids(3), ("a", "b", "nobody")),
    (statements.task_listing(False, False), (10, 1)), (statements.task_listing(True, False), ("u", 10, 0)),
    (statements.task_listing(False, True), ("pending", 2, 0)),
    (statements.task_listing(True, True), ("u", "completed", 5, 0)),
    (statements.task_listing(False, False, True), ("2999-01-01T00:00:00.000000+00:00", "z", 10, 0)),
    (statements.task_listing(True, False, True), ("u", PAST, "b", 10, 0)),
    (statements.task_listing(True, True, True), ("u", "completed", "2999-01-01T00:00:00.000000+00:00", "b", 1, 0)),
    (statements.UNFINISHED_OF_USER, ("u", 10)), (statements.UNFINISHED_OF_USER, ("u", 1)),
    (statements.UNFINISHED_OF_NOBODY, (10,)), (statements.COUNT_KEY, ("key",)), (statements.MIGRATION_VERSION, ()),
]


@pytest.mark.parametrize("statement, args", READS, ids=lambda v: getattr(v, "purpose", None))
def test_reads_answer_alike(twin: Twin, statement: statements.Statement, args: tuple[Any, ...]) -> None:
    rows = [task("root", user_id="u", status="completed"), task("a", user_id="u", created_at=PAST),
            task("b", concurrency_key="key", status="in_progress"), task("c", user_id="u", parent_id="a")]
    twin.both(tree(rows))

    def read(c: Any) -> list[list[Any]]:
        found = [_decoded(row) for row in c.exec_driver_sql(statement.form(c.dialect.name), args)]
        return found if "ORDER BY" in statement.sqlite else sorted(found, key=repr)  # the database's order

    assert twin.alike(read) is not None
    twin.alike(stored)


def test_serialising_a_tree_changes_nothing_alike(twin: Twin) -> None:
    twin.both(tree([task("root"), task("a")]))
    twin.both(lambda c: c.exec_driver_sql(statements.SERIALISE_TREE.form(c.dialect.name), ("a",)))
    twin.alike(stored)


def test_a_trees_usages_read_alike(twin: Twin) -> None:
    """TREE_USAGES: one JSON array of the usages a tree's tasks have (JSON null and NULL left out)."""
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost_usd": None, "calls": 1}
    twin.both(tree([task("root", usage=usage), task("a"), task("b", usage={**usage, "calls": 2})]))

    def read(tree_id: str) -> Callable[[Any], list[Any]]:
        def run(c: Any) -> list[Any]:
            text = c.exec_driver_sql(statements.TREE_USAGES.form(c.dialect.name), (tree_id,)).scalar_one()
            return sorted(json.loads(text), key=repr)
        return run

    assert twin.alike(read("root")) == [usage, {**usage, "calls": 2}]
    assert twin.alike(read("nobody")) == []


def test_a_task_with_its_trees_usages_reads_alike(twin: Twin) -> None:
    """TASK_WITH_TREE_USAGES: the row TASK_BY_ID reads and, for a root only, the array TREE_USAGES
    reads (NULL for a child, no row for a missing id)."""
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost_usd": None, "calls": 1}
    twin.both(tree([task("root"), task("a", usage=usage), task("b"), task("c", usage={**usage, "calls": 2})]))

    def read(task_id: str) -> Callable[[Any], list[Any]]:
        def run(c: Any) -> list[Any]:
            found = []
            for row in c.exec_driver_sql(statements.TASK_WITH_TREE_USAGES.form(c.dialect.name), (task_id,)):
                *columns, usages = row
                alone = c.exec_driver_sql(statements.TASK_BY_ID.form(c.dialect.name), (task_id,)).one()
                assert _decoded(columns) == _decoded(alone)
                found.append([_decoded(columns), None if usages is None else sorted(json.loads(usages), key=repr)])
            return found
        return run

    assert twin.alike(read("root"))[0][1] == [usage, {**usage, "calls": 2}]
    assert twin.alike(read("a"))[0][1] is None
    assert twin.alike(read("nobody")) == []
    twin.both(lambda c: c.execute(T.update().values(usage=None)))
    assert twin.alike(read("root"))[0][1] == []


def test_every_named_statement_of_two_forms_is_checked_here() -> None:
    """A statement added to storage/statements.py with both forms must be run by a test above."""
    both = {name for name, value in vars(statements).items()
            if isinstance(value, statements.Statement) and value.sqlite and value.postgresql}
    checked = {name for name, value in vars(statements).items() if any(value is s for s, _ in READS)}
    # test_limited_claims_decide_alike, test_serialising_a_tree_changes_nothing_alike, test_a_trees_usages_read_alike,
    # test_a_task_with_its_trees_usages_reads_alike
    assert both - checked == {"ADD_RATE", "READ_RATE", "MOVE_RATE", "SERIALISE_TREE", "TREE_USAGES",
                              "TASK_WITH_TREE_USAGES"}


statuses = st.sampled_from(["pending", "in_progress", "completed", "failed", "cancelled"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(statuses, st.lists(st.tuples(st.integers(0, 8), st.sampled_from([True, False, None])),
                                             max_size=3),
                          st.booleans()), min_size=1, max_size=8))
def test_random_trees_are_claimed_alike(twin: Twin,
                                        shape: list[tuple[str, list[tuple[int, bool | None]], bool]]) -> None:
    """Tasks in random states with random dependencies (some on tasks that do not exist), some
    members of the execution and some not: both backends claim the same ones."""
    twin.both(clear)
    rows = [task("root", status="completed")]
    for i, (status, deps, _) in enumerate(shape):
        rows.append(task(f"t{i}", [{"id": f"t{n}", **({} if required is None else {"required": required})}
                                   for n, required in deps], status=status))
    twin.both(tree(rows))
    members = [f"t{i}" for i, (_, _, member) in enumerate(shape) if member]
    twin.both(lambda c: c.execute(T.update().values(
        execution_id=case((T.c.id.in_(members), "e-root"), else_=None))))
    twin.alike(claim([row["id"] for row in rows]))
    twin.alike(stored)


def whole_pass(writes: list[Any], claims: list[str]) -> Callable[[Any], Any]:
    """One engine pass, each backend's own way (SQLite: sqlite_pass on the driver's cursor;
    PostgreSQL: the rows of pass_statement, as the repository sends them in one fetchmany)."""
    def run(c: Any) -> Any:
        one = executions.pg_pass if c.dialect.name == "postgresql" else executions.sqlite_pass
        accepted, claimed, _ = one(c, writes, claims, OWNER, UNTIL, STAMP)
        return accepted, claimed

    return run


def ended_as(status: str) -> dict[str, Any]:
    return {"status": status, "completed_at": STAMP, "updated_at": STAMP, "lease_owner": None,
            **({"next_attempt_at": None} if status == "pending" else {})}


def test_a_chain_link_is_one_row_and_a_task_written_and_claimed_is_two() -> None:
    """The claims of a pass ride in the row of its last writes (statements._PG_CLAIM reads the
    statuses that row writes), except when a claimed task is written in that row."""
    link = executions.pg_step_params([("a", 1, ended_as("completed"))], ["b"], OWNER, UNTIL, STAMP)
    assert len(link) == 1 and link[0][1] == ["a"] and link[0][3] == ["b"]
    retried = executions.pg_step_params([("a", 1, ended_as("pending"))], ["a", "b"], OWNER, UNTIL, STAMP)
    assert [(row[1], row[3]) for row in retried] == [(["a"], []), ([], ["a", "b"])]
    assert len(executions.pg_step_params([], ["b"], OWNER, UNTIL, STAMP)) == 1


@pytest.mark.parametrize("status, required, claimable", [
    ("completed", True, True), ("failed", True, False), ("failed", False, True), ("cancelled", None, False),
    ("pending", True, False), ("in_progress", True, False)])
def test_a_claim_sees_the_outcome_written_in_its_own_row(twin: Twin, status: str, required: bool | None,
                                                         claimable: bool) -> None:
    """A chain link on PostgreSQL: `d`'s outcome and `t`'s claim in one row. `t` is claimed
    exactly when it would be with the outcome written first (as on SQLite); an outcome written
    with a stale epoch is refused and holds `t` back."""
    dependency = {"id": "d", **({} if required is None else {"required": required})}
    twin.both(tree([task("root", status="completed"), task("d"), task("t", [dependency])]))
    epoch = twin.alike(claim(["d"]))["d"]["lease_epoch"]
    values = ended_as(status) if status != "in_progress" else {"progress": 0.5, "updated_at": STAMP}
    accepted, claimed = twin.alike(whole_pass([("d", epoch, values)], ["t"]))
    assert accepted == {"d"} and ("t" in claimed) == claimable
    twin.alike(stored)
    twin.both(clear)
    twin.both(tree([task("root", status="completed"), task("d"), task("t", [dependency])]))
    epoch = twin.alike(claim(["d"]))["d"]["lease_epoch"]
    assert twin.alike(whole_pass([("d", epoch + 1, ended_as("completed"))], ["t"])) == (set(), {})
    twin.alike(stored)


outcomes = st.sampled_from(["completed", "failed", "cancelled", "pending", "progress", "stale"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(outcomes, min_size=1, max_size=5),
       st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([True, False, None])), max_size=3),
                max_size=5),
       st.lists(st.integers(0, 4), max_size=3), st.booleans())
def test_random_passes_of_writes_and_claims_decide_alike(twin: Twin, written: list[str],
                                                         waiting: list[list[tuple[int, bool | None]]],
                                                         claimed_again: list[int], many: bool) -> None:
    """Tasks `d*` in progress get random outcomes (retries back to pending, progress only, a stale
    epoch) in the same pass that claims tasks `t*` depending on the written ones, and some `d*` again: both
    backends accept the same writes, claim the same tasks and store the same rows. `many` spreads
    the writes over more than one PostgreSQL row."""
    twin.both(clear)
    rows = [task("root", status="completed")] + [task(f"d{i}") for i in range(5)]
    rows += [task(f"t{i}", [{"id": f"d{n % len(written)}",
                             **({} if required is None else {"required": required})} for n, required in deps])
             for i, deps in enumerate(waiting)]
    twin.both(tree(rows))
    epochs = {tid: token["lease_epoch"] for tid, token in twin.alike(claim([f"d{i}" for i in range(5)])).items()}
    writes = []
    for i, outcome in enumerate(written):
        if outcome == "progress":
            writes.append((f"d{i}", epochs[f"d{i}"], {"progress": 0.5, "updated_at": STAMP}))
        else:
            epoch = epochs[f"d{i}"] + (outcome == "stale")
            writes.append((f"d{i}", epoch, ended_as("completed" if outcome == "stale" else outcome)))
    claims = [f"t{i}" for i in range(len(waiting))] + [f"d{i}" for i in claimed_again]
    limit = executions._PG_WRITES_PER_ROW
    if many:
        executions._PG_WRITES_PER_ROW = 2
    try:
        twin.alike(whole_pass(writes, claims))
    finally:
        executions._PG_WRITES_PER_ROW = limit
    twin.alike(stored)
