"""A circuit breaker per LLM provider and model (docs/costs.md).

Why: when a provider fails (5xx, 429, timeouts, refused connections), every task of a large tree
would still call it, and each call may be billed or hold a slot for its whole timeout. After
`threshold` consecutive failures of one provider and model, its breaker opens: calls fail at once
without reaching the provider. After `reset_seconds` it is half-open: calls go through again; the
first success closes the breaker, a failure opens it again at once. The breakers live in the instance's memory
(one set per service, built by the container): each instance learns on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from taskgrove.llm.client import TRANSIENT, LLMError

COUNTED = TRANSIENT  # failures that say the provider is unwell (llm/client.py)

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class LLMCircuitOpen(LLMError):
    """The breaker of this provider and model is open: the call was not made."""


@dataclass
class Breaker:
    """One provider and model's breaker."""

    threshold: int
    reset_seconds: float
    state: str = CLOSED
    failures: int = 0
    opened_at: float = 0.0

    def allow(self, now: float) -> bool:
        """Whether a call may go out now (an open breaker past its delay lets one trial through)."""
        if self.state == OPEN and now - self.opened_at >= self.reset_seconds:
            self.state = HALF_OPEN
            return True
        return self.state != OPEN

    def succeeded(self) -> None:
        self.state, self.failures = CLOSED, 0

    def failed(self, now: float) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or self.failures >= self.threshold:
            self.state, self.opened_at = OPEN, now


class Breakers:
    """The breakers of one service, by (provider, model). `threshold` 0 turns them off."""

    def __init__(self, threshold: int, reset_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.reset_seconds = reset_seconds
        self.clock = clock
        self._by_model: dict[tuple[str, str], Breaker] = {}

    def _of(self, provider: str, model: str) -> Breaker:
        key = (provider, model)
        found = self._by_model.get(key)
        if found is None:
            found = self._by_model[key] = Breaker(self.threshold, self.reset_seconds)
        return found

    def state(self, provider: str, model: str) -> str:
        return self._of(provider, model).state

    def usable(self, provider: str, model: str) -> bool:
        """Whether a call to this model would go through now (closed, or open past its delay),
        without changing the breaker: the meter asks it to pick a fallback model."""
        found = self._by_model.get((provider, model))
        return not self.threshold or found is None or found.state != OPEN \
            or self.clock() - found.opened_at >= self.reset_seconds

    def check(self, provider: str, model: str) -> None:
        """Raise LLMCircuitOpen when the breaker refuses the call."""
        if self.threshold and not self._of(provider, model).allow(self.clock()):
            raise LLMCircuitOpen(f"LLM provider {provider!r} model {model!r} failed {self.threshold} times in a "
                                 f"row; calls to it are paused (circuit open) for up to {self.reset_seconds:g}s")

    def record(self, provider: str, model: str, error: BaseException | None) -> None:
        """The call's outcome: None for success; a counted error counts as a failure."""
        if not self.threshold:
            return
        breaker = self._of(provider, model)
        if error is None:
            breaker.succeeded()
        elif isinstance(error, COUNTED):
            breaker.failed(self.clock())
