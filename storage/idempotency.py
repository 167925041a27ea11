"""Idempotency keys: a request resent with the same `Idempotency-Key` gets the first answer.

A client cut off before it saw the answer (a crash, a timeout, a lost connection) cannot tell
whether its request took effect. Sending it again with the same key is always safe: within the
retention window, the first answer is returned and the request is not carried out twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from taskgrove.storage.models import idempotency_table as K
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.wait_store import WithEvent

Row = dict[str, Any]


def reserve(c: Connection, owner: str, key: str, method: str, fingerprint: str, stamp: str,
            expired_before: str) -> Row | None:
    """Reserve `key` for this request; returns the row of an earlier request with it, if any.

    Runs in a transaction of its own: the insert that loses a race fails on the primary key.
    """
    c.execute(delete(K).where(K.c.owner == owner, K.c.key == key, K.c.created_at < expired_before))
    found = c.execute(select(K).where(K.c.owner == owner, K.c.key == key)).first()
    if found is not None:
        return dict(found._mapping)
    # `answer` left out: SQL NULL ("in flight"); a JSON None would be stored as the JSON text null.
    c.execute(insert(K).values(owner=owner, key=key, method=method, fingerprint=fingerprint, created_at=stamp))
    return None


def lookup(c: Connection, owner: str, key: str) -> Row | None:
    found = c.execute(select(K).where(K.c.owner == owner, K.c.key == key)).first()
    return dict(found._mapping) if found is not None else None


def _reserved(owner: str, key: str, reserved_at: str) -> Any:
    """The row of one reservation: the same key reserved again later (after a release) is another."""
    return (K.c.owner == owner, K.c.key == key, K.c.created_at == reserved_at)


def remember(c: Connection, owner: str, key: str, reserved_at: str, answer: Any) -> None:
    c.execute(update(K).where(*_reserved(owner, key, reserved_at)).values(answer={"value": answer}))


def release(c: Connection, owner: str, key: str, reserved_at: str) -> None:
    """The request failed: the key may be used again (a corrected resend is a new request).
    Not when the request's effect was stored (`mark_stored`): a resend completes it instead."""
    c.execute(delete(K).where(*_reserved(owner, key, reserved_at), K.c.answer.is_(None)))


def mark_stored(c: Connection, owner: str, key: str, reserved_at: str, effect: Row) -> None:
    """In the transaction that stores a request's effect: the key's row says what was stored
    ({"stored": effect}, no "value" yet), so the effect and the key's knowledge of it commit
    together. A resend whose first attempt was cut after that completes it, never repeats it."""
    c.execute(update(K).where(*_reserved(owner, key, reserved_at), K.c.answer.is_(None))
              .values(answer={"stored": effect}))


def marked(alongside: Sequence[WithEvent], owner: str, key: str, reserved_at: str) -> WithEvent:
    """One statement for an event's transaction (wait_store.store_event) running `alongside` and
    then `mark_stored` with the event's id, stamp and what `alongside` answered (its answer)."""
    def statement(c: Connection, user_id: str | None, name: str, payload: Mapping[str, Any], event_id: str,
                  stamp: str) -> list[Any]:
        done = [each(c, user_id, name, payload, event_id, stamp) for each in alongside]
        mark_stored(c, owner, key, reserved_at, {"event_id": event_id, "created_at": stamp, "alongside": done})
        return done

    return statement


class IdempotencyStore:
    """The idempotency keys' named operations, each one transaction of its own running the
    statement function above of the same name: what `Idempotency-Key` handling calls
    (agent/services/idempotent.py; issue 44: nothing above storage hands functions to `transact`).
    `reserved_at`: the reservation's `created_at`, which names it (`_reserved`)."""

    def __init__(self, repo: TaskRepository) -> None:
        self._transact = repo.transact

    async def reserve(self, owner: str, key: str, method: str, fingerprint: str, stamp: str,
                      expired: str) -> Row | None:
        return await self._transact(reserve, owner, key, method, fingerprint, stamp, expired)

    async def lookup(self, owner: str, key: str) -> Row | None:
        return await self._transact(lookup, owner, key)

    async def remember(self, owner: str, key: str, reserved_at: str, answer: Any) -> None:
        await self._transact(remember, owner, key, reserved_at, answer)

    async def release(self, owner: str, key: str, reserved_at: str) -> None:
        await self._transact(release, owner, key, reserved_at)
