"""When a call is sent again, and how long the client waits first.

A resend must never run anything twice, so what may be resent depends on what the first try may
have done:

- A refusal is always safe to resend: HTTP 429 (a quota refused the request before anything was
  stored) and 503 (the service or its database cannot serve it; nothing was stored), and a
  connection that could not be opened (nothing was sent).
- A lost answer (the connection dropped after the request went out, a read timeout, a proxy's 502
  or 504) is resent only for calls the service recognises when they come again (`Safety`): reads;
  the calls whose `Idempotency-Key` header the service honours, which answer a resend with the
  first answer (tasks.create, execute, copy, clone, events.emit; a builder tree also names all its
  ids); and calls whose repetition changes nothing (update, cancel, setting a key or a budget,
  updating a schedule or trigger, agents.refresh, tasks.generate without save).
  Everything else (respond, delete, a new schedule or trigger, agents.add and remove,
  tasks.generate with save) raises `Unreachable` with `maybe_sent=True`: the caller decides,
  knowing the request may have been carried out.

Every write carries an `Idempotency-Key` all the same, so those calls become safe to resend as
soon as the service honours the header for them.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass

from taskgrove.client.exceptions import (QuotaExceeded, TaskgroveError, Unavailable, Unreachable,
                                     resend_later)


class Safety(enum.Enum):
    """What sending a call twice does (see the module's docstring)."""

    READ = "read"  # nothing changes
    KEYED = "keyed"  # the service answers a resend with the first answer (Idempotency-Key, or the tree's ids)
    IDEMPOTENT = "idempotent"  # a repetition leaves the same state (update, cancel, config set)
    ONCE = "once"  # a repetition may act twice: resent only after a certain refusal

    @property
    def resend_safe(self) -> bool:
        return self is not Safety.ONCE

    @property
    def is_write(self) -> bool:
        return self is not Safety.READ


@dataclass(frozen=True)
class RetryEvent:
    """Given to `Retry.on_retry` before each wait: which call, which try failed, how, how long the wait."""

    method: str
    attempt: int
    error: TaskgroveError
    delay: float


@dataclass(frozen=True)
class Retry:
    """How a client retries: at most `attempts` tries of one call, waiting `backoff` seconds after
    the first failure and twice as long after each next one (at most `max_backoff`, with jitter),
    or what the service asked for with Retry-After. A Retry-After longer than `max_retry_after` is
    not waited for: the error is raised at once, with its `retry_after`, for the caller to decide.
    `Retry(attempts=1)` turns retries off. `on_retry` is called before each wait (logging, tests)."""

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 10.0
    max_retry_after: float = 120.0
    on_retry: Callable[[RetryEvent], None] | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be at least 1 (1: no retries)")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0:
            raise ValueError("Retry's delays must not be negative")

    def delay(self, attempt: int, error: TaskgroveError, safety: Safety) -> float | None:
        """Seconds to wait before try `attempt + 1` after `error`, or None: raise it now."""
        if attempt >= self.attempts or not retryable(error, safety):
            return None
        asked: float | None = error.retry_after if isinstance(error, (QuotaExceeded, Unavailable)) else None
        if asked is not None and asked > 0:
            if asked > self.max_retry_after:
                return None
            return float(asked) + random.uniform(0, min(1.0, self.backoff))  # not all clients at once
        step = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return step / 2 + random.uniform(0, step / 2)


NO_RETRY = Retry(attempts=1)


def retryable(error: TaskgroveError, safety: Safety) -> bool:
    """Whether `error` may be answered by sending the same call again (see the module's docstring)."""
    if isinstance(error, QuotaExceeded):
        return True
    if isinstance(error, Unavailable):
        return error.http_status in (503, 507) or safety.resend_safe  # 502/504: a proxy lost the answer
    if isinstance(error, Unreachable):
        return not error.maybe_sent or safety.resend_safe
    return safety is Safety.KEYED and resend_later(error)
