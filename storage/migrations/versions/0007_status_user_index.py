"""count a user's unfinished tasks through the status index

Revision ID: 0007
Revises: 0006

0006 gave SERVICE_MAX_PENDING_PER_USER its own partial index, (user_id, status) of the pending and
in-progress tasks. Every status change of every task then wrote two indexes instead of one
(`ix_tasks_status` and the partial one), which measured 5 % of a 1000-task chain on SQLite.
The status index becomes (status, user_id) instead: a status change writes it anyway, and the
user's unfinished tasks are two covering ranges of it ('pending', user) and ('in_progress', user),
still bounded by the quota whatever the user's history. Queries by status alone use its prefix.
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UNFINISHED = "status IN ('pending', 'in_progress')"


def upgrade() -> None:
    op.drop_index("ix_tasks_user_unfinished", "tasks")
    op.drop_index("ix_tasks_status", "tasks")
    op.create_index("ix_tasks_status_user", "tasks", ["status", "user_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_status_user", "tasks")
    op.create_index("ix_tasks_status", "tasks", ["status"])
    op.create_index("ix_tasks_user_unfinished", "tasks", ["user_id", "status"],
                    sqlite_where=sa.text(UNFINISHED), postgresql_where=sa.text(UNFINISHED))
