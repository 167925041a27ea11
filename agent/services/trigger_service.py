"""The trigger operations every surface calls: `triggers.create|get|list|update|delete|runs`, and
what `events.emit` does for triggers (docs/triggers.md).

A trigger starts a copy of a template tree (as a schedule does) for each event of its name whose
payload meets its `match`, under its flow control (key, debounce, batch, singleton, cancel_on). It
belongs to its template's owner, with the permission rules of schedules, and listens to that
user's events only (as waits do). The params are read by agent/foundations/requests_triggers.py;
the fields are checked here; the decisions are agent/engine/trigger_policy.py's, the loop that
carries them out agent/engine/trigger_loop.py, the statements storage/trigger_store.py.
"""

from __future__ import annotations

import builtins  # `list` below is also a method of TriggerService
import math
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import IntegrityError

from taskgrove.agent.engine.trigger_loop import TriggerLoop
from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.calls import CallContext, Handler, typed
from taskgrove.agent.foundations.errors import invalid_params, permission_denied
from taskgrove.agent.foundations.requests_triggers import (CreateTrigger, ListTriggers, TriggerRef, TriggerRuns,
                                                           UpdateTrigger)
from taskgrove.agent.foundations.trigger_metrics import TriggerMetrics
from taskgrove.agent.services.schedule_service import template_root
from taskgrove.agent.services.wait_service import EmitHook
from taskgrove.storage import jsonvalues, trigger_store
from taskgrove.storage.trigger_store import TriggerStore
from taskgrove.storage.clock import now_iso
from taskgrove.storage.repository import TaskRepository

# What a caller sets; everything else of a trigger is its state.
FIELDS = ("task_id", "event", "match", "key", "debounce", "batch", "singleton", "cancel_on", "enabled")
SINGLETON = ("skip", "queue", "replace")
MAX_SECONDS = 7 * 86400.0  # a debounce, a maximum wait, a batch's window: at most a week
MIN_SECONDS = 0.01
MAX_BATCH = trigger_store.PENDING_ROWS
DEFAULT_BATCH_SECONDS = 60.0
MAX_MATCH_CHARS = 10_000
SHOWN = ("id", "task_id", "user_id", "event", "match", "key", "debounce", "batch", "singleton", "cancel_on",
         "enabled", "matched", "runs", "debounced", "batched", "skipped", "cancelled", "last_run_at",
         "last_root_task_id", "created_at", "updated_at")


def public(row: Mapping[str, Any]) -> dict[str, Any]:
    """A trigger as every surface shows it."""
    return {key: row.get(key) for key in SHOWN}


