"""Every statement written as SQL text, named once, its dialect forms side by side.

Why a Python module and not a `queries.sql` file with a loader (procrastinate's way): a few of
these statements have a shape that varies with their arguments (the SET list of a fenced write,
the length of an IN list, the optional filters of a listing), and those are built here by small
cached functions from the same written-out text; a loader would need its own template language
for that. Each statement is a `Statement`: a one-line purpose, its SQLite form and its PostgreSQL
form, each in the driver's own positional style (`?1, ?2` for sqlite3, `$1, $2` for asyncpg and
SQLAlchemy's asyncpg dialect), both taking the same arguments in the same order, so a caller
never rewrites a statement's text. tests/test_statement_forms.py runs each form on its database
with the same rows and checks that they decide alike.

Written out twice where the dialects differ (the claim's dependency test: json_each against
json_array_elements with a LATERAL lookup), never derived from one another by text edits.

What is not here: statements written with SQLAlchemy Core (storage/executions.py,
storage/repository.py, storage/schedule_store.py, ...). SQLAlchemy compiles one definition for each
dialect, so they have no forms to keep alike; the tree read that two modules need is the one
Core query below (TREE_QUERY). On PostgreSQL the engine's claim, fenced writes and end of an
execution are parts of one statement, pass_statement (see its comment); on SQLite they are three.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from sqlalchemy import bindparam, select

from taskgrove.storage.models import JSON_COLUMNS, UNFINISHED
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import tasks_table as T


class Statement(NamedTuple):
    purpose: str
    sqlite: str | None  # None: PostgreSQL only (an advisory lock, the pass)
    postgresql: str | None  # None: SQLite only; on PostgreSQL the step is part of pass_statement

    def form(self, dialect: str) -> str:
        text = self.postgresql if dialect == "postgresql" else self.sqlite
        if text is None:
            raise ValueError(f"no {dialect} form: {self.purpose}")
        return text


def _marks(dialect: str, first: int, count: int) -> str:
    """`count` positional parameters from number `first`, in the dialect's style."""
    mark = "$" if dialect == "postgresql" else "?"
    return ", ".join(f"{mark}{n}" for n in range(first, first + count))


# --- reads of tasks: every column, in the table's order (what `select(tasks)` returns) --------

TASK_COLUMNS: tuple[str, ...] = tuple(column.name for column in T.c)
_SELECT = f"SELECT {', '.join(TASK_COLUMNS)} FROM tasks"

TASK_BY_ID = Statement("One task by id. Args: id.",
                       f"{_SELECT} WHERE id = ?1",
                       f"{_SELECT} WHERE id = $1")
TASK_TREE = Statement("The tasks of a tree, oldest first. Args: task_tree_id.",
                      f"{_SELECT} WHERE task_tree_id = ?1 ORDER BY created_at, id",
                      f"{_SELECT} WHERE task_tree_id = $1 ORDER BY created_at, id")
TASK_CHILDREN = Statement("The children of a task, oldest first. Args: parent_id.",
                          f"{_SELECT} WHERE parent_id = ?1 ORDER BY created_at, id",
                          f"{_SELECT} WHERE parent_id = $1 ORDER BY created_at, id")

# The same tree read in SQLAlchemy Core, for reads inside a transaction (repository.read_tree).
TREE_QUERY = select(T).where(T.c.task_tree_id == bindparam("tree_id")).order_by(T.c.created_at, T.c.id)


@functools.lru_cache(maxsize=64)
def tasks_by_ids(count: int) -> Statement:
    return Statement(f"The tasks of {count} ids. Args: the ids.",
                     f"{_SELECT} WHERE id IN ({_marks('sqlite', 1, count)})",
                     f"{_SELECT} WHERE id IN ({_marks('postgresql', 1, count)})")


