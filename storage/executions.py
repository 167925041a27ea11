"""The statements of durable, fenced execution (the engine runs them through `TaskRepository.transact`).

Each function takes a synchronous connection and is one step of the execution protocol:

- an *execution* row records that a tree is being executed (target task, webhooks) and which
  instance drives it, under a lease; at most one per tree is `running`;
- a *claim* moves a task from `pending` to `in_progress` only if the database agrees that it may
  run now: it belongs to a running execution this instance owns, its retry delay is over, and
  its dependencies are satisfied *in the database* (never in some instance's memory);
- a claim bumps the task's `lease_epoch`: with `lease_owner` that is the fencing token, and every
  later write for that attempt (progress, checkpoint, outcome) is a compare-and-set on it, so an
  instance that lost its lease (paused, cut off) can no longer change the task.

The statements written as SQL text (the claim, fenced writes, the end of an execution, the
limited claims) are in storage/statements.py, each dialect's form there; this module decides which
runs and with which arguments. A new tree's insert with its execution is storage/tree_insert.py's;
the JSON text both write is storage/json_text.py's.
"""

from __future__ import annotations

import functools
import json
import operator
import sqlite3
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from taskgrove.storage import attempts as history_rows
from taskgrove.storage import statements
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.json_text import json_text
from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.models import JSON_COLUMNS, TaskStatus
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import tasks_table as T

Row = dict[str, Any]
Write = tuple[str, int, Mapping[str, Any]]  # task id, the epoch its attempt holds, the values


def claim(c: Connection, ids: Sequence[str], owner: str, until: str, stamp: str) -> dict[str, Row]:
    """Claim what the database agrees may run now (statements.claim); id -> {lease_epoch, attempt, checkpoint}."""
    if not ids:
        return {}
    if c.dialect.name == "postgresql":
        return pg_pass(c, (), ids, owner, until, stamp)[1]
    return _sqlite_claim(c.connection.driver_connection.cursor(), ids, owner, until, stamp)


# --- limited claims: concurrency keys and rate limits ----------------------------------------
# A task that names a concurrency key or a rate is claimed on its own, in its own transaction, so
# that the count of its key and its rate's next free moment are read and written as one decision
# across instances: on PostgreSQL an advisory lock per key serialises the claims of a key (each
# statement after it sees the claims other instances committed), the rate's row is locked; SQLite
# has one instance and one writer. Tasks without either never come here.

def claim_limited(c: Connection, task_id: str, key: str | None, limit: int | None, rate_key: str | None,
                  interval: float | None, owner: str, until: str, stamp: str) -> tuple[str, Any]:
    """Claim one limited task. Returns ("claimed", token), ("key", tasks of the key in progress),
    ("rate", the moment the rate allows the next start) or ("refused", None) as the ordinary claim
    refuses. `interval`: seconds the rate puts between two starts of `rate_key`."""
    dialect = c.dialect.name
    if key is not None and limit is not None:
        if dialect == "postgresql":
            c.exec_driver_sql(statements.LOCK_KEY.form(dialect), (key,))
        running = c.exec_driver_sql(statements.COUNT_KEY.form(dialect), (key,)).scalar_one()
        if running >= limit:
            return "key", running
    if rate_key is not None:
        c.exec_driver_sql(statements.ADD_RATE.form(dialect), (rate_key, stamp))
        allowed_at = c.exec_driver_sql(statements.READ_RATE.form(dialect), (rate_key,)).scalar_one()
        if allowed_at > stamp:
            return "rate", allowed_at
    claimed = claim(c, [task_id], owner, until, stamp)
    if task_id not in claimed:
        return "refused", None
    if rate_key is not None:
        start = max(datetime.fromisoformat(allowed_at), datetime.fromisoformat(stamp))
        next_at = (start + timedelta(seconds=interval or 0.0)).isoformat(timespec="microseconds")
        c.exec_driver_sql(statements.MOVE_RATE.form(dialect), (rate_key, next_at, stamp))
    return "claimed", claimed[task_id]


