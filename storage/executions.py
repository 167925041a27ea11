"""The statements of durable, fenced execution (the engine runs them through `TaskRepository.run`).

Each function takes a synchronous connection and is one step of the execution protocol:

- an *execution* row records that a tree is being executed (target task, webhooks) and which
  instance drives it, under a lease; at most one per tree is `running`;
- a *claim* moves a task from `pending` to `in_progress` only if the database agrees that it may
  run now: it belongs to a running execution this instance owns, its retry delay is over, and
  its dependencies are satisfied *in the database* (never in some instance's memory);
- a claim bumps the task's `lease_epoch`: with `lease_owner` that is the fencing token, and every
  later write for that attempt (progress, checkpoint, outcome) is a compare-and-set on it, so an
  instance that lost its lease (paused, cut off) can no longer change the task.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, case, column, insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.util import await_

from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.models import with_defaults

Row = dict[str, Any]

# A dependency keeps a task from being claimed while it is unfinished; a required one also when
# it ended in anything but `completed`. An optional dependency that nobody will run (pending
# outside any execution of this tree) does not hold the task back.
#
# PostgreSQL plans a prepared statement once (a generic plan) and keeps the plan while the table
# grows; made on a small or never analysed table, such a plan scans the table (or the status
# index, whose dead entries pile up between vacuums) for every pass. So every row these
# statements touch is found by its primary key (an execution's members by their execution id)
# and nothing else: each dependency is looked up on its own (LATERAL ... LIMIT 1: the id is
# unique, the limit only keeps the planner from turning the lookups into a join), the execution
# is a scalar subquery, and status tests are written `(status = ...) IS TRUE`, which no index
# (nor the partial index of running executions) matches.
_BLOCKING_DEPENDENCY = {
    "sqlite": """
        SELECT 1 FROM json_each(tasks.dependencies) AS d
        JOIN tasks AS x ON x.id = json_extract(d.value, '$.id')
        WHERE x.status = 'in_progress'
           OR (coalesce(json_extract(d.value, '$.required'), 1) AND x.status <> 'completed')
           OR (x.status = 'pending' AND x.execution_id = tasks.execution_id)""",
    "postgresql": """
        SELECT 1 FROM json_array_elements(tasks.dependencies) AS d
        CROSS JOIN LATERAL (SELECT x.status, x.execution_id FROM tasks AS x WHERE x.id = d->>'id' LIMIT 1) AS x
        WHERE x.status = 'in_progress'
           OR (coalesce((d->>'required')::boolean, true) AND x.status <> 'completed')
           OR (x.status = 'pending' AND x.execution_id = tasks.execution_id)""",
}


def _claim_sql(blocking: str, ids: str = "id IN :ids", p: str = "") -> str:
    """The claim: pending tasks of `ids` whose retry delay is over, in a running execution this
    instance owns, with no blocking dependency; each gets a new lease and epoch."""
    return f"""
        UPDATE tasks SET status = 'in_progress', progress = 0.0, result = NULL, error = NULL,
               started_at = :{p}stamp, completed_at = NULL, updated_at = :{p}stamp, next_attempt_at = NULL,
               lease_owner = :{p}owner, lease_expires_at = :{p}until, lease_epoch = lease_epoch + 1,
               attempt = attempt + 1
        WHERE {ids} AND (status = 'pending') IS TRUE
          AND (next_attempt_at IS NULL OR next_attempt_at <= :{p}stamp)
          AND (SELECT e.status = 'running' AND e.owner = :{p}owner FROM executions AS e
               WHERE e.id = tasks.execution_id)
          AND NOT EXISTS ({blocking})
        RETURNING id, lease_epoch, attempt, checkpoint"""


@functools.lru_cache(maxsize=4)
def _claim_statement(dialect: str) -> Any:
    return text(_claim_sql(_BLOCKING_DEPENDENCY[dialect])).bindparams(bindparam("ids", expanding=True)).columns(
        T.c.id, T.c.lease_epoch, T.c.attempt, T.c.checkpoint)


def claim(c: Connection, ids: Sequence[str], owner: str, until: str, stamp: str) -> dict[str, Row]:
    """Claim what the database agrees may run now; returns id -> {lease_epoch, attempt, checkpoint}."""
    if not ids:
        return {}
    if c.dialect.name == "sqlite":
        return _sqlite_claim(c, ids, owner, until, stamp)
    query = _claim_statement(c.dialect.name)
    claimed: dict[str, Row] = {}
    for start in range(0, len(ids), 500):
        params = {"ids": list(ids[start:start + 500]), "owner": owner, "until": until, "stamp": stamp}
        for row in c.execute(query, params):
            claimed[row.id] = {"lease_epoch": row.lease_epoch, "attempt": row.attempt, "checkpoint": row.checkpoint}
    return claimed


# --- limited claims: concurrency keys and rate limits ----------------------------------------
# A task that names a concurrency key or a rate is claimed on its own, in its own transaction, so
# that the count of its key and its rate's next free moment are read and written as one decision
# across instances: on PostgreSQL an advisory lock per key serialises the claims of a key (each
# statement after it sees the claims other instances committed), the rate's row is locked; SQLite
# has one instance and one writer. Tasks without either never come here.

_COUNT_KEY = text("SELECT count(*) FROM tasks WHERE concurrency_key = :key AND concurrency_key IS NOT NULL "
                  "AND status = 'in_progress'")  # (the second test lets the partial index serve it)
_LOCK_KEY = text("SELECT pg_advisory_xact_lock(hashtext(:key))")
_ADD_RATE = text("INSERT INTO rate_limits (key, next_at, updated_at) VALUES (:key, :stamp, :stamp) "
                 "ON CONFLICT (key) DO NOTHING")
_READ_RATE = {"sqlite": text("SELECT next_at FROM rate_limits WHERE key = :key"),
              "postgresql": text("SELECT next_at FROM rate_limits WHERE key = :key FOR UPDATE")}
_MOVE_RATE = text("UPDATE rate_limits SET next_at = :next_at, updated_at = :stamp WHERE key = :key")


def claim_limited(c: Connection, task_id: str, key: str | None, limit: int | None, rate_key: str | None,
                  interval: float | None, owner: str, until: str, stamp: str) -> tuple[str, Any]:
    """Claim one limited task. Returns ("claimed", token), ("key", tasks of the key in progress),
    ("rate", the moment the rate allows the next start) or ("refused", None) as the ordinary claim
    refuses. `interval`: seconds the rate puts between two starts of `rate_key`."""
    postgres = c.dialect.name == "postgresql"
    if key is not None and limit is not None:
        if postgres:
            c.execute(_LOCK_KEY, {"key": key})
        running = c.execute(_COUNT_KEY, {"key": key}).scalar_one()
        if running >= limit:
            return "key", running
    if rate_key is not None:
        c.execute(_ADD_RATE, {"key": rate_key, "stamp": stamp})
        allowed_at = c.execute(_READ_RATE[c.dialect.name], {"key": rate_key}).scalar_one()
        if allowed_at > stamp:
            return "rate", allowed_at
    claimed = claim(c, [task_id], owner, until, stamp)
    if task_id not in claimed:
        return "refused", None
    if rate_key is not None:
        start = max(datetime.fromisoformat(allowed_at), datetime.fromisoformat(stamp))
        next_at = (start + timedelta(seconds=interval or 0.0)).isoformat(timespec="microseconds")
        c.execute(_MOVE_RATE, {"key": rate_key, "next_at": next_at, "stamp": stamp})
    return "claimed", claimed[task_id]


# --- PostgreSQL: an engine pass as the rows of one statement ------------------------------
# A pass is its fenced writes, then its claims, then the end of executions. On PostgreSQL each
# part is a row of one statement (pg_step_sql), all sent at once with asyncpg's fetchmany: one
# round trip, one implicit transaction, each row seeing what the rows before it wrote, so a claim
# sees the outcomes written in the same pass. A row handles a set (up to _PG_WRITES_PER_ROW
# writes, or all the claims): a row per task cost about 100 us, most of it the statement's own
# overhead. Every task is found through the primary key (`id = ANY(...)`, an index condition in
# every plan), so the statement's one generic plan stays right however the table grows (see
# _BLOCKING_DEPENDENCY and PgPool's pass connection).
# On a SQLAlchemy connection (pg_pass: tests, a checkpoint) the same rows run one by one.
#
# Claims in one set cannot see each other, where rows one by one would: that changes nothing,
# because a task being claimed is `pending` in the one running execution of its tree, which
# already blocks every task that depends on it (dependencies stay within a tree).

# What a fenced write may set. The writes of a row travel as one JSON array of objects, read by
# json_to_recordset (the text is parsed once): the id, the epoch, a bit mask of the columns the
# write sets, and their values, a JSON column's as its json.dumps text (as the insert sends them,
# see _pg_insert_tasks). A column a write does not set keeps its value; a JSON column set to None
# holds JSON 'null', as SQLAlchemy writes it. So writes of every shape are one set.
_PG_WRITABLE = ("status", "progress", "result", "error", "completed_at", "updated_at", "next_attempt_at",
                "lease_owner", "lease_expires_at", "token_success", "token_failed", "checkpoint")
_PG_BITS = {key: 1 << bit for bit, key in enumerate(_PG_WRITABLE)}
# The planner may join a row's writes to their tasks with a nested loop (its estimate of the
# tasks matched is low), comparing every write with every task: bounded by this many per row.
_PG_WRITES_PER_ROW = 64


def _pg_assignment(key: str) -> str:
    value = f"CAST(w.{key} AS json)" if key in _JSON_COLUMNS else f"w.{key}"
    return f"{key} = CASE WHEN w._mask & {_PG_BITS[key]} = 0 THEN t.{key} ELSE {value} END"


@functools.lru_cache(maxsize=1)
def pg_step_sql() -> str:
    """One row of a pass: the fenced writes `_writes` (a JSON array, see _PG_WRITABLE), the claims
    of `_claim_ids`, or the end of execution `_end_id` (the rest empty or NULL). Returns ('w', id)
    for each accepted write, ('c', id, lease_epoch, attempt, checkpoint) for each claimed task,
    ('e', id, ..., final_status) for an ended execution."""
    assignments = ", ".join(_pg_assignment(key) for key in _PG_WRITABLE)
    fields = ", ".join(f"{key} {_pg_type(key)}" for key in _PG_WRITABLE)
    claim_sql = _claim_sql(_BLOCKING_DEPENDENCY["postgresql"], "id = ANY(CAST(:_claim_ids AS text[]))", "_")
    nothing = "NULL::integer, NULL::integer, NULL::json"
    return (f"WITH w AS MATERIALIZED (SELECT * FROM json_to_recordset(CAST(:_writes AS json)) "
            f"AS w(_id text, _epoch integer, _mask integer, {fields})), "
            f"written AS (UPDATE tasks AS t SET {assignments} FROM w "
            "WHERE t.id = w._id AND t.id = ANY(CAST(:_write_ids AS text[])) "
            "AND (t.status = 'in_progress') IS TRUE AND t.lease_owner = :_owner "
            "AND t.lease_epoch = w._epoch RETURNING t.id), "
            f"claimed AS ({claim_sql}), ended AS ({_end_sql('_', ':_end_id')}) "
            f"SELECT 'w' AS kind, id, {nothing}, NULL::text FROM written "
            "UNION ALL SELECT 'c', id, lease_epoch, attempt, checkpoint, NULL FROM claimed "
            f"UNION ALL SELECT 'e', id, {nothing}, final_status FROM ended")


def pg_step_params(writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str], owner: str,
                   until: str, stamp: str, ends: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The rows of a pass: writes, then claims, then ends (execution id and version).

    A task written twice in one pass gets its second write in a later row: one UPDATE changes a
    row once, and the second write must see the first, as it would one by one."""
    none: dict[str, Any] = {"_write_ids": [], "_writes": "[]", "_claim_ids": [], "_end_id": None, "_version": None}
    rows = [{**none, "_write_ids": [tid for tid, _, _ in layer],
             "_writes": json.dumps([{**_pg_json_as_text(values), "_id": tid, "_epoch": epoch,
                                     "_mask": _pg_mask(tuple(values))} for tid, epoch, values in layer])}
            for layer in _write_parts(writes, _PG_WRITES_PER_ROW)]
    if claims:
        rows.append({**none, "_claim_ids": list(claims)})
    rows.extend({**none, "_end_id": eid, "_version": version} for eid, version in ends)
    for row in rows:
        row.update(_owner=owner, _until=until, _stamp=stamp)
    return rows