@functools.lru_cache(maxsize=16)
def task_listing(by_user: bool, by_status: bool, after: bool = False) -> Statement:
    """Args: user_id (if by_user), status (if by_status), created_at and id of the row the page
    continues after (if after: keyset pagination, a range of the listing's index), limit, offset."""
    def form(dialect: str) -> str:
        mark = "$" if dialect == "postgresql" else "?"
        where = [f"{name} = " for name, wanted in (("user_id", by_user), ("status", by_status)) if wanted]
        if after:
            where.append("(created_at, id) < (")
        terms = [f"{term}{mark}{n}" for n, term in enumerate(where, 1)]
        if after:
            terms[-1] += f", {mark}{len(where) + 1})"
        clause = " WHERE " + " AND ".join(terms) if terms else ""
        n = len(where) + (1 if after else 0)
        return f"{_SELECT}{clause} ORDER BY created_at DESC, id DESC LIMIT {mark}{n + 1} OFFSET {mark}{n + 2}"

    return Statement("Tasks newest first, one page, optionally of a user and a status, optionally after a "
                     "row.", form("sqlite"), form("postgresql"))


# SQLite: two covering ranges of ix_tasks_user_status_created (user_id, status, ...), one per unfinished status.
# PostgreSQL: one range of ix_tasks_unfinished_user, the partial index of unfinished tasks (0016).
def _unfinished_count(owner_mark: str | None, limit_mark: str) -> str:
    """Unfinished tasks of the user at parameter `owner_mark` (None: tasks without a user),
    counted up to the bound at `limit_mark`."""
    who = "user_id IS NULL" if owner_mark is None else f"user_id = {owner_mark}"
    return f"SELECT count(*) AS n FROM (SELECT 1 FROM tasks WHERE {who} AND {UNFINISHED} LIMIT {limit_mark}) AS unfinished"


UNFINISHED_OF_USER = Statement("Unfinished tasks of a user, counted up to a bound. Args: user_id, at_most.",
                               _unfinished_count("?1", "?2"), _unfinished_count("$1", "$2"))
UNFINISHED_OF_NOBODY = Statement("Unfinished tasks without a user, counted up to a bound. Args: at_most.",
                                 _unfinished_count(None, "?1"), _unfinished_count(None, "$1"))

def unfinished_of(owner: str | None, at_most: int) -> tuple[Statement, tuple[Any, ...]]:
    """The count of `owner`'s unfinished tasks (None: the tasks without one) and its args."""
    return (UNFINISHED_OF_NOBODY, (at_most,)) if owner is None else (UNFINISHED_OF_USER, (owner, at_most))


# SQLite only, on the driver's cursor inside the pass's transaction: a group of same-shape fenced
# writes (executions._sqlite_fenced_writes) is undone as a whole when one of its writes was refused.
GROUP_SAVEPOINT = "SAVEPOINT fenced_group"
GROUP_RELEASE = "RELEASE fenced_group"
GROUP_UNDO = "ROLLBACK TO fenced_group"


# The usages of the tree `tree` names, as one JSON array made by the database (`label`: its column
# name, if any): written once per dialect, used alone (TREE_USAGES) and inside tasks.get's read
# (TASK_WITH_TREE_USAGES).
_SQLITE_USAGES_OF = ("SELECT json_group_array(json(u.usage)){label} FROM tasks AS u "
                     "WHERE u.task_tree_id = {tree} AND u.usage IS NOT NULL AND u.usage <> 'null'")
_PG_USAGES_OF = ("SELECT coalesce(json_agg(u.usage), '[]'::json)::text{label} FROM tasks AS u "
                 "WHERE u.task_tree_id = {tree} AND u.usage IS NOT NULL AND u.usage::text <> 'null'")

TREE_USAGES = Statement(
    "The `usage` of every task of a tree that has one, as one JSON array made by the database (one value "
    "to read, not a row per task; tasks.get shows their sum on a root). Args: task_tree_id.",
    _SQLITE_USAGES_OF.format(tree="?1", label=" AS usages"),
    _PG_USAGES_OF.format(tree="$1", label=" AS usages"))

TASK_WITH_TREE_USAGES = Statement(
    "TASK_BY_ID and, for a root, TREE_USAGES of its tree as `tree_usages` (NULL for a child): tasks.get in "
    "one read (one round trip on PostgreSQL; on SQLite one statement instead of two). Args: id.",
    f"SELECT {', '.join(TASK_COLUMNS)}, CASE WHEN parent_id IS NULL THEN "
    f"({_SQLITE_USAGES_OF.format(tree='t.task_tree_id', label='')}) END AS tree_usages FROM tasks AS t WHERE id = ?1",
    f"SELECT {', '.join(TASK_COLUMNS)}, CASE WHEN parent_id IS NULL THEN "
    f"({_PG_USAGES_OF.format(tree='t.task_tree_id', label='')}) END AS tree_usages FROM tasks AS t WHERE id = $1")

