"""The statements of event triggers (tables in storage/trigger_models.py; docs/triggers.md).

Two moments write here. `take_in_event`: an `events.emit` that a trigger matches leaves one inbox
row per (trigger, event) (unique: a second insert of the same event for the same trigger fails),
in the transaction that stores the event (storage/wait_store.store_event): an event is never
stored without the rows of the triggers it matched, so none is lost to a crash in between.
`take_group`: a trigger loop (any instance's) handles the waiting rows of one trigger and key in
one transaction: it locks the trigger's row (PostgreSQL: `FOR UPDATE`, so instances decide for a
trigger one at a time; SQLite has one writer anyway), reads the rows still waiting, lets the
caller's policy decide (`decide`, agent/engine/trigger_policy.py), and when the decision starts a
run, inserts the run's copy of the template and its execution, records the run, and marks the rows
it took with a compare-and-set on `handled_at IS NULL`. A row handled elsewhere meanwhile makes the
whole transaction roll back (TakenElsewhere): each event goes into at most one run, and a crash
before the commit leaves the rows waiting for the next look.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import and_, case, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from taskgrove.storage import copy_plan, tree_insert
from taskgrove.storage.attempts import ms_between
from taskgrove.storage.models import UNFINISHED_STATUSES
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.repository import TaskRepository, read_tree
from taskgrove.storage.trigger_models import trigger_events_table as E
from taskgrove.storage.trigger_models import trigger_runs_table as R
from taskgrove.storage.trigger_models import triggers_table as G
from taskgrove.storage.wait_store import meets

Row = dict[str, Any]
PENDING_ROWS = 1000  # rows of one group read per decision (a batch is at most this size)
KEY_WIDTH = 255  # group_key's column; longer key values are stored as their digest


class TakenElsewhere(Exception):
    """A row this transaction meant to take was handled by another one first: roll back."""


class Plan(NamedTuple):
    """A policy's decision for one trigger and key (agent/engine/trigger_policy.py decides)."""

    action: str  # wait (not due) | hold (queued behind a run) | start | skip | replace
    taken: list[Row]  # the waiting rows a start or a skip takes, oldest first
    due_at: str | None = None  # wait: when to look again
    running: tuple[str, ...] = ()  # replace: the runs to cancel first


Decide = Callable[[Row, list[Row], list[str]], Plan]


def group_key(trigger: Mapping[str, Any], payload: Mapping[str, Any]) -> str:
    """The key a payload's event is grouped by: the text of the payload's `key` field ('' without
    a key, or when the field is missing); a long value is kept as its digest."""
    field = trigger.get("key")
    if not field or field not in payload:
        return ""
    value = payload[field]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(text) > KEY_WIDTH:
        text = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text


# --- the triggers ------------------------------------------------------------------------------------

def insert_trigger(c: Connection, row: Mapping[str, Any]) -> None:
    c.execute(insert(G), dict(row))


def get_trigger(c: Connection, trigger_id: str, lock: bool = False) -> Row | None:
    query = select(G).where(G.c.id == trigger_id)
    found = c.execute(query.with_for_update() if lock else query).first()
    return dict(found._mapping) if found else None


def list_triggers(c: Connection, user_id: str | None, task_id: str | None, event: str | None, limit: int,
                  offset: int) -> list[Row]:
    query = select(G)
    for column, value in ((G.c.user_id, user_id), (G.c.task_id, task_id), (G.c.event, event)):
        if value is not None:
            query = query.where(column == value)
    query = query.order_by(G.c.created_at.desc(), G.c.id).limit(limit).offset(offset)
    return [dict(r._mapping) for r in c.execute(query)]


def update_trigger(c: Connection, trigger_id: str, values: Mapping[str, Any]) -> Row | None:
    c.execute(update(G).where(G.c.id == trigger_id).values(**values))
    return get_trigger(c, trigger_id)