# --- PostgreSQL: an engine pass as the rows of one statement ------------------------------
# A pass is its fenced writes, then its claims, then the end of executions. On PostgreSQL each
# part is a row of one statement (statements.pass_statement), all sent at once with asyncpg's
# fetchmany: one round trip, one implicit transaction, each row seeing what the rows before it
# wrote, so a claim sees the outcomes written in the same pass. A row handles a set (up to
# _PG_WRITES_PER_ROW writes, or all the claims): a row per task cost about 100 us, most of it the
# statement's own overhead. The claims ride in the row of the last writes (the claim reads the
# statuses that row writes, statements._PG_CLAIM), so a chain link is one row, not two, unless a
# task is both written and claimed there: one statement changes a row once, so such claims get a
# row of their own after the writes. Every task is found through the primary key (`id =
# ANY(...)`, an index condition in every plan), so the statement's one generic plan stays right
# however the table grows (see statements.py on the claim, and PgPool's pass connection).
# On a SQLAlchemy connection (pg_pass: the claim, fenced writes and end of an execution run
# through TaskRepository.transact) the same rows run one by one.
#
# Claims in one set cannot see each other, where rows one by one would: that changes nothing,
# because a task being claimed is `pending` in the one running execution of its tree, which
# already blocks every task that depends on it (dependencies stay within a tree).
#
# The writes of a row travel as one JSON array of objects, read by json_to_recordset (the text is
# parsed once): the id, the epoch, a bit mask of the columns the write sets (statements.PG_WRITABLE),
# and their values, a JSON column's as its json.dumps text (as the insert sends them, see
# _pg_insert_tree). A column a write does not set keeps its value; a JSON column set to None
# holds JSON 'null', as SQLAlchemy writes it. So writes of every shape are one set.
_PG_BITS = {key: 1 << bit for bit, key in enumerate(statements.PG_WRITABLE)}
# The planner may join a row's writes to their tasks with a nested loop (its estimate of the
# tasks matched is low), comparing every write with every task: bounded by this many per row.
_PG_WRITES_PER_ROW = 64


def pg_step_params(writes: Sequence[Write], claims: Sequence[str], owner: str, until: str, stamp: str,
                   ends: Sequence[tuple[str, str]] = (),
                   history: Mapping[str, Attempt] | None = None) -> list[tuple[Any, ...]]:
    """The rows of a pass (arguments in statements.PASS_ARGS order): writes, then claims (in the
    last row of writes when none of them is written there), then ends (execution id and
    version). `history`: by task id, the attempt an outcome write ends, carried in that write's
    object (statements.PG_HISTORY_KEYS) and stored if it is accepted.

    A task written twice in one pass gets its second write in a later row: one UPDATE changes a
    row once, and the second write must see the first, as it would one by one."""
    left = dict(history or {})  # a task's first write of the pass carries its row
    rows = [(json.dumps([_pg_write_object(tid, epoch, values, left.pop(tid, None) if left else None)
                         for tid, epoch, values in layer]),
             [tid for tid, _, _ in layer], owner, [], until, stamp, None, None)
            for layer in _write_parts(writes, _PG_WRITES_PER_ROW)]
    if claims and rows and set(rows[-1][1]).isdisjoint(claims):  # with the last writes
        rows[-1] = (*rows[-1][:3], list(claims), *rows[-1][4:])
    elif claims:
        rows.append(("[]", [], owner, list(claims), until, stamp, None, None))
    rows.extend(("[]", [], owner, [], until, stamp, eid, version) for eid, version in ends)
    return rows


def _pg_json_as_text(values: Mapping[str, Any]) -> dict[str, Any]:
    """A write's values with its JSON columns as their text (see _pg_insert_tree for why)."""
    return {key: json_text(value) if key in JSON_COLUMNS else value for key, value in values.items()}


def _pg_write_object(tid: str, epoch: int, values: Mapping[str, Any], row: Attempt | None) -> dict[str, Any]:
    """One write as an object of the pass's JSON array; with `row`, the history row it ends."""
    obj = {**_pg_json_as_text(values), "_id": tid, "_epoch": epoch, "_mask": _pg_mask(tuple(values))}
    if row is not None:
        obj.update(zip(statements.PG_HISTORY_KEYS, row[1:]))
    return obj


@functools.lru_cache(maxsize=64)
def _pg_mask(keys: tuple[str, ...]) -> int:
    """The bits of the columns a write of this shape sets."""
    unknown = set(keys).difference(statements.PG_WRITABLE)
    if unknown:
        raise ValueError(f"not a column a fenced write sets: {', '.join(sorted(unknown))}")
    return sum(_PG_BITS[key] for key in set(keys))


