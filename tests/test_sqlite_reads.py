"""SQLite reads through the DB-API (storage.sqlite_reader.SqliteReader) return exactly the rows the
SQLAlchemy statements return: same keys in the same order, same decoded values (JSON columns,
booleans, floats), the same stand-ins for values that cannot be read back. Anything unusual
takes the SQLAlchemy path."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from taskgrove.storage.jsonvalues import Unreadable
from taskgrove.storage.repository import TaskRepository
from tests.conftest import Client
from tests.test_input_values import store_bad_row

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


def shown(value: Any) -> Any:
    """A read result with its Unreadable stand-ins made visible (they compare equal to {})."""
    if isinstance(value, Unreadable):
        return ("unreadable", value.reason)
    if isinstance(value, dict):
        return [(k, type(v).__name__, shown(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value


async def every_read(repo: TaskRepository) -> list[Any]:
    return [
        await repo.get("bad"), await repo.get("root"), await repo.get("missing"),
        await repo.get_many(["bad", "root", "other", "missing", "bad"]), await repo.get_many([]),
        await repo.tree("root"), await repo.tree("other"), await repo.tree("missing"),
        await repo.children("root"), await repo.children("missing"),
        await repo.list(), await repo.list(limit=2, offset=1), await repo.list(status="completed"),
        await repo.list(user_id="nobody"), await repo.list(user_id="alice", status="pending"),
    ]


async def usual_reads(repo: TaskRepository, plain_path: str) -> list[Any]:
    """every_read through the SQLAlchemy path: the repository's plain path (an attribute) set
    aside meanwhile."""
    saved = getattr(repo.connections, plain_path)
    setattr(repo.connections, plain_path, None)
    try:
        return await every_read(repo)
    finally:
        setattr(repo.connections, plain_path, saved)


async def stored(client: Client, backend: str = "sqlite") -> TaskRepository:
    await client.result("tasks.create", {"tasks": [
        {"id": "root", "name": "root"},
        {"id": "bad", "name": "bad", "parent_id": "root"},
        {"id": "c2", "name": "c2", "parent_id": "root", "inputs": {"é": [1, 2.5, None, True]},
         "dependencies": [{"id": "bad", "required": False}], "custom": {"x": 1}}]})
    await client.result("tasks.create",
                        {"tasks": [{"id": "other", "name": "other", "inputs": {"ok": 1}, "user_id": "alice"}]})
    await client.wait_status("c2", ("completed",))
    await client.runs_ended()
    await store_bad_row(client, "bad", backend)
    repo = client.services.repo
    async with repo.engine.begin() as conn:  # booleans and a float stored as an integer
        await conn.execute(text("UPDATE tasks SET has_copy = true, progress = 1 WHERE id = 'root'"))
    return repo


async def test_the_sqlite_reader_returns_what_sqlalchemy_returns(client: Client) -> None:
    repo = await stored(client)
    assert repo.connections.reader is not None
    fast = await every_read(repo)
    assert shown(fast) == shown(await usual_reads(repo, "reader"))
    assert fast[1]["has_copy"] is True and isinstance(fast[1]["progress"], float)
    assert isinstance(fast[0]["inputs"], Unreadable)


async def test_large_results_and_errors_take_the_sqlalchemy_path(client: Client, monkeypatch: Any) -> None:
    repo = await stored(client)
    assert repo.connections.reader is not None
    expected = shown(await every_read(repo))
    monkeypatch.setattr(repo.connections.reader, "INLINE_ROWS", 1)
    assert shown(await every_read(repo)) == expected

    def broken(*_args: Any) -> Any:
        raise AssertionError("not called")

    monkeypatch.setattr(repo.connections.reader, "INLINE_ROWS", 1000)
    monkeypatch.setattr(repo.connections.reader, "_row", lambda _values: broken())  # a value no processor expected
    assert shown(await every_read(repo)) == expected


async def test_a_task_with_its_tree_usages_is_what_the_usual_reads_give(client: Client) -> None:
    """tasks.get's one plain read (statements.TASK_WITH_TREE_USAGES, a column after the task's):
    the row and, for a root, its tree's usages, as the SQLAlchemy path reads them (None for a
    child, nothing for a missing id; an empty list for a tree without LLM work)."""
    from sqlalchemy import update

    from taskgrove.storage.models import tasks_table

    repo = client.services.repo
    await client.result("tasks.create", [{"id": "r", "name": "r"}, {"id": "a", "name": "a", "parent_id": "r"},
                                         {"id": "b", "name": "b", "parent_id": "r"}])
    await client.result("tasks.create", [{"id": "plain", "name": "plain"}])
    await client.runs_ended()
    spent = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost_usd": None, "calls": 1}
    spend = update(tasks_table).where(tasks_table.c.id.in_(["a", "b"])).values(usage=spent)
    await repo.transact(lambda c: c.execute(spend))
    assert repo.connections.reader is not None
    ids = ("r", "a", "plain", "missing")
    fast = [await repo.get_with_tree_usages(tid) for tid in ids]
    saved, repo.connections.reader = repo.connections.reader, None
    try:
        usual = [await repo.get_with_tree_usages(tid) for tid in ids]
    finally:
        repo.connections.reader = saved
    assert shown(fast) == shown(usual)
    assert [usages for _row, usages in fast] == [[spent, spent], None, [], None]
    assert fast[0][0] == await repo.get("r") and "tree_usages" not in fast[0][0]
    assert (await client.result("tasks.get", {"task_id": "r"}))["tree_usage"]["total_tokens"] == 14
    assert (await client.result("tasks.get", {"task_id": "plain"}))["tree_usage"] == {
        "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost_usd": 0.0, "calls": 0}


async def test_a_read_sees_what_was_just_committed(client: Client) -> None:
    await client.result("tasks.create", {"tasks": [{"id": "t", "name": "t"}]})
    for n in range(20):
        await client.result("tasks.update", {"task_id": "t", "name": f"n{n}"})
        assert (await client.result("tasks.get", {"task_id": "t"}))["name"] == f"n{n}"


async def inserted_three_ways(client: Client, column_text: str, fast_insert: Any,
                              more_inputs: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """Every column of every row (as text: `column_text` formats one column) of a stored tree,
    stored by the create, again by SQLAlchemy's executemany, again by `fast_insert`
    (`more_inputs`: added to the root's inputs)."""
    from sqlalchemy import insert

    from taskgrove.storage import executions
    from taskgrove.storage.models import executions_table, tasks_table, with_defaults

    await client.result("tasks.create", {"tasks": [
        {"id": "r", "name": "r \u00e9\u2603",
         "inputs": {"\u00e9": [1, 2.5, None, True, "x\"y"], "big": 10 ** 20, **(more_inputs or {})},
         "params": {"p": {"q": []}}, "priority": 0, "custom": {"x": 1}},
        {"id": "k", "name": "k", "parent_id": "r", "dependencies": [{"id": "r", "required": False}],
         "retry": {"max_attempts": 2}, "timeout_seconds": 2.5, "status": "completed", "result": {"r": 1}}]})
    await client.runs_ended()
    columns = ", ".join(column_text.format(c.name) for c in tasks_table.c)
    listing = text(f"SELECT {columns} FROM tasks ORDER BY id")

    def compare(c: Any) -> tuple[list[Any], list[Any], list[Any]]:
        rows = [with_defaults(r._mapping) for r in c.execute(tasks_table.select().order_by(tasks_table.c.id))]
        fast = c.execute(listing).all()
        c.execute(text("DELETE FROM tasks"))
        c.execute(insert(tasks_table), rows)
        usual = c.execute(listing).all()
        c.execute(text("DELETE FROM tasks"))
        # The execution goes in with the tasks: its row too must be what SQLAlchemy stores.
        execution = executions.new_execution("r", "r", "u", "me", "2030-01-01T00:00:00+00:00",
                                              "2026-01-01T00:00:00+00:00", {"url": "http://x/\u00e9", "n": [1]}, None)
        shown = text("SELECT {} FROM executions WHERE id = :id".format(
            ", ".join(column_text.format(name) for name in executions_table.c.keys())))
        c.execute(insert(executions_table), execution)
        by_sqlalchemy = c.execute(shown, {"id": execution["id"]}).all()
        c.execute(executions_table.delete().where(executions_table.c.id == execution["id"]))
        fast_insert(c, rows, execution)
        assert c.execute(shown, {"id": execution["id"]}).all() == by_sqlalchemy != []
        return fast, usual, c.execute(listing).all()

    return await client.services.repo.transact(compare)


async def test_the_sqlite_tree_insert_stores_what_sqlalchemy_stores(client: Client) -> None:
    """storage.tree_insert inserts a new tree's rows through the DB-API on SQLite: every column of
    every row must hold what SQLAlchemy's executemany would have stored, byte for byte (the JSON
    text included: `dependents()` matches it with LIKE)."""
    from taskgrove.storage import tree_insert

    fast, usual, again = await inserted_three_ways(client, "quote({})", tree_insert._sqlite_insert_tree)
    assert len(fast) == 2
    assert fast == usual == again


async def test_small_transactions_run_on_the_event_loop_and_never_wait_there(client: Client) -> None:
    """Small engine transactions (passes, one-task inserts) run on the event loop's thread when
    the database thread is idle (Connections.run_here). When another connection holds the
    write lock they must neither fail nor wait on the loop (which would stall every request, and
    here deadlock: the lock holder needs the loop to commit): they go to the database thread."""
    import asyncio

    repo = client.services.repo
    here: list[bool] = []
    real = repo.connections.run_here

    def counted(fn: Any, args: Any) -> Any:
        try:
            done, result = real(fn, args)
        except Exception:
            here.append("raised")
            raise
        here.append(done)
        return done, result

    repo.connections.run_here = counted  # type: ignore[method-assign]
    while repo.connections._queued:  # the service's first looks at the database (schedules) are done
        await asyncio.sleep(0.01)
    await client.result("tasks.create", {"tasks": [{"id": "first", "name": "first"}]})
    assert here and all(here)  # the insert (with its task's claim), the outcome: each on the loop's thread
    # On the loop's thread a statement never waits for a lock: it fails at once instead.
    assert repo.connections.run_here(lambda c: c.exec_driver_sql("PRAGMA busy_timeout").scalar(), ()) == (True, 0)

    here.clear()
    async with repo.engine.begin() as holder:  # another connection takes the write lock
        await holder.execute(text("UPDATE tasks SET name = 'held' WHERE id = 'first'"))
        create = asyncio.create_task(client.http.post("/tasks", json={
            "jsonrpc": "2.0", "id": "c", "method": "tasks.create", "params": [{"id": "second", "name": "second"}]}))
        while not here and not create.done():  # the create's insert was tried on the loop's thread
            await asyncio.sleep(0.01)
        assert here == [False]  # it found the lock taken, and gave up at once
        await asyncio.sleep(0.2)
        assert not create.done()  # waiting for the lock on the database thread, not failed
    answer = (await asyncio.wait_for(create, 30)).json()  # not a timing check: a deadlock must fail, not hang
    assert answer["result"]["status"] == "completed"
    assert (await client.result("tasks.get", {"task_id": "first"}))["name"] == "held"


async def test_commits_on_the_loop_thread_leave_checkpoints_to_the_database_thread(
        client: Client, monkeypatch: Any) -> None:
    """A WAL checkpoint copies pages into the database file and syncs it: never on the loop's
    thread. Its connection does not checkpoint; every CHECKPOINT_EVERY commits there, the
    database thread does (so the WAL does not grow without bound)."""
    import asyncio
    import os

    from taskgrove.storage import connections

    repo = client.services.repo
    monkeypatch.setattr(connections, "CHECKPOINT_EVERY", 4)
    assert repo.connections.run_here(lambda c: c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar(), ()) == (True, 0)
    path = repo.connections.reader.path
    await client.result("tasks.create", {"tasks": [{"id": "first", "name": "first"}]})
    while repo.connections._checkpointing:
        await asyncio.sleep(0.01)
    before = os.path.getsize(path)
    for n in range(6):  # 3 commits each: insert, claim, outcome
        await client.result("tasks.create", {"tasks": [{"id": f"t{n}", "name": "t", "inputs": {"pad": "x" * 5000}}]})
    while repo.connections._checkpointing:
        await asyncio.sleep(0.01)
    assert os.path.getsize(path) > before  # the new rows reached the database file itself

