"""The executor contract: what the engine hands an executor and what it expects back.

An executor is a class with a few descriptive class attributes and one coroutine, `execute`.
The engine creates one instance per task run, so instance attributes are a safe place for
state that `cancel()` needs (a process handle, token usage so far).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from taskgrove.llm.client import LLMSettings

ProgressCallback = Callable[[float, "str | None"], Awaitable[None]]
# Where an attempt's log lines go (agent/engine/logbook.py): stream, text, level (None but for "log").
LogSink = Callable[[str, str, "str | None"], None]


class ExecutorSettings(LLMSettings, Protocol):
    """What built-in executors read from the service's settings (taskgrove.agent.foundations.settings.Settings)."""

    @property
    def extensions(self) -> tuple[str, ...] | None: ...
    @property
    def command_allowlist(self) -> tuple[str, ...]: ...
    @property
    def allow_private_urls(self) -> bool: ...
    @property
    def database_connections(self) -> Mapping[str, Mapping[str, Any]]: ...
    @property
    def database_allow_input_url(self) -> bool: ...
    @property
    def park_sleep_seconds(self) -> float: ...


class ExecutorError(Exception):
    """A failure the executor wants reported as the task's error, without a traceback.

    `retryable=False` marks a failure another attempt cannot fix (bad input, a refused
    request): the task fails at once whatever its retry policy allows.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class _Absent:
    """No `default` given to a wait (None is a default like any other)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class Waiting(BaseException):
    """Raised by the waits of `ExecutionContext`: this attempt parks until the wait is answered.

    A BaseException (like asyncio.CancelledError), so an executor's `except Exception` cannot
    swallow it. The engine stores `wait` (agent/engine/waits.py) and ends the attempt; when the
    answer comes, the same attempt runs again from the start and the wait returns the answer
    at once (replay: an executor's code before a wait runs again; make it idempotent, or put it
    after the wait). `wait`: kind, prompt, schema, timeout, default?, event?, match?, index."""

    def __init__(self, wait: dict[str, Any]) -> None:
        super().__init__(wait.get("kind"), wait.get("index"))
        self.wait = wait


