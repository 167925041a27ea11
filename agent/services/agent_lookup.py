"""The directory as executors and the planner see it: resolve a name or a skill, gate, record.

`DirectoryLookup` implements executors/agent_delegation.py's `AgentDirectory` protocol, handed to
executors as `context.services["agent_directory"]` (the container puts it in the engine's service
map, as it does the LLM key lookup): storage-level reads and writes, no permission rules beyond
visibility (the task's owner sees their own agents and the shared ones), since the task was
admitted already. It also gives the planner its bounded list of agents (`for_plan`) and the
default concurrency key of a task delegated by name (`limit_delegations`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from taskgrove.agent.foundations.agent_metrics import AgentMetrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.agent_service import has_skill
from taskgrove.executors.agent_delegation import AgentTarget
from taskgrove.storage.agent_secrets import AgentSecrets
from taskgrove.storage.agents import CLOSED, AgentStore
from taskgrove.storage.keys import KeyStoreError

PLAN_AT_MOST = 20  # agents listed in a planner's prompt
_WORD = re.compile(r"[a-z0-9]{3,}")
LIMITS_FRESH_SECONDS = 30.0  # how long the per-agent concurrency overrides are read from memory
DELEGATING = "a2a_agent_executor"


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


def health_rank(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Smaller is healthier: breaker closed, fewer failures in a row, more successes, faster."""
    health = row.get("health") or {}
    calls = health.get("calls") or 0
    success = (health.get("successes") or 0) / calls if calls else 0.5
    p50 = health.get("p50_ms")
    return (row.get("breaker", CLOSED) != CLOSED, health.get("consecutive_failures") or 0, -success,
            p50 if p50 is not None else math.inf, row["name"])


def relevance(row: Mapping[str, Any], wanted: set[str]) -> int:
    """How many words of the request the agent's card shares (skills weigh twice)."""
    own = _words(" ".join([row["name"], row.get("description") or "", " ".join(row.get("tags") or ())]))
    skills: set[str] = set()
    for skill in row.get("skills") or ():
        skills |= _words(" ".join([str(skill.get("id") or ""), str(skill.get("name") or ""),
                                   str(skill.get("description") or ""), " ".join(skill.get("tags") or ()),
                                   " ".join(skill.get("examples") or ())]))
    return len(wanted & own) + 2 * len(wanted & skills)


def plan_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the planner is told of one agent (llm/agent_prompt.py formats it)."""
    return {"name": row["name"], "description": row.get("description") or row.get("card_name") or "",
            "skills": [{"id": s.get("id"), "name": s.get("name"), "description": s.get("description"),
                        "tags": list(s.get("tags") or ()), "examples": list(s.get("examples") or ())[:3]}
                       for s in row.get("skills") or ()]}


class DirectoryLookup:
    def __init__(self, store: AgentStore, secrets: AgentSecrets, settings: Settings, metrics: AgentMetrics) -> None:
        self.store = store
        self.secrets = secrets
        self.settings = settings
        self.metrics = metrics
        self._limits: dict[str, int] = {}
        self._limits_read = -math.inf

    # --- AgentDirectory (executors/agent_delegation.py) ------------------------------------

    async def resolve(self, agent: str | None, skill: str | None, user_id: str | None) -> AgentTarget:
        if agent:
            row = await self.store.by_name(agent)
            if row is None or not (row["shared"] or row["user_id"] == user_id or user_id is None):
                raise LookupError(f"no agent named '{agent}' in the directory (agents.list shows them)")
            return self._target(row, "agent", None)
        if not skill:
            raise LookupError("give agent_url, agent (a directory name) or skill")
        rows = [r for r in await self.store.visible(user_id, everyone=user_id is None) if has_skill(r, skill)]
        if not rows:
            raise LookupError(f"no agent in the directory has the skill '{skill}' (a skill id or tag)")
        return self._target(min(rows, key=health_rank), "skill", skill)

    def _target(self, row: Mapping[str, Any], chosen_by: str, skill: str | None) -> AgentTarget:
        try:
            headers = self.secrets.open(row["id"], row.get("credentials"))
        except KeyStoreError as exc:
            raise LookupError(str(exc)) from None
        if row.get("changed"):  # its card moved: not followed until a person accepts it (agents.refresh)
            raise LookupError(f"agent '{row['name']}' changed its card ({', '.join(k for k in row['changed'] if k != 'seen_at')}); "
                              "review it with agents.get and accept it with agents.refresh accept: true")
        return AgentTarget(row["name"], row["card_url"], headers, chosen_by, skill)

    async def gate(self, name: str) -> tuple[str, str | None]:
        return await self.store.pass_gate(name)

    async def record(self, name: str, ok: bool, seconds: float, error: str | None) -> None:
        self.metrics.call(name, ok, seconds)
        await self.store.record_call(name, ok, seconds * 1000.0, error, self.settings.agent_breaker_failures,
                                     self.settings.agent_breaker_cooldown_seconds)

    # --- the planner ------------------------------------------------------------------------

    async def for_plan(self, user_id: str | None, requirement: str, at_most: int = PLAN_AT_MOST) -> list[dict[str, Any]]:
        """The agents `user_id` sees that match `requirement` best, at most `at_most`: all of them
        when they are that few, else those sharing the most words with it (ties: the healthier)."""
        rows = await self.store.visible(user_id, everyone=user_id is None)
        if len(rows) > at_most:
            wanted = _words(requirement)
            scored = sorted(rows, key=lambda r: (-relevance(r, wanted), health_rank(r)))
            rows = [r for r in scored[:at_most] if relevance(r, wanted) > 0] or scored[:at_most]
        return [plan_entry(r) for r in sorted(rows, key=lambda r: r["name"])]

    # --- the default concurrency key of a delegated task -------------------------------------

    async def read_limits(self) -> None:
        """The per-agent concurrency overrides, read at most every LIMITS_FRESH_SECONDS."""
        if time.monotonic() - self._limits_read < LIMITS_FRESH_SECONDS:
            return
        rows = await self.store.visible(None, everyone=True)
        self._limits = {r["name"]: int(r["concurrency"]) for r in rows if r.get("concurrency")}
        self._limits_read = time.monotonic()

    def limit_delegations(self, rows: Sequence[dict[str, Any]]) -> None:
        """Give each new task delegated to an agent by name, without a concurrency of its own, the
        key `agent:<name>` with the agent's limit (SERVICE_AGENT_CONCURRENCY unless overridden)."""
        for row in rows:
            inputs = row.get("inputs") or {}
            name = inputs.get("agent")
            if row.get("concurrency") is not None or not isinstance(name, str) or not name \
                    or inputs.get("agent_url") or _executor_of(row) != DELEGATING:
                continue
            limit = self._limits.get(name, self.settings.agent_concurrency)
            row["concurrency"] = {"key": f"agent:{name}"[:255], "limit": limit}
            row["concurrency_key"] = row["concurrency"]["key"]


def _executor_of(row: Mapping[str, Any]) -> str | None:
    schemas = row.get("schemas") or {}
    params = row.get("params") or {}
    return params.get("executor_id") or schemas.get("method")