SERIALISE_TREE = Statement(
    "Make the transaction the only one changing a task's tree until it commits. Args: task id.",
    # the one write lock, taken before the transaction reads anything
    "UPDATE tasks SET id = id WHERE id = ?1",
    # an advisory lock on the tree id (which never changes)
    "SELECT pg_advisory_xact_lock(hashtext(task_tree_id)) FROM tasks WHERE id = $1")


# --- the engine's claim --------------------------------------------------------------------
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

@functools.lru_cache(maxsize=64)
def claim(count: int) -> Statement:
    """SQLite: claim `count` ids. Args: stamp, owner, until, then the ids (PostgreSQL: in pass_statement)."""
    return Statement(
        "Claim the pending tasks of these ids that may run now: a new lease and epoch each.",
        f"""
        UPDATE tasks SET {", ".join(f"{key} = {value}" for key, value in _SQLITE_CLAIM_SETS.items())}
        WHERE id IN ({_marks('sqlite', 4, count)}) AND {_SQLITE_CLAIMABLE}
        RETURNING id, lease_epoch, attempt, checkpoint""",
        None)


# What a claim sets (SQLite; ?1 stamp, ?2 owner, ?3 until) and when a task may be claimed (SQLite;
# ?1 stamp, ?2 owner): shared by claim and claim_and_write, so the two cannot drift apart. A task
# without dependencies (stored '[]', storage/json_text.py) skips the json_each of its dependency
# test, which would find nothing: SQLite stops at the OR's first true term.
_SQLITE_CLAIM_SETS: dict[str, str] = {
    "status": "'in_progress'", "progress": "0.0", "result": "NULL", "error": "NULL", "started_at": "?1",
    "completed_at": "NULL", "updated_at": "?1", "next_attempt_at": "NULL", "lease_owner": "?2",
    "lease_expires_at": "?3", "lease_epoch": "lease_epoch + 1", "attempt": "attempt + 1"}
_SQLITE_CLAIMABLE = """(status = 'pending') IS TRUE
          AND (next_attempt_at IS NULL OR next_attempt_at <= ?1)
          AND (SELECT e.status = 'running' AND e.owner = ?2 FROM executions AS e
               WHERE e.id = tasks.execution_id)
          AND (tasks.dependencies = '[]' OR NOT EXISTS (
              SELECT 1 FROM json_each(tasks.dependencies) AS d
              JOIN tasks AS x ON x.id = json_extract(d.value, '$.id')
              WHERE x.status = 'in_progress'
                 OR (coalesce(json_extract(d.value, '$.required'), 1) AND x.status <> 'completed')
                 OR (x.status = 'pending' AND x.execution_id = tasks.execution_id)))"""


@functools.lru_cache(maxsize=64)
def claim_and_write(keys: tuple[str, ...]) -> Statement:
    """SQLite: claim one task and write its outcome in one UPDATE (a pure task completed inline,
    agent/engine/inline.py): the claim's conditions and lease, and `keys` set as a fenced write
    right after that claim would set them, only if the claim gives exactly the epoch and attempt
    the caller predicted. The row ends as claim and fenced_write leave it, one row write instead
    of two. Args: stamp, owner, until, id, the predicted epoch and attempt, then the values of
    `keys` (PostgreSQL: rows of pass_statement)."""
    sets = {**_SQLITE_CLAIM_SETS, **{key: f"?{n}" for n, key in enumerate(keys, 7)}}
    return Statement(
        "Claim a pending task that may run now with the epoch and attempt predicted, and store the "
        "outcome decided for it.",
        f"""
        UPDATE tasks SET {", ".join(f"{key} = {value}" for key, value in sets.items())}
        WHERE id = ?4 AND lease_epoch + 1 = ?5 AND attempt + 1 = ?6 AND {_SQLITE_CLAIMABLE}
        RETURNING id, lease_epoch, attempt, checkpoint""",
        None)


