"""The tables of event triggers (docs/triggers.md): the triggers, the events they took in, the runs.

Their own module beside storage/models.py, on the same metadata (as storage/agent_models.py): a
concern of its own, whose statements live in storage/trigger_store.py.

- `triggers`: one row per trigger: the template tree it runs, the event it listens to, its flow
  control (key, debounce, batch, singleton, cancel_on) and its counters. The fire of a trigger's
  group locks this row (PostgreSQL), so two instances never decide for the same trigger at once.
- `trigger_events`: the inbox. One row per (trigger, event) an `events.emit` matched, written by
  the emitting instance; `handled_at` is NULL while the row waits (a debounce window, a batch
  being filled, a queue behind a running run). Whoever handles it sets `handled_at` with a
  compare-and-set, so each event is taken once across instances; the unique key makes a second
  insert of the same event for the same trigger impossible. Pending rows are what survives a
  restart: nothing of a debounce or a batch lives only in memory.
- `trigger_runs`: the runs triggers started, by trigger and key: what `singleton` and `cancel_on`
  look at (joined with the run's execution and root to know whether it still runs).
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import JSON, Boolean, Index, Integer, String, Table, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from taskgrove.storage.models import Base


class EventTrigger(Base):
    """One trigger: an event name (and `match`) that starts runs of a template tree."""

    __tablename__ = "triggers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64))  # the template's root
    user_id: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the template's owner
    event: Mapped[str] = mapped_column(String(255))
    match: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    key: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the payload field runs are keyed by
    debounce: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # {seconds, max_wait_seconds}
    batch: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # {size, seconds}
    singleton: Mapped[str | None] = mapped_column(String(16), nullable=True)  # skip | queue | replace
    cancel_on: Mapped[str | None] = mapped_column(String(255), nullable=True)  # an event name
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    matched: Mapped[int] = mapped_column(Integer, default=0)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    debounced: Mapped[int] = mapped_column(Integer, default=0)
    batched: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[int] = mapped_column(Integer, default=0)
    cancelled: Mapped[int] = mapped_column(Integer, default=0)
    last_run_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    last_root_task_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    updated_at: Mapped[str] = mapped_column(String(40))

    __table_args__ = (Index("ix_triggers_user_event", "user_id", "event"),
                      Index("ix_triggers_user_cancel_on", "user_id", "cancel_on"))


class TriggerInboxRow(Base):
    """One event a trigger took in: to start a run (`kind` start) or to cancel one (`cancel`)."""

    __tablename__ = "trigger_events"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # arrival order
    trigger_id: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(8))  # start | cancel
    group_key: Mapped[str] = mapped_column(String(255))  # the key field's value as text; '' without a key
    payload: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[str] = mapped_column(String(40))
    handled_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # run | debounced | batched | skipped | dropped (a cancel_on came first) | cancel | gone (trigger deleted)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    root_task_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the run it went into

    __table_args__ = (UniqueConstraint("trigger_id", "event_id", name="ux_trigger_events_event"),
                      Index("ix_trigger_events_pending", "handled_at", "trigger_id", "group_key", "seq"))


class TriggerRunRow(Base):
    """A run a trigger started (the root of its copy of the template)."""

    __tablename__ = "trigger_runs"

    root_task_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    trigger_id: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(255))
    events: Mapped[int] = mapped_column(Integer)  # how many events it holds
    created_at: Mapped[str] = mapped_column(String(40))
    cancel_reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # why a trigger cancelled it

    __table_args__ = (Index("ix_trigger_runs_group", "trigger_id", "group_key", "created_at"),)


triggers_table = cast(Table, EventTrigger.__table__)
trigger_events_table = cast(Table, TriggerInboxRow.__table__)
trigger_runs_table = cast(Table, TriggerRunRow.__table__)
