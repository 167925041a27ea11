"""A new tree stored with its execution, atomically: `insert_tree` (and its parts, which the
repository sends on its own PostgreSQL connection), the owner's quota counted in the same call,
and the tasks that may start at once stored already claimed (`claimed_at_insert`), or a tree of
pure tasks stored already completed (`completed_at_insert`, with their history rows and its
execution ended).

On SQLite the execution's row and the tasks go out on the driver's own connection (executemany);
on PostgreSQL one statement (statements.insert_tree) stores both, and with a quota counts the
owner's unfinished tasks first, so a create is one round trip. The execution rows and leases
that follow are storage/executions.py's.
"""

from __future__ import annotations

import json
import operator
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.util import await_

from taskgrove.storage import attempts, statements
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.executions import Row, new_execution
from taskgrove.storage.json_text import json_text
from taskgrove.storage.models import JSON_COLUMNS, TaskStatus
from taskgrove.storage.models import with_defaults


class Quota(NamedTuple):
    """Store new tasks only if `owner` then has at most `limit` unfinished ones
    (SERVICE_MAX_PENDING_PER_USER; agent/services/admission.py decides who is held to it)."""

    owner: str | None
    limit: int
    adding: int


class Done(NamedTuple):
    """A task of a new tree stored already completed: the outcome decided before the insert
    (agent/engine/insert_inline.py: a tree of pure tasks) and the history row of its one attempt."""

    values: Mapping[str, Any]
    history: Attempt


class OverQuota(Exception):
    """`quota` had no room: the owner already has `unfinished` tasks (counted up to the limit). Nothing was stored."""

    def __init__(self, quota: Quota, unfinished: int) -> None:
        super().__init__(quota, unfinished)
        self.quota = quota
        self.unfinished = unfinished


def count_unfinished(c: Connection, owner: str | None, at_most: int) -> int:
    """Pending and in-progress tasks of `owner` (None: tasks without one), counted up to `at_most`."""
    statement, args = statements.unfinished_of(owner, at_most)
    # On the driver's own connection, as the inserts are: SQLAlchemy's execution path costs more
    # than the count itself (measured: 30 of a one-task create's 40 us for it).
    if c.dialect.name == "sqlite":
        return int(c.connection.driver_connection.execute(statement.sqlite, args).fetchone()[0])
    return int(await_(c.connection.driver_connection.fetchval(statement.postgresql, *args)))  # asyncpg


def insert_tree(c: Connection, rows: Sequence[Mapping[str, Any]], user_id: str | None, owner: str, until: str,
                stamp: str, webhook: Mapping[str, Any] | None = None, quota: Quota | None = None,
                traceparent: str | None = None, claims: Collection[str] = (),
                done: Mapping[str, Done] | None = None) -> Row:
    """A new tree and its execution (in the trace `traceparent`, agent/foundations/tracing.py), atomically
    (IntegrityError when an id is taken: the tree's, or a running execution's of a tree with the
    same root id). With a `quota`, the owner's unfinished tasks are counted in the same call
    (on PostgreSQL in the insert's own statement): OverQuota, nothing stored, when they would not fit.

    `claims`: ids of pending tasks without dependencies, stored already claimed by `owner`
    (claimed_at_insert); the execution returned then holds their tokens under "claimed".
    `done`: tasks stored already completed, with their history rows (completed_at_insert).

    The repository's insert_tree sends the PostgreSQL statement on a connection of its own
    instead (pg_insert_tree_call); this function serves a caller's transaction (a schedule's run)."""
    execution, full = new_tree(rows, user_id, owner, until, stamp, webhook, traceparent, claims, done)
    if c.dialect.name == "sqlite":
        unfinished = count_unfinished(c, quota.owner, quota.limit) if quota else 0
        if quota is None or unfinished + quota.adding <= quota.limit:
            _sqlite_insert_tree(c, full, execution)
            attempts.insert_on_cursor(c.connection.driver_connection.cursor(), execution.get("history") or ())
    else:  # asyncpg, the only PostgreSQL driver the settings take
        unfinished = _pg_insert_tree(c, full, execution, quota)
    check_quota(quota, unfinished)
    return execution