def _pg_json_as_text(values: Mapping[str, Any]) -> dict[str, Any]:
    """A write's values with its JSON columns as their text (see _pg_insert_tasks for why)."""
    return {key: _json_text(value) if key in _JSON_COLUMNS else value for key, value in values.items()}


@functools.lru_cache(maxsize=64)
def _pg_mask(keys: tuple[str, ...]) -> int:
    """The bits of the columns a write of this shape sets."""
    unknown = set(keys).difference(_PG_WRITABLE)
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
    rows pg_step_sql returned."""
    accepted: set[str] = set()
    claimed: dict[str, Row] = {}
    ended: dict[str, str] = {}
    for kind, tid, epoch, attempt, checkpoint, final in rows:
        if kind == "w":
            accepted.add(tid)
        elif kind == "c":
            claimed[tid] = {"lease_epoch": epoch, "attempt": attempt, "checkpoint": checkpoint}
        else:
            ended[tid] = final
    return accepted, claimed, ended


@functools.lru_cache(maxsize=1)
def _pg_step_statement() -> Any:
    return text(pg_step_sql()).columns(column("kind", String), T.c.id, T.c.lease_epoch, T.c.attempt, T.c.checkpoint,
                                       X.c.final_status)


def pg_pass(c: Connection, writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str],
            owner: str, until: str = "", stamp: str = "") -> tuple[set[str], dict[str, Row]]:
    """fenced_writes then claim on a SQLAlchemy connection: the rows of pg_step_sql one by one
    (the repository sends them all at once through asyncpg)."""
    statement = _pg_step_statement()
    found: list[Any] = []
    for params in pg_step_params(writes, claims, owner, until, stamp):
        found.extend(c.execute(statement, params))
    return pg_step_results(found)[:2]


def fenced_write(c: Connection, task_id: str, owner: str, epoch: int, values: Mapping[str, Any]) -> bool:
    """Write `values` for the attempt this instance holds; False when it no longer holds it."""
    return c.execute(_fenced_statement(tuple(values)), _fenced_params(task_id, owner, epoch, values)).rowcount > 0


def fenced_writes(c: Connection, writes: Sequence[tuple[str, int, Mapping[str, Any]]], owner: str) -> set[str]:
    """Several fenced writes in one transaction; returns the ids whose write was accepted.

    On PostgreSQL they are the write rows of a pass (pg_pass: every shape in one set). Elsewhere
    writes of the same shape go out as one executemany, retried one by one to learn which were
    refused only when the database reports fewer rows changed than sent.
    """
    if c.dialect.name == "postgresql":
        return pg_pass(c, writes, (), owner)[0]
    accepted: set[str] = set()
    groups = _by_shape(writes)
    if c.dialect.name == "sqlite":
        return _sqlite_fenced_writes(c, groups, owner)
    for keys, group in groups.items():
        if len(group) > 1 and c.dialect.supports_sane_multi_rowcount:
            result = c.execute(_fenced_statement(keys), [_fenced_params(tid, owner, epoch, values)
                                                         for tid, epoch, values in group])
            if result.rowcount == len(group):
                accepted.update(tid for tid, _, _ in group)
                continue
        accepted.update(tid for tid, epoch, values in group if fenced_write(c, tid, owner, epoch, values))
    return accepted


@functools.lru_cache(maxsize=64)
def _fenced_statement(keys: tuple[str, ...]) -> Any:
    """Built once per shape: constructing a statement costs more than running it on SQLite."""
    return (update(T).where(T.c.id == bindparam("_id"), T.c.status == "in_progress",
                            T.c.lease_owner == bindparam("_owner"), T.c.lease_epoch == bindparam("_epoch"))
            .values({key: bindparam(f"_v_{key}") for key in keys}))


def _by_shape(writes: Sequence[tuple[str, int, Mapping[str, Any]]]) -> dict[tuple[str, ...], list[Any]]:
    """Writes grouped by the columns they set: each group is one statement."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for write in writes:
        groups.setdefault(tuple(write[2]), []).append(write)
    return groups