def _write_parts(writes: Sequence[tuple[str, int, Mapping[str, Any]]], size: int) -> list[list[Any]]:
    """`writes` in parts of at most `size`, no task twice in one part: a task's later write goes
    to a later part, so that it sees the earlier one."""
    if len({tid for tid, _, _ in writes}) == len(writes):
        return [list(writes[start:start + size]) for start in range(0, len(writes), size)]
    parts: list[list[Any]] = []
    last: dict[str, int] = {}
    for write in writes:
        index = last.get(write[0], -1) + 1
        while index < len(parts) and len(parts[index]) >= size:
            index += 1
        if index == len(parts):
            parts.append([])
        parts[index].append(write)
        last[write[0]] = index
    return parts


def pg_step_results(rows: Iterable[Sequence[Any]]) -> tuple[set[str], dict[str, Row], dict[str, str]]:
    """(accepted write ids, claimed id -> token, ended execution id -> final status) from the
    rows statements.pass_statement returned."""
    accepted: set[str] = set()
    claimed: dict[str, Row] = {}
    ended: dict[str, str] = {}
    for kind, tid, epoch, attempt, checkpoint, final in rows:
        if kind == "written":
            accepted.add(tid)
        elif kind == "claimed":
            claimed[tid] = {"lease_epoch": epoch, "attempt": attempt, "checkpoint": checkpoint}
        else:
            ended[tid] = final
    return accepted, claimed, ended


def pg_pass(c: Connection, writes: Sequence[Write], claims: Sequence[str], owner: str, until: str = "",
            stamp: str = "", ends: Sequence[tuple[str, str]] = (),
            history: Mapping[str, Attempt] | None = None) -> tuple[set[str], dict[str, Row], dict[str, str]]:
    """A pass (fenced writes, then claims, then ends) on a SQLAlchemy connection: the rows of
    statements.pass_statement one by one (the repository sends them all at once through asyncpg)."""
    sql = statements.pass_statement().postgresql
    found: list[Any] = []
    for args in pg_step_params(writes, claims, owner, until, stamp, ends, history):
        found.extend(c.exec_driver_sql(sql, args))
    return pg_step_results(found)


def fenced_writes(c: Connection, writes: Sequence[Write], owner: str,
                  history: Mapping[str, Attempt] | None = None) -> set[str]:
    """Fenced writes (statements.fenced_write) in one transaction; returns the ids whose write
    was accepted: a write applies only while this instance holds the task's lease at `epoch`.
    `history`: by task id, the attempt an outcome write ends (storage/attempts.py), stored with
    the write when the write is accepted.

    On PostgreSQL they are the write rows of a pass (pg_pass: every shape in one set). On SQLite
    writes of the same shape go out as one executemany, retried one by one to learn which were
    refused only when the database reports fewer rows changed than sent.
    """
    if c.dialect.name == "postgresql":
        return pg_pass(c, writes, (), owner, history=history)[0]
    accepted = _sqlite_fenced_writes(c.connection.driver_connection.cursor(), _by_shape(writes), owner)
    if history:
        history_rows.insert_rows(c, history_rows.rows_for(accepted, history))
    return accepted