# pass_statement's arguments (PASS_ARGS): $1 writes (a JSON array, see PG_WRITABLE), $2 their
# task ids, $3 owner, $4 ids to claim, $5 until, $6 stamp, $7 execution to end, $8 its version.
# Every part of one statement reads the table as it was before the statement: a dependency
# written in the same row (`written`, the pass statement's fenced writes) is read with the status
# that write gave it, so that a row may hold a pass's last writes and its claims together
# (storage/executions.py pg_step_params).
_PG_CLAIM = """
        UPDATE tasks SET status = 'in_progress', progress = 0.0, result = NULL, error = NULL,
               started_at = $6, completed_at = NULL, updated_at = $6, next_attempt_at = NULL,
               lease_owner = $3, lease_expires_at = $5, lease_epoch = lease_epoch + 1,
               attempt = attempt + 1
        WHERE id = ANY(CAST($4 AS text[])) AND (status = 'pending') IS TRUE
          AND (next_attempt_at IS NULL OR next_attempt_at <= $6)
          AND (SELECT e.status = 'running' AND e.owner = $3 FROM executions AS e
               WHERE e.id = tasks.execution_id)
          AND NOT EXISTS (
              SELECT 1 FROM json_array_elements(tasks.dependencies) AS d
              CROSS JOIN LATERAL (SELECT coalesce((SELECT n.status FROM written AS n WHERE n.id = x.id),
                                                  x.status) AS status, x.execution_id
                                  FROM tasks AS x WHERE x.id = d->>'id' LIMIT 1) AS x
              WHERE x.status = 'in_progress'
                 OR (coalesce((d->>'required')::boolean, true) AND x.status <> 'completed')
                 OR (x.status = 'pending' AND x.execution_id = tasks.execution_id))
        RETURNING id, lease_epoch, attempt, checkpoint"""


# --- the end of an execution ---------------------------------------------------------------
# An execution ends only when no member can still run: none in progress, and none pending that
# is not held back for good. The engine decides to end from its memory, which a change it has not
# read yet can contradict (a tasks.update that gave a pending member a dependency while the pass
# took it for runnable: its claim refused, the pass's end must be refused too, or nobody runs it).
# A pending member is held back for good when a dependency is pending in the same execution (that
# one is looked at on its own), or is required and neither completed nor in progress (failed,
# cancelled, pending outside the execution, missing): what the engine's TreeRun calls blocked.
# Any other pending member (a retry waiting for its time, a task whose dependencies are met or
# still running elsewhere) is work the execution still owes; the refused end makes the engine
# read the database again (engine/passes.py _end_runs, engine/run_keeper.py finish).

_SQLITE_UNSETTLED_MEMBER = """(SELECT 1 FROM tasks AS m WHERE m.execution_id = executions.id
                          AND ((m.status = 'in_progress') IS TRUE
                               OR ((m.status = 'pending') IS TRUE AND (m.dependencies = '[]' OR NOT EXISTS (
                                   SELECT 1 FROM json_each(m.dependencies) AS d
                                   LEFT JOIN tasks AS x ON x.id = json_extract(d.value, '$.id')
                                   WHERE (x.status = 'pending' AND x.execution_id = m.execution_id)
                                      OR (coalesce(json_extract(d.value, '$.required'), 1)
                                          AND coalesce(x.status, 'missing') NOT IN ('completed', 'in_progress')))))))"""

_PG_UNSETTLED_MEMBER = """(SELECT 1 FROM tasks AS m WHERE m.execution_id = executions.id
                          AND ((m.status = 'in_progress') IS TRUE
                               OR ((m.status = 'pending') IS TRUE AND NOT EXISTS (
                                   SELECT 1 FROM json_array_elements(m.dependencies) AS d
                                   LEFT JOIN tasks AS x ON x.id = d->>'id'
                                   WHERE (x.status = 'pending' AND x.execution_id = m.execution_id)
                                      OR (coalesce((d->>'required')::boolean, true)
                                          AND coalesce(x.status, 'missing') NOT IN ('completed', 'in_progress'))))))"""