def _fenced_params(task_id: str, owner: str, epoch: int, values: Mapping[str, Any]) -> dict[str, Any]:
    return {"_id": task_id, "_owner": owner, "_epoch": epoch, **{f"_v_{k}": v for k, v in values.items()}}


# --- SQLite: the same statements as plain prepared statements ---------------------------------
# The engine's pass runs these thousands of times for a large tree; through the DB-API cursor they
# cost a third of what SQLAlchemy's execution layer adds around them. Same SQL, same semantics.
# (_JSON_COLUMNS and _json_text serve the PostgreSQL statements above as well.)

_JSON_COLUMNS = frozenset({"result", "checkpoint", "inputs", "params", "schemas", "dependencies", "extra", "retry",
                           "concurrency", "rate_limit"})


_EMPTY_JSON = {type(None): "null", dict: "{}", list: "[]"}  # most stored JSON values: json.dumps skipped


def _sqlite_value(key: str, value: Any) -> Any:
    return _json_text(value) if key in _JSON_COLUMNS else value


def _json_text(value: Any, memo: dict[Any, str] | None = None) -> str:
    """The text SQLAlchemy's JSON type stores for `value` (json.dumps; None is 'null').

    `memo`: texts already written in this statement, by _same_text key. The tasks of one tree
    mostly share their schemas, retry policy and (in layers) dependency lists: each is encoded
    once, not once a row (json.dumps costs about four times building the key)."""
    if not value and type(value) in _EMPTY_JSON:
        return _EMPTY_JSON[type(value)]
    if memo is None:
        return json.dumps(value)
    key = _same_text(value)
    if key is None:
        return json.dumps(value)
    text = memo.get(key)
    if text is None:
        text = memo[key] = json.dumps(value)
    return text


