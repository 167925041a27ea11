"""Table definitions. The migrations in storage/migrations create exactly these tables.

Timestamps are ISO 8601 strings in UTC with a fixed width (`2026-11-21T06:32:13.123456+00:00`):
they sort correctly as text on every backend and go to the wire unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Table, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Defined in storage/status.py (no imports, for light clients); storage.fields, trees and executions
# import them from here.
from taskgrove.storage.status import TASK_STATUSES, TaskStatus  # noqa: F401


class Base(DeclarativeBase):
    pass


ORIGIN_TYPES = ("own", "clone", "reference", "link", "archive")
# A task that is not finished yet (SERVICE_MAX_PENDING_PER_USER counts these), and the same as SQL
# (storage.statements.UNFINISHED_OF_USER).
UNFINISHED_STATUSES = (TaskStatus.PENDING.value, TaskStatus.IN_PROGRESS.value)
UNFINISHED = f"status IN ({', '.join(repr(s) for s in UNFINISHED_STATUSES)})"


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(1024))
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    parent_id: Mapped[str | None] = mapped_column(
        String(64),
        ForeignKey("tasks.id", deferrable=True, initially="DEFERRED"),
        nullable=True,
    )
    task_tree_id: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer, default=1)
    dependencies: Mapped[list] = mapped_column(JSON, default=list)
    inputs: Mapped[dict] = mapped_column(JSON, default=dict)
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    schemas: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default=TaskStatus.PENDING.value)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    result: Mapped[object | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))
    started_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    completed_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    product_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    token_success: Mapped[int] = mapped_column(Integer, default=0)
    token_failed: Mapped[int] = mapped_column(Integer, default=0)
    original_task_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    has_copy: Mapped[bool] = mapped_column(Boolean, default=False)
    has_references: Mapped[bool] = mapped_column(Boolean, default=False)
    origin_type: Mapped[str] = mapped_column(String(16), default="own")
    # Custom fields a deployment supplies at creation that have no column of their own.
    extra: Mapped[dict] = mapped_column(JSON, default=dict)
    # Which instance runs the task and until when (scale-out: an expired lease means a dead owner).
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Fencing token, with lease_owner: every engine write for a claimed task compares both.
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    # Retry policy (engine/retry_policy.py), attempts started so far, and when the next one is due.
    retry: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    timeout_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The latest checkpoint an executor stored; the next attempt resumes from it.
    checkpoint: Mapped[object | None] = mapped_column(JSON, nullable=True)
    # The execution (executions table) that wants this task run; NULL when none does.
    execution_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Attempts cut off by the platform (crash, lost lease, shutdown past its grace): they do not
    # use up `retry.max_attempts`; past SERVICE_MAX_INTERRUPTIONS the task fails.
    interruptions: Mapped[int] = mapped_column(Integer, default=0)
    # Sharing the service (README, "Sharing the service"): at most `limit` tasks of a key in
    # progress at once, attempts of a key no faster than a rate. `concurrency_key` repeats the
    # key of `concurrency` so the tasks of a key in progress are counted through an index.
    concurrency: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    rate_limit: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    concurrency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Durable waits (docs/waits.md, agent/engine/waits.py). JSON text in plain text columns, SQL
    # NULL when unused, so a task that never waits stores, writes and decodes nothing more:
    # `waiting`, the wait its attempt is parked on; `wait_answers`, the answers of that attempt's
    # earlier waits in call order; `wake_at`, when the wait times out (NULL: never).
    waiting: Mapped[str | None] = mapped_column(Text, nullable=True)
    wait_answers: Mapped[str | None] = mapped_column(Text, nullable=True)
    wake_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Costs and budgets (docs/costs.md, migration 0012): `usage`, what the task's LLM calls used
    # over all its attempts ({prompt_tokens, completion_tokens, total_tokens, cost_usd, calls});
    # `budget`, the limit its subtree's calls are held to. NULL for a task without LLM work.
    usage: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    budget: Mapped[dict | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        # Children only: a root is found through ix_tasks_roots_* (migration 0013).
        Index("ix_tasks_parent_id", "parent_id", sqlite_where=text("parent_id IS NOT NULL"),
              postgresql_where=text("parent_id IS NOT NULL")),
        # tasks.list by user, newest first, by offset or cursor; every lookup by user (migration 0013).
        Index("ix_tasks_user_created", "user_id", "created_at", "id"),
        # tasks.list by status, newest first, by offset or cursor; counts by status use the prefix (0017).
        Index("ix_tasks_status_created", "status", "created_at", "id"),
        # tasks.list by user and status, likewise; on SQLite SERVICE_MAX_PENDING_PER_USER counts a
        # user's unfinished tasks as two ranges of it (agent/services/admission.py, migration 0017).
        Index("ix_tasks_user_status_created", "user_id", "status", "created_at", "id"),
        # PostgreSQL only: the same count through an index of unfinished tasks alone, which its
        # planner takes with or without statistics and which finished tasks never cost (0016).
        Index("ix_tasks_unfinished_user", "user_id", postgresql_where=text(UNFINISHED)).ddl_if(dialect="postgresql"),
        # The list of everything, newest first: (created_at, id) is its order and its cursor (0013).
        Index("ix_tasks_created_at", "created_at", "id"),
        Index("ix_tasks_task_tree_id", "task_tree_id"),
        Index("ix_tasks_execution_id", "execution_id"),
        Index("ix_tasks_concurrency_key", "concurrency_key", "status", sqlite_where=text("concurrency_key IS NOT NULL"),
              postgresql_where=text("concurrency_key IS NOT NULL")),
        # Only parked tasks are in these: the waits of a user (events.emit) and tasks.list `waiting`
        # by user and overall, newest first (0020), the waits that time out.
        Index("ix_tasks_waiting_user", "user_id", "created_at", "id", sqlite_where=text("waiting IS NOT NULL"),
              postgresql_where=text("waiting IS NOT NULL")),
        Index("ix_tasks_waiting_created", "created_at", "id", sqlite_where=text("waiting IS NOT NULL"),
              postgresql_where=text("waiting IS NOT NULL")),
        Index("ix_tasks_wake_at", "wake_at", sqlite_where=text("wake_at IS NOT NULL"),
              postgresql_where=text("wake_at IS NOT NULL")),
        # Roots only (one per tree, columns that never change): root-only pages, overall and per
        # user, and the retention sweeper's walk over the oldest trees. On SQLite both also hold
        # `name` last, so a search of the tree list tests names on the index (0021, SQLite only).
        Index("ix_tasks_roots_created", "created_at", "id", sqlite_where=text("parent_id IS NULL"),
              postgresql_where=text("parent_id IS NULL")),
        Index("ix_tasks_roots_user", "user_id", "created_at", "id", sqlite_where=text("parent_id IS NULL"),
              postgresql_where=text("parent_id IS NULL")),
    )


class Execution(Base):
    """An execution request as state: a restarted or surviving instance continues it from here."""

    __tablename__ = "executions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_tree_id: Mapped[str] = mapped_column(String(64))
    task_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    status: Mapped[str] = mapped_column(String(16))  # running | ended
    final_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    webhooks: Mapped[list] = mapped_column(JSON, default=list)
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))
    ended_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # The W3C trace context its spans belong to (agent/foundations/tracing.py; migration 0010).
    traceparent: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (Index("ix_executions_status_lease", "status", "lease_expires_at"),
                      Index("ix_executions_task_tree_id", "task_tree_id"))


class LlmUsageDaily(Base):
    """LLM usage per user and UTC day (docs/costs.md): summed as each call ends, read by
    `usage.get` and the per-user daily budget. `user_id` is '' for calls without a user.
    `cost_usd` sums the priced calls; `unpriced_calls` counts those litellm has no price for."""

    __tablename__ = "llm_usage_daily"

    user_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    total_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    unpriced_calls: Mapped[int] = mapped_column(Integer, default=0)


class UserBudget(Base):
    """A user's own daily LLM budget, set by an admin (config.budget.set); it replaces
    SERVICE_USER_DAILY_BUDGET_USD / _TOKENS for that user. NULL: no limit of that kind."""

    __tablename__ = "user_budgets"

    user_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_cost_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[str] = mapped_column(String(40))


class Event(Base):
    """An event emitted by `events.emit` (agent/waits.py): kept, so that a wait that began just
    before it and parks just after it was emitted still finds it (docs/waits.md, "Which events
    count"), until retention deletes it (docs/retention.md)."""

    __tablename__ = "events"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    name: Mapped[str] = mapped_column(String(255))
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[str] = mapped_column(String(40))

    # By user and name: the events a wait counts. By age: retention's walk over the oldest (0015).
    __table_args__ = (Index("ix_events_user_name_created", "user_id", "name", "created_at"),
                      Index("ix_events_created", "created_at", "id"))


class TaskLog(Base):
    """One log line of an attempt (task logs, storage/log_store.py): what its executor logged, a command's
    output, a REST call. `seq` orders every line (one counter for all tasks, so no instance needs to
    know another's lines to number its own); rows go with their task (TaskRepository.delete)."""

    __tablename__ = "task_logs"

    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                     autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[str] = mapped_column(String(40))
    stream: Mapped[str] = mapped_column(String(8))  # log | stdout | stderr | http
    level: Mapped[str | None] = mapped_column(String(16), nullable=True)
    text: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_task_logs_task_seq", "task_id", "seq"),)
class TaskAttempt(Base):
    """One attempt of a task, kept after the task row moved on to the next (the timeline,
    docs/observability.md). Written in the engine's pass transaction with the outcome
    (storage/attempts.py); deleted with its task."""

    __tablename__ = "task_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    queued_at: Mapped[str | None] = mapped_column(String(40), nullable=True)  # runnable since
    started_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    ended_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # completed | failed | retry | interrupted | cancelled | waiting
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_task_attempts_task_id", "task_id"),)


class RateLimit(Base):
    """Per rate-limit key, the earliest moment the next attempt of that key may start."""

    __tablename__ = "rate_limits"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    next_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))