def new_tree(rows: Sequence[Mapping[str, Any]], user_id: str | None, owner: str, until: str, stamp: str,
             webhook: Mapping[str, Any] | None = None, traceparent: str | None = None,
             claims: Collection[str] = (), done: Mapping[str, Done] | None = None) -> tuple[Row, list[Row]]:
    """What insert_tree stores: the new execution (with its "claimed" tokens, and the "history"
    rows of the tasks `done`) and the full rows. When every task is done, the execution is
    stored ended, completed (what statements.END_EXECUTION would make of it when the last of
    them completed), and holds the full rows under "stored"."""
    root = rows[0]
    execution = new_execution(root["task_tree_id"], root["id"], user_id, owner, until, stamp, webhook, traceparent)
    full = [with_defaults({**row, "execution_id": execution["id"]} if row["status"] == TaskStatus.PENDING else row)
            for row in rows]
    if claims:
        full = [claimed_at_insert(row, owner, until, stamp) if row["id"] in claims else row for row in full]
        execution["claimed"] = {row["id"]: token_of(row) for row in full if row["id"] in claims}
    if done:
        full = [completed_at_insert(row, done[row["id"]]) if row["id"] in done else row for row in full]
        execution["history"] = [done[row["id"]].history for row in full if row["id"] in done]
        if all(row["id"] in done for row in full):
            execution.update(status="ended", final_status=TaskStatus.COMPLETED.value, lease_expires_at=None,
                             ended_at=max(item.values["completed_at"] for item in done.values()))
            # The tree as stored, which nothing but a later request changes: the create answers
            # with it instead of reading it back (agent/engine/insert_inline.py stored_rows).
            execution["stored"] = full
    return execution, full


def check_quota(quota: Quota | None, unfinished: int) -> None:
    """OverQuota when the insert did not fit (`unfinished`: the owner's count the insert made)."""
    if quota is not None and unfinished + quota.adding > quota.limit:
        raise OverQuota(quota, unfinished)  # nothing was stored


def claimed_at_insert(row: Mapping[str, Any], owner: str, until: str, stamp: str) -> Row:
    """A new task's full row as a claim by `owner` at `stamp` leaves it (the values statements.claim
    and its PostgreSQL form set): the task is stored in progress, so its tree's first pass has
    nothing to claim. Only for a pending task without dependencies of a tree being inserted with
    its execution, which is what the claim's conditions then come to."""
    assert row["status"] == TaskStatus.PENDING and not row["dependencies"] and row["next_attempt_at"] is None
    return {**row, "status": TaskStatus.IN_PROGRESS.value, "progress": 0.0, "result": None, "error": None,
            "started_at": stamp, "completed_at": None, "updated_at": stamp, "next_attempt_at": None,
            "lease_owner": owner, "lease_expires_at": until, "lease_epoch": row["lease_epoch"] + 1,
            "attempt": row["attempt"] + 1}


def completed_at_insert(row: Mapping[str, Any], done: Done) -> Row:
    """A new task's full row as a claim and the fenced write of its outcome (a pure task's,
    engine/inline.py) leave it in one pass: started and completed at once (at its history row's
    start), its first attempt, the claim's epoch, no lease. Only for a pending task without retry
    or wait of a tree being inserted with its execution, whose dependencies (if any) are tasks of
    the same tree stored completed no later (engine/insert_inline.py)."""
    values = done.values
    assert row["status"] == TaskStatus.PENDING and row["next_attempt_at"] is None
    assert values["status"] == TaskStatus.COMPLETED
    return {**row, "started_at": done.history.started_at, "next_attempt_at": None,
            "lease_epoch": row["lease_epoch"] + 1, "attempt": row["attempt"] + 1, **values, "lease_owner": None,
            "lease_expires_at": None}