_FLAT = frozenset({str, int, float, bool, type(None)})


def _same_text(value: Any) -> tuple[Any, ...] | None:
    """A key equal only for values json.dumps writes identically (each item's type is part of
    it: 1, 1.0 and True compare equal but are written differently), for an object of plain
    values or a list of such objects; None for anything else."""
    if value.__class__ is dict:
        items = []
        for key, item in value.items():
            if item.__class__ not in _FLAT:
                return None
            items.append((key, item.__class__, item))
        return (dict, *items)
    if value.__class__ is list:
        parts = []
        for item in value:
            part = _same_text(item) if item.__class__ is dict else None
            if part is None:
                return None
            parts.append(part)
        return (list, *parts)
    return None


@functools.lru_cache(maxsize=64)
def _sqlite_fenced_sql(keys: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{key} = ?" for key in keys)
    return f"UPDATE tasks SET {assignments} WHERE id = ? AND status = 'in_progress' AND lease_owner = ? " \
           "AND lease_epoch = ?"


def _sqlite_fenced_writes(c: Connection, groups: Mapping[tuple[str, ...], list[tuple[str, int, Mapping[str, Any]]]],
                          owner: str) -> set[str]:
    cursor = c.connection.driver_connection.cursor()
    accepted: set[str] = set()
    for keys, group in groups.items():
        sql = _sqlite_fenced_sql(keys)
        params = [(*(_sqlite_value(k, values[k]) for k in keys), tid, owner, epoch) for tid, epoch, values in group]
        cursor.executemany(sql, params)
        if cursor.rowcount == len(group):
            accepted.update(tid for tid, _, _ in group)
            continue
        for (tid, _, _), row in zip(group, params):
            cursor.execute(sql, row)
            if cursor.rowcount:
                accepted.add(tid)
    return accepted


def _sqlite_insert_tasks(c: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Full rows (`with_defaults`) inserted as SQLAlchemy's executemany would store them: the same
    column values and the same JSON text (json.dumps, which `dependents()` matches with LIKE)."""
    columns = _task_columns()
    row_values = operator.itemgetter(*columns)
    json_at = [i for i, key in enumerate(columns) if key in _JSON_COLUMNS]
    params = []
    memo: dict[Any, str] = {}
    for row in rows:
        values = list(row_values(row))
        for i in json_at:
            values[i] = _json_text(values[i], memo)
        params.append(values)
    sql = _sqlite_insert_sql()
    try:
        c.connection.driver_connection.cursor().executemany(sql, params)
    except sqlite3.IntegrityError as exc:  # an id is taken: the same error the SQLAlchemy path raises
        raise IntegrityError(sql, None, exc) from exc


def _pg_insert_tasks(c: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """PostgreSQL: full rows (`with_defaults`) as one JSON array and one INSERT ... SELECT, sent on
    the transaction's own asyncpg connection; stored as SQLAlchemy's executemany stores them (the
    JSON columns hold json.dumps text, None as JSON 'null').

    A JSON value holding NUL ("\\u0000", which JSON allows and SQLite and the SQLAlchemy path
    store) cannot be read out of the document by json_populate_recordset, which fails the whole
    insert: such rows travel with their JSON columns as text instead (a JSON string each), cast
    to json in the statement. The usual rows skip that: done always, it made a 1000-task create
    60-70 ms slower (bench/README.md, fifth round)."""
    import asyncpg  # PostgreSQL only: not loaded on SQLite

    text = json.dumps(rows)
    sql = _pg_insert_sql()
    if "\\u0000" in text:
        memo: dict[Any, str] = {}
        sql = _pg_insert_sql(json_as_text=True)
        text = json.dumps([{key: _json_text(value, memo) if key in _JSON_COLUMNS else value
                            for key, value in row.items()} for row in rows])
    try:
        await_(c.connection.driver_connection.execute(sql, text))
    except asyncpg.IntegrityConstraintViolationError as exc:  # an id is taken: what the SQLAlchemy path raises
        raise IntegrityError(sql, None, exc) from exc


@functools.lru_cache(maxsize=2)
def _pg_insert_sql(json_as_text: bool = False) -> str:
    columns = _task_columns()
    if not json_as_text:
        values = ", ".join(f"coalesce({key}, 'null'::json)" if key in _JSON_COLUMNS else key for key in columns)
        return (f"INSERT INTO tasks ({', '.join(columns)}) SELECT {values} "
                "FROM json_populate_recordset(NULL::tasks, CAST($1 AS json))")
    values = ", ".join(f"CAST(r.{key} AS json)" if key in _JSON_COLUMNS else f"r.{key}" for key in columns)
    fields = ", ".join(f"{key} {_pg_type(key)}" for key in columns)
    return (f"INSERT INTO tasks ({', '.join(columns)}) SELECT {values} "
            f"FROM json_to_recordset(CAST($1 AS json)) AS r({fields})")


@functools.lru_cache(maxsize=64)
def _pg_type(key: str) -> str:
    """The type a column of `tasks` is read as from a JSON document: its own, text for JSON
    columns (they travel as their text, see _pg_insert_tasks)."""
    from sqlalchemy.dialects import postgresql  # the dialect's compiler only: no driver is loaded

    if key in _JSON_COLUMNS:
        return "text"
    return T.c[key].type.compile(dialect=postgresql.dialect())


@functools.lru_cache(maxsize=1)
def _task_columns() -> tuple[str, ...]:
    return tuple(column.name for column in T.c)


@functools.lru_cache(maxsize=1)
def _sqlite_insert_sql() -> str:
    columns = _task_columns()
    return f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _sqlite_claim(c: Connection, ids: Sequence[str], owner: str, until: str, stamp: str) -> dict[str, Row]:
    cursor = c.connection.driver_connection.cursor()
    template = _sqlite_claim_sql()
    claimed: dict[str, Row] = {}
    for start in range(0, len(ids), 500):
        chunk = list(ids[start:start + 500])
        sql = template.replace("(:ids)", "(" + ", ".join("?" * len(chunk)) + ")")
        for tid, epoch, attempt, checkpoint in cursor.execute(sql, (stamp, stamp, owner, until, *chunk, stamp, owner)):
            claimed[tid] = {"lease_epoch": epoch, "attempt": attempt,
                            "checkpoint": None if checkpoint is None or checkpoint == "null" else json.loads(checkpoint)}
    return claimed


@functools.lru_cache(maxsize=1)
def _sqlite_claim_sql() -> str:
    """The claim statement of _claim_statement in qmark style, `(:ids)` left to expand per call."""
    sql = _claim_sql(_BLOCKING_DEPENDENCY["sqlite"]).replace("IN :ids", "IN (:ids)")
    return re.sub(r":(stamp|owner|until)\b", "?", sql)


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
                   stamp: str, webhook: Mapping[str, Any] | None) -> Row:
    """The tree's running execution, created (owned by `owner`) when there is none.

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
        row = _new_execution(tree_id, task_id, user_id, owner, until, stamp, webhook)
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
                status="pending", progress=0.0, result=None, error=None, started_at=None, completed_at=None,
                updated_at=stamp, execution_id=execution_id, attempt=0, next_attempt_at=None, checkpoint=None,
                lease_owner=None, lease_expires_at=None, interruptions=0)).rowcount
    c.execute(update(X).where(X.c.id == execution_id).values(updated_at=stamp))
    return joined


