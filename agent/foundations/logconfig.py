"""Logging for `taskgrove serve`: plain text or one JSON object per line, with the task in context.

The task an executor runs is kept in a context variable (each task runs in its own asyncio task,
so the value is that task's alone): every line logged while it runs, by the engine, an executor
or a library it calls, carries its `task_id` and `root_task_id`. Secrets never reach a log line:
URLs are redacted where they are logged, keys and tokens are never logged at all.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

# (task_id, root_task_id) of the task whose executor is running in this context, if any.
current_task: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "taskgrove_current_task", default=None)

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class TaskContext(logging.Filter):
    """Puts task_id / root_task_id on every record made inside a task's execution."""

    def filter(self, record: logging.LogRecord) -> bool:
        task = current_task.get()
        if task is not None:
            record.task_id = getattr(record, "task_id", None) or task[0]
            record.root_task_id = getattr(record, "root_task_id", None) or task[1]
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("task_id", "root_task_id"):
            if getattr(record, key, None):
                line[key] = getattr(record, key)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        task = getattr(record, "task_id", None)
        return f"{text} [task {task}]" if task else text


def configure(log_format: str, level: str) -> None:
    """Root logging for the process; uvicorn's loggers propagate to it (see agent/cli.py)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TaskContext())
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else TextFormatter("%(levelname)s:     %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # uvicorn builds each request's access line (client address, path with query) and calls
    # info() whenever its access logger has a handler anywhere (hasHandlers, checked per
    # connection); above INFO the line is dropped after all. So it has none then: the same log,
    # without that work on every request (about 3 % of a tasks.get, bench/README.md, issue 48).
    logging.getLogger("uvicorn.access").propagate = root.getEffectiveLevel() <= logging.INFO