class TriggerService:
    def __init__(self, repo: TaskRepository, loop: TriggerLoop, metrics: TriggerMetrics) -> None:
        self.repo = repo
        self.triggers = TriggerStore(repo)
        self.loop = loop
        self.metrics = metrics

    # --- helpers --------------------------------------------------------------------------

    async def _trigger_for(self, trigger_id: str, caller: Caller, verb: str) -> dict[str, Any]:
        row = await self.triggers.get(trigger_id)
        if row is None:
            raise invalid_params(f"trigger_id: trigger '{trigger_id}' not found")
        if not caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not {verb} trigger '{trigger_id}'")
        return row

    # --- methods --------------------------------------------------------------------------

    async def create(self, request: CreateTrigger, ctx: CallContext) -> dict[str, Any]:
        spec = spec_of(request.fields, {})  # bad fields first: they need no database
        template = await template_root(self.repo, request.task_id, ctx.caller, "a trigger")
        stamp = now_iso()
        trigger_id = request.trigger_id or str(uuid.uuid4())
        taken = f"trigger_id: trigger '{trigger_id}' already exists; choose another id or update it"
        if request.trigger_id is not None and await self.triggers.get(trigger_id):
            raise invalid_params(taken)
        row = {"id": trigger_id, "task_id": request.task_id, "user_id": template["user_id"], **spec,
               "matched": 0, "runs": 0, "debounced": 0, "batched": 0, "skipped": 0, "cancelled": 0,
               "last_run_at": None, "last_root_task_id": None, "created_at": stamp, "updated_at": stamp}
        try:
            await self.triggers.insert(row)
        except IntegrityError:  # created under the same id meanwhile
            raise invalid_params(taken) from None
        return public(row)

    async def get(self, request: TriggerRef, ctx: CallContext) -> dict[str, Any] | None:
        row = await self.triggers.get(request.trigger_id)
        if row is None:
            return None
        if not ctx.caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not access trigger '{request.trigger_id}'")
        answer = public(row)
        answer["waiting"] = await self.triggers.waiting_count(row["id"])
        return answer

    async def list(self, request: ListTriggers, ctx: CallContext) -> list[dict[str, Any]]:
        user_id = request.user_id
        if user_id is None and ctx.caller.authenticated and not ctx.caller.unrestricted:
            user_id = ctx.caller.user_id
        rows = await self.triggers.listing(user_id, request.task_id, request.event, request.limit,
                                             request.offset)
        return [public(r) for r in rows if ctx.caller.can_access(r["user_id"])]

    async def update(self, request: UpdateTrigger, ctx: CallContext) -> dict[str, Any]:
        row = await self._trigger_for(request.trigger_id, ctx.caller, "update")
        if "task_id" in request.fields and request.fields["task_id"] != row["task_id"]:
            raise invalid_params("task_id: a trigger's template cannot be changed; create another trigger")
        spec = spec_of(request.fields, row)
        updated = await self.triggers.update(row["id"], {**spec, "updated_at": now_iso()})
        if updated is None:
            raise invalid_params(f"trigger_id: trigger '{row['id']}' not found")
        self.loop.wake()  # a new debounce, batch or enabled changes what is due
        return public(updated)

    async def delete(self, request: TriggerRef, ctx: CallContext) -> dict[str, Any]:
        row = await self._trigger_for(request.trigger_id, ctx.caller, "delete")
        deleted = await self.triggers.delete(row["id"], now_iso())
        return {"success": deleted, "trigger_id": row["id"]}

    async def runs(self, request: TriggerRuns, ctx: CallContext) -> builtins.list[dict[str, Any]] | None:
        """The runs the trigger started, newest first; None for an unknown trigger, as triggers.get."""
        if await self.get(TriggerRef(request.trigger_id), ctx) is None:
            return None
        return await self.triggers.runs_of(request.trigger_id, request.key, request.limit)

    # --- events.emit ----------------------------------------------------------------------

    def emit_hook(self) -> EmitHook:
        """What `events.emit` does for triggers: in the transaction that stores the event, every
        enabled trigger of its user listening to its name takes it in (trigger_store.take_in_event:
        an inbox row to start, when its `match` is met; to cancel, for its `cancel_on`), so an
        event is never stored without them; after the commit the loop is woken. The emit's
        answer gets {"triggered": how many triggers took it in}."""
        return EmitHook(trigger_store.take_in_event, self._taken_in)

    def _taken_in(self, taken: int) -> dict[str, Any]:
        if taken:
            self.metrics.counted("matched", taken)
            self.loop.wake()
        return {"triggered": taken}


