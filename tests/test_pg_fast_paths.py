"""PostgreSQL through plain asyncpg (storage/pg.py) decides and reads exactly what the SQLAlchemy
path does: the engine's pass (fenced writes, claims that see them, the end of an execution) and
the reads (same keys in the same order, same decoded values, the same stand-ins for values that
cannot be read back)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from taskgrove.storage import executions, statements, tree_insert
from tests.conftest import POSTGRES_URL, Client, terminate_backend
from tests.deadlines import EVENT_WAIT
from tests.test_engine_pass import OWNER, STAMP, UNTIL, outcome, row
from tests.test_sqlite_reads import every_read, inserted_three_ways, shown, stored, usual_reads

pytestmark = [pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL"),
              pytest.mark.parametrize("backend", ["postgres"])]


async def test_asyncpg_reads_return_what_sqlalchemy_returns(client: Client) -> None:
    repo = await stored(client, "postgres")
    fast = await every_read(repo)
    # the asyncpg path answered (a failure there would have taken the SQLAlchemy path quietly)
    assert await repo.connections.pg.rows(statements.TASK_TREE.postgresql, ("root",)) == fast[5]
    assert shown(fast) == shown(await usual_reads(repo, "pg"))
    assert fast[1]["has_copy"] is True and isinstance(fast[1]["progress"], float)


@pytest.mark.parametrize("status, epoch_offset, claimed_b", [
    ("completed", 0, True), ("failed", 0, False), ("completed", 1, False)])
async def test_the_asyncpg_pass_decides_what_the_sqlalchemy_pass_decides(
        client: Client, status: str, epoch_offset: int, claimed_b: bool) -> None:
    """The scenario of test_engine_pass, the pass sent through the repository (asyncpg, one round
    trip), followed by a pass that ends the execution once its last member has ended."""
    repo = client.services.repo

    def setup(c: Any) -> tuple[str, int]:
        execution = tree_insert.insert_tree(c, [row("a"), row("b", [{"id": "a", "required": True}]), row("x")],
                                           None, OWNER, UNTIL, STAMP)
        return execution["id"], executions.claim(c, ["a", "x"], OWNER, UNTIL, STAMP)["a"]["lease_epoch"]

    def stored(c: Any) -> dict[str, Any]:
        return {r.id: dict(r._mapping) for r in c.execute(executions.T.select())}

    execution_id, epoch = await repo.transact(setup)
    progress = {"progress": 0.5, "updated_at": STAMP}
    accepted, claimed, ended = await repo.write_pass(
        [("a", epoch + epoch_offset, outcome(status)), ("x", 1, progress)], ["b"], OWNER, UNTIL, STAMP,
        [(execution_id, STAMP)])
    rows = await repo.transact(stored)
    assert ("a" in accepted) == (epoch_offset == 0)
    assert "x" in accepted and rows["x"]["progress"] == 0.5 and rows["x"]["status"] == "in_progress"
    assert set(claimed) == ({"b"} if claimed_b else set())
    assert rows["b"]["status"] == ("in_progress" if claimed_b else "pending")
    if claimed_b:
        assert claimed["b"] == {"lease_epoch": 1, "attempt": 1, "checkpoint": None}
    assert ended == {execution_id: None}  # x (and a, or b) still in progress
    if epoch_offset:
        assert rows["a"]["status"] == "in_progress"
        return
    assert rows["a"]["status"] == status and rows["a"]["result"] == ({"ok": True} if status == "completed" else None)
    assert rows["a"]["lease_owner"] is None and rows["a"]["completed_at"] == STAMP

    last = [("x", 1, outcome("completed"))] + ([("b", 1, outcome("completed"))] if claimed_b else [])
    accepted, claimed, ended = await repo.write_pass(last, [], OWNER, UNTIL, STAMP, [(execution_id, STAMP)])
    assert accepted == {tid for tid, _, _ in last} and claimed == {}
    assert ended == {execution_id: "completed" if status == "completed" else "failed"}
    execution = await repo.transact(executions.get_execution, execution_id)
    assert execution["status"] == "ended" and execution["final_status"] == ended[execution_id]


async def test_a_write_of_another_column_is_refused(client: Client) -> None:
    with pytest.raises(ValueError, match="name"):
        await client.services.repo.write_pass([("a", 1, {"name": "x"})], [], OWNER, UNTIL, STAMP)


@pytest.mark.parametrize("more_inputs", [{}, {"nul": "a\u0000b", "\u0000": ["\u0000"]}])
async def test_the_postgres_tree_insert_stores_what_sqlalchemy_stores(client: Client, more_inputs: Any) -> None:
    """On PostgreSQL a new tree's rows are one INSERT ... SELECT through asyncpg: every column of
    every row holds what SQLAlchemy's executemany would have stored, byte for byte (JSON text,
    JSON 'null' for None); also when a JSON value holds NUL (the rows then travel another way)."""
    def insert(c: Any, rows: Any, execution: Any) -> None:
        tree_insert._pg_insert_tree(c, rows, execution, None)

    fast, usual, again = await inserted_three_ways(client, "CAST({} AS text)", insert, more_inputs)
    assert len(fast) == 2 and "null" in fast[0]
    assert fast == usual == again


async def test_json_values_are_stored_as_written_and_the_rest_as_typed(client: Client) -> None:
    """A fenced write on the asyncpg pass stores a JSON column's text as written (key order and
    spacing, which a `jsonb` round trip would change), as the SQLAlchemy path stores it, and the
    other columns with their types."""
    repo = client.services.repo

    def setup(c: Any) -> int:
        tree_insert.insert_tree(c, [row("a"), row("b")], None, OWNER, UNTIL, STAMP)
        claimed = executions.claim(c, ["a", "b"], OWNER, UNTIL, STAMP)
        return claimed["a"]["lease_epoch"]

    def raw(c: Any) -> dict[str, Any]:
        found = c.exec_driver_sql("SELECT id, result::text, progress, token_success, error, status FROM tasks")
        return {r[0]: tuple(r[1:]) for r in found}

    epoch = await repo.transact(setup)
    result = {"z": "a\tb", "a": [1, 2.5, None], "\u00e9": {"k": True}}
    values = {**outcome("completed"), "result": result, "progress": 0.75, "token_success": 7}
    plain = {**outcome("failed"), "error": "it \"broke\"\n\u00e9", "progress": 0.25}
    accepted, _, _ = await repo.write_pass([("a", epoch, values), ("b", epoch, plain)], [], OWNER, UNTIL, STAMP)
    assert accepted == {"a", "b"}
    stored = await repo.transact(raw)
    assert stored["a"] == (json.dumps(result), 0.75, 7, None, "completed")
    assert stored["b"] == ("null", 0.25, 0, "it \"broke\"\n\u00e9", "failed")


async def test_a_pass_of_many_writes_and_claims_decides_each_task(client: Client) -> None:
    """More writes than one row of the pass takes, each task written three times in the same pass
    (its progress, a checkpoint, its outcome: each write applies on top of the one before), an
    outcome with a stale epoch among them, and claims whose dependencies were completed in that
    same pass."""
    repo = client.services.repo
    count = 150  # over _PG_WRITES_PER_ROW: the writes span several rows

    def setup(c: Any) -> dict[str, int]:
        rows = [row("a")] + [row(f"t{i}") for i in range(count)] + [
            row(f"d{i}", [{"id": f"t{i}", "required": True}]) for i in range(count)]
        tree_insert.insert_tree(c, rows, None, OWNER, UNTIL, STAMP)
        claimed = executions.claim(c, [f"t{i}" for i in range(count)], OWNER, UNTIL, STAMP)
        return {tid: token["lease_epoch"] for tid, token in claimed.items()}

    def stored(c: Any) -> dict[str, Any]:
        return {r.id: dict(r._mapping) for r in c.execute(executions.T.select())}

    epochs = await repo.transact(setup)
    assert len(epochs) == count
    progress = [(f"t{i}", epochs[f"t{i}"], {"progress": 0.5, "updated_at": STAMP}) for i in range(count)]
    outcomes = [(f"t{i}", epochs[f"t{i}"] + (i == 7), outcome("completed" if i % 3 else "failed"))
                for i in range(count)]
    checkpoints = [(f"t{i}", epochs[f"t{i}"], {"checkpoint": {"step": i}}) for i in range(count)]
    writes = [write for i in range(count) for write in (progress[i], checkpoints[i], outcomes[i])]
    accepted, claimed, _ = await repo.write_pass(writes, [f"d{i}" for i in range(count)],
                                                 OWNER, UNTIL, STAMP)
    rows = await repo.transact(stored)
    assert accepted == {f"t{i}" for i in range(count)}
    assert rows["t7"]["status"] == "in_progress" and rows["t7"]["progress"] == 0.5
    assert all(rows[f"t{i}"]["checkpoint"] == {"step": i} for i in range(count))
    for i in range(count):
        if i == 7:
            continue
        expected = "completed" if i % 3 else "failed"
        assert rows[f"t{i}"]["status"] == expected and rows[f"t{i}"]["progress"] == 1.0
        assert (f"d{i}" in claimed) == (expected == "completed"), i
        assert rows[f"d{i}"]["status"] == ("in_progress" if expected == "completed" else "pending")
    assert "d7" not in claimed


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::text[]"
    return "'" + str(value).replace("'", "''") + "'"


def _scans_of_tasks(plan: list[str]) -> list[tuple[str, str]]:
    """(scan line, the condition that found its rows) for each scan of `tasks` in an EXPLAIN."""
    scans = []
    for at, line in enumerate(plan):
        if " on tasks" in line and "Scan" in line and "Update on" not in line:
            depth = len(line) - len(line.lstrip())
            found = ""
            for following in plan[at + 1:]:
                if following.strip().startswith("->") and len(following) - len(following.lstrip()) <= depth + 6:
                    break
                if "Index Cond" in following or "TID Cond" in following:
                    found = following.strip()
            scans.append((line.strip(), found))
    return scans


async def test_the_pass_plan_made_on_an_empty_table_finds_tasks_by_key(client: Client) -> None:
    """The pass connection plans its statement once, generically, when the table may be empty. Such
    a plan must still find every task through an index condition once the table holds thousands
    of rows: a scan of the whole table (or of a whole index, filtering) per pass made the
    PostgreSQL fan-out slower with every tree stored. Without the pass connection's settings the
    planner picks `Seq Scan on tasks t` for the writes here."""
    repo = client.services.repo
    assert repo.connections.pg is not None
    conn = await repo.connections.pg._passes()
    await conn.execute("PREPARE probe AS " + statements.pass_statement().postgresql)
    write = [("t1", 1, {**outcome("completed"), "result": {"n": 1}})]
    params = executions.pg_step_params(write, ["t2", "t3"], OWNER, UNTIL, STAMP, [("e", STAMP)])
    merged = {**dict(zip(statements.PASS_ARGS, params[0])), "claim_ids": ["t2", "t3"], "end_id": "e", "version": STAMP}
    explain = f"EXPLAIN EXECUTE probe({', '.join(_literal(merged[name]) for name in statements.PASS_ARGS)})"
    try:
        await conn.fetch(explain)  # the generic plan is made now, on an empty table
        await repo.transact(lambda c: tree_insert.insert_tree(
            c, [row("a")] + [row(f"t{i}") for i in range(3000)], None, OWNER, UNTIL, STAMP))
        await conn.execute("ANALYZE tasks")
        plan = [r[0] for r in await conn.fetch(explain)]
    finally:
        await conn.execute("DEALLOCATE probe")
    scans = _scans_of_tasks(plan)
    assert len(scans) >= 4, plan  # the writes, the claims, each dependency, the members of the execution
    assert all(found for _, found in scans), "\n".join(plan)


async def test_a_pass_connection_left_mid_operation_is_replaced(client: Client) -> None:
    """A pass cancelled half way (the engine stopping, a timeout) or cut by the server leaves
    asyncpg's connection in a state nobody can know; the next pass must get a working one, and a
    cut must come out as a lost connection the engine retries (is_transient), not as an error
    that fails the pass's tasks. Before, the next pass after a cut went on the dead connection."""
    import asyncio

    from sqlalchemy.exc import DBAPIError

    from taskgrove.storage.connections import is_transient

    pg = client.services.repo.connections.pg
    assert [tuple(r) for r in await pg.fetchmany("SELECT $1::int", [(1,)])] == [(1,)]
    first = pg._pass
    slow = asyncio.ensure_future(pg.fetchmany("SELECT pg_sleep($1)", [(5,)]))
    await asyncio.sleep(0.2)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert [tuple(r) for r in await pg.fetchmany("SELECT $1::int", [(2,)])] == [(2,)]
    assert pg._pass is not first  # dropped: its state after a cancel is unknown

    # the server ends the pass connection in the middle of a pass (a failover, an admin)
    pid = pg._pass.get_server_pid()
    cut = asyncio.ensure_future(pg.fetchmany("SELECT pg_sleep($1)", [(5,)]))
    await asyncio.sleep(0.2)
    await terminate_backend(pid, 5000)  # returns once it is gone
    with pytest.raises(DBAPIError) as lost:
        await cut
    assert is_transient(lost.value)
    assert [tuple(r) for r in await pg.fetchmany("SELECT $1::int", [(4,)])] == [(4,)]
    # and one ended between passes (not waiting for it to be gone, so the next pass may meet it
    # alive, dying or dead): that pass goes through or fails as a lost connection, the next goes through
    for n in range(5):
        await terminate_backend(pg._pass.get_server_pid())
        try:
            await pg.fetchmany("SELECT $1::int", [(n,)])
        except DBAPIError as exc:
            assert is_transient(exc)
        assert [tuple(r) for r in await pg.fetchmany("SELECT $1::int", [(n,)])] == [(n,)]

    # a statement the server refuses is the statement's fault: the connection stays
    kept = pg._pass
    with pytest.raises(DBAPIError) as refused:
        await pg.fetchmany("SELECT 1 / $1::int", [(0,)])
    assert not is_transient(refused.value) and pg._pass is kept


