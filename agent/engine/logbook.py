"""Task logs: catching what an attempt logs, bounding it, and writing it in batches.

While an attempt runs, its `AttemptLog` is held in a context variable (`current_log`; each
attempt runs in its own asyncio task, so the value is that attempt's alone). Three kinds of
lines reach it: `ExecutionContext.log` and `log_output` (a command's stdout and stderr, a REST
call's method, URL and status, executors/stdio.py and executors/http.py), and every record of the
standard logger made under that context (`CaptureHandler`, on the root logger beside the service's
own handler, which keeps printing as before).

Nothing is written per line: lines wait in `Logbook.pending` and one statement stores all of them
at most `FLUSH_SECONDS` after the first, and when an attempt ends (so its lines are readable once
its outcome is). An attempt keeps at most SERVICE_MAX_LOG_BYTES of text; the rest is dropped and
one marker line says how much. Known secrets (the LLM key of the call, the task's header values,
tokens and passwords) and URL credentials are masked before a line is kept. Each stored batch goes
out on the bus as `task_log` events (one per task), which `/ws` `subscribe_logs` and the SSE
follow of `tasks.logs` pass on; on PostgreSQL other instances read the table.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from taskgrove.agent.engine.bus import EventBus
from taskgrove.storage.log_store import STREAMS
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import now_iso

log = logging.getLogger(__name__)

TASK_LOG = "task_log"  # the bus event of stored lines: {"type", "log_task_id", "lines"}
FLUSH_SECONDS = 0.5
MASK = "***"
MIN_SECRET_CHARS = 6  # shorter values would mask ordinary words
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")
# A credential after its scheme (an Authorization header printed whole); 16+ characters, so that
# prose ("basic authentication") stays as it is.
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{16,}")

LEVELS = frozenset(("debug", "info", "warning", "error", "critical"))
_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}

current_log: contextvars.ContextVar["AttemptLog | None"] = contextvars.ContextVar("taskgrove_attempt_log",
                                                                                   default=None)


def dropped_marker(count: int) -> str:
    return f"... {count} bytes dropped (SERVICE_MAX_LOG_BYTES)"


def secrets_of(inputs: Mapping[str, Any], llm_api_key: str | None) -> tuple[str, ...]:
    """The values a line must never show: the call's LLM key, the task's header, env and auth values."""
    found: list[str] = [llm_api_key] if llm_api_key else []
    for name in ("headers", "env"):
        values = inputs.get(name)
        if isinstance(values, Mapping):
            found.extend(v for v in values.values() if isinstance(v, str))
    auth = inputs.get("auth")
    if isinstance(auth, Mapping):
        found.extend(auth[k] for k in ("token", "password") if isinstance(auth.get(k), str))
    # Longest first: a secret that contains another is masked whole.
    return tuple(sorted({s for s in found if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True))


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` without known secrets, URL credentials or bearer tokens."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _URL_CREDENTIALS.sub(rf"\1{MASK}@", text)
    return _BEARER.sub(rf"\1 {MASK}", text)


class AttemptLog:
    """The lines of one attempt, within its byte budget."""

    __slots__ = ("book", "task_id", "attempt", "room", "dropped", "inputs", "llm_api_key", "secrets")

    def __init__(self, book: "Logbook", task_id: str, attempt: int, room: int, inputs: Mapping[str, Any],
                 llm_api_key: str | None) -> None:
        self.book = book
        self.task_id = task_id
        self.attempt = attempt
        self.room = room  # bytes of text this attempt may still keep
        self.dropped = 0  # bytes dropped once the budget ran out
        self.inputs = inputs
        self.llm_api_key = llm_api_key
        self.secrets: tuple[str, ...] | None = None  # found on the first line: most attempts log none

    def add(self, stream: str, text: str, level: str | None = None) -> None:
        """Keep one line (an ExecutionContext's LogSink). Once a line does not fit, it and every
        later line are dropped, and counted for the marker."""
        if self.secrets is None:
            self.secrets = secrets_of(self.inputs, self.llm_api_key)
        if stream not in STREAMS:  # an executor's own stream name: kept as a plain log line
            stream = "log"
        if level is not None and level not in LEVELS:  # an executor's own word: one of ours, or info
            level = _LEVEL_ALIASES.get(level, "info")
        text = redact(text.replace("\x00", "\ufffd"), self.secrets)
        size = len(text.encode("utf-8", "replace"))
        if self.dropped or size > self.room:
            self.dropped += size
            return
        self.room -= size
        self.book.keep({"task_id": self.task_id, "attempt": self.attempt, "at": now_iso(), "stream": stream,
                        "level": level, "text": text.encode("utf-8", "replace").decode("utf-8")})


class CaptureHandler(logging.Handler):
    """Routes records made while an attempt runs (its context) into that attempt's log."""

    def emit(self, record: logging.LogRecord) -> None:
        attempt_log = current_log.get()
        if attempt_log is None:
            return
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[0] is not None:
                text += f" ({record.exc_info[0].__name__}: {record.exc_info[1]})"
            attempt_log.add("log", text, record.levelname.lower())
        except Exception:  # a broken message must not break the executor that logged it
            self.handleError(record)


_HANDLER = CaptureHandler()


def install_handler() -> None:
    """Put the capture handler on the root logger once (agent/foundations/logconfig.py `configure` keeps it)."""
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)