def delete_trigger(c: Connection, trigger_id: str, stamp: str) -> bool:
    """The trigger goes; its waiting events are marked `gone` (never started); its runs stay."""
    deleted = c.execute(delete(G).where(G.c.id == trigger_id)).rowcount > 0
    c.execute(update(E).where(E.c.trigger_id == trigger_id, E.c.handled_at.is_(None))
              .values(handled_at=stamp, outcome="gone"))
    return deleted


def matching(c: Connection, user_id: str | None, name: str) -> list[Row]:
    """The enabled triggers of `user_id` that listen to event `name`, to start or to cancel."""
    owner = G.c.user_id.is_(None) if user_id is None else G.c.user_id == user_id
    query = select(G).where(owner, G.c.enabled.is_(True), (G.c.event == name) | (G.c.cancel_on == name))
    return [dict(r._mapping) for r in c.execute(query.order_by(G.c.created_at, G.c.id))]


# --- the inbox ----------------------------------------------------------------------------------------

def take_in(c: Connection, entries: Sequence[Mapping[str, Any]], event_id: str, payload: Mapping[str, Any],
            stamp: str) -> int:
    """One inbox row per entry ({trigger_id, kind, group_key}) for event `event_id`, and each
    trigger's `matched` counted; returns how many rows were written."""
    for entry in entries:
        c.execute(insert(E).values(trigger_id=entry["trigger_id"], event_id=event_id, kind=entry["kind"],
                                   group_key=entry["group_key"], payload=dict(payload), created_at=stamp))
        c.execute(update(G).where(G.c.id == entry["trigger_id"]).values(matched=G.c.matched + 1))
    return len(entries)


def take_in_event(c: Connection, user_id: str | None, name: str, payload: Mapping[str, Any], event_id: str,
                  stamp: str) -> int:
    """What storing an event writes for triggers, in the event's own transaction (wait_store.store_event):
    every enabled trigger of `user_id` listening to `name` takes it in: an inbox row to start when
    its `match` is met, to cancel for its `cancel_on`. Returns how many triggers took it in."""
    entries = []
    for trigger in matching(c, user_id, name):
        if trigger["event"] == name and meets(trigger["match"], payload):
            entries.append({"trigger_id": trigger["id"], "kind": "start", "group_key": group_key(trigger, payload)})
        elif trigger["cancel_on"] == name:
            entries.append({"trigger_id": trigger["id"], "kind": "cancel", "group_key": group_key(trigger, payload)})
    return take_in(c, entries, event_id, payload, stamp)


def pending_groups(c: Connection, limit: int = 500) -> list[Row]:
    """Every (trigger, key) with waiting events, with its trigger: how many wait, the first and last
    arrival, and whether a cancel waits among them. Enabled triggers only."""
    cancels = func.sum(case((E.c.kind == "cancel", 1), else_=0))
    query = (select(E.c.trigger_id, E.c.group_key, func.count().label("count"),
                    func.min(E.c.created_at).label("first_at"), func.max(E.c.created_at).label("last_at"),
                    cancels.label("cancels"))
             .select_from(E.join(G, and_(G.c.id == E.c.trigger_id, G.c.enabled.is_(True))))
             .where(E.c.handled_at.is_(None)).group_by(E.c.trigger_id, E.c.group_key)
             .order_by(func.min(E.c.seq)).limit(limit))
    groups = [dict(r._mapping) for r in c.execute(query)]
    if groups:
        triggers = {r.id: dict(r._mapping) for r in
                    c.execute(select(G).where(G.c.id.in_(sorted({g["trigger_id"] for g in groups}))))}
        for group in groups:
            group["trigger"] = triggers.get(group["trigger_id"])
    return [g for g in groups if g.get("trigger") is not None]


def waiting_rows(c: Connection, trigger_id: str, key: str, kind: str) -> list[Row]:
    query = (select(E).where(E.c.handled_at.is_(None), E.c.trigger_id == trigger_id, E.c.group_key == key,
                             E.c.kind == kind).order_by(E.c.seq).limit(PENDING_ROWS))
    return [dict(r._mapping) for r in c.execute(query)]