def _new_execution(tree_id: str, task_id: str, user_id: str | None, owner: str, until: str, stamp: str,
                   webhook: Mapping[str, Any] | None) -> Row:
    return {"id": uuid.uuid4().hex, "task_tree_id": tree_id, "task_id": task_id, "user_id": user_id,
            "status": "running", "final_status": None, "webhooks": [dict(webhook)] if webhook else [],
            "owner": owner, "epoch": 1, "lease_expires_at": until, "created_at": stamp, "updated_at": stamp,
            "ended_at": None}


def insert_tree(c: Connection, rows: Sequence[Mapping[str, Any]], user_id: str | None, owner: str, until: str,
                stamp: str, webhook: Mapping[str, Any] | None = None) -> Row:
    """A new tree and its execution in one transaction (IntegrityError when an id is taken: the
    tree's, or a running execution's of a tree with the same root id)."""
    root = rows[0]
    execution = _new_execution(root["task_tree_id"], root["id"], user_id, owner, until, stamp, webhook)
    c.execute(insert(X), execution)
    full = [with_defaults({**row, "execution_id": execution["id"]} if row["status"] == "pending" else row)
            for row in rows]
    if c.dialect.name == "sqlite":
        _sqlite_insert_tasks(c, full)
    elif c.dialect.driver == "asyncpg":
        _pg_insert_tasks(c, full)
    else:
        c.execute(insert(T), full)
    return execution


