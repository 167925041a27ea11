"""the per-user quota of unfinished tasks

Revision ID: 0006
Revises: 0005

`ix_tasks_user_unfinished` holds (user, status) of every task that is `pending` or `in_progress`,
and only those: SERVICE_MAX_PENDING_PER_USER counts a user's unfinished tasks through it before a
request stores more (agent/services/admission.py), at a cost bounded by the quota whatever the user's
history (the status makes it a covering index: the count never reads the table). Partial, so a
task leaves it when it ends and finished tasks never cost it anything.
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UNFINISHED = "status IN ('pending', 'in_progress')"


def upgrade() -> None:
    op.create_index("ix_tasks_user_unfinished", "tasks", ["user_id", "status"],
                    sqlite_where=sa.text(UNFINISHED), postgresql_where=sa.text(UNFINISHED))


def downgrade() -> None:
    op.drop_index("ix_tasks_user_unfinished", "tasks")