def running_roots(c: Connection, trigger_id: str, key: str, started_by: str | None = None) -> list[str]:
    """The runs of a trigger's key still going: their execution runs and their root is unfinished
    (a cancelled root is no longer going, even while its execution winds down). `started_by`: only
    runs started at or before that moment."""
    joined = R.join(X, and_(X.c.task_tree_id == R.c.root_task_id, X.c.status == "running")) \
              .join(T, T.c.id == R.c.root_task_id)
    query = (select(R.c.root_task_id).select_from(joined)
             .where(R.c.trigger_id == trigger_id, R.c.group_key == key, T.c.status.in_(UNFINISHED_STATUSES))
             .order_by(R.c.created_at))
    if started_by is not None:
        query = query.where(R.c.created_at <= started_by)
    return list(dict.fromkeys(r.root_task_id for r in c.execute(query)))


def _mark(c: Connection, rows: Sequence[Mapping[str, Any]], outcome: str, stamp: str,
          root: str | None = None) -> None:
    """Compare-and-set: every row of `rows` still waiting becomes handled, or nothing does."""
    if not rows:
        return
    seqs = [r["seq"] for r in rows]
    changed = c.execute(update(E).where(E.c.seq.in_(seqs), E.c.handled_at.is_(None))
                        .values(handled_at=stamp, outcome=outcome, root_task_id=root)).rowcount
    if changed != len(seqs):
        raise TakenElsewhere(f"{len(seqs) - changed} of {len(seqs)} events were handled elsewhere")


# --- deciding for one trigger and key -------------------------------------------------------------

def take_group(c: Connection, trigger_id: str, key: str, decide: Decide, stamp: str, owner: str, until: str,
               traceparent: str | None = None) -> Row:
    """Decide for the waiting start events of (trigger, key) and carry the decision out (see the
    module's docstring). Returns {"plan", "trigger", "execution", "copies"}; execution and copies
    are set when a run was inserted (the caller hands it to the engine after the commit)."""
    trigger = get_trigger(c, trigger_id, lock=True)
    answer: Row = {"plan": Plan("wait", []), "trigger": trigger, "execution": None, "copies": []}
    if trigger is None or not trigger["enabled"]:
        return answer
    rows = waiting_rows(c, trigger_id, key, "start")
    plan = answer["plan"] = decide(trigger, rows, running_roots(c, trigger_id, key) if rows else [])
    counts: dict[str, Any] = {}
    if plan.action == "skip":
        _mark(c, plan.taken, "skipped", stamp)
        counts["skipped"] = G.c.skipped + len(plan.taken)
    elif plan.action == "start":
        template = _template(c, trigger["task_id"])
        if template is None:  # the template is gone: the trigger stops, its events are not run
            _mark(c, plan.taken, "gone", stamp)
            counts["enabled"] = False
        else:
            copies = _copies(template, trigger, key, plan.taken)
            root = copies[0]["id"]
            if trigger.get("batch"):
                _mark(c, plan.taken, "batched", stamp, root)
                counts["batched"] = G.c.batched + len(plan.taken)
            else:
                _mark(c, plan.taken[:-1], "debounced", stamp, root)
                _mark(c, plan.taken[-1:], "run", stamp, root)
                counts["debounced"] = G.c.debounced + len(plan.taken) - 1
            answer["execution"] = tree_insert.insert_tree(c, copies, trigger["user_id"], owner, until, stamp,
                                                          traceparent=traceparent)
            answer["copies"] = copies
            c.execute(insert(R).values(root_task_id=root, trigger_id=trigger_id, group_key=key,
                                       events=len(plan.taken), created_at=stamp))
            c.execute(update(T).where(T.c.id == trigger["task_id"], T.c.has_copy.is_(False)).values(has_copy=True))
            counts.update(runs=G.c.runs + 1, last_run_at=stamp, last_root_task_id=root)
    if counts:
        c.execute(update(G).where(G.c.id == trigger_id).values(**counts))
    return answer