async def test_a_task_with_its_tree_usages_is_what_the_two_reads_give(client: Client) -> None:
    """tasks.get's one read on PostgreSQL (statements.TASK_WITH_TREE_USAGES): the row TASK_BY_ID
    reads, and for a root the usages TREE_USAGES reads (None for a child, nothing for a missing id)."""
    from sqlalchemy import update

    from taskgrove.storage.models import tasks_table

    repo = client.services.repo
    await client.result("tasks.create", [{"id": "r", "name": "r"}, {"id": "a", "name": "a", "parent_id": "r"},
                                         {"id": "b", "name": "b", "parent_id": "r"}])
    await client.runs_ended()
    spent = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost_usd": None, "calls": 1}
    spend = update(tasks_table).where(tasks_table.c.id.in_(["a", "b"])).values(usage=spent)
    await repo.transact(lambda c: c.execute(spend))
    for tid in ("r", "a"):
        row, usages = await repo.get_with_tree_usages(tid)
        assert row == await repo.get(tid)
        assert usages == ([spent, spent] if tid == "r" else None)
    assert await repo.get_with_tree_usages("missing") == (None, None)
    assert (await client.result("tasks.get", {"task_id": "r"}))["tree_usage"]["total_tokens"] == 14


async def test_a_lone_instance_sends_no_notify_until_another_listens(client: Client) -> None:
    """Cross-instance messages (engine/notify.py) go out only while another instance listens: a
    lone instance skips them (it would only hear them back). Another listener, named as every
    instance names its listening connection, is seen within a second, and from then on receives
    the events of the trees run here."""
    import asyncio

    import asyncpg

    from taskgrove.agent.engine.notify import CHANNEL, LISTENER_NAME, PEER_CHECK_SECONDS

    notifier = client.services.engine.publisher.notifier
    await asyncio.sleep(PEER_CHECK_SECONDS * 1.5)
    assert notifier.peers is False
    sent, skipped = notifier.sent, notifier.skipped
    await client.result("tasks.create", [{"id": "alone", "name": "alone", "schemas": {"method": "noop_executor"}}])
    await client.runs_ended()
    # nothing sent; the tree's events were not even built (engine/publish.py Publisher.listened)
    assert notifier.sent == sent and notifier.skipped == skipped

    heard: list[str] = []
    other = await asyncpg.connect(POSTGRES_URL.rpartition("/")[0] + "/" + client.services.settings.database_url
                                  .rpartition("/")[2], server_settings={"application_name": LISTENER_NAME})
    try:
        await other.add_listener(CHANNEL, lambda *args: heard.append(args[-1]))
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while not notifier.peers:
            assert asyncio.get_running_loop().time() < deadline, "the other listener was never seen"
            await asyncio.sleep(0.05)
        await client.result("tasks.create", [{"id": "heard", "name": "heard", "schemas": {"method": "noop_executor"}}])
        await client.runs_ended()
        while not any('"task_id":"heard"' in text and "task_completed" in text for text in heard):
            assert asyncio.get_running_loop().time() < deadline, heard
            await asyncio.sleep(0.05)
    finally:
        await other.close()


