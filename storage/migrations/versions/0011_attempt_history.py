"""attempt history: one row per attempt of a task (the timeline, docs/observability.md)

Revision ID: 0011
Revises: 0010

A task row keeps only its current attempt; `task_attempts` keeps every one: when it became
runnable (`queued_at`), started, ended, and how (`outcome`: completed, failed, retry,
interrupted, cancelled, waiting), written in the engine's pass transaction with the outcome
itself. Rows go with their task (storage/attempts.py `delete_of`), so the table needs no
foreign key; `id` only orders the rows of one task.
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("queued_at", sa.String(40), nullable=True),
        sa.Column("started_at", sa.String(40), nullable=True),
        sa.Column("ended_at", sa.String(40), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_task_attempts_task_id", "task_attempts", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_task_attempts_task_id", "task_attempts")
    op.drop_table("task_attempts")
