"""The directory of agents every surface calls: `agents.add|get|list|refresh|remove` (docs/agents.md).

An agent is an A2A agent a tree may delegate to by name or skill (a2a_agent_executor's `agent`,
`skill`). Permission rules are those of tasks: a user sees and changes their own agents and sees
the shared ones; only an unrestricted caller (an admin, or any caller with JWT off) adds, changes
or removes a shared agent. The params are read by agent/foundations/requests_agents.py, the card by
agent/services/agent_cards.py, the rows by storage/agents.py; credentials go through
storage/agent_secrets.py and never come back out of this module (`public` drops them).

A refresh (asked, or the background one of agent/services/agent_refresh.py) stores a new card's
name, description, version and skills, but not a change of its interfaces: where messages go is
what a person trusted when adding the agent, so a moved agent is flagged (`changed`, what moved)
and keeps its old interfaces until `agents.refresh` with `accept: true`.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

from taskgrove.agent.foundations import cursor as page_cursor
from taskgrove.agent.foundations.calls import CallContext, Handler, typed
from taskgrove.agent.foundations.errors import invalid_params, permission_denied
from taskgrove.agent.foundations.requests_agents import AddAgent, AgentRef, ListAgents
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.agent_cards import CardError, fetch_card
from taskgrove.executors.card_trust import trusted_keys_of
from taskgrove.storage.agent_secrets import AgentSecrets
from taskgrove.storage.agents import CLOSED, AgentStore, empty_health
from taskgrove.storage.clock import now_iso
from taskgrove.storage.keys import KeyStoreError

log = logging.getLogger(__name__)
TRUSTED = ("interfaces",)  # fields a refresh does not follow by itself


def health_label(row: Mapping[str, Any]) -> str:
    """healthy, failing (its last call failed), open (breaker), unknown (never called)."""
    health = row.get("health") or {}
    if row.get("breaker", CLOSED) != CLOSED:
        return "open"
    if not health.get("calls"):
        return "unknown"
    return "failing" if health.get("consecutive_failures") else "healthy"


def public(row: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """An agent as every surface shows it: no credential, only whether one is stored."""
    health = {k: v for k, v in (row.get("health") or empty_health()).items() if k != "latencies_ms"}
    return {"agent_id": row["id"], "name": row["name"], "card_url": row["card_url"], "shared": bool(row["shared"]),
            "user_id": row["user_id"], "tags": list(row.get("tags") or []), "card_name": row.get("card_name"),
            "description": row.get("description"), "version": row.get("version"),
            "protocol_version": row.get("protocol_version"), "skills": list(row.get("skills") or []),
            "interfaces": list(row.get("interfaces") or []), "fetched_at": row.get("fetched_at"),
            "refresh_error": row.get("refresh_error"), "changed": row.get("changed"),
            "has_credentials": bool(row.get("credentials")),
            "concurrency": row.get("concurrency") or settings.agent_concurrency,
            "concurrency_key": f"agent:{row['name']}", "health": {"state": health_label(row), **health},
            "breaker": row.get("breaker") or CLOSED, "breaker_until": row.get("breaker_until"),
            "created_at": row["created_at"], "updated_at": row["updated_at"]}


def has_skill(row: Mapping[str, Any], skill: str) -> bool:
    """Whether the agent offers `skill`: a skill id, or a tag of one of its skills (case-insensitive)."""
    wanted = skill.casefold()
    return any(str(s.get("id", "")).casefold() == wanted or wanted in (str(t).casefold() for t in s.get("tags") or ())
               for s in row.get("skills") or ())


def default_name(card_name: str) -> str:
    """A directory name from a card's name: `Refund Agent` -> `refund-agent`."""
    slug = re.sub(r"[^a-z0-9_.\-]+", "-", card_name.casefold()).strip("-._")[:64]
    return slug or "agent"