def _end_sql(p: str = "", execution: str = ":_id") -> str:
    """End an execution whose members are all settled, if it is still the one its owner saw at
    `version`; its final status from the stored members (`completed` only if every one is)."""
    return f"""
        UPDATE executions SET status = 'ended', ended_at = :{p}stamp, lease_expires_at = NULL,
               final_status = CASE WHEN EXISTS (SELECT 1 FROM tasks WHERE tasks.execution_id = executions.id
                                                AND (tasks.status <> 'completed') IS TRUE)
                                   THEN 'failed' ELSE 'completed' END
        WHERE id = {execution} AND owner = :{p}owner AND (status = 'running') IS TRUE AND updated_at = :{p}version
          AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.execution_id = executions.id
                          AND (tasks.status = 'in_progress') IS TRUE)
        RETURNING id, final_status"""


def end_execution(c: Connection, execution_id: str, owner: str, version: str, stamp: str) -> str | None:
    """End an execution whose members are all settled; returns its final status, or None when it
    cannot end now: a member is still in progress, or the execution changed (joined, taken over)
    since `version`."""
    row = c.execute(_end_statement(), {"_id": execution_id, "owner": owner, "version": version,
                                       "stamp": stamp}).first()
    return row.final_status if row else None


@functools.lru_cache(maxsize=1)
def _end_statement() -> Any:
    return text(_end_sql()).columns(X.c.id, X.c.final_status)


