"""When a schedule runs: pure functions of a schedule's fields and a given `now` (no clock inside).

Cron slots are computed by croniter on zone-aware datetimes in the schedule's IANA time zone and
stored as UTC ISO 8601 times. Around DST changes: a wall-clock time that does not exist (clocks
go forward) runs at the first moment after the gap; a wall-clock time that occurs twice (clocks go
back) runs once, at its first occurrence, unless the hour field is a wildcard (`*`, `*/2`), whose
slots follow real time. Interval slots are `anchor + k * interval_seconds`, the anchor being
`start_at`, or the creation time plus one interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

# A missed slot with `catch_up: none` still runs when the schedule loop reaches it within this many
# seconds (a wake-up a little late on a loaded machine is not downtime).
ON_TIME_GRACE_SECONDS = 2.0
MAX_INTERVAL_SECONDS = 10 * 366 * 86_400.0


def iso(moment: datetime) -> str:
    """The stored form of a moment: UTC, fixed width (sorts as text, like every timestamp column)."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def parse_iso(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp).astimezone(timezone.utc)


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; ValueError when there is none of that name."""
    try:
        return ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, a path, a directory, NUL...
        raise ValueError(name) from None


def check_cron(expr: str) -> None:
    """ValueError unless `expr` is a five-field cron expression croniter accepts."""
    from croniter import croniter

    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise ValueError(expr)
    try:  # is_valid passes some expressions that can never match (e.g. 30 February)
        croniter(expr, datetime(2000, 1, 1, tzinfo=timezone.utc)).get_next(datetime)
    except Exception:
        raise ValueError(expr) from None


def next_slot(spec: Mapping[str, Any], after: datetime) -> datetime | None:
    """The first slot of `spec` strictly after `after`; None when there is none (past `end_at`).

    `spec` holds the schedule's fields: `cron` or `interval_seconds`, `timezone`, `start_at`,
    `end_at` (ISO strings or None) and `created_at` (the interval's anchor without `start_at`).
    """
    start = parse_iso(spec["start_at"]) if spec.get("start_at") else None
    end = parse_iso(spec["end_at"]) if spec.get("end_at") else None
    if spec.get("cron"):
        slot = _next_cron(spec["cron"], zone(spec.get("timezone") or "UTC"),
                          max(after, start - timedelta(microseconds=1)) if start else after)
    else:
        interval = float(spec["interval_seconds"])
        anchor = start or parse_iso(spec["created_at"]) + timedelta(seconds=interval)
        if after < anchor:
            slot = anchor
        else:
            steps = math.floor((after - anchor).total_seconds() / interval) + 1
            slot = anchor + timedelta(seconds=steps * interval)
            while slot <= after:  # float rounding
                slot += timedelta(seconds=interval)
    if end is not None and slot > end:
        return None
    return slot


def _next_cron(expr: str, tz: ZoneInfo, after: datetime) -> datetime:
    from croniter import croniter

    hour_is_wildcard = expr.split()[1].startswith("*")
    moments = croniter(expr, after.astimezone(tz))
    while True:
        slot = moments.get_next(datetime)
        if hour_is_wildcard or not _second_occurrence(slot, tz):
            return slot.astimezone(timezone.utc)


def _second_occurrence(moment: datetime, tz: ZoneInfo) -> bool:
    """True when `moment`'s wall-clock time already happened once earlier (clocks went back)."""
    wall = moment.astimezone(tz).replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0)
    return first.astimezone(timezone.utc) < moment.astimezone(timezone.utc)


def plan(spec: Mapping[str, Any], slot: datetime, now: datetime) -> tuple[bool, datetime | None]:
    """For the due `slot` at `now`: whether it runs, and the slot after it.

    On time (within ON_TIME_GRACE_SECONDS) a slot always runs. Missed slots (downtime, or a
    schedule loop that fell behind) collapse into one: `catch_up: latest` runs once for them all,
    `none` runs none of them. Either way the next slot is the first one after `now`.
    """
    on_time = (now - slot).total_seconds() <= ON_TIME_GRACE_SECONDS
    runs = on_time or spec.get("catch_up", "latest") == "latest"
    return runs, next_slot(spec, max(now, slot))
