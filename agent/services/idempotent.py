"""`Idempotency-Key` for requests that create or start work (tasks.create, execute, copy, clone).

The header makes a resend safe: within SERVICE_IDEMPOTENCY_SECONDS the same key, from the same
user, for the same request, answers with the first answer's object and does nothing again. The
same key sent with a different request is refused (-32602); a resend while the first request is
still being carried out waits for its answer. A request that failed leaves no trace: its key can
be sent again with a corrected request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.idempotency import IdempotencyStore
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import iso_in, now_iso

HEADER = "idempotency-key"
MAX_KEY = 255
IN_FLIGHT_WAIT = 60.0  # seconds a resend waits for the first request's answer


class IdempotentMethods:
    def __init__(self, repo: TaskRepository, settings: Settings) -> None:
        self.repo = repo
        self.keys = IdempotencyStore(repo)
        self.settings = settings

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
        stamp = now_iso()
        expired = iso_in(-self.settings.idempotency_seconds)
        try:
            earlier = await self.keys.reserve(owner, key, method, fingerprint, stamp, expired)
        except Exception:  # lost the race to reserve it: the other request's row is there now
            earlier = await self.keys.lookup(owner, key)
            if earlier is None:
                raise
        if earlier is not None:
            return await self._earlier_answer(earlier, owner, key, method, fingerprint)
        try:
            answer = await handler(params, ctx)
        except BaseException:
            await self.keys.release(owner, key)
            raise
        first = answer.first if isinstance(answer, StreamReply) else answer
        await self.keys.remember(owner, key, first)
        return answer

    async def _earlier_answer(self, earlier: dict[str, Any], owner: str, key: str, method: str,
                              fingerprint: str) -> Any:
        if earlier["method"] != method or earlier["fingerprint"] != fingerprint:
            raise invalid_params("Idempotency-Key was already used for a different request; use a new key")
        deadline = time.monotonic() + IN_FLIGHT_WAIT
        row: dict[str, Any] | None = earlier
        while row is not None and row["answer"] is None:  # the first request is still running
            if time.monotonic() > deadline:
                raise invalid_params("The request with this Idempotency-Key is still being carried out; "
                                     "send it again later")
            await asyncio.sleep(0.05)
            row = await self.keys.lookup(owner, key)
        if row is None:  # the first request failed meanwhile: this one is carried out afresh
            raise invalid_params("The first request with this Idempotency-Key failed; send it again")
        return row["answer"]["value"]


def _fingerprint(method: str, params: Any) -> str:
    text = json.dumps([method, params], sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