def _template(c: Connection, task_id: str) -> list[Row] | None:
    root = c.execute(select(T.c.task_tree_id).where(T.c.id == task_id)).first()
    return read_tree(c, root.task_tree_id) if root is not None else None


def _copies(template: list[Row], trigger: Mapping[str, Any], key: str, taken: Sequence[Mapping[str, Any]]) -> list[Row]:
    """A fresh copy of the template (tasks.copy semantics), root first. The events go to the root's
    inputs (`event`: the last payload; with `batch`, `events`: every payload, oldest first) and its
    origin to the root's extra (`trigger_id`, `trigger_key`, `trigger_event_ids`)."""
    selected, root = copy_plan.connect(template, copy_plan.copy_selection(template, trigger["task_id"], False))
    copies = copy_plan.plan_copies(template, selected, root, origin_for=dict.fromkeys(selected, "clone"),
                                   reset=copy_plan.RESETTABLE)
    head = copies[0]
    inputs = dict(head.get("inputs") or {})
    if trigger.get("batch"):
        inputs["events"] = [row["payload"] for row in taken]
    else:
        inputs["event"] = taken[-1]["payload"]
    head["inputs"] = inputs
    head["extra"] = {**(head.get("extra") or {}), "trigger_id": trigger["id"], "trigger_key": key,
                     "trigger_event_ids": [row["event_id"] for row in taken]}
    return copies


# --- cancelling ---------------------------------------------------------------------------------------

def waiting_cancels(c: Connection, trigger_id: str, key: str) -> list[Row]:
    return waiting_rows(c, trigger_id, key, "cancel")


def settle_cancel(c: Connection, cancel: Mapping[str, Any], cancelled: Sequence[str], reason: str,
                  stamp: str) -> dict[str, int] | None:
    """After the runs `cancelled` were cancelled for `cancel` (a cancel_on event): the cancel is
    handled, the start events of its key that came before it are dropped, the reason is kept on
    the runs. Returns {cancelled, dropped} (runs newly counted, start events dropped); None when
    another instance settled it first (nothing changes then)."""
    changed = c.execute(update(E).where(E.c.seq == cancel["seq"], E.c.handled_at.is_(None))
                        .values(handled_at=stamp, outcome="cancel")).rowcount
    if not changed:
        return None
    dropped = c.execute(update(E).where(E.c.trigger_id == cancel["trigger_id"], E.c.group_key == cancel["group_key"],
                                        E.c.kind == "start", E.c.handled_at.is_(None), E.c.seq < cancel["seq"])
                        .values(handled_at=stamp, outcome="dropped")).rowcount
    counted = record_cancels(c, cancel["trigger_id"], cancelled, reason)
    if dropped:
        c.execute(update(G).where(G.c.id == cancel["trigger_id"]).values(skipped=G.c.skipped + dropped))
    return {"cancelled": counted, "dropped": dropped}


def record_cancels(c: Connection, trigger_id: str, roots: Sequence[str], reason: str) -> int:
    """The reason a trigger cancelled `roots` (cancel_on, or singleton replace), counted once per
    run; returns how many runs were newly counted."""
    if not roots:
        return 0
    changed = c.execute(update(R).where(R.c.root_task_id.in_(list(roots)), R.c.cancel_reason.is_(None))
                        .values(cancel_reason=reason)).rowcount
    if changed:
        c.execute(update(G).where(G.c.id == trigger_id).values(cancelled=G.c.cancelled + changed))
    return changed


# --- reading the runs ---------------------------------------------------------------------------------

