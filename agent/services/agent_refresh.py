"""The background refresh of the directory's cards (SERVICE_AGENT_REFRESH_SECONDS, docs/agents.md).

Every instance runs one; they do not step on each other because each refresh is claimed first
(storage/agents.py `claim_refresh`, a compare-and-set on `refresh_due_at`): the instance whose
statement moved the due time refreshes that card, the others skip it. A refresh asks
conditionally (ETag, Last-Modified) and flags a change of interfaces instead of following it
(AgentService.refresh_row). At start it also seeds SERVICE_AGENTS, trying again each round for a
card that could not be fetched yet.
"""

from __future__ import annotations

import asyncio
import logging

from taskgrove.agent.services.agent_cards import CardError
from taskgrove.agent.services.agent_lookup import DirectoryLookup
from taskgrove.agent.services.agent_service import AgentService

log = logging.getLogger(__name__)
MIN_EVERY, MAX_EVERY = 1.0, 60.0  # how often the loop looks for due cards


class AgentRefresher:
    def __init__(self, agents: AgentService, lookup: DirectoryLookup) -> None:
        self.agents = agents
        self.lookup = lookup
        self._job: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        if self._job is None:
            self._stopping.clear()
            self._job = asyncio.create_task(self._loop(), name="taskgrove-agent-refresh")

    async def stop(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            self._stopping.set()
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)

    async def refresh_due(self) -> int:
        """Refresh every card whose time has come and that this instance claims; how many."""
        every = self.agents.settings.agent_refresh_seconds
        done = 0
        for row in await self.agents.store.due():
            if not await self.agents.store.claim_refresh(row["id"], row["refresh_due_at"], every):
                continue  # another instance refreshes it
            try:
                await self.agents.refresh_row(row, conditional=True)
                done += 1
            except CardError as exc:
                log.warning("agent %s: refreshing its card failed: %s", row["name"], exc)
        return done

    async def _loop(self) -> None:
        settings = self.agents.settings
        every = min(MAX_EVERY, max(MIN_EVERY, settings.agent_refresh_seconds / 4))
        pending_seeds = tuple(settings.agents)
        while not self._stopping.is_set():
            try:
                if pending_seeds:
                    await self.agents.seed(pending_seeds)
                    known = {r["card_url"] for r in await self.agents.store.visible(None, everyone=True)}
                    pending_seeds = tuple(url for url in pending_seeds if url not in known)
                await self.refresh_due()
                await self.lookup.read_limits()
            except Exception:  # a busy or unreachable database: the next round tries again
                log.exception("agent directory refresh failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), every)
            except asyncio.TimeoutError:
                pass
