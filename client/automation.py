"""`client.agents` and `client.triggers` of AsyncClient: the directory of A2A agents a tree
delegates to (docs/agents.md) and the triggers that start runs from events (docs/triggers.md).
Each method sends one call through `Connection.call` with its `Safety` (client/resend.py): the
service honours no Idempotency-Key for these methods, so adds, creates, removes and deletes are
not resent after a lost answer; updates and refreshes, which repeat harmlessly, are."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from taskgrove.client.answers_automation import (Agent, AgentPage, AgentRemoval, Trigger, TriggerDeletion,
                                                 TriggerRun)
from taskgrove.client.reading import not_found as _not_found, read_many as _many, read_one as _one
from taskgrove.client.resend import Safety
from taskgrove.client.rpc import Connection


class AsyncAgents:
    """`client.agents`: the directory of A2A agents a tree may delegate to by name or skill
    (docs/agents.md). A user sees their own agents and the shared ones; only an admin adds,
    refreshes or removes a shared one."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def add(self, card_url: str, *, name: str | None = None, tags: Sequence[str] | None = None,
                  headers: Mapping[str, str] | None = None, credential: str | None = None, shared: bool = False,
                  concurrency: int | None = None) -> Agent:
        """Add the agent whose card is at `card_url` (or the agent's base URL) under `name`
        (default: from the card's name). `headers` (or `credential`, sent as a Bearer token) go
        with every request to the agent, stored encrypted and never shown again. Not resent after
        a lost answer (a second add of the name is refused): Unreachable with `maybe_sent`."""
        params: dict[str, Any] = {"card_url": card_url, "shared": shared}
        if name is not None:
            params["name"] = name
        if tags is not None:
            params["tags"] = list(tags)
        if headers is not None:
            params["headers"] = dict(headers)
        if credential is not None:
            params["credential"] = credential
        if concurrency is not None:
            params["concurrency"] = concurrency
        return _one(Agent, await self._conn.call("agents.add", params, safety=Safety.ONCE))

    async def get(self, name: str) -> Agent:
        """One agent by directory name; NotFound when the caller sees none of that name."""
        found = await self._conn.call("agents.get", {"name": name}, safety=Safety.READ)
        if found is None:
            raise _not_found(f"name: no agent '{name}' in the directory", "agents.get")
        return _one(Agent, found)

    async def list(self, *, skill: str | None = None, tag: str | None = None, health: str | None = None,
                   page_size: int = 50) -> AsyncIterator[Agent]:
        """Every agent the caller sees, in the order they were added, a page at a time by cursor
        as you iterate: `async for agent in client.agents.list(skill="billing"):`. `skill`: a
        skill id or tag; `health`: healthy, failing, open or unknown."""
        cursor: str | None = None
        while True:
            page = await self.list_page(skill=skill, tag=tag, health=health, limit=page_size, cursor=cursor)
            for agent in page.agents:
                yield agent
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def list_page(self, *, skill: str | None = None, tag: str | None = None, health: str | None = None,
                        limit: int = 50, cursor: str | None = None) -> AgentPage:
        """One page of agents.list (`next_cursor`: pass it as `cursor` for the next; None: the last)."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("skill", skill), ("tag", tag), ("health", health), ("cursor", cursor)):
            if value is not None:
                params[key] = value
        return _one(AgentPage, await self._conn.call("agents.list", params, safety=Safety.READ))

    async def refresh(self, name: str, *, accept: bool = False) -> Agent:
        """Fetch the agent's card again and store it. A change of its interfaces is only flagged
        (`changed`) unless `accept=True`. Safe to resend: a repetition stores the same card."""
        return _one(Agent, await self._conn.call("agents.refresh", {"name": name, "accept": accept},
                                                 safety=Safety.IDEMPOTENT))

    async def remove(self, name: str) -> AgentRemoval:
        """Remove the agent from the directory (not resent after a lost answer, as a delete)."""
        return _one(AgentRemoval, await self._conn.call("agents.remove", {"name": name}, safety=Safety.ONCE))


class AsyncTriggers:
    """`client.triggers`: runs of a stored tree started by events (docs/triggers.md), with flow
    control per payload key: `debounce`, `batch`, `singleton`, `cancel_on`."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def create(self, task_id: str, event: str, *, match: Mapping[str, Any] | None = None,
                     key: str | None = None, debounce: Mapping[str, Any] | None = None,
                     batch: Mapping[str, Any] | None = None, singleton: str | None = None,
                     cancel_on: str | None = None, enabled: bool = True, trigger_id: str | None = None) -> Trigger:
        """A trigger that runs a copy of the stored tree `task_id` (its root) for each event
        `event` whose payload has the values of `match`. `key`: the payload field that groups
        events; `debounce` {"seconds", "max_wait_seconds"}, `batch` {"size", "seconds"},
        `singleton` skip, queue or replace, `cancel_on` an event name. `trigger_id`: its id
        (default a new one). Not resent after a lost answer: Unreachable with `maybe_sent`
        (with a `trigger_id`, a create sent again would answer Conflict, never a second trigger)."""
        params: dict[str, Any] = {"task_id": task_id, "event": event, "enabled": enabled}
        for name, value in (("match", match), ("debounce", debounce), ("batch", batch)):
            if value is not None:
                params[name] = dict(value)
        for name, text in (("key", key), ("singleton", singleton), ("cancel_on", cancel_on),
                           ("trigger_id", trigger_id)):
            if text is not None:
                params[name] = text
        return _one(Trigger, await self._conn.call("triggers.create", params, safety=Safety.ONCE))

    async def get(self, trigger_id: str) -> Trigger:
        """One trigger, with `waiting` (its events not run yet); NotFound when there is none."""
        found = await self._conn.call("triggers.get", {"trigger_id": trigger_id}, safety=Safety.READ)
        if found is None:
            raise _not_found(f"trigger_id: trigger '{trigger_id}' not found", "triggers.get")
        return _one(Trigger, found)

    async def list(self, *, task_id: str | None = None, event: str | None = None, user_id: str | None = None,
                   page_size: int = 100) -> AsyncIterator[Trigger]:
        """Every matching trigger (the caller's own by default), newest first, a page at a time as
        you iterate. The service pages triggers by offset: a trigger created while you iterate
        may shift a page (seen twice, or not at all)."""
        offset = 0
        while True:
            page = await self.list_page(task_id=task_id, event=event, user_id=user_id, limit=page_size,
                                        offset=offset)
            for trigger in page:
                yield trigger
            if len(page) < page_size:
                return
            offset += len(page)

    async def list_page(self, *, task_id: str | None = None, event: str | None = None, user_id: str | None = None,
                        limit: int = 100, offset: int = 0) -> builtins.list[Trigger]:
        """One page of triggers.list (`limit` 1-1000)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        for name, value in (("task_id", task_id), ("event", event), ("user_id", user_id)):
            if value is not None:
                params[name] = value
        return _many(Trigger, await self._conn.call("triggers.list", params, safety=Safety.READ))

    async def update(self, trigger_id: str, **changes: Any) -> Trigger:
        """Change a trigger's fields (event, match, key, debounce, batch, singleton, cancel_on,
        enabled; None clears one); its template cannot change. Safe to resend."""
        return _one(Trigger, await self._conn.call("triggers.update", {"trigger_id": trigger_id, **changes},
                                                   safety=Safety.IDEMPOTENT))

    async def delete(self, trigger_id: str) -> TriggerDeletion:
        """Delete a trigger: its waiting events are dropped, its runs stay (not resent after a lost answer)."""
        return _one(TriggerDeletion, await self._conn.call("triggers.delete", {"trigger_id": trigger_id},
                                                           safety=Safety.ONCE))

    async def runs(self, trigger_id: str, *, key: str | None = None,
                   limit: int | None = None) -> builtins.list[TriggerRun]:
        """The runs the trigger started, newest first (of one payload `key` value when given)."""
        params: dict[str, Any] = {"trigger_id": trigger_id}
        if key is not None:
            params["key"] = key
        if limit is not None:
            params["limit"] = limit
        found = await self._conn.call("triggers.runs", params, safety=Safety.READ)
        if found is None:
            raise _not_found(f"trigger_id: trigger '{trigger_id}' not found", "triggers.runs")
        return _many(TriggerRun, found)