def runs_of(c: Connection, trigger_id: str, key: str | None, limit: int) -> list[Row]:
    """The runs a trigger started, newest first: root, key, how many events, the root's status,
    the first execution's end, and why the trigger cancelled it (if it did)."""
    query = (select(R, T.c.status, T.c.name).select_from(R.join(T, T.c.id == R.c.root_task_id, isouter=True))
             .where(R.c.trigger_id == trigger_id).order_by(R.c.created_at.desc(), R.c.root_task_id).limit(limit))
    if key is not None:
        query = query.where(R.c.group_key == key)
    runs = [dict(r._mapping) for r in c.execute(query)]
    ended: dict[str, Row] = {}
    if runs:
        found = c.execute(select(X.c.task_tree_id, X.c.created_at, X.c.ended_at, X.c.final_status)
                          .where(X.c.task_tree_id.in_([r["root_task_id"] for r in runs]))
                          .order_by(X.c.created_at.desc()))
        for e in found:
            ended[e.task_tree_id] = dict(e._mapping)  # the earliest wins (read last)
    return [{"root_task_id": r["root_task_id"], "name": r["name"], "key": r["group_key"], "events": r["events"],
             "status": r["status"], "started_at": r["created_at"],
             "ended_at": ended.get(r["root_task_id"], {}).get("ended_at"),
             "final_status": ended.get(r["root_task_id"], {}).get("final_status"),
             "duration_ms": ms_between(ended.get(r["root_task_id"], {}).get("created_at"),
                                       ended.get(r["root_task_id"], {}).get("ended_at")),
             "cancel_reason": r["cancel_reason"]} for r in runs]


def waiting_count(c: Connection, trigger_id: str) -> int:
    """How many of a trigger's events wait (a debounce, a batch, a queue)."""
    return int(c.execute(select(func.count()).select_from(E)
                         .where(E.c.trigger_id == trigger_id, E.c.handled_at.is_(None))).scalar() or 0)


class TriggerStore:
    """The triggers' named operations, each one transaction of its own running the statement
    function above of the same name: what the trigger service and the trigger loop call (issue
    44: storage offers named operations; nothing above it hands functions to `transact`)."""

    def __init__(self, repo: TaskRepository) -> None:
        self._transact = repo.transact

    async def get(self, trigger_id: str) -> Row | None:
        return await self._transact(get_trigger, trigger_id)

    async def insert(self, row: Mapping[str, Any]) -> None:
        await self._transact(insert_trigger, row)

    async def listing(self, user_id: str | None, task_id: str | None, event: str | None, limit: int,
                      offset: int) -> list[Row]:
        return await self._transact(list_triggers, user_id, task_id, event, limit, offset)

    async def update(self, trigger_id: str, values: Mapping[str, Any]) -> Row | None:
        return await self._transact(update_trigger, trigger_id, values)

    async def delete(self, trigger_id: str, stamp: str) -> bool:
        return await self._transact(delete_trigger, trigger_id, stamp)

    async def runs_of(self, trigger_id: str, key: str | None, limit: int) -> list[Row]:
        return await self._transact(runs_of, trigger_id, key, limit)

    async def waiting_count(self, trigger_id: str) -> int:
        return await self._transact(waiting_count, trigger_id)

    async def pending_groups(self, limit: int = 500) -> list[Row]:
        return await self._transact(pending_groups, limit)

    async def take_group(self, trigger_id: str, key: str, decide: Decide, stamp: str, owner: str, until: str,
                         traceparent: str | None = None) -> Row:
        return await self._transact(take_group, trigger_id, key, decide, stamp, owner, until, traceparent)

    async def record_cancels(self, trigger_id: str, roots: Sequence[str], reason: str) -> int:
        return await self._transact(record_cancels, trigger_id, roots, reason)

    async def waiting_cancels(self, trigger_id: str, key: str) -> list[Row]:
        return await self._transact(waiting_cancels, trigger_id, key)

    async def running_roots(self, trigger_id: str, key: str, started_by: str | None = None) -> list[str]:
        return await self._transact(running_roots, trigger_id, key, started_by)

    async def settle_cancel(self, cancel: Mapping[str, Any], cancelled: Sequence[str], reason: str,
                            stamp: str) -> dict[str, int] | None:
        return await self._transact(settle_cancel, cancel, cancelled, reason, stamp)