class LLMKey(Base):
    """Per-user, per-provider LLM keys, encrypted at rest (see agent/auth keys)."""

    __tablename__ = "llm_keys"

    user_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))


class IdempotencyKey(Base):
    """The first answer to a request sent with an `Idempotency-Key` header (storage/idempotency.py)."""

    __tablename__ = "idempotency_keys"

    owner: Mapped[str] = mapped_column(String(255), primary_key=True)  # the caller's user id, "" for none
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    method: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))  # of the params: the same key, another request?
    answer: Mapped[object | None] = mapped_column(JSON, nullable=True)  # NULL while the first is in flight
    created_at: Mapped[str] = mapped_column(String(40))


class Schedule(Base):
    """A template tree run on a cron expression or an interval (agent/services/schedule_service.py, storage/schedule_store.py).

    `next_run_at` is the slot the next run is due at; claiming it is one compare-and-set on this
    column (storage/schedule_store.claim_slot), so each slot runs once whatever the number of instances.
    """

    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64))  # the root of the template tree
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the template's owner
    cron: Mapped[str | None] = mapped_column(String(255), nullable=True)
    interval_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    max_runs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    end_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    overlap: Mapped[str] = mapped_column(String(16), default="skip")  # skip | allow
    catch_up: Mapped[str] = mapped_column(String(16), default="latest")  # latest | none
    webhook_config: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    next_run_at: Mapped[str | None] = mapped_column(String(40), nullable=True)  # NULL: no more runs
    last_run_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    last_slot: Mapped[str | None] = mapped_column(String(40), nullable=True)  # slot of the latest run
    last_root_task_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)  # slots consumed without a run (overlap, catch-up)
    last_skipped_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))

    __table_args__ = (
        Index("ix_schedules_due", "enabled", "next_run_at"),
        Index("ix_schedules_user_id", "user_id"),
    )