class Logbook:
    """The lines of this instance's attempts waiting to be stored, and their one writer."""

    def __init__(self, repo: TaskRepository, bus: EventBus, max_bytes: int) -> None:
        self.repo = repo
        self.bus = bus
        self.max_bytes = max_bytes
        self.pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    def open(self, task_id: str, attempt: int, inputs: Mapping[str, Any],
             llm_api_key: str | None) -> AttemptLog | None:
        """The log of an attempt about to run, set as the current one; None when logs are off."""
        if self.max_bytes <= 0:
            return None
        if self._loop is None:
            self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()
            install_handler()
        attempt_log = AttemptLog(self, task_id, attempt, self.max_bytes, inputs, llm_api_key)
        current_log.set(attempt_log)
        return attempt_log

    def end(self, attempt_log: AttemptLog | None) -> bool:
        """The attempt ended: its marker if lines were dropped. True: lines wait to be stored, and
        the caller awaits `flush()` before handing the attempt's outcome on (no coroutine, no
        write for the many attempts that log nothing)."""
        if attempt_log is None:
            return False
        current_log.set(None)  # the flush's own log records belong to no attempt
        if attempt_log.dropped:
            self._marker(attempt_log)
        return bool(self.pending)

    def close_later(self, attempt_log: AttemptLog | None) -> None:
        """The attempt was stopped (cancelled, or the engine stops): its lines are stored with the
        next flush, which nobody waits for."""
        if attempt_log is None:
            return
        current_log.set(None)
        if attempt_log.dropped:
            self._marker(attempt_log)
        elif self.pending:
            self._arm_anywhere()

    def _marker(self, attempt_log: AttemptLog) -> None:
        self.keep({"task_id": attempt_log.task_id, "attempt": attempt_log.attempt, "at": now_iso(),
                   "stream": "log", "level": "warning", "text": dropped_marker(attempt_log.dropped)})

    def keep(self, line: dict[str, Any]) -> None:
        self.pending.append(line)
        if self._timer is None:
            self._arm_anywhere()

    def _arm_anywhere(self) -> None:
        if self._loop is None:
            return
        if threading.get_ident() == self._thread:
            self._arm()
        else:  # a record logged on another thread (asyncio.to_thread copies the context)
            self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        if self._timer is None and self._loop is not None:
            # A fresh context: the write's own log records belong to no attempt.
            self._timer = self._loop.call_later(FLUSH_SECONDS, self._flush_later, context=contextvars.Context())

    def _flush_later(self) -> None:
        self._timer = None
        job = asyncio.get_running_loop().create_task(self.flush())
        self._flushing.add(job)
        job.add_done_callback(self._flushing.discard)

    async def flush(self) -> None:
        """Store every pending line in one statement, then publish them."""
        async with self._lock:
            batch, self.pending = self.pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not batch:
                return
            try:
                seqs = await self.repo.add_log_lines(batch)
            except Exception as exc:  # e.g. the task was deleted meanwhile: its lines go with it
                log.warning("could not store %d log lines: %s", len(batch), exc)
                return
        self._publish(batch, seqs)

    def _publish(self, batch: list[dict[str, Any]], seqs: list[int]) -> None:
        by_task: dict[str, list[dict[str, Any]]] = {}
        for line, seq in zip(batch, seqs):
            by_task.setdefault(line["task_id"], []).append(wire_line({**line, "seq": seq}))
        for task_id, lines in by_task.items():
            # No task_id/root_task_id: the subscribers of status events never see log lines.
            self.bus.publish({"type": TASK_LOG, "task_id": None, "root_task_id": None,
                              "log_task_id": task_id, "lines": lines})

    async def stop(self) -> None:
        """Store what is pending (the engine stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()


def wire_line(row: Mapping[str, Any]) -> dict[str, Any]:
    """A line as tasks.logs, /ws and SSE show it: seq, attempt, at, stream, level (if any), text."""
    line = {"seq": row["seq"], "attempt": row["attempt"], "at": row["at"], "stream": row["stream"]}
    if row.get("level"):
        line["level"] = row["level"]
    line["text"] = row["text"]
    return line