def sqlite_pass(c: Connection, writes: Sequence[Write], claims: Sequence[str], owner: str, until: str,
                stamp: str, ends: Sequence[tuple[str, str]] = (), history: Mapping[str, Attempt] | None = None,
                later: Sequence[Write] = ()) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
    """SQLite: a whole engine pass (fenced_writes with their history, then claim, then
    end_execution, in that order, in the caller's transaction) on one cursor of the driver's
    connection. Why: each of the three steps found the driver's connection through SQLAlchemy's
    pool wrappers (four Python calls) and opened a cursor of its own; a chain runs a pass per task.
    The statements, their arguments and their order are those of the three functions. PostgreSQL's
    pass is pg_pass (the repository's _pg_write_pass): this function is never given its connection.
    `later`: fenced writes after the claims (the outcomes of pure tasks claimed here: agent/engine/inline.py),
    their history in `history` too; the returned accepted ids hold both kinds. A later write of a
    task being claimed is done with its claim in one UPDATE when the claim gives the epoch and
    attempt predicted (_sqlite_claim_and_write), before the other claims: neither can depend on
    the other, both being runnable at once."""
    cursor = c.connection.driver_connection.cursor()
    accepted = _sqlite_fenced_writes(cursor, _by_shape(writes), owner) if writes else set()
    if history and accepted:
        history_rows.insert_on_cursor(cursor, history_rows.rows_for(accepted, history))
    done: set[str] = set()
    if later and history:  # claimed and written in one row write each where the prediction holds
        done, claimed = _sqlite_claim_and_write(cursor, later, set(claims), history, owner, until, stamp)
        claims = [tid for tid in claims if tid not in claimed]
        later = [write for write in later if write[0] not in claimed]
    else:
        claimed = {}
    if claims:
        claimed.update(_sqlite_claim(cursor, claims, owner, until, stamp))
    if later:
        done |= _sqlite_fenced_writes(cursor, _by_shape(later), owner)
    if done:
        if history:
            history_rows.insert_on_cursor(cursor, history_rows.rows_for(done, history))
        accepted |= done
    ended = {eid: _sqlite_end(cursor, eid, owner, version, stamp) for eid, version in ends}
    return accepted, claimed, ended


def _by_shape(writes: Sequence[Write]) -> dict[tuple[str, ...], list[Any]]:
    """Writes grouped by the columns they set: each group is one statement."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for write in writes:
        groups.setdefault(tuple(write[2]), []).append(write)
    return groups


# --- SQLite: the statements as plain prepared statements ---------------------------------------
# The engine's pass runs these thousands of times for a large tree; through the DB-API cursor they
# cost a third of what SQLAlchemy's execution layer adds around them.
# (Their JSON values are written as text by storage/json_text.py, as the PostgreSQL statements above.)

@functools.lru_cache(maxsize=64)
def _sqlite_write_shape(keys: tuple[str, ...]) -> tuple[str, Callable[[Mapping[str, Any]], Any], tuple[int, ...]]:
    """For writes that set `keys`: the statement, a getter of their values in that order, and
    the places of JSON columns among them (written as their text). Found once per shape, so a
    write's arguments cost no Python call per value."""
    getter = operator.itemgetter(*keys) if len(keys) > 1 else (lambda values, key=keys[0]: (values[key],))
    return (statements.fenced_write(keys).sqlite, getter,
            tuple(i for i, key in enumerate(keys) if key in JSON_COLUMNS))


def _sqlite_write_params(getter: Callable[[Mapping[str, Any]], Any], json_at: tuple[int, ...], tid: str,
                         owner: str, epoch: int, values: Mapping[str, Any]) -> list[Any]:
    """One fenced write's arguments: its values (JSON columns as their text), id, owner, epoch."""
    params = [*getter(values), tid, owner, epoch]
    for i in json_at:
        params[i] = json_text(params[i])
    return params


def _sqlite_fenced_writes(cursor: sqlite3.Cursor, groups: Mapping[tuple[str, ...], list[Write]],
                          owner: str) -> set[str]:
    accepted: set[str] = set()
    for keys, group in groups.items():
        sql, getter, json_at = _sqlite_write_shape(keys)
        params = [_sqlite_write_params(getter, json_at, tid, owner, epoch, values) for tid, epoch, values in group]
        if len(group) == 1:  # applied or refused whole: nothing to undo, so no savepoint (a chain's every pass)
            cursor.execute(sql, params[0])
            if cursor.rowcount:
                accepted.add(group[0][0])
            continue
        cursor.execute(statements.GROUP_SAVEPOINT)
        cursor.executemany(sql, params)
        if cursor.rowcount == len(group):
            cursor.execute(statements.GROUP_RELEASE)
            accepted.update(tid for tid, _, _ in group)
            continue
        # Some write was refused, but not which: undo the group and try each write alone. Run
        # again on top of the group, a write it applied would be refused (its fence moved with it).
        cursor.execute(statements.GROUP_UNDO)
        cursor.execute(statements.GROUP_RELEASE)
        for (tid, _, _), row in zip(group, params):
            cursor.execute(sql, row)
            if cursor.rowcount:
                accepted.add(tid)
    return accepted


