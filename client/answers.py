"""One typed model per answer of the service, so that a caller reads `tree.children[0].status`,
never `answer["children"][0]["status"]`.

Why pydantic: the answers are nested JSON (a tree of tasks, each with its wait and retry policy);
pydantic checks each answer against its model as it is read, and gives mypy real attribute types.

Why `extra="allow"`: a newer service may add a field; an older client keeps working and keeps the
field (in `model_extra`), instead of failing on every read. The other direction is guarded by
`tests/test_client_answers.py`: it calls every method on a real service and fails when an answer
holds a field no model declares (or a model declares one the service never sends), so the models
cannot drift from the service unnoticed.

Timestamps stay the ISO 8601 strings the service sends (SPEC.md types them as strings): `dump()`
then gives back exactly the JSON the service answered, which the command line prints for scripts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

JSON = Any  # any JSON value: a task's inputs, result, an answer to a wait


class TaskStatus(str, enum.Enum):
    """A task's stored status (SPEC.md, States and transitions). A `str` subclass: a member equals its text."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """Completed, failed or cancelled: the task will not change by itself any more."""
        return self in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class Model(BaseModel):
    """Base of every answer: frozen (an answer is a fact about a moment), unknown fields kept."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        """The answer as the service sent it (JSON types, the service's field names, only the
        fields it sent): what `taskgrove ... --json` prints."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --- tasks -------------------------------------------------------------------------------------


class Dependency(Model):
    """A task this one runs after; `required: false` lets it run even if that task fails."""

    id: str
    required: bool = True


class Wait(Model):
    """What a parked task waits for (docs/waits.md): an answer (`kind` "input"), an event, or a time."""

    kind: str
    prompt: str | None = None
    json_schema: JSON = Field(default=None, alias="schema")
    since: str | None = None
    deadline: str | None = None
    event: str | None = None
    match: dict[str, JSON] | None = None

    @property
    def wants_input(self) -> bool:
        """True when `respond` answers it (the other kinds end by an event or by time)."""
        return self.kind == "input"


class RetryPolicy(Model):
    """How a failed attempt is tried again (docs/failures.md)."""

    max_attempts: int
    backoff: str
    base_seconds: float
    max_seconds: float
    jitter: bool


class UsageTotals(Model):
    """LLM tokens and cost, summed (per attempt, tree, day or user; docs/costs.md)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None
    calls: int = 0


class Task(Model):
    """One task as the service stores it (SPEC.md, Task, plus the fields of docs/jsonrpc.md)."""

    id: str
    name: str
    description: str | None = None
    user_id: str | None = None
    parent_id: str | None = None
    priority: int = 1
    dependencies: list[Dependency] = Field(default_factory=list)
    inputs: dict[str, JSON] = Field(default_factory=dict)
    params: dict[str, JSON] = Field(default_factory=dict)
    schemas: dict[str, JSON] = Field(default_factory=dict)
    status: TaskStatus
    progress: float = 0.0
    result: JSON = None
    error: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    product_id: str | None = None
    token_success: int = 0
    token_failed: int = 0
    original_task_id: str | None = None
    has_copy: bool = False
    has_references: bool = False
    origin_type: str = "own"
    task_tree_id: str | None = None
    retry: RetryPolicy | None = None
    timeout_seconds: float | None = None
    attempt: int | None = None
    next_attempt_at: str | None = None
    interruptions: int | None = None
    concurrency: JSON = None
    rate_limit: JSON = None
    usage: UsageTotals | None = None
    budget: JSON = None
    waiting: Wait | None = None
    # Only in some answers: tasks.get of a pending task held back by a key or rate (`waiting_for`),
    # tasks.get of a root and tasks.tree (`tree_usage`), tasks.list with roots only (`status_counts`).
    waiting_for: str | None = None
    tree_usage: UsageTotals | None = None
    status_counts: dict[str, int] | None = None

    @property
    def executor(self) -> str | None:
        """The executor id (`schemas.method`)."""
        method = self.schemas.get("method")
        return method if isinstance(method, str) else None


class TaskTree(Task):
    """A task with its `children`, recursively: the answer of tasks.create, tasks.tree, copy, clone."""

    children: list[TaskTree] = Field(default_factory=list)

    def walk(self) -> Iterator[TaskTree]:
        """Every task of the tree, parents before their children (iterative: a tree may be deep)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def find(self, task_id: str) -> TaskTree:
        """The task of this tree with id `task_id` (KeyError when it is not in the tree)."""
        for node in self.walk():
            if node.id == task_id:
                return node
        raise KeyError(task_id)

    @property
    def statuses(self) -> dict[str, TaskStatus]:
        """Every task's status, by id."""
        return {node.id: node.status for node in self.walk()}

    @property
    def waiting_for_input(self) -> list[TaskTree]:
        """The tasks of the tree that wait for an answer (`respond`)."""
        return [node for node in self.walk() if node.waiting is not None and node.waiting.wants_input]


