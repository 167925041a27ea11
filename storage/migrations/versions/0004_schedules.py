"""schedules: template trees run on a cron expression or an interval

Revision ID: 0004
Revises: 0003

One row per schedule: its template (`task_id`, the root of a tree that is copied for every run),
its timing (`cron` in `timezone`, or `interval_seconds`; `start_at`, `end_at`, `max_runs`), its
policies (`overlap`, `catch_up`), an optional webhook, and its state: `next_run_at`, the slot the
next run is due at (claimed by a compare-and-set on it), the latest run and the counters.
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("interval_seconds", sa.Float, nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("max_runs", sa.Integer, nullable=True),
        sa.Column("start_at", sa.String(40), nullable=True),
        sa.Column("end_at", sa.String(40), nullable=True),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("webhook_config", sa.JSON, nullable=True),
        sa.Column("next_run_at", sa.String(40), nullable=True),
        sa.Column("last_run_at", sa.String(40), nullable=True),
        sa.Column("last_slot", sa.String(40), nullable=True),
        sa.Column("last_root_task_id", sa.String(64), nullable=True),
        sa.Column("runs", sa.Integer, nullable=False, server_default="0"),
        sa.Column("skipped", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_skipped_at", sa.String(40), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )
    op.create_index("ix_schedules_due", "schedules", ["enabled", "next_run_at"])
    op.create_index("ix_schedules_user_id", "schedules", ["user_id"])


def downgrade() -> None:
    op.drop_table("schedules")
