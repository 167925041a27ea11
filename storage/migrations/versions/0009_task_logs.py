"""task logs: the log lines of each attempt (what its executor logged, a command's output, REST calls)

Revision ID: 0009
Revises: 0008

One row per line, numbered by `seq` (one counter for the table); read by task in `seq` order
(`ix_task_logs_task_seq`), deleted with their task.
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_logs",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.String(40), nullable=False),
        sa.Column("stream", sa.String(8), nullable=False),
        sa.Column("level", sa.String(16), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
    )
    op.create_index("ix_task_logs_task_seq", "task_logs", ["task_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_task_logs_task_seq", "task_logs")
    op.drop_table("task_logs")