def _tree_of(root: str, user: str | None = None) -> list[dict[str, Any]]:
    """A root, a child claimable at once, one waiting for it, and one holding a NUL (which sends
    the JSON columns as text), tree id `root`."""
    rows = [{**row(root), "task_tree_id": root, "parent_id": None, "user_id": user}]
    rows += [{**row(f"{root}-{n}", [{"id": f"{root}-0"}] if n == 1 else None), "task_tree_id": root,
              "parent_id": root, "user_id": user} for n in range(2)]
    rows.append({**row(f"{root}-nul"), "task_tree_id": root, "parent_id": root, "user_id": user,
                 "inputs": {"text": "a\u0000b"}})
    return rows


async def test_a_new_trees_insert_through_asyncpg_stores_what_the_sqlalchemy_path_stores(client: Client) -> None:
    """TaskRepository.insert_tree sends its one statement on the read pool (PgPool.value);
    tree_insert.insert_tree in a SQLAlchemy transaction (a schedule's run) sends the same one. Both
    store the same rows and answer the same execution; a taken id and a full quota are refused
    alike, with nothing stored."""
    from sqlalchemy.exc import IntegrityError

    repo = client.services.repo
    quota = tree_insert.Quota("ann", 10, 4)

    def everything(c: Any, tree: str) -> list[dict[str, Any]]:
        found = [dict(r._mapping) for r in c.execute(executions.T.select().where(
            executions.T.c.task_tree_id == tree).order_by(executions.T.c.id))]
        def named(v: Any) -> Any:  # the tree's ids without the tree's own name
            return "T" + v[len(tree):] if isinstance(v, str) and (v == tree or v.startswith(tree + "-")) else v

        return [{k: named(v) if k != "dependencies" else [{**d, "id": named(d["id"])} for d in v]
                 for k, v in r.items() if k != "execution_id"} for r in found]

    fast = await repo.insert_tree(_tree_of("p", "ann"), "ann", OWNER, UNTIL, STAMP, quota, None, {"p-0"})
    slow = await repo.transact(tree_insert.insert_tree, _tree_of("q", "ann"), "ann", OWNER, UNTIL, STAMP, None,
                               quota, None, {"q-0"})
    assert fast["claimed"] == {"p-0": {"lease_epoch": 1, "attempt": 1, "checkpoint": None}}
    assert {k: v for k, v in fast.items() if k not in ("id", "task_tree_id", "task_id", "claimed")} == \
        {k: v for k, v in slow.items() if k not in ("id", "task_tree_id", "task_id", "claimed")}
    assert await repo.transact(everything, "p") == await repo.transact(everything, "q")
    assert {r["id"]: r["inputs"] for r in await repo.transact(everything, "p")}["T-nul"] == {"text": "a\u0000b"}

    with pytest.raises(IntegrityError):  # an id taken
        await repo.insert_tree(_tree_of("p"), None, OWNER, UNTIL, STAMP, None, None, set())
    with pytest.raises(tree_insert.OverQuota):  # ann has 8 unfinished (trees p and q): 4 more do not fit in 10
        await repo.insert_tree(_tree_of("r", "ann"), "ann", OWNER, UNTIL, STAMP, quota, None, set())
    assert await repo.transact(everything, "r") == []


async def test_a_pooled_connection_the_server_dropped_does_not_fail_the_next_create(client: Client) -> None:
    """A new tree's insert takes a connection of the read pool: one the server has closed since
    (a restart, an idle timeout, pg_terminate_backend) is replaced, the create goes through."""
    import asyncio

    pool = client.services.repo.connections.pg._reads()
    async def server_pid(conn: Any) -> int:
        return conn.get_server_pid()

    pid = await pool.run("", server_pid)
    await terminate_backend(pid)
    await asyncio.sleep(0.3)
    root = await client.result("tasks.create", [{"id": "after-drop", "name": "after"}])
    assert root["status"] == "completed"