def _sqlite_claim_and_write(cursor: sqlite3.Cursor, later: Sequence[Write], claims: Collection[str],
                            history: Mapping[str, Attempt], owner: str, until: str, stamp: str,
                            ) -> tuple[set[str], dict[str, Row]]:
    """Pure tasks (sqlite_pass's `later` writes of tasks in its `claims`): each claimed and its
    outcome written in one UPDATE (statements.claim_and_write) when the claim gives the epoch of
    its write and the attempt of its history row, as predicted from the run's memory. The ids done and their claims; the
    rest take the two steps (claim, then the fenced write), which decide as they always did."""
    done: set[str] = set()
    claimed: dict[str, Row] = {}
    for tid, epoch, values in later:
        row = history.get(tid)
        if row is None or tid not in claims:
            continue
        keys = tuple(values)
        _, getter, json_at = _sqlite_write_shape(keys)
        params = [stamp, owner, until, tid, epoch, row.attempt, *getter(values)]
        for i in json_at:
            params[6 + i] = json_text(params[6 + i])
        for _, lease_epoch, attempt, checkpoint in cursor.execute(statements.claim_and_write(keys).sqlite, params):
            done.add(tid)
            claimed[tid] = {"lease_epoch": lease_epoch, "attempt": attempt,
                            "checkpoint": None if checkpoint in (None, "null") else read_stored(checkpoint)}
    return done, claimed


def _sqlite_claim(cursor: sqlite3.Cursor, ids: Sequence[str], owner: str, until: str, stamp: str) -> dict[str, Row]:
    claimed: dict[str, Row] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        sql = statements.claim(len(chunk)).sqlite
        for tid, epoch, attempt, checkpoint in cursor.execute(sql, (stamp, owner, until, *chunk)):
            claimed[tid] = {"lease_epoch": epoch, "attempt": attempt,
                            "checkpoint": None if checkpoint in (None, "null") else read_stored(checkpoint)}
    return claimed


# --- executions -----------------------------------------------------------------------------

def running_execution(c: Connection, tree_id: str, lock: bool = False) -> Row | None:
    query = select(X).where(X.c.task_tree_id == tree_id, X.c.status == "running")
    row = c.execute(query.with_for_update() if lock else query).first()
    return dict(row._mapping) if row else None


def latest_execution(c: Connection, tree_id: str) -> Row | None:
    """The tree's most recent execution, running or ended."""
    row = c.execute(select(X).where(X.c.task_tree_id == tree_id).order_by(X.c.created_at.desc()).limit(1)).first()
    return dict(row._mapping) if row else None


def get_execution(c: Connection, execution_id: str) -> Row | None:
    row = c.execute(select(X).where(X.c.id == execution_id)).first()
    return dict(row._mapping) if row else None


def open_execution(c: Connection, tree_id: str, task_id: str, user_id: str | None, owner: str, until: str,
                   stamp: str, webhook: Mapping[str, Any] | None, traceparent: str | None = None) -> Row:
    """The tree's running execution, created (owned by `owner`) when there is none, with
    `traceparent` (the trace its spans belong to; a joined execution keeps its own).

    A second request for a tree that is already being executed joins that execution: its
    webhook is added to the execution's list, and the owner runs the tasks it asks for.
    """
    for _ in range(3):
        found = running_execution(c, tree_id, lock=True)
        if found is not None:
            if webhook is not None:
                webhooks = [*found["webhooks"], dict(webhook)]
                c.execute(update(X).where(X.c.id == found["id"]).values(webhooks=webhooks, updated_at=stamp))
                found["webhooks"] = webhooks
            return found
        row = new_execution(tree_id, task_id, user_id, owner, until, stamp, webhook, traceparent)
        if c.dialect.name == "sqlite":  # one instance, whose engine opens executions one at a time
            c.execute(insert(X), row)
            return row
        try:
            with c.begin_nested():  # another instance may have opened one first
                c.execute(insert(X), row)
        except IntegrityError:
            continue
        return row
    raise RuntimeError(f"could not open an execution of tree {tree_id}")


