"""The statements of durable waits (agent/engine/waits.py decides when each runs).

A parked task is `in_progress` with `waiting` set and no lease. Ending its wait is one
compare-and-set on the wait itself: the row still waits (`waiting IS NOT NULL`) under the epoch
of the attempt that parked it, so of two answers (two people, an answer and a timeout, an event
seen by two instances) exactly one wins, and an answer meant for one wait can never reach the
next wait of the same task (each park follows a claim, which raises the epoch).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from taskgrove.storage.jsonvalues import Unreadable, read_stored
from taskgrove.storage.models import TaskStatus
from taskgrove.storage.models import events_table as E
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.repository import TaskRepository

Row = dict[str, Any]

# What reads show of a wait (the stored form also keeps index, timeout and default).
PUBLIC_KEYS = ("kind", "prompt", "schema", "since", "deadline")
EVENT_KEYS = ("event", "match")
# A question of another agent (kind `agent_input`, executors/a2a_questions.py) also shows who asks.
AGENT_KEYS = ("agent",)


def read(text: str | None) -> Any:
    """A wait column's value (`waiting`, `wait_answers`: text columns, so SQLAlchemy does not
    decode them), read by the JSON gate's reader: NULL (no wait, no answers) is never decoded, and
    a row that cannot be read back is a jsonvalues.Unreadable (an empty dict), never an exception."""
    return None if text is None else read_stored(text)


def public_wait(text: str | None) -> dict[str, Any] | None:
    """What reads show of a stored wait: kind, prompt, schema, since, deadline (and for an event
    its name and match); None when the task waits for nothing."""
    wait = read(text)
    if not isinstance(wait, dict) or isinstance(wait, Unreadable):
        return None
    shown = {key: wait.get(key) for key in PUBLIC_KEYS}
    if wait.get("kind") == "event":
        shown.update({key: wait.get(key) for key in EVENT_KEYS})
    elif wait.get("kind") == "agent_input":
        shown.update({key: wait.get(key) for key in AGENT_KEYS})
    return shown


# What a reader of parked tasks needs (no JSON column: nothing to decode).
_PARKED = (T.c.id, T.c.task_tree_id, T.c.user_id, T.c.name, T.c.lease_epoch, T.c.waiting, T.c.wait_answers,
           T.c.attempt)


def _still_waiting(task_id: str, epoch: int) -> Any:
    return (T.c.id == task_id, T.c.status == TaskStatus.IN_PROGRESS.value, T.c.waiting.is_not(None),
            T.c.lease_epoch == epoch)


def answer(c: Connection, task_id: str, epoch: int, answers: str, stamp: str) -> Row | None:
    """End the wait of `task_id` parked at `epoch` with its answers (`answers`: the JSON text of
    every answer of the attempt so far, the new one last): the task is `pending` again, to be
    claimed for the same attempt (the claim adds back the one taken here). None: the wait was
    answered, timed out or cancelled meanwhile."""
    query = (update(T).where(*_still_waiting(task_id, epoch))
             .values(status=TaskStatus.PENDING.value, waiting=None, wake_at=None, wait_answers=answers,
                     attempt=T.c.attempt - 1, next_attempt_at=None, lease_owner=None, lease_expires_at=None,
                     updated_at=stamp)
             .returning(T.c.attempt))
    found = c.execute(query).first()
    return {"status": TaskStatus.PENDING.value, "waiting": None, "wake_at": None, "wait_answers": answers,
            "attempt": found.attempt, "lease_owner": None, "updated_at": stamp} if found else None


def fail(c: Connection, task_id: str, epoch: int, error: str, stamp: str) -> bool:
    """End the wait of `task_id` parked at `epoch` as the task's failure (a timeout without a default)."""
    query = (update(T).where(*_still_waiting(task_id, epoch))
             .values(status=TaskStatus.FAILED.value, waiting=None, wake_at=None, wait_answers=None, error=error,
                     result=None, completed_at=stamp, updated_at=stamp, lease_owner=None, lease_expires_at=None))
    return c.execute(query).rowcount > 0


def parked_of_user(c: Connection, user_id: str | None) -> list[Row]:
    """The parked tasks of a user (None: of nobody), through the partial index of parked tasks."""
    owner = T.c.user_id.is_(None) if user_id is None else T.c.user_id == user_id
    query = select(*_PARKED).where(T.c.waiting.is_not(None), owner, T.c.status == TaskStatus.IN_PROGRESS.value)
    return [dict(row._mapping) for row in c.execute(query)]


def add_event(c: Connection, user_id: str | None, name: str, payload: Mapping[str, Any], stamp: str) -> str:
    event_id = uuid.uuid4().hex
    c.execute(insert(E).values(id=event_id, user_id=user_id, name=name, payload=dict(payload), created_at=stamp))
    return event_id


# A statement that belongs to storing an event: (connection, user_id, name, payload, event_id, stamp)
# -> what it answers (storage/trigger_store.take_in_event: the trigger rows of the event).
WithEvent = Callable[[Connection, "str | None", str, Mapping[str, Any], str, str], Any]


def store_event(c: Connection, user_id: str | None, name: str, payload: Mapping[str, Any], stamp: str,
                alongside: Sequence[WithEvent] = ()) -> tuple[str, list[Any]]:
    """Store an event and run `alongside` in the same transaction (each given the new event's id):
    either the event and everything written for it are stored, or nothing is. Returns the event's
    id and what each statement of `alongside` answered, in order."""
    event_id = add_event(c, user_id, name, payload, stamp)
    return event_id, [statement(c, user_id, name, payload, event_id, stamp) for statement in alongside]


def meets(match: Mapping[str, Any] | None, payload: Any) -> bool:
    """Whether an event's payload has every key of `match` with the same value (a wait's, a trigger's)."""
    return isinstance(payload, dict) and all(key in payload and payload[key] == value
                                             for key, value in (match or {}).items())


def events_since(c: Connection, user_id: str | None, name: str, since: str, limit: int = 1000) -> list[Row]:
    """Events `name` of a user emitted at or after `since`, oldest first."""
    owner = E.c.user_id.is_(None) if user_id is None else E.c.user_id == user_id
    query = (select(E).where(owner, E.c.name == name, E.c.created_at >= since)
             .order_by(E.c.created_at, E.c.id).limit(limit))
    return [dict(row._mapping) for row in c.execute(query)]


class WaitStore:
    """The durable waits' named operations, each one transaction of its own running the statement
    function above of the same name: what the engine's waits call (agent/engine/waits.py; issue
    44: nothing above storage hands functions to `transact`)."""

    def __init__(self, repo: TaskRepository) -> None:
        self._transact = repo.transact

    async def events_since(self, user_id: str | None, name: str, since: str) -> list[Row]:
        return await self._transact(events_since, user_id, name, since)

    async def answer(self, task_id: str, epoch: int, answers: str, stamp: str) -> Row | None:
        return await self._transact(answer, task_id, epoch, answers, stamp)

    async def fail(self, task_id: str, epoch: int, error: str, stamp: str) -> bool:
        return await self._transact(fail, task_id, epoch, error, stamp)

    async def store_event(self, user_id: str | None, name: str, payload: Mapping[str, Any], stamp: str,
                          alongside: Sequence[WithEvent] = ()) -> tuple[str, list[Any]]:
        return await self._transact(store_event, user_id, name, payload, stamp, alongside)

    async def parked_of_user(self, user_id: str | None) -> list[Row]:
        return await self._transact(parked_of_user, user_id)
