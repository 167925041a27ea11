"""Flow control of event triggers, as pure decisions (docs/triggers.md): no I/O, no clock of its own.

A trigger's waiting events of one key (oldest first) and the runs of that key still going become
one `Plan` (storage/trigger_store.py carries it out in the transaction that read them):

- no debounce, no batch: every event is a run of its own, oldest first;
- `debounce {seconds, max_wait_seconds}`: one run with the last payload once the key has been quiet
  for `seconds`, or once its first waiting event is `max_wait_seconds` old;
- `batch {size, seconds}`: one run with up to `size` payloads, as soon as `size` wait, or once the
  first waiting event is `seconds` old;
- `singleton`, when a run of the key is still going: `skip` (the events are consumed without a
  run), `queue` (they wait until it ends), `replace` (cancel it, then start).

Times are the events' `created_at` (the emitting instance's clock) against the deciding
instance's clock, as for the waits of docs/waits.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from taskgrove.storage.trigger_store import Plan


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def due_at(trigger: Mapping[str, Any], count: int, first_at: str, last_at: str) -> datetime:
    """When a key's waiting start events come due (its singleton aside): the moment to look again."""
    debounce, batch = trigger.get("debounce"), trigger.get("batch")
    if debounce:
        due = _at(last_at) + timedelta(seconds=debounce["seconds"])
        if debounce.get("max_wait_seconds") is not None:
            due = min(due, _at(first_at) + timedelta(seconds=debounce["max_wait_seconds"]))
        return due
    if batch:
        if count >= batch["size"]:
            return _at(first_at)
        return _at(first_at) + timedelta(seconds=batch["seconds"])
    return _at(first_at)


def decide(trigger: Mapping[str, Any], rows: Sequence[dict[str, Any]], running: Sequence[str],
           now: datetime) -> Plan:
    """The plan for a key's waiting start events `rows` (oldest first) at `now`, `running` being the
    roots of that key's runs still going."""
    if not rows:
        return Plan("wait", [])
    due = due_at(trigger, len(rows), rows[0]["created_at"], rows[-1]["created_at"])
    if due > now:
        return Plan("wait", [], due_at=due.isoformat())
    batch = trigger.get("batch")
    if trigger.get("debounce"):
        taken = list(rows)
    elif batch:
        taken = list(rows[:batch["size"]])
    else:
        taken = list(rows[:1])
    if running:
        policy = trigger.get("singleton")
        if policy == "skip":
            return Plan("skip", taken)
        if policy == "queue":
            return Plan("hold", [])
        if policy == "replace":
            return Plan("replace", [dict(r) for r in taken], running=tuple(running))
    return Plan("start", [dict(r) for r in taken])
