"""The schedule operations every surface calls: `schedules.create|get|list|update|delete|trigger`.

A schedule runs a copy of a template tree (tasks.copy semantics: the copy's `original_task_id`
points to the template) on a cron expression or an interval. It belongs to its template's owner;
the permission rules are those of tasks. The params are read by the typed requests of
agent/foundations/requests_services.py; the fields' validation lives here, the timing in engine/slots.py,
the statements (and the one compare-and-set that claims a slot) in storage/schedule_store.py, the
loop in engine/schedule_loop.py.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.engine import slots
from taskgrove.agent.engine.schedule_loop import ScheduleLoop
from taskgrove.agent.engine.webhooks import WebhookConfig
from taskgrove.agent.foundations.errors import invalid_params, permission_denied
from taskgrove.agent.foundations.requests_services import CreateSchedule, ListSchedules, ScheduleRef, ScheduleRuns, UpdateSchedule
from taskgrove.agent.foundations import params as rpc_params
from taskgrove.agent.foundations.calls import CallContext, Handler, typed
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.schedule_store import ScheduleStore
from taskgrove.storage.repository import TaskRepository

OVERLAP = ("skip", "allow")
CATCH_UP = ("latest", "none")
# What a caller sets; everything else of a schedule is its state.
FIELDS = ("task_id", "cron", "interval_seconds", "timezone", "enabled", "max_runs", "start_at", "end_at",
          "overlap", "catch_up", "webhook_config")
TIMING = ("cron", "interval_seconds", "timezone", "start_at", "end_at", "enabled", "max_runs")
MAX_RUNS = 2**31 - 1
MASK = "***"  # what a read shows of a webhook header's value


async def template_root(repo: TaskRepository, task_id: str, caller: Caller, runner: str) -> dict[str, Any]:
    """The stored tree that `runner` ("a schedule", "a trigger") runs copies of: a root the caller
    may access. One rule for every kind of stored template."""
    row = await repo.get(task_id)
    if row is None:
        raise invalid_params(f"task_id: task '{task_id}' not found")
    if not caller.can_access(row["user_id"]):
        raise permission_denied(f"You may not access task '{task_id}'")
    if row["parent_id"] is not None:
        raise invalid_params(f"task_id: task '{task_id}' is not the root of its tree (its root is "
                             f"'{row['task_tree_id']}'); {runner} runs a copy of a whole tree")
    return row


class ScheduleService:
    def __init__(self, repo: TaskRepository, schedule_loop: ScheduleLoop, settings: Settings) -> None:
        self.repo = repo
        self.schedules = ScheduleStore(repo)
        self.schedule_loop = schedule_loop
        self.settings = settings

    # --- helpers --------------------------------------------------------------------------

    async def _schedule_for(self, schedule_id: str, caller: Caller, verb: str) -> dict[str, Any]:
        row = await self.schedules.get(schedule_id)
        if row is None:
            raise invalid_params(f"schedule_id: schedule '{schedule_id}' not found")
        if not caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not {verb} schedule '{schedule_id}'")
        return row

    async def _spec(self, params: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
        """The schedule's settable fields: `base` (defaults, or the stored schedule) changed by
        `params` (a request's `fields`), every one checked. Errors name the field."""
        unknown = sorted(set(params) - set(FIELDS) - {"schedule_id", "id"})
        if unknown:
            raise invalid_params(f"{unknown[0]}: unknown field (fields: {', '.join(FIELDS)})")
        spec = dict(base)
        for key in FIELDS:
            if key in params:
                spec[key] = params[key]
        # Setting one of cron and interval_seconds replaces the other.
        if params.get("cron") is not None and "interval_seconds" not in params:
            spec["interval_seconds"] = None
        if params.get("interval_seconds") is not None and "cron" not in params:
            spec["cron"] = None
        out: dict[str, Any] = {}
        out["cron"] = rpc_params.string(spec, "cron", max_length=255)
        interval = spec.get("interval_seconds")
        if interval is not None:
            if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
                    or not 1 <= interval <= slots.MAX_INTERVAL_SECONDS:
                raise invalid_params(f"interval_seconds must be a number of seconds from 1 to "
                                     f"{slots.MAX_INTERVAL_SECONDS:.0f}, got {interval!r}"[:300])
            interval = float(interval)
        out["interval_seconds"] = interval
        if (out["cron"] is None) == (interval is None):
            raise invalid_params("cron, interval_seconds: give exactly one of them (a five-field cron expression, "
                                 "or an interval of at least 1 second)")
        out["timezone"] = rpc_params.string(spec, "timezone", max_length=64) or "UTC"
        try:
            tz = slots.zone(out["timezone"])
        except ValueError:
            raise invalid_params(f"timezone must be an IANA time zone name such as 'Europe/Berlin', "
                                 f"got {out['timezone']!r}"[:300]) from None
        if out["cron"] is not None:
            try:
                slots.check_cron(out["cron"])
            except ValueError:
                raise invalid_params(f"cron must be a five-field cron expression (minute hour day-of-month month "
                                     f"day-of-week), got {out['cron']!r}"[:300]) from None
        out["enabled"] = rpc_params.boolean(spec, "enabled", True)
        out["max_runs"] = (rpc_params.integer(spec, "max_runs", 0, low=1, high=MAX_RUNS)
                           if spec.get("max_runs") is not None else None)
        for key in ("start_at", "end_at"):
            out[key] = _moment(spec, key, tz)
        if out["start_at"] and out["end_at"] and out["end_at"] <= out["start_at"]:
            raise invalid_params(f"end_at must be after start_at ({out['end_at']} is not after {out['start_at']})")
        for key, allowed in (("overlap", OVERLAP), ("catch_up", CATCH_UP)):
            value = rpc_params.string(spec, key, max_length=32) or allowed[0]
            if value not in allowed:
                raise invalid_params(f"{key} must be one of {', '.join(allowed)}, got {value!r}"[:300])
            out[key] = value
        webhook = spec.get("webhook_config")
        if webhook is not None and webhook is not base.get("webhook_config"):
            webhook = dataclasses.asdict(await WebhookConfig.parse(_unmasked(webhook, base), self.settings))
        out["webhook_config"] = webhook
        return out

    @staticmethod
    def _next(spec: Mapping[str, Any], runs: int, now: datetime) -> str | None:
        if not spec["enabled"] or (spec["max_runs"] is not None and runs >= spec["max_runs"]):
            return None
        slot = slots.next_slot(spec, now)
        return slots.iso(slot) if slot is not None else None

    # --- methods --------------------------------------------------------------------------

    async def create(self, request: CreateSchedule, ctx: CallContext) -> dict[str, Any]:
        task_id = request.task_id
        template = await template_root(self.repo, task_id, ctx.caller, "a schedule")
        spec = await self._spec(request.fields, {})
        now = datetime.now(timezone.utc)
        stamp = slots.iso(now)
        row = {"id": str(uuid.uuid4()), "task_id": task_id, "user_id": template["user_id"], **spec,
               "created_at": stamp, "updated_at": stamp, "last_run_at": None, "last_slot": None,
               "last_root_task_id": None, "runs": 0, "skipped": 0, "last_skipped_at": None}
        row["next_run_at"] = self._next(row, 0, now)
        await self.schedules.insert(row)
        self.schedule_loop.wake()
        return public(row)

    async def get(self, request: ScheduleRef, ctx: CallContext) -> dict[str, Any] | None:
        schedule_id = request.schedule_id
        row = await self.schedules.get(schedule_id)
        if row is None:
            return None
        if not ctx.caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not access schedule '{schedule_id}'")
        return public(row)

    async def runs(self, request: ScheduleRuns, ctx: CallContext) -> list[dict[str, Any]] | None:
        """The trees the schedule started, newest first, with their durations (storage/schedule_store.py
        runs_of); None for an unknown schedule, as schedules.get."""
        row = await self.get(ScheduleRef(request.schedule_id), ctx)
        if row is None:
            return None
        stored = await self.schedules.get(request.schedule_id)
        return await self.schedules.runs_of(stored, request.limit)  # type: ignore[arg-type]  # found just above

    async def list(self, request: ListSchedules, ctx: CallContext) -> list[dict[str, Any]]:
        user_id = request.user_id
        if user_id is None and ctx.caller.authenticated and not ctx.caller.unrestricted:
            user_id = ctx.caller.user_id
        rows = await self.schedules.listing(user_id, request.task_id, request.limit, request.offset)
        return [public(r) for r in rows if ctx.caller.can_access(r["user_id"])]

    async def update(self, request: UpdateSchedule, ctx: CallContext) -> dict[str, Any]:
        params = request.fields
        row = await self._schedule_for(request.schedule_id, ctx.caller, "update")
        if "task_id" in params and params["task_id"] != row["task_id"]:
            raise invalid_params("task_id: a schedule's template cannot be changed; create another schedule")
        spec = await self._spec(params, row)
        now = datetime.now(timezone.utc)
        values: dict[str, Any] = {**spec, "updated_at": slots.iso(now)}
        if any(spec[key] != row[key] for key in TIMING) or row["next_run_at"] is None and spec["enabled"]:
            values["next_run_at"] = self._next({**row, **spec}, row["runs"], now)
        updated = await self.schedules.update(row["id"], values)
        if updated is None:
            raise invalid_params(f"schedule_id: schedule '{row['id']}' not found")
        self.schedule_loop.wake()
        return public(updated)

    async def delete(self, request: ScheduleRef, ctx: CallContext) -> dict[str, Any]:
        row = await self._schedule_for(request.schedule_id, ctx.caller, "delete")
        deleted = await self.schedules.delete(row["id"])
        return {"success": deleted, "schedule_id": row["id"]}

    async def trigger(self, request: ScheduleRef, ctx: CallContext) -> dict[str, Any]:
        """Run the template now: one more run (counted in `runs`), no slot consumed."""
        row = await self._schedule_for(request.schedule_id, ctx.caller, "trigger")
        claimed = await self.schedule_loop.start_run(row, None, None)
        if claimed is None:
            raise invalid_params(f"schedule_id: schedule '{row['id']}' not found")
        if claimed["execution"] is None:
            raise invalid_params(f"task_id: the template task '{row['task_id']}' of schedule '{row['id']}' no "
                                 "longer exists; the schedule was disabled")
        self.schedule_loop.wake()
        answer = public(claimed["schedule"])
        answer["root_task_id"] = claimed["copies"][0]["id"]
        return answer


def public(row: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule as the wire shows it; webhook header values are not echoed (they hold secrets)."""
    answer = {key: row.get(key) for key in (
        "id", "task_id", "user_id", "cron", "interval_seconds", "timezone", "enabled", "max_runs", "start_at",
        "end_at", "overlap", "catch_up", "webhook_config", "next_run_at", "last_run_at", "last_slot",
        "last_root_task_id", "runs", "skipped", "last_skipped_at", "created_at", "updated_at")}
    webhook = row.get("webhook_config")
    if webhook:
        answer["webhook_config"] = {**webhook, "headers": dict.fromkeys(webhook.get("headers") or {}, MASK)}
    return answer


def _unmasked(webhook: Any, base: Mapping[str, Any]) -> Any:
    """A webhook_config sent back as read (header values shown as `***`) keeps the stored values."""
    stored = (base.get("webhook_config") or {}).get("headers") or {}
    if not isinstance(webhook, Mapping) or not isinstance(webhook.get("headers"), Mapping):
        return webhook
    headers = {k: stored[k] if v == MASK and k in stored else v for k, v in webhook["headers"].items()}
    return {**webhook, "headers": headers}


def _moment(spec: Mapping[str, Any], key: str, tz: Any) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise invalid_params(f"{key} must be an ISO 8601 date-time such as '2026-01-31T09:00:00+01:00', "
                             f"got {value!r}"[:300])
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise invalid_params(f"{key} must be an ISO 8601 date-time such as '2026-01-31T09:00:00+01:00', "
                             f"got {value!r}"[:300]) from None
    if moment.tzinfo is None:  # a wall-clock time in the schedule's zone
        moment = moment.replace(tzinfo=tz)
    try:
        return slots.iso(moment)
    except (OverflowError, ValueError):
        raise invalid_params(f"{key} is out of range: {value!r}"[:300]) from None


def schedule_methods(service: ScheduleService) -> dict[str, Handler]:
    return {
        "schedules.create": typed(CreateSchedule.from_params, service.create),
        "schedules.get": typed(ScheduleRef.from_params, service.get),
        "schedules.list": typed(ListSchedules.from_params, service.list),
        "schedules.update": typed(UpdateSchedule.from_params, service.update),
        "schedules.delete": typed(ScheduleRef.from_params, service.delete),
        "schedules.trigger": typed(ScheduleRef.from_params, service.trigger),
        "schedules.runs": typed(ScheduleRuns.from_params, service.runs),
    }