END_EXECUTION = Statement(
    "End an execution none of whose members can still run (none in progress, none pending and not held "
    "back for good), if its owner still holds it at the version it saw; its final status `completed` only "
    "if every member is. Args: execution id, owner, version, stamp.",
    f"""
        UPDATE executions SET status = 'ended', ended_at = ?4, lease_expires_at = NULL,
               final_status = CASE WHEN EXISTS (SELECT 1 FROM tasks WHERE tasks.execution_id = executions.id
                                                AND (tasks.status <> 'completed') IS TRUE)
                                   THEN 'failed' ELSE 'completed' END
        WHERE id = ?1 AND owner = ?2 AND (status = 'running') IS TRUE AND updated_at = ?3
          AND NOT EXISTS {_SQLITE_UNSETTLED_MEMBER}
        RETURNING id, final_status""",
    None)

_PG_END = f"""
        UPDATE executions SET status = 'ended', ended_at = $6, lease_expires_at = NULL,
               final_status = CASE WHEN EXISTS (SELECT 1 FROM tasks WHERE tasks.execution_id = executions.id
                                                AND (tasks.status <> 'completed') IS TRUE)
                                   THEN 'failed' ELSE 'completed' END
        WHERE id = $7 AND owner = $3 AND (status = 'running') IS TRUE AND updated_at = $8
          AND NOT EXISTS {_PG_UNSETTLED_MEMBER}
        RETURNING id, final_status"""


# --- fenced writes ---------------------------------------------------------------------------
# What a fenced write may set (PG_WRITABLE, the PostgreSQL pass takes no other column).

PG_WRITABLE = ("status", "progress", "result", "error", "completed_at", "updated_at", "next_attempt_at",
               "lease_owner", "lease_expires_at", "token_success", "token_failed", "checkpoint",
               "waiting", "wake_at", "wait_answers", "usage")


@functools.lru_cache(maxsize=64)
def fenced_write(keys: tuple[str, ...]) -> Statement:
    """SQLite: set `keys` of one task. Args: their values, then id, owner, epoch (PostgreSQL: in
    pass_statement)."""
    assignments = ", ".join(f"{key} = ?{n}" for n, key in enumerate(keys, 1))
    n = len(keys)
    return Statement(
        "Write the values of an attempt if its instance still holds the task's lease at the same epoch.",
        f"UPDATE tasks SET {assignments} WHERE id = ?{n + 1} AND status = 'in_progress' AND lease_owner = ?{n + 2} "
        f"AND lease_epoch = ?{n + 3}",
        None)


@functools.lru_cache(maxsize=64)
def pg_type(key: str) -> str:
    """The type a column of `tasks` is read as from a JSON document: its own, text for JSON
    columns (they travel as their text, see tree_insert._pg_insert_tree)."""
    from sqlalchemy.dialects import postgresql  # the dialect's compiler only: no driver is loaded

    if key in JSON_COLUMNS:
        return "text"
    return T.c[key].type.compile(dialect=postgresql.dialect())


def _pg_assignment(bit: int, key: str) -> str:
    value = f"CAST(w.{key} AS json)" if key in JSON_COLUMNS else f"w.{key}"
    return f"{key} = CASE WHEN w._mask & {1 << bit} = 0 THEN t.{key} ELSE {value} END"


# --- the attempt history (storage/attempts.py) ------------------------------------------------

ATTEMPT_COLUMNS = ("task_id", "attempt", "queued_at", "started_at", "ended_at", "outcome", "error")
INSERT_ATTEMPT = Statement(
    "SQLite: add one attempt to a task's history (executemany). Args: ATTEMPT_COLUMNS. (PostgreSQL: "
    "the pass's `history` part, or SQLAlchemy Core elsewhere.)",
    f"INSERT INTO task_attempts ({', '.join(ATTEMPT_COLUMNS)}) VALUES ({_marks('sqlite', 1, 7)})",
    None)

