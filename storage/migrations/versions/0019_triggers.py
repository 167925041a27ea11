"""triggers: event triggers, their inbox of events and their runs (docs/triggers.md)

Revision ID: 0019
Revises: 0018

`triggers` (a template, an event, flow control, counters), `trigger_events` (one row per event a
trigger took in; `handled_at` NULL while a debounce, a batch or a queue holds it; unique per
trigger and event) and `trigger_runs` (the runs started, by trigger and key). The columns are
storage/trigger_models.py's.
"""
import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "triggers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("event", sa.String(255), nullable=False),
        sa.Column("match", sa.JSON, nullable=True),
        sa.Column("key", sa.String(255), nullable=True),
        sa.Column("debounce", sa.JSON, nullable=True),
        sa.Column("batch", sa.JSON, nullable=True),
        sa.Column("singleton", sa.String(16), nullable=True),
        sa.Column("cancel_on", sa.String(255), nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("matched", sa.Integer, nullable=False),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("debounced", sa.Integer, nullable=False),
        sa.Column("batched", sa.Integer, nullable=False),
        sa.Column("skipped", sa.Integer, nullable=False),
        sa.Column("cancelled", sa.Integer, nullable=False),
        sa.Column("last_run_at", sa.String(40), nullable=True),
        sa.Column("last_root_task_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )
    op.create_index("ix_triggers_user_event", "triggers", ["user_id", "event"])
    op.create_index("ix_triggers_user_cancel_on", "triggers", ["user_id", "cancel_on"])
    op.create_table(
        "trigger_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("trigger_id", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("group_key", sa.String(255), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("handled_at", sa.String(40), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("root_task_id", sa.String(64), nullable=True),
        sa.UniqueConstraint("trigger_id", "event_id", name="ux_trigger_events_event"),
    )
    op.create_index("ix_trigger_events_pending", "trigger_events", ["handled_at", "trigger_id", "group_key", "seq"])
    op.create_table(
        "trigger_runs",
        sa.Column("root_task_id", sa.String(64), primary_key=True),
        sa.Column("trigger_id", sa.String(64), nullable=False),
        sa.Column("group_key", sa.String(255), nullable=False),
        sa.Column("events", sa.Integer, nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("cancel_reason", sa.Text, nullable=True),
    )
    op.create_index("ix_trigger_runs_group", "trigger_runs", ["trigger_id", "group_key", "created_at"])


def downgrade() -> None:
    op.drop_table("trigger_runs")
    op.drop_table("trigger_events")
    op.drop_table("triggers")
