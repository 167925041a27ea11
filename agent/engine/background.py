"""The engine's background jobs: coroutines that nobody awaits where they start (a refresh, a
detached attempt's cancel hook, a run's end, a continued execution's webhooks).

Kept here so that no job is garbage-collected half way, and stop() can wait for them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self) -> None:
        self.jobs: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self.jobs.add(job)
        job.add_done_callback(self.jobs.discard)