def spec_of(params: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A trigger's settable fields: `base` (nothing, or the stored trigger) changed by `params`,
    every one checked; errors name the field first."""
    unknown = sorted(set(params) - set(FIELDS))
    if unknown:
        raise invalid_params(f"{unknown[0]}: unknown field (fields: {', '.join(FIELDS)})"[:300])
    spec = {key: params[key] if key in params else base.get(key) for key in FIELDS if key != "task_id"}
    out: dict[str, Any] = {"event": rpc_params.string(spec, "event", required=True, max_length=255)}
    match = spec.get("match")
    if match is not None:
        if not isinstance(match, Mapping):
            raise invalid_params(f"match must be an object (payload keys and the values they must have), "
                                 f"got {type(match).__name__}")
        if (bad := jsonvalues.problem(dict(match), "match", jsonvalues.STORED_MAX_DEPTH)) is not None:
            raise invalid_params(bad)
        if len(repr(match)) > MAX_MATCH_CHARS:
            raise invalid_params(f"match is larger than {MAX_MATCH_CHARS} characters")
        match = dict(match) or None
    out["match"] = match
    out["key"] = rpc_params.string(spec, "key", max_length=255)
    out["debounce"] = _debounce(spec.get("debounce"))
    out["batch"] = _batch(spec.get("batch"))
    if out["debounce"] and out["batch"]:
        raise invalid_params("debounce, batch: give at most one of them (a debounce starts one run with the last "
                             "event, a batch one run with many)")
    singleton = rpc_params.string(spec, "singleton", max_length=16)
    if singleton is not None and singleton not in SINGLETON:
        raise invalid_params(f"singleton must be one of {', '.join(SINGLETON)}, got {singleton!r}"[:300])
    out["singleton"] = singleton
    out["cancel_on"] = rpc_params.string(spec, "cancel_on", max_length=255)
    if out["cancel_on"] is not None and out["cancel_on"] == out["event"]:
        raise invalid_params(f"cancel_on must name another event than event ({out['event']!r})"[:300])
    out["enabled"] = rpc_params.boolean(spec, "enabled", True)
    return out


def _seconds(value: Any, name: str, low: float = MIN_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= MAX_SECONDS:
        raise invalid_params(f"{name} must be a number of seconds from {low:g} to {MAX_SECONDS:.0f}, "
                             f"got {value!r}"[:300])
    return float(value)


def _only(value: Any, name: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise invalid_params(f"{name} must be an object with {', '.join(keys)}, got {type(value).__name__}")
    unknown = sorted(str(k) for k in set(value) - set(keys))
    if unknown:
        raise invalid_params(f"{name}.{unknown[0]}: unknown field (fields: {', '.join(keys)})"[:300])
    return value


def _debounce(value: Any) -> dict[str, Any] | None:
    """{seconds: the quiet time, max_wait_seconds: optional, at least seconds}."""
    if value is None:
        return None
    value = _only(value, "debounce", ("seconds", "max_wait_seconds"))
    if value.get("seconds") is None:
        raise invalid_params("debounce.seconds is required: how long a key must be quiet before its run starts")
    seconds = _seconds(value["seconds"], "debounce.seconds")
    most = value.get("max_wait_seconds")
    if most is not None:
        most = _seconds(most, "debounce.max_wait_seconds", seconds)
    return {"seconds": seconds, "max_wait_seconds": most}


def _batch(value: Any) -> dict[str, Any] | None:
    """{size: events in one run at most, seconds: how long the first one waits at most}."""
    if value is None:
        return None
    value = _only(value, "batch", ("size", "seconds"))
    if value.get("size") is None:
        raise invalid_params("batch.size is required: how many events one run holds at most")
    size = rpc_params.bounded(value["size"], "batch.size", low=1, high=MAX_BATCH)
    seconds = value.get("seconds")
    return {"size": size,
            "seconds": DEFAULT_BATCH_SECONDS if seconds is None else _seconds(seconds, "batch.seconds")}


def trigger_methods(service: TriggerService) -> dict[str, Handler]:
    return {
        "triggers.create": typed(CreateTrigger.from_params, service.create),
        "triggers.get": typed(TriggerRef.from_params, service.get),
        "triggers.list": typed(ListTriggers.from_params, service.list),
        "triggers.update": typed(UpdateTrigger.from_params, service.update),
        "triggers.delete": typed(TriggerRef.from_params, service.delete),
        "triggers.runs": typed(TriggerRuns.from_params, service.runs),
    }