class TaskPage(Model):
    """One page of tasks.list; pass `next_cursor` for the next (None: the last page)."""

    tasks: list[Task]
    next_cursor: str | None = None


class ClonePreview(Model):
    """tasks.clone with `save: false`: the tasks a clone would store, nothing stored (ready for create)."""

    tasks: list[Task]
    saved: bool = False


class Execution(Model):
    """tasks.execute: the execution started (it returns right after starting)."""

    success: bool
    protocol: str = "jsonrpc"
    root_task_id: str
    task_id: str
    original_task_id: str | None = None
    status: str
    message: str | None = None
    streaming: bool | None = None
    webhook_url: str | None = None


class TokenUsage(Model):
    total_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Cancellation(Model):
    """One task's answer of tasks.cancel: `status` "cancelled", or "failed" (already finished) /
    "error" (not found), with why in `message`."""

    task_id: str
    status: str
    message: str | None = None
    force: bool = False
    token_usage: TokenUsage | None = None
    result: JSON = None
    error: str | None = None

    @property
    def cancelled(self) -> bool:
        return self.status == TaskStatus.CANCELLED.value


class Deletion(Model):
    """tasks.delete: how many tasks went (the task and its descendants)."""

    success: bool
    task_id: str
    deleted_count: int
    children_deleted: int


class Attempt(Model):
    """One call of a task's executor (tasks.attempts), oldest first; `outcome` "running" for the current one."""

    task_id: str
    attempt: int
    queued_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    outcome: str
    error: str | None = None
    queued_ms: float | None = None
    ran_ms: float | None = None


class LogLine(Model):
    """One line of a task's log (tasks.logs): what its executor wrote, on which stream, when."""

    seq: int
    attempt: int
    at: str
    stream: str
    level: str | None = None
    text: str


class LogPage(Model):
    task_id: str
    lines: list[LogLine]
    next_after: int | None = None


class Answer(Model):
    """tasks.respond: the wait answered; the task resumes."""

    task_id: str
    status: str
    wait: Wait | None = None


class Emitted(Model):
    """events.emit: the event stored and the waits it resumed."""

    event_id: str
    name: str
    user_id: str | None = None
    created_at: str
    resumed: int
    task_ids: list[str]
    triggered: int | None = None  # how many triggers took the event in (docs/triggers.md)


class RunningStatus(Model):
    """tasks.running.status: one task's status, or `not_found` / `permission_denied`."""

    task_id: str
    context_id: str | None = None
    status: str
    progress: float | None = None
    name: str | None = None
    error: str | None = None
    is_running: bool | None = None
    started_at: str | None = None
    updated_at: str | None = None


class RunningCount(Model):
    count: int
    user_id: str | None = None


class Purge(Model):
    """tasks.purge: what one retention sweep deleted (`swept` False: another instance was sweeping)."""

    swept: bool
    trees: int = 0
    tasks: int = 0
    idempotency_records: int = 0
    events: int = 0
    trigger_events: int = 0  # handled inbox rows of triggers (docs/triggers.md)
    older_than: float | None = None


class UsageDay(UsageTotals):
    day: str


class Usage(Model):
    """usage.get: a user's LLM usage today and per day."""

    user_id: str | None = None
    today: UsageTotals
    days: list[UsageDay]


class BudgetRemaining(Model):
    tokens: int | None = None
    cost_usd: float | None = None


class Budget(Model):
    """config.budget.get / set: a user's daily LLM budget, today's usage and what is left."""

    user_id: str | None = None
    source: str
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    today: UsageTotals
    remaining: BudgetRemaining | None = None


# --- schedules ----------------------------------------------------------------------------------


class Schedule(Model):
    """A schedule (docs/schedules.md): when the stored tree `task_id` runs again."""

    id: str
    task_id: str
    user_id: str | None = None
    cron: str | None = None
    interval_seconds: float | None = None
    timezone: str | None = None
    enabled: bool
    max_runs: int | None = None
    start_at: str | None = None
    end_at: str | None = None
    overlap: str | None = None
    catch_up: str | None = None
    webhook_config: dict[str, JSON] | None = None
    next_run_at: str | None = None
    last_run_at: str | None = None
    last_slot: str | None = None
    last_root_task_id: str | None = None
    runs: int = 0
    skipped: int = 0
    last_skipped_at: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    # schedules.trigger: the tree this run created.
    root_task_id: str | None = None