# In the PostgreSQL pass an outcome's history row travels in its write's JSON object (the `_h_`
# keys, storage/executions.py pg_step_params) and is inserted only if the write was accepted.
PG_HISTORY_KEYS = ("_h_attempt", "_h_queued", "_h_started", "_h_ended", "_h_outcome", "_h_error")
_PG_HISTORY_FIELDS = ("_h_attempt integer, _h_queued text, _h_started text, _h_ended text, _h_outcome text, "
                      "_h_error text")
_PG_HISTORY = f"""
        INSERT INTO task_attempts ({', '.join(ATTEMPT_COLUMNS)})
        SELECT w._id, w._h_attempt, w._h_queued, w._h_started, w._h_ended, w._h_outcome, w._h_error
        FROM w JOIN written ON written.id = w._id WHERE w._h_outcome IS NOT NULL"""


# --- PostgreSQL: an engine pass as one statement -----------------------------------------------
# The fenced writes of a pass, then its claims, then the end of an execution, as the rows of one
# statement (storage/executions.py explains why); a row's claims see its own writes (_PG_CLAIM).
# Returns ('written', id) for each accepted write, ('claimed', id, lease_epoch, attempt,
# checkpoint) for each claimed task, ('ended', id, ..., final_status) for an ended execution.
# Bit `n` of a write's `_mask` says it sets PG_WRITABLE[n].

@functools.lru_cache(maxsize=1)
def pass_statement() -> Statement:
    assignments = ", ".join(_pg_assignment(bit, key) for bit, key in enumerate(PG_WRITABLE))
    fields = ", ".join(f"{key} {pg_type(key)}" for key in PG_WRITABLE)
    nothing = "NULL::integer, NULL::integer, NULL::json"
    return Statement(
        "PostgreSQL: one row of an engine pass: fenced writes (with their attempts' history), claims, "
        "the end of an execution. "
        "Args: see PASS_ARGS.",
        None,
        f"WITH w AS MATERIALIZED (SELECT * FROM json_to_recordset(CAST($1 AS json)) "
        f"AS w(_id text, _epoch integer, _mask integer, {fields}, {_PG_HISTORY_FIELDS})), "
        f"written AS (UPDATE tasks AS t SET {assignments} FROM w "
        "WHERE t.id = w._id AND t.id = ANY(CAST($2 AS text[])) "
        "AND (t.status = 'in_progress') IS TRUE AND t.lease_owner = $3 "
        "AND t.lease_epoch = w._epoch RETURNING t.id, t.status), "
        f"history AS ({_PG_HISTORY}), claimed AS ({_PG_CLAIM}), ended AS ({_PG_END}) "
        f"SELECT 'written' AS kind, id, {nothing}, NULL::text FROM written "
        "UNION ALL SELECT 'claimed', id, lease_epoch, attempt, checkpoint, NULL FROM claimed "
        f"UNION ALL SELECT 'ended', id, {nothing}, final_status FROM ended")


PASS_ARGS = ("writes", "write_ids", "owner", "claim_ids", "until", "stamp", "end_id", "version")


# --- inserting a tree's tasks ----------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def insert_tasks(json_as_text: bool = False) -> Statement:
    """Full rows of tasks. SQLite: args are one row's values in TASK_COLUMNS order (executemany).
    PostgreSQL: one arg, every row as one JSON array; `json_as_text`: its JSON columns as their
    text (a JSON string each, for values json_populate_recordset cannot read: a NUL)."""
    return Statement("Insert new tasks, every column given.",
                     f"INSERT INTO tasks ({', '.join(TASK_COLUMNS)}) VALUES ({_marks('sqlite', 1, len(TASK_COLUMNS))})",
                     _pg_insert_tasks(json_as_text))


def _pg_insert_tasks(json_as_text: bool, where: str = "") -> str:
    columns = ", ".join(TASK_COLUMNS)
    if not json_as_text:
        values = ", ".join(f"coalesce({key}, 'null'::json)" if key in JSON_COLUMNS else key for key in TASK_COLUMNS)
        source = "json_populate_recordset(NULL::tasks, CAST($1 AS json))"
    else:
        values = ", ".join(f"CAST(r.{key} AS json)" if key in JSON_COLUMNS else f"r.{key}" for key in TASK_COLUMNS)
        source = f"json_to_recordset(CAST($1 AS json)) AS r({', '.join(f'{k} {pg_type(k)}' for k in TASK_COLUMNS)})"
    return f"INSERT INTO tasks ({columns}) SELECT {values} FROM {source}{where}"


