"""The named operations of the directory of agents (table in storage/agent_models.py).

`AgentStore` is the only way into the `agents` table. Each operation is one short transaction
run where storage/connections.py runs transactions (the database thread on SQLite, the async
driver on PostgreSQL); the statements are SQLAlchemy Core, compiled for each dialect
(storage/statements.py says why those have no written-out forms).

Decisions made here, because only one transaction can make them for every instance at once:

- A refresh is claimed with a compare-and-set on `refresh_due_at` (`claim_refresh`): whichever
  instance moves it owns that refresh, so one refresher at a time per agent, however many run.
- A call's outcome and the breaker move together (`record_call`): the row is read for update, the
  health counters and latencies changed, and the breaker opened after `threshold` failures in a
  row, closed by a success.
- Who probes an open breaker after its cool-down is a compare-and-set too (`pass_gate`): one task
  gets `probe`, the others keep waiting until it ends.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.engine import Connection

from taskgrove.storage.agent_models import agents_table as A
from taskgrove.storage.clock import now_iso
from taskgrove.storage.connections import Connections

Row = dict[str, Any]
LATENCIES_KEPT = 100  # the last calls whose latency gives p50 / p95
RECENT_KEPT = 10  # the last calls shown on the Agents page
PROBE_SECONDS = 300.0  # how long one probe holds an open breaker before another task may probe
PROBE_RECHECK_SECONDS = 2.0  # how soon a task that found a probe under way looks again
CLOSED, OPEN, PROBING = "closed", "open", "probing"


def _stamp_in(seconds: float) -> str:
    return now_iso(round(seconds * 1_000_000))


def _visible(user_id: str | None) -> Any:
    """The agents `user_id` sees: its own and the shared ones (None: every agent, an admin's view)."""
    return A.c.shared.is_(True) | (A.c.user_id == user_id)


def empty_health() -> Row:
    return {"calls": 0, "successes": 0, "failures": 0, "consecutive_failures": 0, "latencies_ms": [],
            "p50_ms": None, "p95_ms": None, "last_error": None, "last_call_at": None, "last_success_at": None,
            "recent": []}


def _percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(float(values[0]), 1)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return round(cuts[max(0, min(98, int(share * 100) - 1))], 1)


def next_health(health: Mapping[str, Any] | None, ok: bool, ms: float, error: str | None, at: str) -> Row:
    """The health after one more call (pure: tests/test_agent_directory.py checks it)."""
    out = {**empty_health(), **(health or {})}
    out["calls"] += 1
    latencies = [*out["latencies_ms"], round(float(ms), 1)][-LATENCIES_KEPT:]
    out["latencies_ms"] = latencies
    out["p50_ms"], out["p95_ms"] = _percentile(latencies, 0.50), _percentile(latencies, 0.95)
    out["last_call_at"] = at
    if ok:
        out["successes"] += 1
        out["consecutive_failures"] = 0
        out["last_success_at"] = at
    else:
        out["failures"] += 1
        out["consecutive_failures"] += 1
        out["last_error"] = (error or "failed")[:500]
    recent = {"at": at, "ok": ok, "ms": round(float(ms), 1), "error": None if ok else (error or "failed")[:200]}
    out["recent"] = [*out["recent"], recent][-RECENT_KEPT:]
    return out


# --- the statements, each a plain function of a synchronous connection ------------------------

def _insert(c: Connection, row: Mapping[str, Any]) -> None:
    c.execute(insert(A), dict(row))


def _by(c: Connection, column: str, value: str) -> Row | None:
    found = c.execute(select(A).where(A.c[column] == value)).first()
    return dict(found._mapping) if found else None


def _page(c: Connection, user_id: str | None, everyone: bool, after: tuple[str, str] | None, limit: int) -> list[Row]:
    query = select(A)
    if not everyone:
        query = query.where(_visible(user_id))
    if after is not None:
        query = query.where(or_(A.c.created_at > after[0], and_(A.c.created_at == after[0], A.c.id > after[1])))
    return [dict(r._mapping) for r in c.execute(query.order_by(A.c.created_at, A.c.id).limit(limit))]


def _update(c: Connection, agent_id: str, values: Mapping[str, Any]) -> Row | None:
    c.execute(update(A).where(A.c.id == agent_id).values(**values))
    return _by(c, "id", agent_id)


def _delete(c: Connection, agent_id: str) -> bool:
    return c.execute(delete(A).where(A.c.id == agent_id)).rowcount > 0


def _due(c: Connection, now: str, limit: int) -> list[Row]:
    query = select(A).where(A.c.refresh_due_at.is_not(None), A.c.refresh_due_at <= now)
    return [dict(r._mapping) for r in c.execute(query.order_by(A.c.refresh_due_at).limit(limit))]


def _claim_refresh(c: Connection, agent_id: str, due: str | None, next_due: str) -> bool:
    where = A.c.refresh_due_at.is_(None) if due is None else A.c.refresh_due_at == due
    return c.execute(update(A).where(A.c.id == agent_id, where).values(refresh_due_at=next_due)).rowcount > 0


def _record_call(c: Connection, name: str, ok: bool, ms: float, error: str | None, threshold: int,
                 cooldown: float) -> Row | None:
    found = c.execute(select(A.c.id, A.c.health, A.c.breaker).where(A.c.name == name).with_for_update()).first()
    if found is None:
        return None
    stamp = now_iso()
    health = next_health(found.health, ok, ms, error, stamp)
    values: dict[str, Any] = {"health": health, "updated_at": stamp}
    if ok:
        values.update(breaker=CLOSED, breaker_until=None)
    elif found.breaker == PROBING or (threshold and health["consecutive_failures"] >= threshold):
        values.update(breaker=OPEN, breaker_until=_stamp_in(cooldown))
    c.execute(update(A).where(A.c.id == found.id).values(**values))
    return {"breaker": values.get("breaker", found.breaker), "breaker_until": values.get("breaker_until"),
            "health": health}


def _pass_gate(c: Connection, name: str) -> tuple[str, str | None]:
    """("go", None) when the breaker is closed; ("probe", None) for the one task that probes an
    open breaker whose cool-down passed; ("wait", until) for every other task."""
    found = c.execute(select(A.c.id, A.c.breaker, A.c.breaker_until).where(A.c.name == name)).first()
    if found is None or found.breaker == CLOSED:
        return "go", None
    now = now_iso()
    soon = _stamp_in(PROBE_RECHECK_SECONDS)  # a probe is under way: look again shortly
    if found.breaker_until is not None and found.breaker_until > now:
        return "wait", min(found.breaker_until, soon) if found.breaker == PROBING else found.breaker_until
    until = _stamp_in(PROBE_SECONDS)
    claimed = c.execute(update(A).where(A.c.id == found.id, A.c.breaker == found.breaker,
                                        A.c.breaker_until == found.breaker_until)
                        .values(breaker=PROBING, breaker_until=until)).rowcount
    return ("probe", None) if claimed else ("wait", soon)


class AgentStore:
    """The directory's operations, for the agent service, the refresher and the delegation lookup."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections

    async def insert(self, row: Mapping[str, Any]) -> None:
        await self.connections.transact(_insert, row)

    async def by_id(self, agent_id: str) -> Row | None:
        return await self.connections.transact(_by, "id", agent_id)

    async def by_name(self, name: str) -> Row | None:
        return await self.connections.transact(_by, "name", name)

    async def page(self, user_id: str | None, everyone: bool, after: tuple[str, str] | None, limit: int) -> list[Row]:
        """Agents in the order they were added, after the (created_at, id) key `after`."""
        return await self.connections.transact(_page, user_id, everyone, after, limit)

    async def visible(self, user_id: str | None, everyone: bool = False, at_most: int = 5000) -> list[Row]:
        """Every agent `user_id` sees (the planner and delegation by skill choose among them)."""
        return await self.page(user_id, everyone, None, at_most)

    async def update(self, agent_id: str, values: Mapping[str, Any]) -> Row | None:
        return await self.connections.transact(_update, agent_id, {**values, "updated_at": now_iso()})

    async def delete(self, agent_id: str) -> bool:
        return await self.connections.transact(_delete, agent_id)

    async def due(self, limit: int = 50) -> list[Row]:
        return await self.connections.transact(_due, now_iso(), limit)

    async def claim_refresh(self, agent_id: str, due: str | None, every: float) -> bool:
        return await self.connections.transact(_claim_refresh, agent_id, due, _stamp_in(every))

    async def record_call(self, name: str, ok: bool, ms: float, error: str | None, threshold: int,
                          cooldown: float) -> Row | None:
        return await self.connections.transact(_record_call, name, ok, ms, error, threshold, cooldown)

    async def pass_gate(self, name: str) -> tuple[str, str | None]:
        return await self.connections.transact(_pass_gate, name)