class ScheduleRun(Model):
    """One run of a schedule (schedules.runs), newest first."""

    root_task_id: str
    name: str | None = None
    status: str
    slot: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    final_status: str | None = None
    duration_ms: float | None = None


class ScheduleDeletion(Model):
    success: bool
    schedule_id: str


# --- keys, system ---------------------------------------------------------------------------------


class LlmKeyStatus(Model):
    """config.llm_key.get: whether a key is stored (never the key itself)."""

    has_key: bool
    user_id: str | None = None
    provider: str | None = None
    providers: dict[str, bool] = Field(default_factory=dict)


class LlmKeyStored(Model):
    success: bool
    user_id: str | None = None
    provider: str | None = None


class LlmKeyDeleted(Model):
    success: bool
    user_id: str | None = None
    deleted: bool
    provider: str | None = None


class Health(Model):
    status: str
    message: str | None = None
    version: str | None = None
    timestamp: str | None = None
    running_tasks_count: int | None = None


class ExecutorInfo(Model):
    id: str
    name: str
    extension: str | None = None
    description: str | None = None


class Executors(Model):
    executors: list[ExecutorInfo]
    count: int
    restricted: bool = False
    allowed_ids: list[str] | None = None


# --- live events (watch) --------------------------------------------------------------------------

EventType = Literal["task_status", "task_progress", "task_completed", "task_failed", "final"]
AnswerT = TypeVar("AnswerT")


class EventData(Model):
    """The `data` of a /ws message (docs/live-updates.md); `statuses` only on the `final` event."""

    status: TaskStatus
    progress: float | None = None
    name: str | None = None
    message: str | None = None
    timestamp: str | None = None
    snapshot: bool | None = None
    waiting: Wait | None = None
    result: JSON = None
    error: str | None = None
    statuses: dict[str, TaskStatus] | None = None


class Event(Model, Generic[AnswerT]):
    """One change of a watched tree, with the event names of docs/live-updates.md: `task_status`
    (started, or a task's state when watching began: `snapshot`), `task_progress`,
    `task_completed`, `task_failed` (failed or cancelled), and last `final` (the tree settled;
    `data.statuses` has every task's status). A task that starts waiting for an answer is a
    `task_status` whose `waiting` wants input: answer it with `respond(value)`.

    `AnswerT` is what `respond` returns: a coroutine to await from an AsyncClient's watch, the
    Answer itself from a Client's."""

    type: EventType
    task_id: str
    context_id: str | None = None
    data: EventData

    _responder: Callable[[str, JSON], AnswerT] | None = PrivateAttr(default=None)
    # Another event of a wait this watch announced already (a progress event published after the
    # park carries the wait too): `wants_input` is False, so a loop answers each question once.
    _repeat: bool = PrivateAttr(default=False)

    @property
    def tree_id(self) -> str | None:
        """The tree's root task id (the wire's `context_id`)."""
        return self.context_id

    @property
    def status(self) -> TaskStatus:
        return self.data.status

    @property
    def progress(self) -> float | None:
        return self.data.progress

    @property
    def waiting(self) -> Wait | None:
        return self.data.waiting

    @property
    def is_final(self) -> bool:
        return self.type == "final"

    @property
    def wants_input(self) -> bool:
        """True when this task now waits for an answer: call `respond(value)`. One event of a
        watch says so for each wait (later events of the same wait do not ask again)."""
        return self.data.waiting is not None and self.data.waiting.wants_input and not self._repeat

    def respond(self, value: JSON) -> AnswerT:
        """Answer this task's wait with `value` (tasks.respond). Raises ValueError when the task
        does not wait for input; the service checks the value against the wait's schema."""
        if not self.wants_input:
            raise ValueError(f"task {self.task_id} does not wait for input in this event")
        if self._responder is None:
            raise ValueError("this event was not made by a client's watch: use client.respond(task_id, value)")
        return self._responder(self.task_id, value)

    def bound(self, responder: Callable[[str, JSON], Any]) -> Any:
        """A copy whose `respond` calls `responder` (how the clients hand out their events)."""
        copy = self.model_copy()
        copy._responder = responder
        copy._repeat = self._repeat
        return copy

    def repeating(self) -> "Event[AnswerT]":
        """This event marked as another of a wait already announced (client/watch.py)."""
        self._repeat = True
        return self


# The events of each client's watch, for annotations: `respond` returns a coroutine to await from an
# AsyncClient's watch, the Answer itself from a Client's.
AsyncEvent = Event[Coroutine[Any, Any, Answer]]
SyncEvent = Event[Answer]