# Each model's Table (declarative models type `__table__` as the wider FromClause).
tasks_table = cast(Table, Task.__table__)
schedules_table = cast(Table, Schedule.__table__)
llm_keys_table = cast(Table, LLMKey.__table__)
executions_table = cast(Table, Execution.__table__)
idempotency_table = cast(Table, IdempotencyKey.__table__)
rate_limits_table = cast(Table, RateLimit.__table__)
events_table = cast(Table, Event.__table__)
task_logs_table = cast(Table, TaskLog.__table__)
task_attempts_table = cast(Table, TaskAttempt.__table__)
llm_usage_daily_table = cast(Table, LlmUsageDaily.__table__)
user_budgets_table = cast(Table, UserBudget.__table__)

# The columns of `tasks` holding JSON, from the table itself: stored as json.dumps text, read
# back through jsonvalues.read_stored (which may yield Unreadable).
JSON_COLUMNS: frozenset[str] = frozenset(column.name for column in tasks_table.c if isinstance(column.type, JSON))

# Columns the wire shows for a task, in the order SPEC.md lists them.
TASK_FIELDS = (
    "id", "name", "description", "user_id", "parent_id", "priority", "dependencies", "inputs",
    "params", "schemas", "status", "progress", "result", "error", "created_at", "updated_at",
    "started_at", "completed_at", "product_id", "token_success", "token_failed",
    "original_task_id", "has_copy", "has_references", "origin_type", "task_tree_id",
    "retry", "timeout_seconds", "attempt", "next_attempt_at", "interruptions", "concurrency", "rate_limit",
    "usage", "budget",
)


# What a new task row holds where its definition says nothing (executemany needs every key).
_DEFAULTS: dict[str, Any] = {
    "description": None, "user_id": None, "parent_id": None, "priority": 1, "dependencies": [],
    "inputs": {}, "params": {}, "schemas": {}, "status": TaskStatus.PENDING.value, "progress": 0.0,
    "result": None, "error": None, "started_at": None, "completed_at": None,
    "product_id": None, "token_success": 0, "token_failed": 0, "original_task_id": None,
    "has_copy": False, "has_references": False, "origin_type": "own", "extra": {},
    "lease_owner": None, "lease_expires_at": None, "lease_epoch": 0, "retry": None, "attempt": 0,
    "next_attempt_at": None, "timeout_seconds": None, "checkpoint": None, "execution_id": None,
    "interruptions": 0, "concurrency": None, "rate_limit": None, "concurrency_key": None,
    "waiting": None, "wait_answers": None, "wake_at": None, "usage": None, "budget": None,
}


_TASK_COLUMNS = frozenset(tasks_table.c.keys())


def with_defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    """A full row for `row`: every column present, unknown keys dropped. A row holding columns
    only (every new tree's, from storage/new_tree.py) is merged at C speed, without a Python step
    per key (a 1000-task insert makes a thousand)."""
    if _TASK_COLUMNS.issuperset(row):
        return {**_DEFAULTS, **row}
    return {**_DEFAULTS, **{k: v for k, v in row.items() if k in _TASK_COLUMNS}}
