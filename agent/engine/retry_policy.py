"""Retry policies: what a task may do after a failed attempt, and when.

A policy lives on the task (`retry`), fully spelled out at creation from the service defaults,
so a read always shows what will happen. Delays become stored times (`next_attempt_at`), never
in-process sleeps, so a restart or another instance honours them.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BACKOFFS = ("fixed", "exponential", "linear")
MAX_ATTEMPTS = 100
MAX_DELAY_SECONDS = 7 * 86_400.0


class PolicyError(ValueError):
    """The `retry` object of a task is malformed; the message names the field."""


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff: str = "exponential"
    base_seconds: float = 1.0
    max_seconds: float = 300.0
    jitter: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "backoff": self.backoff, "base_seconds": self.base_seconds,
                "max_seconds": self.max_seconds, "jitter": self.jitter}

    @functools.cached_property
    def _plain(self) -> dict[str, Any]:  # as_dict once, for comparisons only (never handed out)
        return self.as_dict()

    @classmethod
    def parse(cls, raw: Any, defaults: "RetryPolicy", where: str = "retry") -> "RetryPolicy":
        """`raw` (an object with any subset of the fields, or null) completed from `defaults`."""
        if raw is None:
            return defaults
        if not isinstance(raw, Mapping):
            raise PolicyError(f"{where} must be an object such as {{\"max_attempts\": 3}}")
        unknown = sorted(set(raw) - set(defaults.as_dict()))
        if unknown:
            raise PolicyError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(defaults.as_dict())}")
        merged = {**defaults.as_dict(), **raw}
        attempts = merged["max_attempts"]
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS:
            raise PolicyError(f"{where}.max_attempts must be an integer from 1 to {MAX_ATTEMPTS}")
        if merged["backoff"] not in BACKOFFS:
            raise PolicyError(f"{where}.backoff must be one of {', '.join(BACKOFFS)}")
        for key in ("base_seconds", "max_seconds"):
            value = merged[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= MAX_DELAY_SECONDS:
                raise PolicyError(f"{where}.{key} must be a number of seconds from 0 to {MAX_DELAY_SECONDS:g}")
        if merged["max_seconds"] < merged["base_seconds"]:
            raise PolicyError(f"{where}.max_seconds must not be smaller than {where}.base_seconds")
        if not isinstance(merged["jitter"], bool):
            raise PolicyError(f"{where}.jitter must be true or false")
        return cls(attempts, merged["backoff"], float(merged["base_seconds"]), float(merged["max_seconds"]),
                   merged["jitter"])

    def delay(self, failed_attempt: int) -> float:
        """Seconds to wait after attempt number `failed_attempt` (1-based) failed.

        Jitter takes up to a quarter off, so instances retrying the same outage spread out
        without ever waiting longer than the policy says.
        """
        n = max(1, failed_attempt)
        if self.backoff == "fixed":
            seconds = self.base_seconds
        elif self.backoff == "linear":
            seconds = self.base_seconds * n
        else:
            seconds = self.base_seconds * 2.0 ** min(n - 1, 60)
        seconds = min(seconds, self.max_seconds)
        if self.jitter and seconds > 0:
            seconds *= 1.0 - random.random() * 0.25
        return seconds


def stored_policy(row: Mapping[str, Any], defaults: RetryPolicy) -> RetryPolicy:
    """The policy of a stored task; rows written before policies existed get the defaults."""
    if row.get("retry") == defaults._plain:  # most tasks: the defaults, as completed at creation
        return defaults  # (loose equality, 1 == True: parse would then refuse it, giving defaults too)
    try:
        return RetryPolicy.parse(row.get("retry"), defaults)
    except PolicyError:
        return defaults