def token_of(row: Mapping[str, Any]) -> Row:
    """What a claim returns for a task it claimed (statements.claim's RETURNING): its fencing epoch,
    the attempt and the checkpoint the attempt resumes from."""
    return {"lease_epoch": row["lease_epoch"], "attempt": row["attempt"], "checkpoint": row["checkpoint"]}


_ROW_VALUES = operator.itemgetter(*statements.TASK_COLUMNS)


def _execution_values(execution: Mapping[str, Any]) -> list[Any]:
    return [json.dumps(execution[key]) if key == "webhooks" else execution[key] for key in statements.EXECUTION_COLUMNS]


def _sqlite_insert_tree(c: Connection, rows: Sequence[Mapping[str, Any]], execution: Mapping[str, Any]) -> None:
    """The execution, and its full rows (`with_defaults`) as SQLAlchemy's executemany would store
    them: the same values and JSON text (json.dumps, which `dependents()` matches with LIKE)."""
    json_at = [i for i, key in enumerate(statements.TASK_COLUMNS) if key in JSON_COLUMNS]
    params = []
    memo: dict[Any, str] = {}
    for row in rows:
        values = list(_ROW_VALUES(row))
        for i in json_at:
            values[i] = json_text(values[i], memo)
        params.append(values)
    sql = statements.insert_tasks().sqlite
    try:
        c.connection.driver_connection.execute(statements.insert_tree().sqlite, _execution_values(execution))
        c.connection.driver_connection.cursor().executemany(sql, params)
    except sqlite3.IntegrityError as exc:  # an id is taken: the same error the SQLAlchemy path raises
        raise IntegrityError(sql, None, exc) from exc


def _pg_insert_tree(c: Connection, rows: Sequence[Mapping[str, Any]], execution: Mapping[str, Any],
                    quota: Quota | None) -> int:
    """PostgreSQL: the `execution`'s row and full rows (`with_defaults`, as one JSON array) in one
    statement (statements.insert_tree) on the connection's asyncpg connection, stored as
    SQLAlchemy stores them; with a `quota`, the owner's count (returned; 0 without). Rows with a
    NUL in a JSON value, which json_populate_recordset cannot read, travel with their JSON columns
    as text (done always, it made a 1000-task create 60-70 ms slower: bench/README.md)."""
    import asyncpg  # PostgreSQL only: not loaded on SQLite

    sql, args = pg_insert_tree_call(rows, execution, quota)
    try:
        return int(await_(c.connection.driver_connection.fetchval(sql, *args)) or 0)
    except asyncpg.IntegrityConstraintViolationError as exc:  # an id is taken: what the SQLAlchemy path raises
        raise IntegrityError(sql, None, exc) from exc


def pg_insert_tree_call(rows: Sequence[Mapping[str, Any]], execution: Mapping[str, Any],
                        quota: Quota | None) -> tuple[str, list[Any]]:
    """PostgreSQL: the statement of _pg_insert_tree and its arguments. Its one value is the
    owner's count with a `quota` (None without). The execution's "history" rows (new_tree's
    `done`) are inserted in the same statement, as one JSON argument after the others."""
    text = json.dumps(rows)
    if as_text := "\\u0000" in text:
        memo: dict[Any, str] = {}
        text = json.dumps([{key: json_text(value, memo) if key in JSON_COLUMNS else value
                            for key, value in row.items()} for row in rows])
    args = [text, *_execution_values(execution), *(() if quota is None else (quota.adding, quota.limit)),
            *(() if quota is None or quota.owner is None else (quota.owner,))]
    owner_kind = None if quota is None else "nobody" if quota.owner is None else "user"
    history = execution.get("history")
    if history:
        args.append(json.dumps([row._asdict() for row in history]))
    return statements.insert_tree(as_text, owner_kind, len(args) if history else 0).postgresql, args