class AgentService:
    def __init__(self, store: AgentStore, secrets: AgentSecrets, settings: Settings) -> None:
        self.store = store
        self.secrets = secrets
        self.settings = settings

    # --- helpers --------------------------------------------------------------------------

    async def _agent_for(self, ref: AgentRef, ctx: CallContext, verb: str) -> dict[str, Any] | None:
        row = await (self.store.by_id(ref.agent_id) if ref.agent_id else self.store.by_name(ref.name or ""))
        if row is None:
            return None
        caller = ctx.caller
        visible = row["shared"] or caller.can_access(row["user_id"])
        if not visible or (verb != "access" and row["shared"] and not caller.unrestricted):
            raise permission_denied(f"You may not {verb} agent '{row['name']}'")
        return row

    async def _fetch(self, row: Mapping[str, Any], headers: Mapping[str, str], conditional: bool) -> Any:
        try:
            return await fetch_card(row["card_url"], headers, self.settings.allow_private_urls,
                                    etag=row.get("etag") if conditional else None,
                                    last_modified=row.get("last_modified") if conditional else None,
                                    trusted_keys=trusted_keys_of(self.settings))
        except CardError as exc:
            raise invalid_params(f"card_url: {exc}") from None

    def _headers(self, row: Mapping[str, Any]) -> dict[str, str]:
        try:
            return self.secrets.open(row["id"], row.get("credentials"))
        except KeyStoreError as exc:
            raise invalid_params(str(exc)) from None

    # --- methods --------------------------------------------------------------------------

    async def add(self, request: AddAgent, ctx: CallContext) -> dict[str, Any]:
        caller = ctx.caller
        if request.shared and not caller.unrestricted:
            raise permission_denied("Only an admin may add a shared agent")
        agent_id = str(uuid.uuid4())
        try:
            credentials = self.secrets.seal(agent_id, request.headers)
        except KeyStoreError as exc:
            raise invalid_params(str(exc)) from None
        fetched = await self._fetch({"card_url": request.card_url}, request.headers, conditional=False)
        fields = fetched.fields
        name = request.name or default_name(fields["card_name"])
        if await self.store.by_name(name) is not None:
            raise invalid_params(f"name: an agent named '{name}' is in the directory already; give another name")
        stamp = now_iso()
        row = {"id": agent_id, "name": name, "user_id": None if request.shared else caller.user_id,
               "shared": request.shared, "card_url": request.card_url, "tags": request.tags, **fields,
               "etag": fetched.etag, "last_modified": fetched.last_modified, "fetched_at": stamp,
               "refresh_due_at": None, "refresh_error": None, "changed": None, "credentials": credentials,
               "concurrency": request.concurrency, "health": empty_health(), "breaker": CLOSED,
               "breaker_until": None, "created_at": stamp, "updated_at": stamp}
        try:
            await self.store.insert(row)
        except Exception as exc:  # the unique name, taken by a concurrent add
            if await self.store.by_name(name) is not None:
                raise invalid_params(f"name: an agent named '{name}' is in the directory already") from None
            raise exc
        await self.store.claim_refresh(agent_id, None, self.settings.agent_refresh_seconds)
        return public(row, self.settings)

    async def get(self, request: AgentRef, ctx: CallContext) -> dict[str, Any] | None:
        row = await self._agent_for(request, ctx, "access")
        return None if row is None else public(row, self.settings)

    async def list(self, request: ListAgents, ctx: CallContext) -> dict[str, Any]:
        """A page of the agents the caller sees, in the order they were added; `next_cursor` null
        on the last page. Filters are applied to the page as read, reading on until it is full."""
        caller = ctx.caller
        everyone = caller.unrestricted and (caller.user_id is None or caller.is_admin)
        after = page_cursor.decode(request.cursor)
        found: list[dict[str, Any]] = []
        while len(found) <= request.limit:
            batch = await self.store.page(caller.user_id, everyone, after, max(request.limit * 2, 50))
            for row in batch:
                if self._matches(row, request):
                    found.append(row)
            if len(batch) < max(request.limit * 2, 50):
                break
            after = (batch[-1]["created_at"], batch[-1]["id"])
        page, more = found[:request.limit], len(found) > request.limit
        last = page[-1] if page else None
        return {"agents": [public(r, self.settings) for r in page],
                "next_cursor": page_cursor.encode(last["created_at"], last["id"]) if more and last else None}

    @staticmethod
    def _matches(row: Mapping[str, Any], request: ListAgents) -> bool:
        if request.skill is not None and not has_skill(row, request.skill):
            return False
        if request.tag is not None and request.tag.casefold() not in (t.casefold() for t in row.get("tags") or ()):
            return False
        return request.health is None or health_label(row) == request.health

    async def refresh(self, request: AgentRef, ctx: CallContext) -> dict[str, Any]:
        row = await self._agent_for(request, ctx, "refresh")
        if row is None:
            raise invalid_params(f"name: no agent '{request.name or request.agent_id}' in the directory")
        try:
            updated = await self.refresh_row(row, accept=request.accept)
        except CardError as exc:
            raise invalid_params(f"card_url: {exc}") from None
        return public(updated, self.settings)

    async def refresh_row(self, row: Mapping[str, Any], *, accept: bool = False, conditional: bool = False) -> dict[str, Any]:
        """Fetch the card again and store it; a change of interfaces is flagged unless `accept`.
        Raises CardError (the failure is stored as `refresh_error` too)."""
        try:
            fetched = await fetch_card(row["card_url"], self._headers(row), self.settings.allow_private_urls,
                                       etag=row.get("etag") if conditional else None,
                                       last_modified=row.get("last_modified") if conditional else None,
                                       trusted_keys=trusted_keys_of(self.settings))
        except CardError as exc:
            await self.store.update(row["id"], {"refresh_error": str(exc)[:1000]})
            raise
        stamp = now_iso()
        values: dict[str, Any] = {"fetched_at": stamp, "refresh_error": None}
        if fetched.fields is None:  # 304 Not Modified
            return await self.store.update(row["id"], values) or dict(row)
        fields = dict(fetched.fields)
        values.update(etag=fetched.etag, last_modified=fetched.last_modified)
        moved = {key: {"before": row.get(key), "after": fields[key]} for key in TRUSTED
                 if (row.get(key) or []) != fields[key]}
        if moved and not accept:
            for key in moved:
                fields.pop(key)
            values["changed"] = {**moved, "seen_at": stamp}
            log.warning("agent %s: its card changed %s; not followed until agents.refresh with accept: true",
                        row["name"], ", ".join(moved))
        else:
            values["changed"] = None
        values.update(fields)
        return await self.store.update(row["id"], values) or {**row, **values}

    async def remove(self, request: AgentRef, ctx: CallContext) -> dict[str, Any]:
        row = await self._agent_for(request, ctx, "remove")
        if row is None:
            raise invalid_params(f"name: no agent '{request.name or request.agent_id}' in the directory")
        return {"success": await self.store.delete(row["id"]), "name": row["name"]}

    async def seed(self, urls: tuple[str, ...]) -> None:
        """SERVICE_AGENTS: each card URL not in the directory yet becomes a shared agent; a card
        that cannot be fetched now is tried again at the next start (logged, never fatal)."""
        known = {r["card_url"] for r in await self.store.visible(None, everyone=True)}
        for url in urls:
            if url in known:
                continue
            try:
                await self.add(AddAgent.from_params({"card_url": url, "shared": True}), CallContext())
            except Exception as exc:  # noqa: BLE001 - one bad URL must not stop the service
                log.warning("SERVICE_AGENTS: could not add %s: %s", url, getattr(exc, "message", exc))


def agent_methods(service: AgentService) -> dict[str, Handler]:
    return {
        "agents.add": typed(AddAgent.from_params, service.add),
        "agents.get": typed(AgentRef.from_params, service.get),
        "agents.list": typed(ListAgents.from_params, service.list),
        "agents.refresh": typed(AgentRef.from_params, service.refresh),
        "agents.remove": typed(AgentRef.from_params, service.remove),
    }
