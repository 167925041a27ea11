"""tasks.list by cursor (keyset pagination, agent/foundations/cursor.py): every list shape paged by cursor gives
the same rows as one long page, new tasks never shift a page, a made-up cursor is a -32602 naming
`cursor`, and the page's statement reads an index in order on both backends (no sort of the table)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from hypothesis import given, settings as hsettings, strategies as st

from taskgrove.agent.foundations import cursor
from taskgrove.agent.foundations.errors import INVALID_PARAMS, RpcError
from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.requests import ListTasks, NewTree
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage import repository
from taskgrove.storage.models import tasks_table
from taskgrove.storage.repository import list_query, window_end_query
from tests.conftest import Client, running_app

SHAPES: list[dict[str, Any]] = [{}, {"user_id": "alice"}, {"root_only": True}, {"root_only": True, "user_id": "bob"},
                                {"status": "pending"}, {"search": "step"}]


async def store_trees(client: Client, count: int, prefix: str = "t") -> None:
    """`count` stored trees (not executed) of 3 tasks, alternately alice's and bob's: stored as
    tasks.create stores them, without running them (the pending shape stays listable)."""
    for n in range(count):
        root = f"{prefix}{n:03}"
        tree = [{"id": root, "name": f"tree {n}", "user_id": ("alice", "bob")[n % 2]},
                *({"id": f"{root}-{i}", "name": "step", "parent_id": root, "user_id": ("alice", "bob")[n % 2]}
                  for i in range(2))]
        await client.services.tasks.create_tree(new_tree(tree), _anyone())


def new_tree(tasks: list[dict[str, Any]]) -> NewTree:
    return NewTree.from_params(tasks)


def _anyone() -> Caller:
    return Caller()  # JWT off: anyone may store anyone's tree


async def pages(client: Client, params: dict[str, Any], limit: int) -> list[str]:
    ids: list[str] = []
    page = await client.result("tasks.list", {**params, "limit": limit, "cursor": None})
    while True:
        assert set(page) == {"tasks", "next_cursor"}
        ids.extend(task["id"] for task in page["tasks"])
        if page["next_cursor"] is None:
            assert page["tasks"] or not ids  # no empty page after a full one: next_cursor said "no more"
            return ids
        assert len(page["tasks"]) == limit  # a page before the last is full
        page = await client.result("tasks.list", {**params, "limit": limit, "cursor": page["next_cursor"]})


async def test_every_shape_paged_by_cursor_lists_what_one_page_lists(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        await client.services.tasks.create_tree(new_tree([{"id": "seed", "name": "seed"}]), _anyone())
        await store_trees(client, 14)
        for shape in SHAPES:
            whole = [task["id"] for task in await client.result("tasks.list", {**shape, "limit": 1000})]
            assert whole, shape
            for limit in (1, 4, 7):
                assert await pages(client, shape, limit) == whole, (shape, limit)
        # Without `cursor` the answer is the list of SPEC.md, as before.
        assert isinstance(await client.result("tasks.list", {"limit": 2}), list)
        assert await client.result("tasks.list", {"status": "deleted", "cursor": ""}) == {"tasks": [],
                                                                                          "next_cursor": None}


async def test_new_tasks_never_shift_a_page(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        await client.services.tasks.create_tree(new_tree([{"id": "seed", "name": "seed"}]), _anyone())
        await store_trees(client, 6)
        first = await client.result("tasks.list", {"root_only": True, "limit": 3, "cursor": None})
        await store_trees(client, 4, prefix="new")  # newer than every listed task
        rest = await client.result("tasks.list", {"root_only": True, "limit": 100, "cursor": first["next_cursor"]})
        listed = [t["id"] for t in first["tasks"]] + [t["id"] for t in rest["tasks"]]
        assert listed == ["t005", "t004", "t003", "t002", "t001", "t000", "seed"]
        assert rest["next_cursor"] is None


async def test_a_bad_cursor_is_a_clear_error(client: Client) -> None:
    made_up = ["abc", "!!!", cursor.encode("2026-01-01T00:00:00.000000+00:00", "x")[:-3], 5, ["a"], {"a": 1},
               "W10", "WzEsIjIwMjYiLCJ4Il0", "x" * 1000]
    for bad in made_up:
        error = await client.error("tasks.list", {"cursor": bad})
        assert error["code"] == INVALID_PARAMS and "cursor" in error["data"], bad
    error = await client.error("tasks.list", {"cursor": None, "offset": 5})
    assert error["code"] == INVALID_PARAMS and "cursor" in error["data"]


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
                                               max_size=120)))
def test_any_cursor_is_a_position_or_a_clear_error(text: str) -> None:
    try:
        request = ListTasks.from_params({"cursor": text})
    except RpcError as exc:
        assert exc.code == INVALID_PARAMS and "cursor" in str(exc.data)
        return
    assert request.paged and (request.after is None) == (text == "")


@given(st.datetimes(timezones=st.just(__import__("datetime").timezone.utc)),
       st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp", "Co", "Cn")),
               min_size=1, max_size=64))
def test_a_cursor_given_out_reads_back_as_its_key(moment: Any, task_id: str) -> None:
    stamp = moment.isoformat(timespec="microseconds")
    if not task_id.isprintable():
        return
    assert cursor.decode(cursor.encode(stamp, task_id)) == (stamp, task_id)


async def test_metrics_count_each_status_up_to_a_bound(client: Client) -> None:
    """Exact on a small table (the wheel check's `taskgrove_tasks{status="completed"} 2.0`), and no
    further than the bound on a large one: the count never reads more of the status index."""
    await client.result("tasks.create", [{"id": "r", "name": "r"},
                                         {"id": "c", "name": "c", "parent_id": "r", "schemas": {"method": "noop_executor"}}])
    await client.services.tasks.create_tree(new_tree([{"id": "p", "name": "p"}]), _anyone())
    metrics = (await client.http.get("/metrics")).text
    assert 'taskgrove_tasks{status="completed"} 2.0' in metrics and 'taskgrove_tasks{status="pending"} 1.0' in metrics
    assert await client.services.repo.count_by_status(at_most=1) == {
        "pending": 1, "in_progress": 0, "completed": 1, "failed": 0, "cancelled": 0}


PLANS = [({"user_id": "u"}, "ix_tasks_user_created"), ({"root_only": True}, "ix_tasks_roots_created"),
         ({"root_only": True, "user_id": "u"}, "ix_tasks_roots_user"), ({}, "ix_tasks_created_at"),
         ({"status": "failed"}, "ix_tasks_status_created"),
         ({"user_id": "user-7", "status": "failed"}, "ix_tasks_user_status_created"),
         # parked tasks only, in order (0020); by user either one: PostgreSQL may read every parked task and
         # filter by user, as bounded as the user's own range when few tasks wait
         ({"waiting": True}, "ix_tasks_waiting_created"), ({"waiting": True, "user_id": "u"}, "ix_tasks_waiting_")]


@pytest.mark.parametrize("shape,index", PLANS)
async def test_each_page_reads_its_index_in_order(backend: str, db_url: str, make_settings: Callable[..., Settings],
                                                  shape: dict[str, Any], index: str) -> None:
    """A page by cursor (and a first page) is a range of its index, newest first: no sort step,
    whatever the table holds (SQLite: the plan of an empty table; PostgreSQL: of 5,000 rows of 50 users, told to avoid scans of the table and sorts where it can)."""
    async with running_app(make_settings()) as client:
        await client.result("tasks.create", [{"id": "one", "name": "one"}])  # the row PostgreSQL's fill copies
    for after in (None, ("2026-01-01T00:00:00.000000+00:00", "x")):
        query = list_query(**shape, limit=100, after=after)
        plan = await explain(backend, db_url, query)
        assert index in plan, plan
        assert "TEMP B-TREE" not in plan and not re.search(r"Sort  \(", plan), plan


SEARCH_PLANS = [({}, "ix_tasks_created_at"), ({"root_only": True}, "ix_tasks_roots_created"),
                ({"user_id": "u"}, "ix_tasks_user_created"), ({"root_only": True, "user_id": "u"}, "ix_tasks_roots_user"),
                ({"root_only": True, "status": "failed"}, "ix_tasks_status_created")]


@pytest.mark.parametrize("shape,index", SEARCH_PLANS)
async def test_a_search_reads_a_bounded_range_of_its_shapes_index(backend: str, db_url: str,
                                                                  make_settings: Callable[..., Settings],
                                                                  shape: dict[str, Any], index: str) -> None:
    """A search's window end is a range of the shape's index, and its page that same range down to
    the window's end, newest first: no sort, and never the table."""
    async with running_app(make_settings()) as client:
        await client.result("tasks.create", [{"id": "one", "name": "one"}])  # the row PostgreSQL's fill copies
    until = ("2025-01-01T00:00:00.000000+00:00", "x")
    for after in (None, ("2026-01-01T00:00:00.000000+00:00", "x")):
        for query in (window_end_query(**shape, after=after), list_query(**shape, search="ste", until=until, after=after)):
            plan = await explain(backend, db_url, query)
            assert index in plan, plan
            assert "TEMP B-TREE" not in plan and not re.search(r"Sort  \(", plan), plan


async def test_a_search_of_the_tree_list_tests_names_on_the_roots_index(backend: str, db_url: str,
                                                                         make_settings: Callable[..., Settings]) -> None:
    """SQLite (0021): the roots' indexes end with `name`, so the search reads the name from the
    index entry and seeks the table row only for a root it answers (a deferred seek). PostgreSQL
    keeps them without it (its index scans test the row anyway, and a long name could pass its
    entry size limit)."""
    async with running_app(make_settings()):
        pass
    query = list_query(root_only=True, search="ste", until=("2025-01-01T00:00:00.000000+00:00", "x"))
    if backend == "sqlite":
        import sqlite3

        from sqlalchemy.dialects import sqlite

        text = str(query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
        conn = sqlite3.connect(db_url.removeprefix("sqlite+aiosqlite:///").removeprefix("sqlite:///"))
        try:
            columns = [row[2] for row in conn.execute("PRAGMA index_info(ix_tasks_roots_created)")]
            program = [row[1] for row in conn.execute(f"EXPLAIN {text}")]
        finally:
            conn.close()
        assert columns == ["created_at", "id", "name"]
        assert "DeferredSeek" in program, program
    else:
        import asyncpg

        conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            definition = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_tasks_roots_created'")
        finally:
            await conn.close()
        assert "(created_at, id)" in definition, definition


def matching(task: dict[str, Any], search: str) -> bool:
    return search.lower() in task["name"].lower() or task["id"].startswith(search)


async def pages_of_a_search(client: Client, params: dict[str, Any], limit: int) -> list[str]:
    """Every page by cursor: pages may hold fewer than `limit` tasks (a window with few matches),
    none more; an empty page is never the last one unless it is the first."""
    ids: list[str] = []
    page = await client.result("tasks.list", {**params, "limit": limit, "cursor": None})
    for _ in range(1000):
        assert len(page["tasks"]) <= limit
        ids.extend(task["id"] for task in page["tasks"])
        if page["next_cursor"] is None:
            return ids
        page = await client.result("tasks.list", {**params, "limit": limit, "cursor": page["next_cursor"]})
    raise AssertionError("no last page")


SEARCHES = [{"search": "tree 1"}, {"search": "tree 1", "root_only": True}, {"search": "t00"},
            {"search": "STEP", "user_id": "bob"}, {"search": "no such task"},
            {"search": "tree", "root_only": True, "status": "pending", "user_id": "alice"}]


def window_of(params: dict[str, Any]) -> dict[str, Any]:
    """The filters whose index range a search's window counts (repository.window_end_query):
    `user_id`, `status`, and `root_only` where no status is given."""
    window = {key: params[key] for key in ("user_id", "status") if key in params}
    if params.get("root_only") and "status" not in params:
        window["root_only"] = True
    return window


@pytest.mark.parametrize("small", [True, False])
async def test_a_search_examines_a_window_and_pages_by_cursor_reach_every_match(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, small: bool) -> None:
    """A search examines the newest SEARCH_WINDOW entries of the index range its filters read:
    without a cursor it answers their matches; by cursor each page continues below the last one
    examined, so the pages together list every match, newest first, as an unbounded search would."""
    if small:
        monkeypatch.setattr(repository, "SEARCH_WINDOW", 4)
    window = repository.SEARCH_WINDOW
    async with running_app(make_settings()) as client:
        await store_trees(client, 14)
        await client.result("tasks.create", [{"id": "done", "name": "tree done", "user_id": "alice",
                                              "schemas": {"method": "noop_executor"}}])
        await client.wait_status("done", ("completed",))
        for params in SEARCHES:
            shape = {key: value for key, value in params.items() if key != "search"}
            everything = await client.result("tasks.list", {**shape, "limit": 1000})
            wanted = [task["id"] for task in everything if matching(task, params["search"])]
            for limit in (1, 3, 100):
                assert await pages_of_a_search(client, params, limit) == wanted, (params, limit)
            examined = {task["id"] for task in (await client.result("tasks.list", {**window_of(params), "limit": 1000}))[:window]}
            newest = [task["id"] for task in everything if task["id"] in examined and matching(task, params["search"])]
            assert [task["id"] for task in await client.result("tasks.list", {**params, "limit": 1000})] == newest
        first = await client.result("tasks.list", {"search": "t00", "limit": 100, "cursor": None})
        assert (first["next_cursor"] is None) == (window > 43)  # 43 tasks stored: the window held them all


async def test_children_still_read_the_parent_index(backend: str, db_url: str,
                                                   make_settings: Callable[..., Settings]) -> None:
    """ix_tasks_parent_id holds children only now: a lookup by parent still reads it."""
    async with running_app(make_settings()):
        pass
    query = select(tasks_table).where(tasks_table.c.parent_id == "p")
    assert "ix_tasks_parent_id" in await explain(backend, db_url, query)


# 5,000 stored tasks of 50 users, a fifth of them roots: copies of one real row (every column filled
# as the service fills it), with their own ids, users, times and parents.
FILL_POSTGRES = """
INSERT INTO tasks SELECT filled.* FROM (SELECT * FROM tasks LIMIT 1) t, generate_series(0, 4999) g,
LATERAL jsonb_populate_record(NULL::tasks, to_jsonb(t) || jsonb_build_object(
    'id', 'fill-' || g, 'task_tree_id', 'fill-' || (g / 5 * 5), 'user_id', 'user-' || (g % 50),
    'status', CASE WHEN g / 50 % 25 = 0 THEN 'failed' ELSE 'completed' END,  -- 4 %, of every user
    'parent_id', CASE WHEN g % 5 = 0 THEN NULL ELSE 'fill-' || (g / 5 * 5) END,
    'created_at', to_char(timestamp '2025-01-01' + g * interval '1 minute', 'YYYY-MM-DD"T"HH24:MI:SS.US+00:00'))) filled
"""


async def explain(backend: str, db_url: str, query: Any) -> str:
    if backend == "sqlite":
        import sqlite3

        from sqlalchemy.dialects import sqlite

        text = str(query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
        conn = sqlite3.connect(db_url.removeprefix("sqlite+aiosqlite:///").removeprefix("sqlite:///"))
        try:
            return " | ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {text}"))
        finally:
            conn.close()
    import asyncpg
    from sqlalchemy.dialects import postgresql

    text = str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
    transaction = conn.transaction()
    await transaction.start()
    try:  # rolled back: the fill is for the planner only
        # A table of many users, analysed: on an empty one the planner's costs tie, and which of
        # two ordered indexes it takes is a coin's throw. Ask whether an index gives the page in
        # order (a sort or a bitmap scan is only taken where nothing else can answer).
        await conn.execute(FILL_POSTGRES)
        await conn.execute("ANALYZE tasks")
        for switch in ("seqscan", "bitmapscan", "sort"):
            await conn.execute(f"SET LOCAL enable_{switch} = off")
        return " | ".join(row[0] for row in await conn.fetch(f"EXPLAIN {text}"))
    finally:
        await transaction.rollback()
        await conn.close()
