"""A task's status: the one list of them, in a module without imports so that light clients
(the remote command line, which never loads SQLAlchemy) use the same names as the service."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """A task's status: the one list of them. A member equals its text ("pending"), so rows,
    wire values and members compare alike; write `.value` where a plain str must be stored."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TASK_STATUSES = tuple(status.value for status in TaskStatus)
# The statuses a task ends in: none of them changes again except by a new execution.
FINISHED_STATUSES = (TaskStatus.COMPLETED.value, TaskStatus.FAILED.value, TaskStatus.CANCELLED.value)
