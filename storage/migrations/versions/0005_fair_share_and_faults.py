"""fair share and faults: interruptions, concurrency keys, rate limits

Revision ID: 0005
Revises: 0004

Tasks gain `interruptions` (attempts cut off by the platform: a crash, a lost lease, a shutdown
past its grace; they do not use up the task's retries, up to SERVICE_MAX_INTERRUPTIONS),
`concurrency` and `rate_limit` (the objects a task was created with, normalised) and
`concurrency_key` (the key alone, so the tasks of a key in progress are counted through an index).
`rate_limits` keeps, per key, the earliest moment the next attempt of that key may start: a claim
moves it forward by one interval in the same transaction, so the rate holds across instances.
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("interruptions", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("concurrency", sa.JSON, nullable=True))
        batch.add_column(sa.Column("rate_limit", sa.JSON, nullable=True))
        batch.add_column(sa.Column("concurrency_key", sa.String(255), nullable=True))
    # Partial: only limited tasks are in it, so every other task's writes do not maintain it.
    op.create_index("ix_tasks_concurrency_key", "tasks", ["concurrency_key", "status"],
                    sqlite_where=sa.text("concurrency_key IS NOT NULL"),
                    postgresql_where=sa.text("concurrency_key IS NOT NULL"))
    op.create_table(
        "rate_limits",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("next_at", sa.String(40), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rate_limits")
    op.drop_index("ix_tasks_concurrency_key", "tasks")
    with op.batch_alter_table("tasks") as batch:
        for column in ("concurrency_key", "rate_limit", "concurrency", "interruptions"):
            batch.drop_column(column)
