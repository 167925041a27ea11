"""durable waits: a task parked on a wait, the answers of its earlier waits, stored events

Revision ID: 0008
Revises: 0007

A task waiting for input, an event or a timer stays `in_progress` with `waiting` set (the wait,
JSON text) and holds no lease; `wait_answers` keeps the answers its attempt already received (JSON
text), `wake_at` when the wait times out. All three are SQL NULL for a task that never waits, and
the two partial indexes hold parked tasks only. `events` keeps what `events.emit` received.
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("waiting", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("wait_answers", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("wake_at", sa.String(40), nullable=True))
    op.create_index("ix_tasks_waiting_user", "tasks", ["user_id"], sqlite_where=sa.text("waiting IS NOT NULL"),
                    postgresql_where=sa.text("waiting IS NOT NULL"))
    op.create_index("ix_tasks_wake_at", "tasks", ["wake_at"], sqlite_where=sa.text("wake_at IS NOT NULL"),
                    postgresql_where=sa.text("wake_at IS NOT NULL"))
    op.create_table(
        "events",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(255), nullable=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
    )
    op.create_index("ix_events_user_name_created", "events", ["user_id", "name", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_events_user_name_created", "events")
    op.drop_table("events")
    op.drop_index("ix_tasks_wake_at", "tasks")
    op.drop_index("ix_tasks_waiting_user", "tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("wake_at")
        batch.drop_column("wait_answers")
        batch.drop_column("waiting")