@dataclass
class ExecutionContext:
    """Everything an executor may look at besides its inputs.

    `dependency_results` maps each dependency's task id to that task's result; the task's own
    `inputs` are never modified with them (see docs/execution.md, "Dependency results").
    """

    task_id: str
    task: Mapping[str, Any]
    settings: ExecutorSettings
    dependency_results: dict[str, Any] = field(default_factory=dict)
    user_id: str | None = None
    # LLM key from the X-LLM-API-KEY header of the request that started the run, if any.
    llm_api_key: str | None = field(default=None, repr=False)  # never in a logged repr
    llm_provider: str | None = None
    # Services an executor may need (e.g. "tasks" for generate_executor); set by the app.
    services: Mapping[str, Any] = field(default_factory=dict)
    # This attempt's number (1 for the first) and how many the task's retry policy allows. With
    # the task id and the execution they make an idempotency key for side effects (below). An
    # attempt cut off by the platform (a crash, a lost lease) runs again with the same number in
    # the same execution, so the same key: its side effects may have happened already
    # (at-least-once, docs/scale-out.md).
    attempt: int = 1
    max_attempts: int = 1
    # How many times the platform cut this task off before (0 on an undisturbed run).
    interruptions: int = 0
    # The fencing token of this attempt's claim (docs/scale-out.md): the service's LLM meter
    # compares it with the stored one before each call, so an attempt that lost its task stops
    # spending. None outside the engine.
    lease_epoch: int | None = None
    # The execution this attempt belongs to (the `executions` row; None outside the engine). A
    # task executed again (a person re-running it) is in a new execution, whose attempts count
    # from 1 again: without it the key would repeat the first execution's.
    execution_id: str | None = None
    # What the previous attempt stored with `checkpoint()`; None on a first attempt.
    last_checkpoint: Any = None
    # The answers of this attempt's earlier waits, in call order (the `wait_answers` column).
    wait_answers: list[Any] = field(default_factory=list)
    # The W3C `traceparent` of this attempt's span while traces are on (docs/observability.md),
    # else None: an executor that calls out sends it as the `traceparent` header, so the callee's
    # spans join the execution's trace (rest_executor, a2a_agent_executor, the LLM executors do).
    traceparent: str | None = None
    _progress: ProgressCallback | None = None
    _checkpoint: Callable[[Any], Awaitable[None]] | None = None
    _log: LogSink | None = None
    _waits: int = 0  # waits called so far in this run of the attempt: the next one's index

    @property
    def idempotency_key(self) -> str:
        """`<task id>:<execution id>:<attempt>`: the same for every re-run of an interrupted
        attempt, new for a retry and for each execution (`<task id>:<attempt>` outside the engine)."""
        if self.execution_id is None:
            return f"{self.task_id}:{self.attempt}"
        return f"{self.task_id}:{self.execution_id}:{self.attempt}"

    async def checkpoint(self, data: Any) -> None:
        """Store `data` (JSON, size-limited) for this task; the latest wins, and a later attempt
        (after a failure, a timeout or a crash) finds it in `last_checkpoint` to resume from.
        Once the task is cancelled the call does not return: the engine calls `cancel` and then
        cancels this coroutine (docs/failures.md, Checkpoints)."""
        if self._checkpoint is not None:
            await self._checkpoint(data)

    # --- durable waits (docs/waits.md) ----------------------------------------------------
    # Each wait holds no slot and no memory while it waits: the attempt ends (Waiting) and runs
    # again from the start once the wait is answered; the waits it passes return their stored
    # answers at once, by their order of call. So call waits in the same order on every run.

    async def wait_for_input(self, prompt: str, schema: Mapping[str, Any] | None = None,
                             timeout: float | None = None, default: Any = ABSENT) -> Any:
        """The answer a person or agent gives through `tasks.respond`, valid against `schema`
        (a JSON Schema). After `timeout` seconds: `default` if given, else the task fails."""
        return self._wait({"kind": "input", "prompt": str(prompt), "schema": dict(schema) if schema else None},
                          timeout, default)

    async def wait_for_event(self, name: str, match: Mapping[str, Any] | None = None,
                             timeout: float | None = None, default: Any = ABSENT) -> Any:
        """The payload of the first event `name` of this task's user (`events.emit`) whose payload
        has every key of `match` with the same value, emitted after this wait began."""
        return self._wait({"kind": "event", "prompt": f"event {name}", "schema": None, "event": str(name),
                           "match": dict(match) if match else None}, timeout, default)

    async def wait_for_agent(self, question: Mapping[str, Any], timeout: float | None = None) -> Any:
        """The answer (tasks.respond) to a question another agent asked this task (a remote A2A
        task's `input-required`, executors/a2a_questions.py): a wait of kind `agent_input` with the
        question's `prompt`, `schema` and `agent` (who asks). After `timeout` seconds the task fails."""
        schema = question.get("schema")
        return self._wait({"kind": "agent_input", "prompt": str(question.get("prompt") or ""),
                           "schema": dict(schema) if schema else None, "agent": dict(question.get("agent") or {})},
                          timeout, ABSENT)

    async def sleep(self, seconds: float) -> None:
        """A durable timer: no slot while it runs, and a restart does not lose it."""
        self._wait({"kind": "timer", "prompt": f"sleep {float(seconds):g}s", "schema": None},
                   max(0.0, float(seconds)), None)

    def hold(self, prompt: str, seconds: float, answer: Any) -> Any:
        """A durable timer like `sleep` whose answer, once it ends, is `answer`: a wait that must
        tell its own answers apart on a replay (see `next_answer`) gives a marker here."""
        return self._wait({"kind": "timer", "prompt": str(prompt), "schema": None}, max(0.0, float(seconds)), answer)

    def next_answer(self) -> Any:
        """The stored answer the next wait of this run would return, or ABSENT: a wait that is not
        always called (a2a_agent_executor's breaker wait) skips its own earlier answers with it."""
        return self.wait_answers[self._waits] if self._waits < len(self.wait_answers) else ABSENT

    def _wait(self, wait: dict[str, Any], timeout: float | None, default: Any) -> Any:
        index, self._waits = self._waits, self._waits + 1
        if index < len(self.wait_answers):
            return self.wait_answers[index]
        wait.update(index=index, timeout=None if timeout is None else float(timeout))
        if default is not ABSENT:
            wait["default"] = default
        raise Waiting(wait)

    def log(self, message: str, level: str = "info") -> None:
        """Keep `message` in this attempt's log (tasks.logs; SERVICE_MAX_LOG_BYTES bounds it). Cheap:
        lines are buffered and written in batches. Never log secrets (tokens, keys, header values)."""
        if self._log is not None:
            self._log("log", str(message), str(level).lower())

    def log_output(self, stream: str, text: str) -> None:
        """One line of a program's output (`stream`: "stdout" or "stderr") or of a REST call
        ("http") into this attempt's log; for executors that run something (executors/stdio.py)."""
        if self._log is not None:
            self._log(stream, text, None)

    async def report_progress(self, progress: float, message: str | None = None) -> None:
        """Publish progress (0..1) for this task; cheap, safe to call often."""
        if self._progress is not None:
            await self._progress(max(0.0, min(1.0, float(progress))), message)


class Executor:
    """Base class for every executor.

    Subclasses set `id`, `name`, `extension`, `description` and optionally `input_schema`
    (a JSON Schema the engine validates `inputs` against before calling `execute`).
    `execute` returns the task result (any JSON value; a dict is usual). It may raise
    `ExecutorError` for an expected failure. `cancel` is called when the task is cancelled
    while running, before the running coroutine is cancelled; it may return a dict with
    `token_usage` and/or `result` (partial result) for the cancellation answer.
    """

    id: ClassVar[str] = ""
    name: ClassVar[str] = ""
    extension: ClassVar[str] = "core"
    description: ClassVar[str] = ""
    type: ClassVar[str | None] = None
    input_schema: ClassVar[dict[str, Any] | None] = None
    # Pure: `execute` returns from its inputs and dependency results alone, without awaiting
    # anything and without side effects, so the engine may complete the task inside the
    # transaction that made it runnable (agent/engine/inline.py). Honoured only when a class
    # sets it itself (a subclass does not inherit it): see inline.declares_pure.
    pure: ClassVar[bool] = False

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        self.params: dict[str, Any] = dict(params or {})
        # Executors that call LLMs keep running totals here; the engine stores them as
        # token_success / token_failed and returns them from cancel.
        self.token_usage: dict[str, int] | None = None
        # The same calls with their cost (llm/usage.py) that nobody stored yet: the engine adds it
        # to the task's `usage` when the attempt ends. The service's LLM clients store each call
        # as it ends (their meter), so the built-in executors leave it None.
        self.llm_usage: dict[str, Any] | None = None

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        raise NotImplementedError

    async def cancel(self) -> dict[str, Any] | None:
        return None

    @classmethod
    def descriptor(cls) -> dict[str, Any]:
        return {
            "id": cls.id,
            "name": cls.name or cls.id,
            "extension": cls.extension,
            "description": cls.description,
        }