# A new tree's execution (storage/executions.py insert_tree); `webhooks`, its JSON column, as text.
EXECUTION_COLUMNS: tuple[str, ...] = tuple(column.name for column in X.c)
# With a quota, its args follow the execution's values: adding, limit, then the owner (a user).
QUOTA_ARGS_AT = 2 + len(EXECUTION_COLUMNS)


@functools.lru_cache(maxsize=8)
def insert_tree(json_as_text: bool = False, quota: str | None = None, history_arg: int = 0) -> Statement:
    """A new tree: its execution's row, and (PostgreSQL) its tasks in the same statement.

    SQLite: the execution's row only (args: its values in EXECUTION_COLUMNS order); the tasks
    follow with insert_tasks. PostgreSQL: $1 the tasks as insert_tasks takes them, then the
    execution's values: one statement, so one round trip, atomic even outside a transaction (a
    create then needs no BEGIN and COMMIT of its own: three round trips fewer than the execution,
    the tasks and the transaction's ends sent apart). With a `quota` ("user": the owner is a
    user; "nobody": tasks without one), the owner's unfinished tasks are counted first in the same
    statement (UNFINISHED_OF_*), nothing is inserted when `adding` more would pass `limit`, and
    the statement answers the count (args after the execution's: adding, limit, the user).
    `history_arg`: the number of a last argument holding attempt history rows to insert too, as
    a JSON array of ATTEMPT_COLUMNS objects (PostgreSQL; a tree stored with a task already
    completed, storage/tree_insert.py `done`)."""
    columns = ", ".join(EXECUTION_COLUMNS)
    values = ", ".join(f"CAST(${n} AS json)" if key == "webhooks" else f"${n}"
                       for n, key in enumerate(EXECUTION_COLUMNS, start=2))
    sqlite = f"INSERT INTO executions ({columns}) VALUES ({_marks('sqlite', 1, len(EXECUTION_COLUMNS))})"
    if quota is None:
        return Statement("Insert a new tree's execution (and, on PostgreSQL, its tasks).", sqlite,
                         f"WITH execution AS (INSERT INTO executions ({columns}) VALUES ({values})) "
                         + _pg_insert_history(history_arg, ", ", " ") + _pg_insert_tasks(json_as_text))
    adding, limit, owner = (f"${QUOTA_ARGS_AT + i}" for i in range(3))
    counted = _unfinished_count(owner if quota == "user" else None, limit)
    return Statement(
        "Insert a new tree's execution (and, on PostgreSQL, its tasks) if its owner's quota has room.", sqlite,
        f"WITH counted AS ({counted}), room AS (SELECT 1 FROM counted WHERE n + {adding} <= {limit}), "
        f"execution AS (INSERT INTO executions ({columns}) SELECT {values} FROM room), "
        + _pg_insert_history(history_arg, "", ", ", " WHERE EXISTS (SELECT 1 FROM room)")
        + f"inserted AS ({_pg_insert_tasks(json_as_text, ' WHERE EXISTS (SELECT 1 FROM room)')}) "
        "SELECT n FROM counted")


def _pg_insert_history(arg: int, before: str, after: str, where: str = "") -> str:
    """insert_tree's CTE adding the history rows of argument `arg` between `before` and `after`
    (nothing when `arg` is 0)."""
    if not arg:
        return ""
    columns = ", ".join(ATTEMPT_COLUMNS)
    return (f"{before}history AS (INSERT INTO task_attempts ({columns}) SELECT {columns} "
            f"FROM json_populate_recordset(NULL::task_attempts, CAST(${arg} AS json)){where}){after}")


# --- limited claims: concurrency keys and rate limits ------------------------------------------

COUNT_KEY = Statement(
    "Tasks of a concurrency key in progress. Args: key.",  # the IS NOT NULL lets the partial index serve it
    "SELECT count(*) FROM tasks WHERE concurrency_key = ?1 AND concurrency_key IS NOT NULL "
    "AND status = 'in_progress'",
    "SELECT count(*) FROM tasks WHERE concurrency_key = $1 AND concurrency_key IS NOT NULL "
    "AND status = 'in_progress'")
