"""`Idempotency-Key` for requests that create or start work (tasks.create, execute, copy, clone, events.emit).

The header makes a resend safe: within SERVICE_IDEMPOTENCY_SECONDS the same key, from the same
user, for the same request, answers with the first answer's object and does nothing again. The
same key sent with a different request is refused (-32602); a resend while the first request is
still being carried out waits for its answer. A request that failed leaves no trace: its key can
be sent again with a corrected request.

The database may go away at any statement (issue 46): the key's reservation, the request's own
writes and the key's answer are separate transactions, and any of them may fail, or commit with
its answer lost. So: a handler whose effect is one transaction marks the key in it
(`current()`, storage/idempotency.mark_stored: events.emit), and a resend whose first attempt was
cut after that completes the request instead of repeating it; an attempt of this instance that
ended with its key not settled (released, or answered) is remembered here (`_ended`), so a resend
knows the reservation is abandoned rather than in flight, and the key is settled in the
database from a background task once it is back (for a resend that reaches another instance).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.idempotency import IdempotencyStore, Row
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import iso_in, now_iso

log = logging.getLogger(__name__)

HEADER = "idempotency-key"
MAX_KEY = 255
IN_FLIGHT_WAIT = 60.0  # seconds a resend waits for the first request's answer
MAX_ENDED = 10_000  # ended attempts remembered (oldest forgotten first): memory stays bounded
SETTLE_RETRY_SECONDS = (0.2, 5.0)  # a key's release or answer written again after this, doubling up to that
AFRESH = object()  # the earlier reservation is gone (released): reserve the key afresh


@dataclass
class Reservation:
    """The key the running request holds: `reserved_at` names its row; `stored` is what the
    first attempt stored (storage/idempotency.mark_stored) when this one completes it."""

    owner: str
    key: str
    reserved_at: str
    stored: dict[str, Any] | None = None


@dataclass
class Ended:
    """An attempt of this instance whose key may not be settled in the database yet: its
    answer when it succeeded (`answered`), else it failed (the key is to be released)."""

    reserved_at: str
    answer: Any = None
    answered: bool = False


_current: ContextVar[Reservation | None] = ContextVar("idempotency_reservation", default=None)


def current() -> Reservation | None:
    """The reservation of the request being carried out, if it was sent with a key."""
    return _current.get()


class IdempotentMethods:
    def __init__(self, repo: TaskRepository, settings: Settings) -> None:
        self.repo = repo
        self.keys = IdempotencyStore(repo)
        self.settings = settings
        self._in_flight: set[tuple[str, str, str]] = set()  # (owner, key, reserved_at) being carried out here
        self._ended: OrderedDict[tuple[str, str, str], Ended] = OrderedDict()  # by (owner, key, reserved_at)
        self._settling: set[asyncio.Task[None]] = set()

    def wrap(self, method: str, handler: Handler) -> Handler:
        async def idempotent(params: Any, ctx: CallContext) -> Any:
            key = ctx.request.headers.get(HEADER) if ctx.request is not None else None
            if key is None:
                return await handler(params, ctx)
            return await self.once(method, handler, params, ctx, key)

        return idempotent

    async def once(self, method: str, handler: Handler, params: Any, ctx: CallContext, key: str) -> Any:
        """`handler(params, ctx)` carried out once per (user, key); a resend gets the first answer."""
        if not key.strip() or len(key) > MAX_KEY or not key.isprintable():
            raise invalid_params(f"Idempotency-Key must be 1 to {MAX_KEY} printable characters")
        owner = ctx.caller.user_id or ""
        fingerprint = _fingerprint(method, params)
        if method == "tasks.create":
            params = with_ids(params, f"{owner}\n{key}\n{fingerprint}")
        for _ in range(3):  # a reservation released as we looked is reserved afresh
            stamp = now_iso()
            earlier = await self._reserve(owner, key, method, fingerprint, stamp)
            if earlier is None or earlier["created_at"] == stamp:  # ours (perhaps its commit's answer was lost)
                return await self._carry_out(handler, params, ctx, Reservation(owner, key, stamp))
            answer = await self._earlier_answer(earlier, method, fingerprint, handler, params, ctx)
            if answer is not AFRESH:
                return answer
        raise invalid_params("The request with this Idempotency-Key is still being carried out; send it again later")

    async def _reserve(self, owner: str, key: str, method: str, fingerprint: str, stamp: str) -> Row | None:
        try:
            return await self.keys.reserve(owner, key, method, fingerprint, stamp,
                                           iso_in(-self.settings.idempotency_seconds))
        except Exception:  # lost the race to reserve it, or the database went away (perhaps after storing ours)
            try:
                earlier = await self.keys.lookup(owner, key)
            except Exception:
                earlier = None
            if earlier is None:
                self._settle_later(owner, key, Ended(stamp))  # released should it have been stored
                raise
            return earlier

    async def _carry_out(self, handler: Handler, params: Any, ctx: CallContext, reservation: Reservation) -> Any:
        name = (reservation.owner, reservation.key, reservation.reserved_at)
        self._in_flight.add(name)
        token = _current.set(reservation)
        try:
            answer = await handler(params, ctx)
        except BaseException:
            await self._settle(reservation.owner, reservation.key, Ended(reservation.reserved_at))
            raise
        finally:
            _current.reset(token)
            self._in_flight.discard(name)
        first = answer.first if isinstance(answer, StreamReply) else answer
        await self._settle(reservation.owner, reservation.key, Ended(reservation.reserved_at, first, True))
        return answer

    async def _earlier_answer(self, earlier: Row, method: str, fingerprint: str, handler: Handler, params: Any,
                              ctx: CallContext) -> Any:
        """The answer of the request that reserved the key first: waited for while it is carried
        out; completed (its effect stored, its answer not) or carried out afresh (it failed) when
        it ended without settling the key, here (known at once) or elsewhere (after the wait)."""
        if earlier["method"] != method or earlier["fingerprint"] != fingerprint:
            raise invalid_params("Idempotency-Key was already used for a different request; use a new key")
        owner, key = earlier["owner"], earlier["key"]
        deadline = time.monotonic() + IN_FLIGHT_WAIT
        row: Row | None = earlier
        while row is not None:
            answer, reserved_at = row["answer"], row["created_at"]
            if answer is not None and "value" in answer:
                return answer["value"]
            ended = self._ended.get((owner, key, reserved_at))
            ours = ended is not None  # it ended here, its key not settled when it did
            if ended is not None and ended.answered:  # answered here; its write waits for the database
                return ended.answer
            gone = (owner, key, reserved_at) not in self._in_flight and (ours or time.monotonic() > deadline)
            if gone and answer is not None:  # its effect is stored: complete it
                return await self._carry_out(handler, params, ctx,
                                             Reservation(owner, key, reserved_at, answer.get("stored")))
            if gone and ours:  # it failed here before its effect was stored
                await self.keys.release(owner, key, reserved_at)
                return AFRESH
            if time.monotonic() > deadline:
                raise invalid_params("The request with this Idempotency-Key is still being carried out; "
                                     "send it again later")
            await asyncio.sleep(0.05)
            row = await self.keys.lookup(owner, key)
        return AFRESH  # the first request failed meanwhile (its key released): this one is carried out

    # --- settling a key ---------------------------------------------------------------------

    async def _settle(self, owner: str, key: str, ended: Ended) -> None:
        """Write how the attempt ended (its answer, or the key's release); when the database
        cannot take it now, remember it here and write it from the background. Never raises:
        the request's own outcome is what its caller gets."""
        self._remember(owner, key, ended)  # a resend here knows the attempt ended
        try:
            await self._write(owner, key, ended)
        except Exception:
            self._settle_later(owner, key, ended)
            return
        if ended.answered:  # the database has the answer: nothing left to know here
            self._ended.pop((owner, key, ended.reserved_at), None)

    def _remember(self, owner: str, key: str, ended: Ended) -> None:
        name = (owner, key, ended.reserved_at)
        self._ended[name] = ended
        self._ended.move_to_end(name)
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    async def _write(self, owner: str, key: str, ended: Ended) -> None:
        if ended.answered:
            await self.keys.remember(owner, key, ended.reserved_at, ended.answer)
        else:
            await self.keys.release(owner, key, ended.reserved_at)

    def _settle_later(self, owner: str, key: str, ended: Ended) -> None:
        self._remember(owner, key, ended)
        task = asyncio.get_running_loop().create_task(self._keep_settling(owner, key, ended))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _keep_settling(self, owner: str, key: str, ended: Ended) -> None:
        """Write `ended` once the database takes it, within the key's retention; a resend that
        reaches another instance then finds the key answered or free."""
        delay, longest = SETTLE_RETRY_SECONDS
        give_up = time.monotonic() + self.settings.idempotency_seconds
        while time.monotonic() < give_up:
            await asyncio.sleep(delay)
            if self._ended.get((owner, key, ended.reserved_at)) is not ended:
                return  # settled otherwise (a resend took it up), or forgotten
            try:
                await self._write(owner, key, ended)
            except Exception:
                delay = min(delay * 2, longest)
                continue
            if ended.answered:
                self._ended.pop((owner, key, ended.reserved_at), None)
            return
        log.warning("Idempotency-Key %r: could not settle its reservation within its retention", key)


def with_ids(params: Any, seed: str) -> Any:
    """tasks.create's params (SPEC.md's shapes: an array of tasks, one task, {"tasks": ...},
    tasks nested in `children`) with an id for every task given none, the same ones for the same
    `seed` (the caller, key and request). A resend that is carried out afresh (its first attempt
    failed, perhaps after its tree was stored) then names the same tree, and a tree is stored once
    as a create with ids is: the resend is answered with the stored tree (TaskService._resent)."""
    numbers = iter(range(1 << 62))
    top = {**params, "tasks": params["tasks"]} if isinstance(params, Mapping) and "tasks" in params \
        else {"tasks": params}
    stack: list[tuple[Any, Any]] = [(top, "tasks")]  # (container, index): no recursion over nesting depth
    while stack:
        holder, at = stack.pop()
        value = holder[at]
        if isinstance(value, list):
            holder[at] = value = list(value)
            stack.extend((value, index) for index in range(len(value)))
        elif isinstance(value, Mapping):
            holder[at] = task = dict(value)
            if task.get("id") is None:
                task["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"taskgrove:{seed}\n{next(numbers)}"))
            if isinstance(task.get("children"), list):
                stack.append((task, "children"))
    return top if isinstance(params, Mapping) and "tasks" in params else top["tasks"]


def _fingerprint(method: str, params: Any) -> str:
    text = json.dumps([method, params], sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