def join(c: Connection, execution_id: str, expected: Mapping[str, str], stamp: str) -> int:
    """Make tasks members of the execution, ready for a fresh first attempt; returns how many.

    `expected` maps each task id to the status it was read with: a task that moved since (it
    just completed, another request took it) is left alone. Bumps the execution's `updated_at`
    (its version): an owner about to end it must first see the new members.
    """
    joined = 0
    by_status: dict[str, list[str]] = {}
    for tid, status in expected.items():
        by_status.setdefault(status, []).append(tid)
    for status, ids in by_status.items():
        for start in range(0, len(ids), 500):
            joined += c.execute(update(T).where(T.c.id.in_(ids[start:start + 500]), T.c.status == status).values(
                status=TaskStatus.PENDING.value, progress=0.0, result=None, error=None, started_at=None, completed_at=None,
                updated_at=stamp, execution_id=execution_id, attempt=0, next_attempt_at=None, checkpoint=None,
                lease_owner=None, lease_expires_at=None, interruptions=0, waiting=None, wait_answers=None,
                wake_at=None)).rowcount
    c.execute(update(X).where(X.c.id == execution_id).values(updated_at=stamp))
    return joined


def new_execution(tree_id: str, task_id: str, user_id: str | None, owner: str, until: str, stamp: str,
                   webhook: Mapping[str, Any] | None, traceparent: str | None = None) -> Row:
    return {"id": uuid.uuid4().hex, "task_tree_id": tree_id, "task_id": task_id, "user_id": user_id,
            "status": "running", "final_status": None, "webhooks": [dict(webhook)] if webhook else [],
            "owner": owner, "epoch": 1, "lease_expires_at": until, "created_at": stamp, "updated_at": stamp,
            "ended_at": None, "traceparent": traceparent}


def end_execution(c: Connection, execution_id: str, owner: str, version: str, stamp: str) -> str | None:
    """End an execution whose members are all settled (statements.END_EXECUTION); returns its
    final status, or None when it cannot end now: a member is still in progress or may still run
    (pending, and not held back for good by a dependency: a change the engine had not read yet),
    or the execution changed (joined, taken over) since `version`."""
    if c.dialect.name == "postgresql":
        return pg_pass(c, (), (), owner, stamp=stamp, ends=[(execution_id, version)])[2].get(execution_id)
    # On the driver's own connection, as the pass's writes and claims are: through exec_driver_sql
    # SQLAlchemy builds the result's column metadata anew on every call (no compiled cache for
    # driver SQL), measured at 3-4 % of a one-task create.
    return _sqlite_end(c.connection.driver_connection.cursor(), execution_id, owner, version, stamp)


def _sqlite_end(cursor: sqlite3.Cursor, execution_id: str, owner: str, version: str, stamp: str) -> str | None:
    # fetchall: the statement runs to its end (no statement left open inside the transaction).
    rows = cursor.execute(statements.END_EXECUTION.sqlite, (execution_id, owner, version, stamp)).fetchall()
    return rows[0][1] if rows else None


def renew(c: Connection, owner: str, task_ids: Sequence[str], execution_ids: Sequence[str],
          until: str) -> tuple[set[str], set[str]]:
    """Extend this instance's leases; returns the task and execution ids it still holds."""
    tasks: set[str] = set()
    for start in range(0, len(task_ids), 500):
        query = (update(T).where(T.c.id.in_(task_ids[start:start + 500]), T.c.status == TaskStatus.IN_PROGRESS.value,
                                 T.c.lease_owner == owner).values(lease_expires_at=until).returning(T.c.id))
        tasks.update(c.execute(query).scalars())
    executions: set[str] = set()
    if execution_ids:
        query = (update(X).where(X.c.id.in_(list(execution_ids)), X.c.status == "running", X.c.owner == owner)
                 .values(lease_expires_at=until).returning(X.c.id))
        executions.update(c.execute(query).scalars())
    return tasks, executions


def expired_tasks(c: Connection, now: str | None) -> list[Row]:
    """Tasks in progress whose lease ran out before `now` (None: every task in progress), but
    not those parked on a wait: they hold no lease, and no attempt of theirs is running."""
    query = select(T).where(T.c.status == TaskStatus.IN_PROGRESS.value, T.c.waiting.is_(None))
    if now is not None:
        query = query.where((T.c.lease_expires_at.is_(None)) | (T.c.lease_expires_at < now))
    return [dict(row._mapping) for row in c.execute(query)]