def renew(c: Connection, owner: str, task_ids: Sequence[str], execution_ids: Sequence[str],
          until: str) -> tuple[set[str], set[str]]:
    """Extend this instance's leases; returns the task and execution ids it still holds."""
    tasks: set[str] = set()
    for start in range(0, len(task_ids), 500):
        query = (update(T).where(T.c.id.in_(task_ids[start:start + 500]), T.c.status == "in_progress",
                                 T.c.lease_owner == owner).values(lease_expires_at=until).returning(T.c.id))
        tasks.update(c.execute(query).scalars())
    executions: set[str] = set()
    if execution_ids:
        query = (update(X).where(X.c.id.in_(list(execution_ids)), X.c.status == "running", X.c.owner == owner)
                 .values(lease_expires_at=until).returning(X.c.id))
        executions.update(c.execute(query).scalars())
    return tasks, executions


def expired_tasks(c: Connection, now: str | None) -> list[Row]:
    """Tasks in progress whose lease ran out before `now` (None: every task in progress)."""
    query = select(T).where(T.c.status == "in_progress")
    if now is not None:
        query = query.where((T.c.lease_expires_at.is_(None)) | (T.c.lease_expires_at < now))
    return [dict(row._mapping) for row in c.execute(query)]


def interrupt(c: Connection, row: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """End an attempt whose instance is gone: compare-and-set on the token that attempt held."""
    query = (update(T).where(T.c.id == row["id"], T.c.status == "in_progress",
                             T.c.lease_owner.is_(row["lease_owner"]) if row["lease_owner"] is None
                             else T.c.lease_owner == row["lease_owner"],
                             T.c.lease_epoch == row["lease_epoch"]).values(**values))
    return c.execute(query).rowcount > 0


def take_over(c: Connection, owner: str, until: str, stamp: str, only_expired: bool) -> list[Row]:
    """Executions whose owner's lease ran out (or every running one), now owned by `owner`."""
    now = stamp if only_expired else None
    query = select(X).where(X.c.status == "running")
    if now is not None:
        query = query.where((X.c.lease_expires_at.is_(None)) | (X.c.lease_expires_at < now))
    taken: list[Row] = []
    for found in [dict(row._mapping) for row in c.execute(query)]:
        if found["owner"] == owner and now is not None:
            continue  # our own lease lapsed while we were busy: the heartbeat deals with it
        changed = c.execute(update(X).where(X.c.id == found["id"], X.c.status == "running",
                                            X.c.epoch == found["epoch"])
                            .values(owner=owner, epoch=found["epoch"] + 1, lease_expires_at=until,
                                    updated_at=stamp)).rowcount
        if changed:
            taken.append({**found, "previous_owner": found["owner"], "owner": owner, "epoch": found["epoch"] + 1})
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
    query = (update(T).where(T.c.status == "in_progress", T.c.lease_owner == owner)
             .values(status=case((over, "failed"), else_="pending"), error=case((over, limit_error), else_=error),
                     completed_at=case((over, stamp), else_=None), updated_at=stamp, lease_owner=None,
                     lease_expires_at=None, attempt=case((over, T.c.attempt), else_=T.c.attempt - 1),
                     interruptions=T.c.interruptions + 1)
             .returning(T.c.id))
    released = list(c.execute(query).scalars())
    if execution_ids:
        c.execute(update(X).where(X.c.id.in_(list(execution_ids)), X.c.owner == owner, X.c.status == "running")
                  .values(lease_expires_at=stamp, updated_at=stamp))
    return released
