"""Which concurrency key and rate a task's attempts must respect (README, "Sharing the service").

The task's own fields (storage/sharing.py) meet the deployment's settings here:
`SERVICE_CONCURRENCY_LIMITS` and `SERVICE_RATE_LIMITS` hold for every task that names the key,
and where both give a number the stricter one wins. A task with neither goes through the
engine's ordinary, set-based claim; only limited tasks are claimed one by one
(storage/executions.py `claim_limited`), so the rules cost nothing to everyone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.sharing import per_second


@dataclass(frozen=True)
class TaskLimits:
    key: str | None = None  # concurrency key
    limit: int | None = None  # tasks of the key in progress at once, across instances
    rate_key: str | None = None
    interval: float | None = None  # seconds between two starts of the rate key

    def __bool__(self) -> bool:
        return self.limit is not None or self.interval is not None


NONE = TaskLimits()


def limits_of(row: Mapping[str, Any], settings: Settings) -> TaskLimits:
    concurrency, rate = row.get("concurrency"), row.get("rate_limit")
    if not concurrency and not rate:
        return NONE
    key = limit = rate_key = interval = None
    if concurrency:
        key = concurrency["key"]
        limits = [n for n in (concurrency.get("limit"), settings.concurrency_limits.get(key)) if n is not None]
        limit = min(limits) if limits else None
    if rate:
        rate_key = rate["key"]
        rates = [r for r in (per_second(rate), settings.rate_limits.get(rate_key)) if r is not None]
        interval = 1.0 / min(rates) if rates else None
    return TaskLimits(key if limit is not None else None, limit, rate_key if interval is not None else None, interval)
