"""The engine's background jobs: coroutines that nobody awaits where they start (a refresh, a
detached attempt's cancel hook, a run's end, a continued execution's webhooks).

Kept here so that no job is garbage-collected half way, and stop() can wait for them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self.jobs: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self.jobs.add(job)
        job.add_done_callback(self._done)

    def _done(self, job: asyncio.Task[Any]) -> None:
        """Forget a finished job; a job that failed says so in the log (nobody awaits it)."""
        self.jobs.discard(job)
        if not job.cancelled() and (exc := job.exception()) is not None:
            log.error("background job %s failed", getattr(job.get_coro(), "__qualname__", job.get_name()), exc_info=exc)


    async def finish(self, timeout: float) -> None:
        """Wait for the jobs at most `timeout` seconds, then cancel the rest (at shutdown: a job
        that retries while the database is away would otherwise hold the stop up for good)."""
        jobs = list(self.jobs)
        if not jobs:
            return
        _, pending = await asyncio.wait(jobs, timeout=timeout)
        for job in pending:
            job.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