def interrupt(c: Connection, row: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """End an attempt whose instance is gone: compare-and-set on the token that attempt held;
    the attempt goes into the history as `interrupted` (storage/attempts.py)."""
    query = (update(T).where(T.c.id == row["id"], T.c.status == TaskStatus.IN_PROGRESS.value,
                             T.c.lease_owner.is_(row["lease_owner"]) if row["lease_owner"] is None
                             else T.c.lease_owner == row["lease_owner"],
                             T.c.lease_epoch == row["lease_epoch"], T.c.waiting.is_(None)).values(**values))
    if c.execute(query).rowcount == 0:
        return False
    history_rows.insert_rows(c, [Attempt(row["id"], row.get("attempt") or 1, None, row.get("started_at"),
                                         values["updated_at"], history_rows.INTERRUPTED, values.get("error"))])
    return True


def take_over(c: Connection, owner: str, until: str, stamp: str, only_expired: bool,
              driven: Collection[str] = ()) -> list[Row]:
    """Executions whose owner's lease ran out (or every running one), now owned by `owner`.

    `driven`: the executions `owner` has a run of in memory. One of its own whose lease ran out
    is taken (adopted) only when not among them: stored for it with no run (a tree's insert
    whose commit's answer was lost), nobody else would ever take it."""
    now = stamp if only_expired else None
    query = select(X).where(X.c.status == "running")
    if now is not None:
        query = query.where((X.c.lease_expires_at.is_(None)) | (X.c.lease_expires_at < now))
    taken: list[Row] = []
    for found in [dict(row._mapping) for row in c.execute(query)]:
        if found["owner"] == owner and now is not None and found["id"] in driven:
            continue  # our own lease lapsed while we were busy: the heartbeat deals with it
        changed = c.execute(update(X).where(X.c.id == found["id"], X.c.status == "running",
                                            X.c.epoch == found["epoch"])
                            .values(owner=owner, epoch=found["epoch"] + 1, lease_expires_at=until,
                                    updated_at=stamp)).rowcount
        if changed:
            taken.append({**found, "previous_owner": found["owner"], "owner": owner, "epoch": found["epoch"] + 1,
                          "lease_expires_at": until, "updated_at": stamp})  # as stored: the run's version
    return taken


def release(c: Connection, owner: str, execution_ids: Sequence[str], stamp: str, error: str,
            max_interruptions: int) -> list[str]:
    """Graceful stop: hand this instance's executions and attempts back for another to resume.

    An attempt cut off here is interrupted like one cut off by a crash: `pending` again with the
    same attempt number (the resumed one takes it), one more interruption; past
    `max_interruptions` the task fails instead (`error` then says so)."""
    over = T.c.interruptions + 1 > max_interruptions
    limit_error = (f"{error}; the task was interrupted more often than SERVICE_MAX_INTERRUPTIONS "
                   f"({max_interruptions}) allows, so it is not run again")
    query = (update(T).where(T.c.status == TaskStatus.IN_PROGRESS.value, T.c.lease_owner == owner)
             .values(status=case((over, TaskStatus.FAILED.value), else_=TaskStatus.PENDING.value), error=case((over, limit_error), else_=error),
                     completed_at=case((over, stamp), else_=None), updated_at=stamp, lease_owner=None,
                     lease_expires_at=None, attempt=case((over, T.c.attempt), else_=T.c.attempt - 1),
                     interruptions=T.c.interruptions + 1)
             .returning(T.c.id, T.c.status, T.c.attempt, T.c.started_at, T.c.error))
    released = []
    cut_off = []  # their attempts, into the history as interrupted (storage/attempts.py)
    for tid, status, attempt, started_at, why in c.execute(query):
        released.append(tid)
        number = attempt if status == TaskStatus.FAILED.value else attempt + 1  # the attempt that ran
        cut_off.append(Attempt(tid, max(1, number), None, started_at, stamp, history_rows.INTERRUPTED, why))
    history_rows.insert_rows(c, cut_off)
    if execution_ids:
        c.execute(update(X).where(X.c.id.in_(list(execution_ids)), X.c.owner == owner, X.c.status == "running")
                  .values(lease_expires_at=stamp, updated_at=stamp))
    return released