LOCK_KEY = Statement("Serialise the claims of a concurrency key until the transaction ends. Args: key.",
                     None, "SELECT pg_advisory_xact_lock(hashtext($1))")
ADD_RATE = Statement("The row of a rate-limit key, added free when missing. Args: key, stamp.",
                     "INSERT INTO rate_limits (key, next_at, updated_at) VALUES (?1, ?2, ?2) "
                     "ON CONFLICT (key) DO NOTHING",
                     "INSERT INTO rate_limits (key, next_at, updated_at) VALUES ($1, $2, $2) "
                     "ON CONFLICT (key) DO NOTHING")
READ_RATE = Statement("When a rate-limit key allows its next start, its row locked. Args: key.",
                      "SELECT next_at FROM rate_limits WHERE key = ?1",  # one writer: nothing to lock
                      "SELECT next_at FROM rate_limits WHERE key = $1 FOR UPDATE")
MOVE_RATE = Statement("Set when a rate-limit key allows its next start. Args: key, next_at, stamp.",
                      "UPDATE rate_limits SET next_at = ?2, updated_at = ?3 WHERE key = ?1",
                      "UPDATE rate_limits SET next_at = $2, updated_at = $3 WHERE key = $1")


# --- retention (agent/services/retention_service.py) -------------------------------------------------------------

# One sweeper at a time across instances: a session lock held for one sweep (the migrations' lock,
# 74251, is a transaction lock on another key). SQLite has one writer anyway: no form.
SWEEP_LOCK = Statement("Take the retention sweeper's lock if free: true when taken. No args.",
                       None, "SELECT pg_try_advisory_lock(74252)")
SWEEP_UNLOCK = Statement("Release the retention sweeper's lock. No args.",
                         None, "SELECT pg_advisory_unlock(74252)")


# --- between instances: LISTEN/NOTIFY (agent/engine/notify.py) ---------------------------------
# PostgreSQL only: one instance on SQLite has no one to tell.

COUNT_LISTENERS = Statement(
    "Other instances listening: connections named as every instance names its listening one, or (an "
    "older instance) whose last statement was the LISTEN. Args: own listener's pid, that name, the LISTEN "
    "statement's text.",
    None,
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1 "
    "AND (application_name = $2 OR query = $3)")
NOTIFY_ALL = Statement("Send every payload on a channel, one statement. Args: channel, payloads (text[]).",
                       None, "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
NOTIFY_ONE = Statement("Send one payload on a channel. Args: channel, payload.",
                       None, "SELECT pg_notify($1, $2)")


# --- migrations (storage/db.py) ---------------------------------------------------------------

MIGRATION_VERSION = Statement("The migration the database is at (Alembic's table). No args.",
                              "SELECT version_num FROM alembic_version",
                              "SELECT version_num FROM alembic_version")
# SQLite: a new, empty database gets the newest schema (storage/sqlite_schema.py) in one transaction
# that holds the write lock; the driver leaves DDL outside transactions, hence the explicit BEGIN.
WRITE_LOCK = Statement("Begin a transaction holding the write lock. No args.", "BEGIN IMMEDIATE", None)
SCHEMA_OBJECTS = Statement("How many tables, indexes, ... the database holds. No args.",
                           "SELECT count(*) FROM sqlite_master", None)
SET_MIGRATION_VERSION = Statement("Record the migration the new schema is at. Args: revision.",
                                  "INSERT INTO alembic_version (version_num) VALUES (?)", None)
# Every SQLite connection's settings: WAL so readers never block the writer, a busy timeout instead
# of instant "database is locked" errors, foreign keys on; a connection of the event loop's thread
# adds LOOP_PRAGMAS (storage/db.py create_loop_engine says why).
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA busy_timeout=30000", "PRAGMA foreign_keys=ON",
                  "PRAGMA synchronous=NORMAL")
LOOP_PRAGMAS = ("PRAGMA busy_timeout=0", "PRAGMA wal_autocheckpoint=0")
